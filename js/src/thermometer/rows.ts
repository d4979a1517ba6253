// Rows of the layer thermometer: the stats table, the scales shared by all rows, one row element
// per layer, and sort keys. Layer names are untrusted text: only textContent (via dom.h).
import { textOn } from "../lib/contrast";
import { fmt, fmtInt, fmtPct, h } from "../lib/dom";
import { decode, type WireArray } from "../lib/ndarray";
import { log, symlog, type Scale } from "../lib/scale";

export interface Layer {
  name: string;
  module?: string;
  type?: string;
  shape?: number[];
  dtype?: string;
  flags?: string[];
  calls?: number;
}

export interface LegendEntry {
  label?: string;
  color?: string;
  description?: string;
}

export type Legend = Record<string, LegendEntry>;

export interface Diagnosis {
  code: string;
  severity: string;
  layer: string;
  message: string;
  suggestion: string;
}

/** The N × K statistics table (`stats` trait) addressed by column name; NaN where absent. */
export class StatTable {
  readonly rows: number;
  private data: Float32Array | null;
  private k: number;
  private index = new Map<string, number>();

  constructor(wire: WireArray | null | undefined, columns: string[], rows: number) {
    this.rows = rows;
    this.k = columns.length;
    columns.forEach((c, i) => this.index.set(c, i));
    this.data = null;
    if (!wire || !wire.view || rows === 0 || this.k === 0) return;
    const arr = decode(wire);
    if (arr.shape.length !== 2 || arr.shape[0] !== rows || arr.shape[1] !== this.k) {
      throw new Error(`nbdebug: stats of shape [${arr.shape}] do not match ${rows} layers × ${this.k} columns`);
    }
    this.data = arr.data instanceof Float32Array ? arr.data : Float32Array.from(arr.data);
  }

  /** A table over `data` (rows × columns, row-major), e.g. one history step's values. */
  static fromArray(data: Float32Array, columns: string[], rows: number): StatTable {
    const t = new StatTable(null, columns, rows);
    t.data = rows && columns.length ? data : null;
    return t;
  }

  has(col: string): boolean {
    return this.index.has(col);
  }

  get(row: number, col: string): number {
    const j = this.index.get(col);
    if (j === undefined || !this.data || row < 0 || row >= this.rows) return NaN;
    return this.data[row * this.k + j];
  }
}

export interface Scales {
  act: Scale; // activation values → [0, 100] (%)
  grad: Scale | null; // gradient norms → [6, 100] (%), null when no row has one
}

