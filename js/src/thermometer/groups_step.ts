// The grouped view at the step the thermometer's slider shows, or over the whole run, from data
// already in the browser (no kernel round trip; the kernel cannot answer while the cell runs):
// the rows' values and flags from the HistoryStore's slot (or the merged `layers`/`stats` traits),
// the blocks' strips aggregated as nbdebug/inspectors/groups.py `_strip` does (worst flag, mean std,
// max |x|, ‖∇‖ of the block, mean zero fraction, NaN/Inf count), flags ORed upward (row → block →
// group), and the residual stream norm after each block from its output row's mean and std at that
// step (nbdebug/inspectors/residual.py `residual_history`), with its growth and largest jump.
import type { AnyModel } from "../lib/rpc";
import type { GroupData, Residual } from "./groups_data";
import type { HistoryStore } from "./history";
import { StatTable, type Layer } from "./rows";

/** What the grouped view shows: the payload as sent, one kept slot, or the whole run. */
export type GroupPosition = { kind: "payload" } | { kind: "slot"; slot: number } | { kind: "whole" };

/** The table's position in the thermometer (same rule as its `position()`: the `step` trait, 0 the
 * last kept slot, -1 the whole run once the merged rows came; a finished run without 2+ kept slots:
 * the payload as sent). While the cell runs, the payload is the tree alone (`groups_live`). */
export function groupPosition(model: AnyModel, store: HistoryStore): GroupPosition {
  const n = store.length;
  const running = Boolean(model.get("running"));
  if (running ? n < 1 : n < 2) return { kind: "payload" };
  const step = Number(model.get("step") ?? 0);
  if (!running && step < 0 && (model.get("layers") ?? []).length) return { kind: "whole" };
  return { kind: "slot", slot: step > 0 ? store.slotOf(step) : n - 1 };
}

/** One row's values (in `d.rowFields` order) and flag codes, or null when the source lacks it. */
type RowSource = (name: string) => { value: (field: string) => number; codes: string[] } | null;

/** The grouped view at kept slot `slot` of `store` (rows matched by name; a row the history lacks is empty). */
export function groupsAtSlot(d: GroupData, store: HistoryStore, slot: number): GroupData {
  const index = new Map(store.rows.map((r, i) => [String(r.name), i]));
  const src: RowSource = (name) => {
    const i = index.get(name);
    if (i === undefined) return null;
    return { value: (f) => store.get(slot, i, f), codes: store.codes(store.flagsAt(slot, i)) };
  };
  const residual = residualAt(d, store, slot, index);
  return aggregate(d, src, { step: store.step(slot), whole: false, residual });
}

/** The grouped view over the whole run: the merged rows (`layers` trait with their flags, `stats`
 * over `columns`); the residual stream is the payload's (merged over the run already). */
export function groupsWhole(d: GroupData, layers: Layer[], stats: StatTable): GroupData {
  const index = new Map<string, number>();
  layers.forEach((l, i) => index.has(String(l.name)) || index.set(String(l.name), i));
  const src: RowSource = (name) => {
    const i = index.get(name);
    if (i === undefined) return null;
    return { value: (f) => stats.get(i, f), codes: (layers[i].flags ?? []).map(String) };
  };
  return aggregate(d, src, { step: null, whole: true, residual: null });
}

interface ResidualAt {
  norm: Float64Array; // per block of the residual group (NaN: not captured, not seen, or non-finite)
  bad: boolean[];
  info: Residual;
}

/** Flag codes → the row's severity (the payload's SEVERITY map; an unknown flag counts 1, none 0). */
function severity(d: GroupData, codes: string[]): number {
  let s = 0;
  for (const c of codes) s = Math.max(s, d.severity[c] ?? 1);
  return s;
}

