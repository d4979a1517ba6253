// The detail panel of the selected layer: every statistic, plus a 32-bin histogram fetched on
// demand with rpc(model, "histogram", {row}) and drawn on <canvas class="nbdebug-histogram">.
import { fmt, fmtInt, h, replaceChildren } from "../lib/dom";
import { rpc, type AnyModel, type RpcAnswer } from "../lib/rpc";
import { Latest } from "../lib/request";
import type { StatTable } from "./rows";

export interface HistogramResult {
  name: string;
  min: number;
  max: number;
  total: number;
  sampled: number;
  exact: boolean;
  /** The kept steps the values were taken at (the row's first call): first … last of its bucket; 0 unknown. */
  first_step?: number;
  last_step?: number;
}

/** Where the histogram is shown: `at` the slider's position ("step 5", "whole run"; "" without a
 * history); `unavailable`: why no histogram exists (no request is sent, e.g. a rank of a run). */
export interface ShowAt {
  at?: string;
  unavailable?: string;
  /** The row's index in `stats` when it differs from its index in the run's table (a step's rows). */
  statRow?: number;
}

/** What the histogram note says: the values counted (exactly, or a sample of how many). */
export function histogramNote(result: HistogramResult): string {
  const total = Number(result.total);
  return result.exact ? `exact: all ${fmtInt(total)} values` : `sample of ${fmtInt(Number(result.sampled))} of ${fmtInt(total)} values`;
}

/** Which step the histogram's values are from, said against the slider's position `at` ("" without
 * a history): values are kept at the row's first call only, never implied to be another step's. */
export function histogramWhen(result: HistogramResult, at = ""): string {
  if (!at) return "";
  const a = Number(result.first_step) || 0;
  const b = Number(result.last_step) || a;
  const kept = a ? (a === b ? `step ${fmtInt(a)}` : `steps ${fmtInt(a)}–${fmtInt(b)}`) : "";
  if (kept && a === b && at === `step ${fmtInt(a)}`) return `histogram of step ${fmtInt(a)}'s values (the row's first call)`;
  const not = at === "whole run" ? "not the whole run's" : `not ${at}'s`;
  return `histogram of the values kept at ${kept || "the row's first call"}${kept ? " (the row's first call)" : ""}, ${not}: histograms are kept for the first call only`;
}

const CSS_W = 360;
const CSS_H = 120;

/** Draw `counts` as filled bars; returns false when the canvas has no 2D context. */
export function drawHistogram(canvas: HTMLCanvasElement, counts: ArrayLike<number>, edges: ArrayLike<number>, color: string): boolean {
  const dpr = Math.max(1, Math.min(3, (typeof window !== "undefined" && window.devicePixelRatio) || 1));
  canvas.width = Math.round(CSS_W * dpr);
  canvas.height = Math.round(CSS_H * dpr);
  const ctx = canvas.getContext("2d");
  if (!ctx) return false;
  const W = canvas.width;
  const H = canvas.height;
  ctx.clearRect(0, 0, W, H);
  let peak = 0;
  for (let i = 0; i < counts.length; i++) if (counts[i] > peak) peak = counts[i];
  const n = counts.length;
  if (n === 0 || peak <= 0) return true;
  const bw = W / n;
  ctx.fillStyle = color;
  for (let i = 0; i < n; i++) {
    const c = counts[i];
    if (!(c > 0)) continue;
    // Non-empty bins get at least 2 device pixels so rare values stay visible.
    const bh = Math.max(2, (c / peak) * (H - 2));
    ctx.fillRect(i * bw + 0.5, H - bh, Math.max(1, bw - 1), bh);
  }
  // Mark zero when it lies inside the edges.
  const lo = edges[0];
  const hi = edges[edges.length - 1];
  if (lo < 0 && hi > 0) {
    ctx.fillStyle = "rgba(127,127,127,0.8)";
    ctx.fillRect(Math.round(((0 - lo) / (hi - lo)) * W), 0, Math.max(1, Math.round(dpr)), H);
  }
  return true;
}

const SHOWN = ["mean", "std", "min", "max", "zero_frac", "near_zero_frac", "nan", "inf", "numel", "grad_norm", "grad_mean", "grad_std", "grad_min", "grad_max", "param_grad_norm"];

