// Small SVG line charts: a series over evenly spaced slots, an optional min/max band (decimated
// buckets, or several slots per pixel), vertical marks (first NaN, skipped steps) and a cursor.
// Built with createElementNS/setAttribute only; tooltips are <title> text nodes.
//
//   svg = sparkline(y, { width: 90, height: 18, lo, hi, marks: [{ at: 41, cls: "nan" }], cursor: 12 })

const NS = "http://www.w3.org/2000/svg";

export interface Mark {
  /** Slot index. */
  at: number;
  /** Class added to the mark's line (e.g. "nbd-mark-nan"). */
  cls: string;
  title?: string;
}

export interface SparkOptions {
  width: number;
  height: number;
  lo?: ArrayLike<number>;
  hi?: ArrayLike<number>;
  /** Log10 scale (positive values only; others are gaps). */
  log?: boolean;
  marks?: Mark[];
  /** Slot index of the cursor (the step the table shows), or undefined. */
  cursor?: number;
  cls?: string;
  title?: string;
}

function el(tag: string, attrs: Record<string, string | number>): SVGElement {
  const e = document.createElementNS(NS, tag) as SVGElement;
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

/** x position (px) of slot `i` of `n` in a chart `width` wide. */
export function slotX(i: number, n: number, width: number): number {
  return n <= 1 ? width / 2 : (i / (n - 1)) * (width - 2) + 1;
}

/**
 * Columns of the chart: for each pixel column, the last finite value and the band (min of lo,
 * max of hi over the slots falling in it). Non-finite values are gaps.
 */
export function columns(
  y: ArrayLike<number>,
  width: number,
  lo?: ArrayLike<number>,
  hi?: ArrayLike<number>,
  log = false,
): { x: number; y: number; lo: number; hi: number }[] {
  const n = y.length;
  const t = (v: number) => (log ? (v > 0 ? Math.log10(v) : NaN) : v);
  const out: { x: number; y: number; lo: number; hi: number }[] = [];
  let cur: { x: number; y: number; lo: number; hi: number } | null = null;
  for (let i = 0; i < n; i++) {
    const x = Math.round(slotX(i, n, width));
    const v = t(y[i]);
    const a = t(lo ? lo[i] : y[i]);
    const b = t(hi ? hi[i] : y[i]);
    if (!cur || cur.x !== x) {
      if (cur) out.push(cur);
      cur = { x, y: NaN, lo: Infinity, hi: -Infinity };
    }
    if (Number.isFinite(v)) cur.y = v;
    for (const w of [v, a, b]) {
      if (Number.isFinite(w)) {
        if (w < cur.lo) cur.lo = w;
        if (w > cur.hi) cur.hi = w;
      }
    }
  }
  if (cur) out.push(cur);
  return out.map((c) => (c.lo > c.hi ? { ...c, lo: NaN, hi: NaN } : c));
}

/** The chart as an <svg> element. */
export function sparkline(y: ArrayLike<number>, opts: SparkOptions): SVGSVGElement {
  const { width: W, height: H } = opts;
  const svg = el("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: opts.cls ?? "nbd-spark" }) as SVGSVGElement;
  if (opts.title) {
    const t = el("title", {});
    t.textContent = opts.title;
    svg.appendChild(t);
  }
  const n = y.length;
  const cols = columns(y, W, opts.lo, opts.hi, opts.log);
  let vmin = Infinity;
  let vmax = -Infinity;
  for (const c of cols) {
    if (Number.isFinite(c.lo)) vmin = Math.min(vmin, c.lo);
    if (Number.isFinite(c.hi)) vmax = Math.max(vmax, c.hi);
  }
  const pad = 1.5;
  const sy = (v: number) =>
    vmax > vmin ? H - pad - ((v - vmin) / (vmax - vmin)) * (H - 2 * pad) : H / 2;
  // Band: one vertical segment per column where the bucket spans more than its last value.
  let band = "";
  for (const c of cols) {
    if (Number.isFinite(c.lo) && c.hi > c.lo) band += `M${c.x} ${sy(c.hi).toFixed(1)}V${sy(c.lo).toFixed(1)}`;
  }
  if (band) svg.appendChild(el("path", { d: band, class: "nbd-spark-band" }));
  let line = "";
  let pen = false;
  for (const c of cols) {
    if (!Number.isFinite(c.y)) {
      pen = false;
      continue;
    }
    line += `${pen ? "L" : "M"}${c.x} ${sy(c.y).toFixed(1)}`;
    pen = true;
  }
  if (line) svg.appendChild(el("path", { d: line, class: "nbd-spark-line" }));
  for (const m of opts.marks ?? []) {
    if (!(m.at >= 0 && m.at < n)) continue;
    const x = slotX(m.at, n, W).toFixed(1);
    const mark = el("line", { x1: x, x2: x, y1: 0, y2: H, class: `nbd-spark-mark ${m.cls}` });
    if (m.title) {
      const t = el("title", {});
      t.textContent = m.title;
      mark.appendChild(t);
    }
    svg.appendChild(mark);
  }
  if (opts.cursor !== undefined && opts.cursor >= 0 && opts.cursor < n) {
    const x = slotX(opts.cursor, n, W).toFixed(1);
    svg.appendChild(el("line", { x1: x, x2: x, y1: 0, y2: H, class: "nbd-spark-cursor" }));
  }
  return svg;
}