/** Shared scales: symlog over every row's finite min/max (and 0); log over positive grad norms. */
export function computeScales(stats: StatTable): Scales {
  let lo = 0;
  let hi = 0;
  const spreads: number[] = [];
  let glo = Infinity;
  let ghi = -Infinity;
  for (let i = 0; i < stats.rows; i++) {
    for (const c of ["min", "max", "mean"]) {
      const v = stats.get(i, c);
      if (Number.isFinite(v)) {
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
    }
    const s = stats.get(i, "std");
    if (Number.isFinite(s) && s > 0) spreads.push(s);
    const g = stats.get(i, "grad_norm");
    if (Number.isFinite(g) && g > 0) {
      if (g < glo) glo = g;
      if (g > ghi) ghi = g;
    }
  }
  // Linear region around 0: a tenth of the median spread, but never below 1e-6 of the extent.
  const extent = Math.max(Math.abs(lo), Math.abs(hi));
  spreads.sort((a, b) => a - b);
  const median = spreads.length ? spreads[Math.floor(spreads.length / 2)] : extent || 1;
  const linthresh = Math.max(median / 10, extent * 1e-6, 1e-30);
  return {
    act: symlog([lo, hi], [0, 100], linthresh),
    grad: glo <= ghi ? log([glo === ghi ? glo / 10 : glo, ghi], [6, 100]) : null,
  };
}

function pct(x: number): string {
  return `${Number.isFinite(x) ? x.toFixed(3) : 0}%`;
}

/** Hex "#rrggbb" → "rgba(r, g, b, a)"; other colour strings are returned unchanged. */
export function tint(color: string, alpha: number): string {
  const m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(color.trim());
  if (!m) return color;
  return `rgba(${parseInt(m[1], 16)}, ${parseInt(m[2], 16)}, ${parseInt(m[3], 16)}, ${alpha})`;
}

/** A safe CSS colour from the legend (anything odd falls back to grey). */
export function flagColor(legend: Legend, code: string): string {
  const c = legend[code]?.color ?? "";
  return /^(#[0-9a-f]{3,8}|rgba?\([0-9.,\s%]+\)|[a-z]+)$/i.test(c.trim()) ? c.trim() : "#888888";
}

/** Mirrors nbdebug.inspectors.report.UPDATE_SPLIT: an "update_ratio" flag above it is "too high". */
export const UPDATE_SPLIT = 1e-3;

/**
 * Flags as the views show them: "update_ratio" becomes "update_high" or "update_low" from the row's
 * ratio (two fixes, two chips), when the legend has those codes and the ratio is known.
 */
export function displayFlags(flags: string[], ratio: number, legend: Legend): string[] {
  if (!flags.includes("update_ratio") || !Number.isFinite(ratio) || !legend.update_high) return flags;
  const code = ratio > UPDATE_SPLIT ? "update_high" : "update_low";
  return flags.map((f) => (f === "update_ratio" ? code : f));
}

/** A flag chip: the legend's colour, its text black or white, whichever reads (WCAG AA). */
export function chip(legend: Legend, code: string): HTMLElement {
  const entry = legend[code] ?? {};
  const color = flagColor(legend, code);
  return h("span", {
    class: "nbd-chip",
    style: { "--nbd-chip": color, color: textOn(color) },
    text: entry.label || code,
    title: entry.description || code,
  });
}

function thermometerCell(stats: StatTable, i: number, x: Scale): HTMLElement {
  const mean = stats.get(i, "mean");
  const std = stats.get(i, "std");
  const min = stats.get(i, "min");
  const max = stats.get(i, "max");
  const track = h("div", { class: "nbd-track" });
  const z = x(0);
  track.appendChild(h("span", { class: "nbd-zero", style: { left: pct(z) } }));
  if (!Number.isNaN(min) && !Number.isNaN(max)) {
    const a = x.clamped(min);
    const b = x.clamped(max);
    track.appendChild(h("span", { class: "nbd-range", style: { left: pct(a), width: pct(Math.max(b - a, 0.3)) } }));
  }
  if (Number.isFinite(mean)) {
    if (Number.isFinite(std)) {
      const a = x.clamped(mean - std);
      const b = x.clamped(mean + std);
      track.appendChild(h("span", { class: "nbd-box", style: { left: pct(a), width: pct(b - a) } }));
    }
    track.appendChild(h("span", { class: "nbd-mean", style: { left: pct(x.clamped(mean)) } }));
  }
  const title = `mean ${fmt(mean)} ± std ${fmt(std)}\nmin ${fmt(min)} … max ${fmt(max)}`;
  return h("div", { class: "nbd-therm", title }, [track]);
}

function zeroCell(stats: StatTable, i: number, flagged: boolean): HTMLElement {
  const z = stats.get(i, "zero_frac");
  if (Number.isNaN(z)) return h("div", { class: "nbd-zero-frac nbd-empty", text: "—" });
  const near = stats.get(i, "near_zero_frac");
  const units = stats.get(i, "dead_unit_frac");
  const title = `exactly zero: ${fmtPct(z)}` + (Number.isNaN(near) ? "" : `\nnear zero: ${fmtPct(near)}`) +
    (Number.isFinite(units) ? `\nunits zero for every sample: ${fmtPct(units)}` : "");
  const fill = h("span", { style: { width: pct(Math.min(1, Math.max(0, z)) * 100) } });
  return h("div", { class: ["nbd-zero-frac nbd-num", flagged && "nbd-evidence"], title }, [h("span", { class: "nbd-mini" }, [fill]), fmtPct(z)]);
}

function badgeCell(stats: StatTable, i: number): HTMLElement {
  const cell = h("div", { class: "nbd-nonfinite" });
  const add = (col: string, label: string, cls: string) => {
    const n = stats.get(i, col);
    if (n > 0) cell.appendChild(h("span", { class: `nbd-badge ${cls}`, text: `${label} ${fmtInt(n)}`, title: `${col}: ${fmtInt(n)}` }));
  };
  add("nan", "NaN", "nbd-nan");
  add("inf", "Inf", "nbd-inf");
  add("grad_nan", "∇NaN", "nbd-nan nbd-grad");
  add("grad_inf", "∇Inf", "nbd-inf nbd-grad");
  return cell;
}

function gradCell(stats: StatTable, i: number, g: Scale | null, flagged: boolean): HTMLElement {
  const v = stats.get(i, "grad_norm");
  if (Number.isNaN(v) || !g) {
    return h("div", { class: ["nbd-grad nbd-empty", flagged && "nbd-evidence"], text: Number.isNaN(v) ? "—" : fmt(v), title: "no gradient of the loss at this output" });
  }
  const width = v > 0 ? g.clamped(v) : 0;
  const title = `‖∂L/∂out‖ ${fmt(v)}: the norm of the loss's gradient at this layer's output` +
    (Number.isNaN(stats.get(i, "grad_std")) ? "" : `, its std ${fmt(stats.get(i, "grad_std"))}`);
  return h("div", { class: ["nbd-grad nbd-num", flagged && "nbd-evidence"], title }, [
    h("span", { class: "nbd-gbar", style: { width: `${(width * 0.55).toFixed(2)}%` } }),
    fmt(v),
  ]);
}

/** Integer and bool outputs (masks, indices, argmax): shown with their dtype, never flagged dead. */
export function isCountDtype(dtype: string | undefined): boolean {
  return !!dtype && !/^(float|bfloat|complex)/.test(dtype);
}

/** One grid row for layer `i` (the cells behind its flags in bold: the evidence). */
export function buildRow(layer: Layer, i: number, stats: StatTable, scales: Scales, legend: Legend): HTMLElement {
  const flags = displayFlags(Array.isArray(layer.flags) ? layer.flags.map(String) : [], stats.get(i, "update_ratio"), legend);
  const has = (...codes: string[]) => codes.some((c) => flags.includes(c));
  const shape = Array.isArray(layer.shape) ? `[${layer.shape.join(", ")}]` : "";
  const nameCell = h("div", { class: "nbd-name", title: layer.module && layer.module !== layer.name ? `${layer.name}\nmodule ${layer.module}` : String(layer.name) }, [
    String(layer.name),
    (layer.calls ?? 1) > 1 ? h("span", { class: "nbd-calls", text: `×${layer.calls}` }) : null,
  ]);
  const row = h("div", { class: ["nbd-row", flags.length > 0 && "nbd-flagged"], data: { row: i }, attrs: { tabindex: 0 } }, [
    h("div", { class: "nbd-idx", text: i }),
    nameCell,
    h("div", { class: "nbd-type", text: layer.type ?? "", title: layer.type ?? "" }),
    h("div", { class: "nbd-shape", title: `${shape} ${layer.dtype ?? ""}`.trim() }, [
      shape,
      // integer/bool outputs (masks, indices) are counts, not activations: say so
      isCountDtype(layer.dtype) ? h("span", { class: "nbd-dtype", text: ` ${layer.dtype}` }) : null,
    ]),
    thermometerCell(stats, i, scales.act),
    zeroCell(stats, i, has("dead", "dead_units")),
    badgeCell(stats, i),
    gradCell(stats, i, scales.grad, has("exploding", "vanishing")),
    h("div", { class: "nbd-flags", title: flags.map((f) => legend[String(f)]?.label || String(f)).join(", ") }, flags.map((f) => chip(legend, String(f)))),
  ]);
  if (flags.length) {
    const c = flagColor(legend, String(flags[0]));
    row.style.setProperty("--nbd-flag", c);
    row.style.setProperty("--nbd-flag-bg", tint(c, 0.1));
  }
  return row;
}

/** Sort key of row `i` for column `col` ("" = execution order); strings sort as text. */
export function sortKey(layers: Layer[], stats: StatTable, i: number, col: string): number | string {
  const layer = layers[i];
  switch (col) {
    case "":
      return i;
    case "name":
      return String(layer.name);
    case "type":
      return String(layer.type ?? "");
    case "flags":
      return (layer.flags ?? []).length;
    case "shape":
      return (layer.shape ?? []).reduce((a, b) => a * b, 1);
    case "nonfinite":
      return (stats.get(i, "nan") || 0) + (stats.get(i, "inf") || 0);
    default:
      return stats.get(i, col);
  }
}

/**
 * Row indices ordered by `col` (NaN last in both directions, ties in execution order);
 * `col` "" is execution order whatever `desc` says.
 */
export function sortedOrder(layers: Layer[], stats: StatTable, col: string, desc: boolean): number[] {
  const idx = layers.map((_, i) => i);
  if (!col) return idx;
  const keys = idx.map((i) => sortKey(layers, stats, i, col));
  const dir = desc ? -1 : 1;
  idx.sort((a, b) => {
    const ka = keys[a];
    const kb = keys[b];
    const na = typeof ka === "number" && Number.isNaN(ka);
    const nb = typeof kb === "number" && Number.isNaN(kb);
    if (na || nb) return na === nb ? a - b : na ? 1 : -1;
    const c = typeof ka === "string" ? ka.localeCompare(String(kb)) : (ka as number) - (kb as number);
    return c !== 0 ? dir * c : a - b;
  });
  return idx;
}
