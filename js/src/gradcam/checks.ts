// --faithfulness and --sanity in the Grad-CAM view: the methods ranked with their four AUCs, the
// curves (one small SVG chart per metric, one line per method, the focused one drawn thicker), and
// the sanity table whose flagged methods "do not depend on the class decision". Text via textContent.
import { fmt, h, replaceChildren } from "../lib/dom";

const NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const TITLES: Record<string, string> = {
  deletion: "deletion (↓ better)", insertion: "insertion (↑ better)", road_morf: "ROAD, most relevant first (↓)", road_lerf: "ROAD, least relevant first (↑)",
};

export interface Faithfulness {
  ranking: string[];
  auc: Record<string, Record<string, number | null>>;
  target: number;
  target_name: string;
  lower_is_better: string[];
  images?: number;
  forwards?: number;
}

/** One method's place in the panel (nbdebug/inspectors/cam_verdict.py, CamRank): sanity before rank, ties share a rank. */
export interface CamRank {
  method: string;
  rank: number;
  tied: string[];
  failed: boolean | null;
  score: number;
  rho: number | null;
}

export interface SanityRow {
  method: string;
  rho: number | null;
  flagged: boolean;
  cascade: [string, number | null][];
}

/** A method's colour (stable: its index in the view's method list). */
export function colourOf(methods: string[], m: string): string {
  const i = Math.max(0, methods.indexOf(m));
  return PALETTE[i % PALETTE.length];
}

