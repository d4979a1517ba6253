// The "spread across ranks" column added to the rank's thermometer rows: min … max of the chosen
// stat over the ranks at the step the rank's thermometer shows (its step slider; "whole run": over the
// ranks' merged rows), from the `spread` trait of nbdebug/widgets/run.py, already in the browser:
// {fields, rows, lo, hi} (at each rank's last kept step, lo/hi float32 [rows, fields]), `steps` [K]
// with `step_lo`/`step_hi` [K, rows, fields], `whole_lo`/`whole_hi` [rows, fields]. The thermometer
// redraws its rows itself (slider, sort, live); a MutationObserver adds the cell to every row it
// (re)builds, at the position the mounted rank model (run/local.ts) holds.
import { fmt, h } from "../lib/dom";
import { decode, type WireArray } from "../lib/ndarray";
import { shared } from "../thermometer/live";
import { mountedFor } from "./local";

export interface Spread {
  fields?: string[];
  rows?: string[];
  lo?: WireArray;
  hi?: WireArray;
  steps?: WireArray;
  step_lo?: WireArray;
  step_hi?: WireArray;
  whole_lo?: WireArray;
  whole_hi?: WireArray;
}

/** Where the rank's thermometer is: its last kept step, one kept step, or the whole run. */
export type SpreadAt = { kind: "last" } | { kind: "step"; step: number } | { kind: "whole" };

interface Index {
  at: Map<string, number>;
  lo: ArrayLike<number>;
  hi: ArrayLike<number>;
  k: number;
  steps: Map<number, number>; // kept step → index into step_lo/step_hi
  slo: ArrayLike<number>;
  shi: ArrayLike<number>;
  wlo: ArrayLike<number> | null;
  whi: ArrayLike<number> | null;
}

const INDEX = new WeakMap<object, Index>();

function indexOf(spread: Spread): Index {
  let ix = INDEX.get(spread);
  if (!ix) {
    const rows = Array.isArray(spread.rows) ? spread.rows : [];
    const k = (spread.fields ?? []).length;
    const data = (w: WireArray | undefined) => (w?.view ? decode(w).data : null);
    const lo = data(spread.lo) ?? new Float32Array(0);
    const hi = data(spread.hi) ?? new Float32Array(0);
    const n = rows.length * k;
    if (lo.length !== n || hi.length !== n) {
      throw new Error(`nbdebug: spread of ${lo.length} values does not match ${rows.length} rows × ${k} fields`);
    }
    const steps = Array.from(data(spread.steps) ?? []);
    const slo = data(spread.step_lo) ?? new Float32Array(0);
    const shi = data(spread.step_hi) ?? new Float32Array(0);
    if (slo.length !== steps.length * n || shi.length !== steps.length * n) {
      throw new Error(`nbdebug: spread over time of ${slo.length} values does not match ${steps.length} steps × ${rows.length} rows × ${k} fields`);
    }
    const wlo = data(spread.whole_lo);
    const whi = data(spread.whole_hi);
    const whole = wlo && whi && wlo.length === n && whi.length === n;
    ix = { at: new Map(rows.map((r, i) => [String(r), i])), lo, hi, k, steps: new Map(steps.map((s, i) => [Number(s), i])), slo, shi, wlo: whole ? wlo : null, whi: whole ? whi : null };
    INDEX.set(spread, ix);
  }
  return ix;
}

/** `[lo, hi]` of `field` for `row` at `at` (default: each rank's last kept step); NaN when no rank
 * had a finite value there, or no spread was kept for that step. */
export function spreadOf(spread: Spread, row: string, field: string, at: SpreadAt = { kind: "last" }): [number, number] {
  const j = (spread.fields ?? []).indexOf(field);
  const ix = indexOf(spread);
  const i = ix.at.get(row);
  if (j < 0 || i === undefined) return [NaN, NaN];
  const cell = i * ix.k + j;
  if (at.kind === "whole") return ix.wlo && ix.whi ? [ix.wlo[cell], ix.whi[cell]] : [NaN, NaN];
  if (at.kind === "step") {
    const s = ix.steps.get(at.step);
    if (s === undefined) return [NaN, NaN];
    const n = ix.at.size * ix.k;
    return [ix.slo[s * n + cell], ix.shi[s * n + cell]];
  }
  return [ix.lo[cell], ix.hi[cell]];
}

/** Whether the spread holds values for `at` (a step it kept, the whole run when sent). */
export function spreadHas(spread: Spread, at: SpreadAt): boolean {
  const ix = indexOf(spread);
  return at.kind === "last" || (at.kind === "whole" ? ix.wlo !== null : ix.steps.has(at.step));
}

