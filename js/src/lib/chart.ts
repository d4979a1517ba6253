// A line chart over training steps: one or more series (the loss of a run, of several runs), an
// optional min/max band (merged steps), vertical marks (incidents, events, a divergence), a cursor,
// a log-scale toggle and the values under the pointer. It fills the width it is given (the SVG
// stretches; strokes keep their width), so a narrow notebook clips nothing. Text is HTML (labels,
// readout) set with textContent; the SVG is built with createElementNS/setAttribute only.
//
//   const c = new Chart({ name: "loss", onPick: (step) => … });
//   c.update([{ label: "loss", steps, y }], { marks: [{ step: 41, cls: "nbd-mark-nan" }], cursor: 12 });

import { fmt, fmtInt, h, replaceChildren } from "./dom";

const NS = "http://www.w3.org/2000/svg";
/** Width of the chart's coordinate system (the SVG stretches it to the element's width). */
export const CHART_W = 600;

export interface ChartSeries {
  label: string;
  /** Kept steps, increasing. */
  steps: ArrayLike<number>;
  y: ArrayLike<number>;
  lo?: ArrayLike<number>;
  hi?: ArrayLike<number>;
  /** Class of the series' line (its colour). */
  cls?: string;
}

export interface ChartMark {
  step: number;
  cls: string;
  title?: string;
}

export interface ChartOptions {
  /** What the values are ("loss"): the readout says "loss 2.5 at step 4". */
  name: string;
  height?: number;
  /** Extra classes of the readout element. */
  readoutClass?: string;
  /** A click on the chart picks the step under the pointer. */
  onPick?: (step: number) => void;
}

export interface ChartView {
  marks?: ChartMark[];
  /** The step the rest of the view shows (a vertical line; the readout's default). */
  cursor?: number;
}