function aggregate(d: GroupData, src: RowSource, o: { step: number | null; whole: boolean; residual: ResidualAt | null }): GroupData {
  const R = d.rowCount;
  const F = d.rowFields.length;
  const codes = [...d.flagCodes];
  const bit = new Map(codes.map((c, i) => [c, i]));
  const values = new Float32Array(R * F).fill(NaN);
  const rowFlags = new Uint32Array(R);
  const sev = new Float64Array(R);
  for (let r = 0; r < R; r++) {
    const row = src(d.name(r));
    if (!row) continue;
    d.rowFields.forEach((f, j) => (values[r * F + j] = row.value(f)));
    for (const c of row.codes) {
      if (!bit.has(c) && codes.length < 32) bit.set(c, codes.push(c) - 1);
      const b = bit.get(c);
      if (b !== undefined) rowFlags[r] = (rowFlags[r] | (1 << b)) >>> 0;
    }
    sev[r] = severity(d, row.codes);
  }
  const rows = d.blockRows();
  const S = d.stripStats;
  const strip = new Float32Array(d.blocks.length * S.length).fill(NaN);
  const blockFlags = new Uint32Array(d.blocks.length);
  const col = (f: string) => d.rowFields.indexOf(f);
  const [iStd, iMin, iMax, iG, iZ, iNan, iInf] = ["std", "min", "max", "grad_norm", "zero_frac", "nan", "inf"].map(col);
  const at = (r: number, j: number) => (j < 0 ? NaN : values[r * F + j]);
  rows.forEach((members, b) => {
    for (const r of members) blockFlags[b] = (blockFlags[b] | rowFlags[r]) >>> 0;
    if (!members.length) return;
    const acc = { sev: 0, std: 0, nStd: 0, abs: -Infinity, g2: 0, nG: 0, z: 0, nZ: 0, bad: 0 };
    for (const r of members) {
      acc.sev = Math.max(acc.sev, sev[r]);
      const s = at(r, iStd);
      if (Number.isFinite(s)) (acc.std += s), acc.nStd++;
      for (const j of [iMin, iMax]) {
        const v = Math.abs(at(r, j));
        if (Number.isFinite(v)) acc.abs = Math.max(acc.abs, v);
      }
      const g = at(r, iG);
      if (Number.isFinite(g)) (acc.g2 += g * g), acc.nG++;
      const z = at(r, iZ);
      if (Number.isFinite(z)) (acc.z += z), acc.nZ++;
      for (const j of [iNan, iInf]) {
        const v = at(r, j);
        if (!Number.isNaN(v)) acc.bad += v;
      }
    }
    const put = (stat: string, v: number) => {
      const j = S.indexOf(stat);
      if (j >= 0) strip[b * S.length + j] = v;
    };
    put("severity", acc.sev);
    put("std", acc.nStd ? acc.std / acc.nStd : NaN);
    put("absmax", acc.abs > -Infinity ? acc.abs : NaN);
    put("grad_norm", acc.nG ? Math.sqrt(acc.g2) : NaN);
    put("zero_frac", acc.nZ ? acc.z / acc.nZ : NaN);
    put("nonfinite", acc.bad);
  });
  const groupFlags = new Uint32Array(d.groups.length);
  d.groups.forEach((g, i) => g.blocks.forEach((b) => (groupFlags[i] = (groupFlags[i] | blockFlags[b]) >>> 0)));
  // the residual stream: at a step, from the block outputs; over the whole run, the payload's
  const jr = S.indexOf("residual");
  let residual = d.residual;
  let growth: ArrayLike<number> = d.growth;
  if (jr >= 0 && o.residual) {
    const blocks = d.groups[o.residual.info.group].blocks;
    blocks.forEach((b, i) => (strip[b * S.length + jr] = o.residual!.norm[i]));
    residual = o.residual.info;
    growth = Float32Array.from(blocks, (_, i) => (i ? o.residual!.norm[i] / o.residual!.norm[i - 1] : NaN));
  } else if (jr >= 0) {
    d.blocks.forEach((_, b) => (strip[b * S.length + jr] = d.stripValue(b, "residual")));
  }
  return d.retimed({ values, rowFlags, flagCodes: codes, strip, blockFlags, groupFlags, step: o.step, whole: o.whole, residual, growth });
}

/** The residual stream at kept slot `slot`: per block of the residual group, the per-token RMS norm
 * of its output row (the block's own row, else `block[0]`): sqrt(d · ((n − 1)/n · std² + mean²)),
 * d the last dimension and n the elements of the row's shape; NaN where the row holds NaN/Inf. */
function residualAt(d: GroupData, store: HistoryStore, slot: number, index: Map<string, number>): ResidualAt | null {
  const base = d.residual;
  if (!base) return null;
  const blocks = d.groups[base.group]?.blocks ?? [];
  const norm = new Float64Array(blocks.length).fill(NaN);
  const bad = blocks.map(() => false);
  blocks.forEach((b, i) => {
    const name = d.blocks[b].name;
    const r = index.get(name) ?? index.get(`${name}[0]`);
    if (r === undefined) return;
    const shape = (store.rows[r].shape ?? []).map(Number);
    const dim = shape.length ? shape[shape.length - 1] : 1;
    const n = shape.length ? shape.reduce((a, x) => a * x, 1) : Infinity;
    const mean = store.get(slot, r, "mean");
    const std = store.get(slot, r, "std");
    bad[i] = store.get(slot, r, "nan") > 0 || store.get(slot, r, "inf") > 0;
    const corr = n > 1 && Number.isFinite(n) ? (n - 1) / n : 1;
    norm[i] = bad[i] ? NaN : Math.sqrt(dim * (corr * std * std + mean * mean));
  });
  let jump: number | null = null;
  for (let i = 1; i < blocks.length; i++) {
    const g = norm[i] / norm[i - 1];
    if (Number.isFinite(g) && (jump === null || g > norm[jump] / norm[jump - 1])) jump = i;
  }
  const first = bad.indexOf(true);
  return {
    norm,
    bad,
    info: {
      ...base,
      largest_jump: jump === null ? null : d.blocks[blocks[jump]].name,
      first_nonfinite: first < 0 ? null : d.blocks[blocks[first]].name,
    },
  };
}