function statsTable(stats: StatTable, row: number, columns: string[]): HTMLElement {
  const cols = [...SHOWN.filter((c) => columns.includes(c)), ...columns.filter((c) => !SHOWN.includes(c))];
  const body = cols
    .filter((c) => !Number.isNaN(stats.get(row, c)))
    .map((c) => {
      const v = stats.get(row, c);
      const text = c === "numel" || c.endsWith("nan") || c.endsWith("inf") ? fmtInt(v) : fmt(v);
      return h("tr", {}, [h("td", { text: c }), h("td", { text, title: String(v) })]);
    });
  return h("table", { class: "nbd-stats" }, [h("tbody", {}, body)]);
}

/** Controls the detail panel; `show(row)` fetches and draws, ignoring answers to stale requests. */
export class DetailPanel {
  readonly el: HTMLElement;
  readonly latest = new Latest();
  // answers per row of the run's table: a histogram does not depend on the slider's step, so moving
  // the slider with a row selected sends no new request (cleared when the table's rows change)
  private cache = new Map<number, Promise<RpcAnswer<HistogramResult>>>();
  private source: unknown = undefined;

  constructor(private model: AnyModel, private accent: () => string) {
    this.el = h("div", { class: "nbd-detail" });
  }

  /** Forget cached answers when `source` (the run table's rows) is not the one they came from. */
  reset(source: unknown): void {
    if (source === this.source) return;
    this.source = source;
    this.cache.clear();
  }

  private fetch(row: number): Promise<RpcAnswer<HistogramResult>> {
    let p = this.cache.get(row);
    if (!p) {
      p = rpc<HistogramResult>(this.model, "histogram", { row });
      this.cache.set(row, p);
      p.catch(() => this.cache.get(row) === p && this.cache.delete(row));
    }
    return p;
  }

  clear(): void {
    this.latest.cancel();
    replaceChildren(this.el, []);
    this.el.removeAttribute("data-histogram");
  }

  async show(row: number, name: string, stats: StatTable, columns: string[], where: ShowAt = {}): Promise<void> {
    const isLatest = this.latest.start();
    const at = where.at ?? "";
    const canvas = h("canvas", { class: "nbdebug-histogram", attrs: { width: CSS_W, height: CSS_H } });
    const lo = h("span", { text: "" });
    const hi = h("span", { text: "" });
    const note = h("div", { class: "nbd-hist-note", text: "loading histogram…" });
    const when = h("div", { class: "nbd-hist-when", text: "" }); // which step the values are from
    const box = h("div", { class: "nbd-hist-box" }, [canvas, h("div", { class: "nbd-hist-axis" }, [lo, hi]), note, when]);
    replaceChildren(this.el, [
      h("div", { class: "nbd-detail-title" }, ["layer ", h("code", { text: name }), at ? ` at ${at}` : ""]),
      box,
      statsTable(stats, where.statRow ?? row, columns),
    ]);
    if (where.unavailable) {
      // nothing to fetch (a rank's table: histograms are not kept across processes): a quiet line
      canvas.style.display = "none";
      note.textContent = where.unavailable;
      this.el.setAttribute("data-histogram", "none");
      return;
    }
    this.el.setAttribute("data-histogram", "loading");
    try {
      const { result, arrays } = await this.fetch(row);
      if (!isLatest()) return;
      const counts = arrays.counts?.data;
      const edges = arrays.edges?.data;
      if (!counts || !edges) throw new Error("nbdebug: histogram answer lacks counts or edges");
      drawHistogram(canvas, counts, edges, this.accent());
      lo.textContent = fmt(result.min);
      hi.textContent = fmt(result.max);
      note.textContent = histogramNote(result);
      when.textContent = histogramWhen(result, at);
      this.el.setAttribute("data-histogram", "ready");
    } catch (err) {
      if (!isLatest()) return;
      const msg = err instanceof Error ? err.message : String(err);
      note.className = "nbd-error";
      note.textContent = `histogram failed: ${msg}`;
      this.el.setAttribute("data-histogram", "error");
      try {
        this.model.set("js_error", `histogram of ${name}: ${msg}`);
        this.model.save_changes();
      } catch {
        /* the model may be gone */
      }
    }
  }
}