/** The position of the rank thermometer mounted for the run view whose trait is `spread` (the
 * thermometer's own rule: `step` 0 its last kept slot, > 0 that slot's step, -1 the whole run).
 * Its last slot is that step when the spread has it, else each rank's last kept step. */
export function spreadPosition(spread: Spread): SpreadAt {
  const local = mountedFor(spread);
  if (!local) return { kind: "last" };
  const store = shared(local).store;
  const n = store.length;
  const step = Number(local.get("step") ?? 0);
  if (n < 2 && !local.get("running")) return { kind: "last" }; // one step: the table is the merged rows
  if (step < 0 && (local.get("layers") ?? []).length) return spreadHas(spread, { kind: "whole" }) ? { kind: "whole" } : { kind: "last" };
  const at: SpreadAt = { kind: "step", step: store.step(step > 0 ? store.slotOf(step) : n - 1) };
  return step > 0 || spreadHas(spread, at) ? at : { kind: "last" };
}

const WHERE = (at: SpreadAt) => (at.kind === "whole" ? "over the whole run (merged rows)" : at.kind === "step" ? `at step ${at.step}` : "at each rank's last kept step");

/** Whether lo and hi differ beyond float32 rounding. */
export function differs(lo: number, hi: number): boolean {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) return false;
  return Math.abs(hi - lo) > 1e-6 * Math.max(Math.abs(lo), Math.abs(hi), 1e-30);
}

/** The spread cell of one row at `at`. */
export function spreadCell(spread: Spread, row: string, field: string, at: SpreadAt = { kind: "last" }): HTMLElement {
  if (!spreadHas(spread, at)) {
    return h("div", { class: "nbd-spread-cell nbd-empty", text: "—", title: `no spread across ranks kept for step ${at.kind === "step" ? at.step : "?"} (the widget keeps evenly spaced steps)` });
  }
  const [lo, hi] = spreadOf(spread, row, field, at);
  if (Number.isNaN(lo)) return h("div", { class: "nbd-spread-cell nbd-empty", text: "—", title: `no rank has a finite ${field} for this row ${WHERE(at)}` });
  const text = lo === hi ? fmt(lo) : `${fmt(lo)} … ${fmt(hi)}`;
  return h("div", {
    class: ["nbd-spread-cell", "nbd-num", differs(lo, hi) && "nbd-spread-differs"],
    text,
    title: `${field} across ranks ${WHERE(at)}: min ${fmt(lo)}, max ${fmt(hi)}`,
    data: { at: at.kind === "step" ? at.step : at.kind },
  });
}

/** A row's name: the first text node of its name cell (a "×N" calls badge may follow). */
export function rowName(row: Element): string {
  const cell = row.querySelector(".nbd-name");
  const first = cell?.firstChild;
  return first && first.nodeType === 3 ? String(first.textContent ?? "") : String(cell?.textContent ?? "");
}

/** Keeps a spread cell on every row and a header cell of a thermometer mounted in `host`. */
export class SpreadColumn {
  private observer: MutationObserver | null = null;

  constructor(
    private host: HTMLElement,
    private spread: () => Spread,
    private field: () => string,
  ) {}

  /** Decorate what is there now and whatever the thermometer redraws later. */
  attach(): void {
    this.detach();
    this.decorate(true);
    const body = this.host.querySelector(".nbd-body");
    const head = this.host.querySelector(".nbd-head");
    if (typeof MutationObserver === "undefined" || !body || !head) return;
    this.observer = new MutationObserver(() => this.decorate(false));
    this.observer.observe(body, { childList: true });
    this.observer.observe(head, { childList: true });
  }

  detach(): void {
    this.observer?.disconnect();
    this.observer = null;
  }

  /** Add missing cells (`all`: redo every cell, e.g. after the stat changed). */
  decorate(all: boolean): void {
    const field = this.field();
    const spread = this.spread();
    const at = spreadPosition(spread);
    const head = this.host.querySelector(".nbd-head");
    if (head) {
      let hc = head.querySelector(":scope > .nbd-h-spread");
      if (hc && all) {
        hc.remove();
        hc = null;
      }
      if (!hc) {
        head.appendChild(h("div", { class: "nbd-h nbd-h-spread", text: `${field} across ranks`, title: `min … max over the ranks ${WHERE(at)} (bold: the ranks differ)` }));
      }
    }
    for (const row of Array.from(this.host.querySelectorAll(".nbd-body > .nbd-row"))) {
      const old = row.querySelector(":scope > .nbd-spread-cell");
      if (old && !all) continue;
      old?.remove();
      row.appendChild(spreadCell(spread, rowName(row), field, at));
    }
  }
}