function svgEl(tag: string, attrs: Record<string, string | number>): SVGElement {
  const e = document.createElementNS(NS, tag) as SVGElement;
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

/** Index of the step in sorted `steps` nearest to `s` (-1 when empty). */
export function nearest(steps: ArrayLike<number>, s: number): number {
  const n = steps.length;
  if (!n) return -1;
  let a = 0;
  let b = n - 1;
  while (b - a > 1) {
    const m = (a + b) >> 1;
    if (steps[m] <= s) a = m;
    else b = m;
  }
  return Math.abs(steps[a] - s) <= Math.abs(steps[b] - s) ? a : b;
}

/** Per pixel column of `x(step)`: the last finite value and the band over the points falling in it. */
export function stepColumns(s: ChartSeries, x: (step: number) => number, t: (v: number) => number): { x: number; y: number; lo: number; hi: number }[] {
  const out: { x: number; y: number; lo: number; hi: number }[] = [];
  let cur: { x: number; y: number; lo: number; hi: number } | null = null;
  for (let i = 0; i < s.steps.length; i++) {
    const px = Math.round(x(s.steps[i]) * 2) / 2;
    if (!cur || cur.x !== px) {
      if (cur) out.push(cur);
      cur = { x: px, y: NaN, lo: Infinity, hi: -Infinity };
    }
    const v = t(s.y[i]);
    if (Number.isFinite(v)) cur.y = v;
    for (const w of [v, t(s.lo ? s.lo[i] : s.y[i]), t(s.hi ? s.hi[i] : s.y[i])]) {
      if (Number.isFinite(w)) {
        cur.lo = Math.min(cur.lo, w);
        cur.hi = Math.max(cur.hi, w);
      }
    }
  }
  if (cur) out.push(cur);
  return out;
}

export class Chart {
  readonly el: HTMLElement;
  private svg: SVGSVGElement;
  private top: HTMLElement;
  private bottom: HTMLElement;
  private first: HTMLElement;
  private last: HTMLElement;
  private readout: HTMLElement;
  private logBox: HTMLInputElement;
  private logLabel: HTMLElement;
  private height: number;
  private series: ChartSeries[] = [];
  private view: ChartView = {};
  private x0 = 0;
  private x1 = 1;
  private steps: number[] = [];
  /** Log10 y axis (positive values only). */
  log = false;

  constructor(private opts: ChartOptions) {
    this.height = opts.height ?? 80;
    this.svg = svgEl("svg", { viewBox: `0 0 ${CHART_W} ${this.height}`, preserveAspectRatio: "none", height: this.height, class: "nbd-chart-svg nbd-spark" }) as SVGSVGElement;
    this.svg.setAttribute("width", "100%");
    this.top = h("span", { class: "nbd-chart-ymax" });
    this.bottom = h("span", { class: "nbd-chart-ymin" });
    this.first = h("span", { class: "nbd-chart-x0" });
    this.last = h("span", { class: "nbd-chart-x1" });
    this.readout = h("span", { class: ["nbd-chart-readout", opts.readoutClass ?? ""] });
    this.logBox = h("input", { class: "nbd-chart-log", attrs: { type: "checkbox" } });
    this.logLabel = h("label", { class: "nbd-chart-log-label", title: "log10 of the values (values ≤ 0 are left out)" }, [this.logBox, "log scale"]);
    this.el = h("div", { class: "nbd-chart" }, [
      h("div", { class: "nbd-chart-plot" }, [h("div", { class: "nbd-chart-y" }, [this.top, this.bottom]), h("div", { class: "nbd-chart-area" }, [this.svg])]),
      h("div", { class: "nbd-chart-x" }, [this.first, this.last]),
      h("div", { class: "nbd-chart-foot" }, [this.readout, this.logLabel]),
    ]);
    this.svg.addEventListener("mousemove", this.onMove);
    this.svg.addEventListener("mouseleave", this.onLeave);
    this.svg.addEventListener("click", this.onClick);
    this.logBox.addEventListener("change", this.onLog);
  }

  private onLog = () => {
    this.log = this.logBox.checked;
    this.draw();
  };

  /** The step under a pointer event (NaN outside the data). */
  stepAt(ev: { clientX: number }): number {
    const r = this.svg.getBoundingClientRect();
    if (!(r.width > 0) || !this.steps.length) return NaN;
    const fx = ((ev.clientX - r.left) / r.width) * CHART_W;
    const s = this.x0 + ((fx - 2) / (CHART_W - 4)) * (this.x1 - this.x0);
    return this.steps[nearest(this.steps, s)];
  }

  private onMove = (ev: MouseEvent) => this.hover(this.stepAt(ev));
  private onLeave = () => this.hover(NaN);
  private onClick = (ev: MouseEvent) => {
    const s = this.stepAt(ev);
    if (Number.isFinite(s) && this.opts.onPick) this.opts.onPick(s);
  };

  /** Show the values at `step` (NaN: the cursor's, else the last step's) and a line there while hovering. */
  hover(step: number): void {
    this.svg.querySelector("line.nbd-chart-hover")?.remove();
    const at = Number.isFinite(step) ? step : this.view.cursor ?? this.steps[this.steps.length - 1];
    if (Number.isFinite(step)) {
      const x = this.x(step).toFixed(1);
      this.svg.appendChild(svgEl("line", { x1: x, x2: x, y1: 0, y2: this.height, class: "nbd-chart-hover" }));
    }
    this.readout.textContent = this.valuesAt(at);
    this.el.dataset.hover = Number.isFinite(step) ? String(step) : "";
  }

  /** The readout at `step`: "loss 2.5 at step 4", or "step 4: a 2.5 · b 2.7" for several series. */
  valuesAt(step: number | undefined): string {
    if (step === undefined || !Number.isFinite(step) || !this.series.length) return "";
    const value = (s: ChartSeries) => {
      const i = nearest(s.steps, step);
      return i >= 0 && s.steps[i] === step ? Number(s.y[i]) : NaN;
    };
    if (this.series.length === 1) return `${this.opts.name} ${fmt(value(this.series[0]), 4)} at step ${fmtInt(step)}`;
    return `step ${fmtInt(step)}: ` + this.series.map((s) => `${s.label} ${fmt(value(s), 4)}`).join(" · ");
  }

  private x(step: number): number {
    return this.x1 > this.x0 ? 2 + ((step - this.x0) / (this.x1 - this.x0)) * (CHART_W - 4) : CHART_W / 2;
  }

  update(series: ChartSeries[], view: ChartView = {}): void {
    this.series = series;
    this.view = view;
    const all = new Set<number>();
    for (const s of series) for (let i = 0; i < s.steps.length; i++) all.add(Number(s.steps[i]));
    this.steps = [...all].sort((a, b) => a - b);
    this.x0 = this.steps[0] ?? 0;
    this.x1 = this.steps[this.steps.length - 1] ?? 1;
    this.draw();
  }

  private draw(): void {
    const H = this.height;
    const t = (v: number) => (this.log ? (v > 0 ? Math.log10(v) : NaN) : Number(v));
    const cols = this.series.map((s) => stepColumns(s, (st) => this.x(st), t));
    let lo = Infinity;
    let hi = -Infinity;
    for (const cs of cols) for (const c of cs) if (c.lo <= c.hi) [lo, hi] = [Math.min(lo, c.lo), Math.max(hi, c.hi)];
    const y = (v: number) => (hi > lo ? H - 3 - ((v - lo) / (hi - lo)) * (H - 6) : H / 2);
    const kids: SVGElement[] = [];
    cols.forEach((cs, k) => {
      const cls = this.series[k].cls ?? "";
      let band = "";
      let line = "";
      let pen = false;
      for (const c of cs) {
        if (c.lo < c.hi) band += `M${c.x} ${y(c.hi).toFixed(1)}V${y(c.lo).toFixed(1)}`;
        if (!Number.isFinite(c.y)) {
          pen = false;
          continue;
        }
        line += `${pen ? "L" : "M"}${c.x} ${y(c.y).toFixed(1)}`;
        pen = true;
      }
      if (band) kids.push(svgEl("path", { d: band, class: `nbd-spark-band nbd-chart-band ${cls}`, "vector-effect": "non-scaling-stroke" }));
      if (line) kids.push(svgEl("path", { d: line, class: `nbd-spark-line nbd-chart-line ${cls}`, "vector-effect": "non-scaling-stroke" }));
    });
    for (const m of this.view.marks ?? []) {
      if (!(m.step >= this.x0 && m.step <= this.x1)) continue;
      const x = this.x(m.step).toFixed(1);
      const mark = svgEl("line", { x1: x, x2: x, y1: 0, y2: H, class: `nbd-spark-mark nbd-chart-mark ${m.cls}`, "vector-effect": "non-scaling-stroke", "data-step": m.step });
      if (m.title) {
        const tt = svgEl("title", {});
        tt.textContent = m.title;
        mark.appendChild(tt);
      }
      kids.push(mark);
    }
    if (this.view.cursor !== undefined && Number.isFinite(this.view.cursor)) {
      const x = this.x(this.view.cursor).toFixed(1);
      kids.push(svgEl("line", { x1: x, x2: x, y1: 0, y2: H, class: "nbd-spark-cursor", "vector-effect": "non-scaling-stroke" }));
    }
    replaceChildren(this.svg, kids);
    this.svg.setAttribute("data-scale", this.log ? "log" : "linear");
    const label = (v: number) => (this.log ? fmt(Math.pow(10, v)) : fmt(v));
    this.top.textContent = hi >= lo ? label(hi) : "";
    this.bottom.textContent = hi >= lo ? label(lo) : "";
    this.first.textContent = this.steps.length ? `step ${fmtInt(this.x0)}` : "";
    this.last.textContent = this.steps.length > 1 ? `step ${fmtInt(this.x1)}` : "";
    this.logBox.checked = this.log;
    this.hover(Number(this.el.dataset.hover || NaN));
  }

  destroy(): void {
    this.svg.removeEventListener("mousemove", this.onMove);
    this.svg.removeEventListener("mouseleave", this.onLeave);
    this.svg.removeEventListener("click", this.onClick);
    this.logBox.removeEventListener("change", this.onLog);
  }
}

/** The chart's styles (scoped under `scope`, e.g. ".nbdebug-thermometer"). */
export function chartCss(scope: string): string {
  return `
${scope} .nbd-chart { width: 100%; min-width: 0; }
${scope} .nbd-chart-plot { display: flex; align-items: stretch; gap: 4px; }
${scope} .nbd-chart-y { display: flex; flex-direction: column; justify-content: space-between; font-size: 0.85em; text-align: right; min-width: 3.2em; font-variant-numeric: tabular-nums; }
${scope} .nbd-chart-area { flex: 1 1 auto; min-width: 0; }
${scope} svg.nbd-chart-svg { display: block; width: 100%; border-bottom: 1px solid var(--nbd-border, rgba(127,127,127,0.3)); cursor: crosshair; overflow: hidden; }
${scope} .nbd-chart-x { display: flex; justify-content: space-between; font-size: 0.85em; margin-left: calc(3.2em + 4px); }
${scope} .nbd-chart-foot { display: flex; flex-wrap: wrap; justify-content: space-between; gap: 2px 12px; font-size: 0.88em; font-variant-numeric: tabular-nums; }
${scope} .nbd-chart-readout { overflow-wrap: anywhere; }
${scope} .nbd-chart-log-label { display: inline-flex; gap: 4px; align-items: center; cursor: pointer; }
${scope} .nbd-chart-hover { stroke: currentColor; stroke-opacity: 0.6; stroke-dasharray: 3 2; }
${scope} .nbd-chart-mark.nbd-mark-spike { stroke: #e6550d; }
${scope} .nbd-chart-mark.nbd-mark-event { stroke: #6a51a3; stroke-dasharray: 2 2; }
${scope} .nbd-chart-mark.nbd-mark-root { stroke: #b30000; stroke-width: 2; }
${scope} .nbd-chart-mark.nbd-mark-diverge { stroke: #b30000; stroke-width: 1.5; stroke-dasharray: 4 2; }
`;
}