function svg(tag: string, attrs: Record<string, string | number>): SVGElement {
  const e = document.createElementNS(NS, tag) as SVGElement;
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

/** The points of one curve (fractions 0–1 → x, probability 0–`top` → y), NaN padding skipped. */
export function curvePoints(fr: ArrayLike<number>, ys: ArrayLike<number>, width: number, height: number, top: number): string {
  const pts: string[] = [];
  for (let i = 0; i < fr.length; i++) {
    if (!Number.isFinite(fr[i]) || !Number.isFinite(ys[i])) continue;
    const x = 2 + fr[i] * (width - 4);
    const y = height - 2 - (Math.min(ys[i], top) / (top || 1)) * (height - 4);
    pts.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  }
  return pts.join(" ");
}

/** One chart per metric: `curves` M×4×S (methods × metrics × points), `fractions` 4×S. */
export function curveCharts(methods: string[], metrics: string[], curves: Float32Array, fractions: Float32Array, focus: string,
                            all: string[]): HTMLElement {
  const s = fractions.length / metrics.length;
  let top = 0;
  for (const v of curves) if (Number.isFinite(v)) top = Math.max(top, v);
  top = top > 0 ? Math.min(1, top * 1.05) : 1;
  const charts = metrics.map((metric, j) => {
    const width = 180;
    const height = 90;
    const chart = svg("svg", { class: "nbd-curve", width, height, viewBox: `0 0 ${width} ${height}`, "data-metric": metric });
    chart.appendChild(svg("rect", { x: 0.5, y: 0.5, width: width - 1, height: height - 1, fill: "none", stroke: "#ccc" }));
    const fr = fractions.subarray(j * s, (j + 1) * s);
    methods.forEach((m, i) => {
      const ys = curves.subarray((i * metrics.length + j) * s, (i * metrics.length + j + 1) * s);
      const line = svg("polyline", { points: curvePoints(fr, ys, width, height, top), fill: "none", stroke: colourOf(all, m),
                                     "stroke-width": m === focus ? 2.5 : 1, "data-method": m, opacity: m === focus ? 1 : 0.7 });
      const title = document.createElementNS(NS, "title");
      title.textContent = m;
      line.appendChild(title);
      chart.appendChild(line);
    });
    return h("figure", { class: "nbd-chart" }, [chart, h("figcaption", { text: TITLES[metric] ?? metric })]);
  });
  return h("div", { class: "nbd-charts" }, [...charts, h("div", { class: "nbd-axis", text: `x: fraction of pixels perturbed; y: probability (0–${fmt(top, 2)})` })]);
}

/** An area with three fixed decimals ("n/a" for none). */
export function fixed3(v: number | null | undefined): string {
  return v === null || v === undefined || !Number.isFinite(v) ? "n/a" : v.toFixed(3);
}

/** The ranking table in the kernel's order (`ranks`: methods passing the sanity check first, greyed
 * after them those failing it; tied methods share a rank, written "2="), the four AUCs with three
 * decimals; a row click focuses its method. Without `ranks`: `f.ranking`, one rank each. */
export function rankTable(f: Faithfulness, metrics: string[], all: string[], focus: string, onPick: (m: string) => void,
                          ranks: CamRank[] = []): HTMLElement {
  const head = h("tr", {}, [h("th", { text: "#" }), h("th", { text: "method" }),
    ...metrics.map((k) => h("th", { text: `${k.replace("_", " ")} ${f.lower_is_better.includes(k) ? "↓" : "↑"}` }))]);
  const order: CamRank[] = ranks.length ? ranks
    : f.ranking.map((m, i) => ({ method: m, rank: i + 1, tied: [], failed: null, score: NaN, rho: null }));
  const rows = order.map((r) => {
    const m = r.method;
    const cls = [m === focus ? "nbd-focus" : "", r.failed ? "nbd-failed" : ""].filter(Boolean).join(" ");
    return h("tr", { class: cls, data: { method: m, rank: r.rank }, on: { click: () => onPick(m) } }, [
      h("td", { text: `${r.rank}${r.tied.length ? "=" : ""}`, title: r.tied.length ? `tied with ${r.tied.join(", ")}: the same pixel order` : "" }),
      h("td", {}, [h("span", { class: "nbd-swatch", style: { background: colourOf(all, m) } }), h("span", { text: m }),
        r.failed ? h("span", { class: "nbd-fail-tag", text: "fails sanity" }) : null]),
      ...metrics.map((k) => h("td", { class: "nbd-num", text: fixed3(f.auc[m]?.[k]) })),
    ]);
  });
  return h("table", { class: "nbd-rank" }, [head, ...rows]);
}

/** The sanity table: ρ per method with its cascade; flagged rows say why. */
export function sanityTable(rows: SanityRow[], threshold: number): HTMLElement {
  const body = rows.map((r) => h("tr", { class: r.flagged ? "nbd-flagged" : "", data: { method: r.method } }, [
    h("td", { text: r.method }),
    h("td", { text: r.rho === null ? "n/a" : r.rho.toFixed(2) }),
    h("td", { class: "nbd-cascade", text: r.cascade.map(([layer, rho]) => `${layer} ${rho === null ? "n/a" : rho.toFixed(2)}`).join(" → ") }),
    h("td", { class: "nbd-flag", text: r.flagged ? "does not depend on the class decision" : "" }),
  ]));
  return h("div", { class: "nbd-sanity" }, [
    h("div", { class: "nbd-caption", text: `sanity: Spearman ρ between each map and the map with the layers after the CAM layer re-initialised (from the output down); ρ ≥ ${threshold} is flagged` }),
    h("table", {}, [h("tr", {}, [h("th", { text: "method" }), h("th", { text: "ρ" }), h("th", { text: "cascade" }), h("th", { text: "" })]), ...body]),
  ]);
}

/** Fill `box` with the faithfulness panel (ranking, then curves once they arrived). */
export function faithPanel(box: HTMLElement, f: Faithfulness, metrics: string[], all: string[], focus: string, onPick: (m: string) => void,
                           curves: { methods: string[]; data: Float32Array; fractions: Float32Array } | null, ranks: CamRank[] = []): void {
  const sane = ranks.some((r) => r.failed !== null);
  replaceChildren(box, [
    h("div", { class: "nbd-caption", text: `faithfulness for ${f.target_name} (sample 0): area under each curve; ` +
      (sane ? "methods that pass the sanity check first, then best first (insertion − deletion + ROAD); = marks a tie (the same pixel order)"
        : "methods best first (insertion − deletion + ROAD); = marks a tie (the same pixel order)") }),
    rankTable(f, metrics, all, focus, onPick, ranks),
    curves ? curveCharts(curves.methods, metrics, curves.data, curves.fractions, focus, all) : h("div", { class: "nbd-info", text: "loading curves…" }),
  ]);
}
