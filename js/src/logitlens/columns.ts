// The lens columns the browser holds (the last position arrives with the widget, the others are
// fetched), the metric of a cell, its position on the colour scale, and the colour bar's ticks.
import { fmt, fmtPct } from "../lib/dom";
import type { NdArray } from "../lib/ndarray";
import type { Tick } from "../lib/legend";

export const METRIC_LABELS: Record<string, string> = {
  top1_prob: "top-1 probability",
  entropy: "entropy (nats)",
  target_prob: "target probability",
  target_rank: "target rank",
  kl: "KL(final ‖ layer) (nats)",
};

export interface Column {
  ids: Int32Array; // R*k
  probs: Float32Array;
  entropy: Float32Array; // R
  kl: Float32Array;
  tprob: Float32Array;
  trank: Int32Array;
}

export class Columns {
  private cols = new Map<number, Column>();

  constructor(readonly R: number, readonly k: number) {}

  get(pos: number): Column | undefined {
    return this.cols.get(pos);
  }

  has(pos: number): boolean {
    return this.cols.has(pos);
  }

  /** Show `other`'s columns from now on (shared: what is stored there later appears here too). */
  adopt(other: Columns): void {
    this.cols = other.cols;
  }

  /** Arrays `(R, P, ...)` of `positions` (rpc "columns" or the initial trait) split per position. */
  store(positions: number[], arrays: Record<string, NdArray>): void {
    const { R, k } = this;
    const P = positions.length;
    positions.forEach((pos, j) => {
      const at = (a: NdArray, width: number) => {
        const out = new (a.data.constructor as any)(R * width);
        for (let r = 0; r < R; r++) out.set(a.data.subarray((r * P + j) * width, (r * P + j + 1) * width), r * width);
        return out;
      };
      this.cols.set(pos, {
        ids: at(arrays.top_ids, k),
        probs: at(arrays.top_probs, k),
        entropy: at(arrays.entropy, 1),
        kl: at(arrays.kl, 1),
        tprob: at(arrays.target_prob, 1),
        trank: at(arrays.target_rank, 1),
      });
    });
  }
}

export function value(metric: string, c: Column, r: number, k: number): number {
  switch (metric) {
    case "entropy": return c.entropy[r];
    case "kl": return c.kl[r];
    case "target_prob": return c.tprob[r];
    case "target_rank": return c.trank[r];
    default: return c.probs[r * k];
  }
}

export function fmtValue(metric: string, v: number): string {
  if (metric === "target_rank") return v < 0 ? "–" : `#${v + 1}`;
  if (metric === "top1_prob" || metric === "target_prob") return fmtPct(v);
  return fmt(v);
}

/** Where a value sits on the colour scale, [0, 1], and the colour bar's ticks for that scale. */
export interface ColourScale {
  t: (v: number) => number;
  ticks: Tick[];
}

/** Probabilities as they are; entropy/KL over the visible maximum; rank on a log scale (#1 brightest). */
export function colourScale(metric: string, cols: Columns, positions: number[], r0: number, r1: number): ColourScale {
  if (metric === "top1_prob" || metric === "target_prob")
    return { t: (v) => v, ticks: [0, 0.5, 1].map((at) => ({ at, text: fmtPct(at) })) };
  if (metric === "target_rank")
    return {
      t: (v) => (v < 0 ? NaN : 1 - Math.min(1, Math.log10(1 + v) / 4)),
      ticks: [{ at: 0, text: "≥ #10k" }, { at: 0.25, text: "#1k" }, { at: 0.5, text: "#100" }, { at: 0.75, text: "#10" }, { at: 1, text: "#1" }],
    };
  let mx = 1e-9;
  for (const p of positions) {
    const c = cols.get(p);
    if (!c) continue;
    for (let r = r0; r <= r1; r++) {
      const v = value(metric, c, r, cols.k);
      if (Number.isFinite(v)) mx = Math.max(mx, v);
    }
  }
  return { t: (v) => v / mx, ticks: [0, 0.5, 1].map((at) => ({ at, text: fmt(at * mx) })) };
}
