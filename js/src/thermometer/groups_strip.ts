// The grouped view's per-block pictures (split out of groups.ts): the heat strip across a group's
// blocks (one magma cell per block, scaled across the group), the block and group sparklines over the
// kept steps (cursor at the step the view shows), and the labels of the strip statistics.
import { cssColor } from "../lib/colormap";
import { fmt, h } from "../lib/dom";
import { sparkline } from "../lib/sparkline";
import type { GroupData } from "./groups_data";

/** Strip statistics drawn on a log scale (norms span decades). */
export const LOG = new Set(["absmax", "grad_norm", "residual"]);
export const LABELS: Record<string, string> = {
  severity: "worst flag",
  std: "mean std",
  absmax: "max |x|",
  grad_norm: "‖∇‖ of block",
  zero_frac: "zero fraction",
  nonfinite: "NaN/Inf count",
  residual: "residual stream norm",
};
export const label = (stat: string) => LABELS[stat] ?? stat;

/** Value → colour position in [0, 1] (null: no value). */
export type Scaler = (v: number) => number | null;

/** The strip statistic of group `g`: `stat`, or the first with values in this group (a nested
 * group has no residual stream: its strips show the mean std instead of empty cells). */
export function statFor(d: GroupData, g: number, stat: string): string {
  const has = (s: string) => d.groups[g].blocks.some((b) => Number.isFinite(d.stripValue(b, s)));
  if (has(stat)) return stat;
  return ["std", "absmax", "severity"].find(has) ?? stat;
}

/** The colour scale of `stat` across group `g`'s blocks (severity: fixed; others: min…max). */
export function makeScaler(d: GroupData, g: number, stat: string): Scaler {
  if (stat === "severity") return (v) => (Number.isFinite(v) ? 0.15 + (0.8 * Math.min(v, 3)) / 3 : null);
  const log = LOG.has(stat);
  const tf = (v: number) => (log ? (v > 0 ? Math.log10(v) : NaN) : v);
  const vals = d.groups[g].blocks.map((b) => tf(d.stripValue(b, stat))).filter(Number.isFinite);
  const lo = Math.min(...vals);
  const hi = Math.max(...vals);
  return (v) => {
    const x = tf(v);
    if (!Number.isFinite(x)) return null;
    return hi > lo ? 0.1 + (0.85 * (x - lo)) / (hi - lo) : 0.5;
  };
}

/** The strip of group `g`: one cell per block (data-block), its value in the title. */
export function stripEl(d: GroupData, g: number, stat: string, scale: Scaler): HTMLElement {
  const cells = d.groups[g].blocks.map((b, i) => {
    const v = d.stripValue(b, stat);
    const t = scale(v);
    const extra = stat === "residual" && d.residual?.group === g && d.growth.length ? ` (×${fmt(d.growth[i])} vs previous block)` : "";
    return h("span", {
      class: ["nbd-cell", t === null && "nbd-cell-nan", d.blocks[b].flags !== 0 && "nbd-cell-flagged"],
      style: t === null ? {} : { background: cssColor("magma", t) },
      data: { block: b },
      title: `${d.blocks[b].name}: ${label(stat)} ${fmt(v)}${extra}`,
    });
  });
  return h("span", { class: "nbd-strip", title: `${label(stat)} per block${d.at ? ` ${d.at}` : ""}` }, cells);
}

/** Over the kept steps: the largest value of `stat` over group `g`'s blocks (null: no series). */
export function groupSeries(d: GroupData, g: number, stat: string): Float32Array | null {
  let out: Float32Array | null = null;
  for (const b of d.groups[g].blocks) {
    const y = d.series(b, stat);
    if (!y) return null;
    if (!out) out = Float32Array.from(y, () => NaN);
    for (let k = 0; k < y.length; k++) if (!(y[k] <= out[k])) out[k] = Number.isNaN(y[k]) ? out[k] : y[k];
  }
  return out;
}

/** A sparkline of `y` over the blocks' kept steps, its cursor at the step the view shows. */
export function sparkEl(d: GroupData, y: Float32Array | null, what: string, stat: string): Element | null {
  if (!y) return null;
  const steps = d.histSteps;
  const title = `${what} over ${y.length} kept steps (${steps[0]}–${steps[steps.length - 1]})`;
  return sparkline(y, { width: 90, height: 16, log: LOG.has(stat), title, cls: "nbd-spark nbd-gspark", cursor: d.histCursor() });
}
