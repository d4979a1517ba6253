// The layers × heads grid of thumbnails. Sinks and near-uniform heads get a neutral grey mark;
// colour and, under the thumbnail, the reason (the headline's statistic: "prev 100%") only for the heads
// that stand out for this model; the other heads print the selected metric. "Outliers only" keeps
// the layers with such a head and leaves the other cells of those rows empty, so columns stay aligned.
import { paintU8 } from "../lib/colormap";
import { h, replaceChildren } from "../lib/dom";
import { flagAt, fmtMetric, LABELS, metricAt, type AttentionData } from "./data";
import type { Peek } from "./peek";

interface Cell {
  el: HTMLElement;
  val: HTMLElement;
}

export class HeadGrid {
  readonly el: HTMLElement;
  private cells = new Map<number, Cell>();

  constructor(
    private d: AttentionData,
    private peek: Peek,
    private pick: (l: number, hd: number, add: boolean) => void,
  ) {
    this.el = h("div", { class: "nba-grid", style: { "grid-template-columns": `auto repeat(${d.H}, 56px)` } });
  }

  draw(cmap: string, outliersOnly: boolean, metric: string, selected: [number, number][]): void {
    const { d } = this;
    replaceChildren(this.el, [h("div", { class: "nba-collabel", text: "" })]);
    for (let hd = 0; hd < d.H; hd++) this.el.appendChild(h("div", { class: "nba-collabel", text: `h${hd}` }));
    this.cells.clear();
    this.el.toggleAttribute("data-outliers-only", outliersOnly);
    for (let l = 0; l < d.L; l++) {
      const any = Array.from({ length: d.H }, (_, hd) => d.outliers.has(l * d.H + hd)).some(Boolean);
      if (outliersOnly && !any) continue;
      this.el.appendChild(h("div", { class: "nba-rowlabel", text: `L${l}` }));
      for (let hd = 0; hd < d.H; hd++) {
        if (outliersOnly && !d.outliers.has(l * d.H + hd)) {
          this.el.appendChild(h("div", { class: "nba-gap" }));
          continue;
        }
        this.el.appendChild(this.cell(l, hd, cmap));
      }
    }
    this.showValues(metric);
    this.markSelected(selected);
  }

  private cell(l: number, hd: number, cmap: string): HTMLElement {
    const { d } = this;
    const s = d.thumbs ? d.thumbs.shape[2] : 0;
    const f = flagAt(d, l, hd);
    const out = d.outliers.get(l * d.H + hd);
    const canvas = h("canvas", { attrs: { width: s, height: s } });
    const g = canvas.getContext("2d"); // null where canvases are unsupported: metrics still show
    if (d.thumbs && s > 0 && g) {
      const off = (l * d.H + hd) * s * s;
      paintU8((d.thumbs.data as Uint8Array).subarray(off, off + s * s), s, s, cmap, g);
    }
    const val = h("div", { class: "nba-val" });
    const lines = d.names.map((n) => `${LABELS[n] || n}: ${fmtMetric(n, metricAt(d, n, l, hd))}`);
    const marks = [f & 1 ? "sink on the first token (normal)" : "", f & 2 ? "sink on [SEP]/EOS (normal)" : "", f & 4 ? "near-uniform" : ""].filter(Boolean);
    const why = out ? `stands out: ${out.text}` : "";
    const el = h(
      "div",
      {
        class: ["nba-head", f & 3 ? "nba-sink" : "", f & 4 ? "nba-uniform" : "", out ? "nba-outlier" : ""],
        data: { layer: l, head: hd },
        title: [`layer ${l}, head ${hd}`, why, ...marks, ...lines].filter(Boolean).join("\n"),
        on: {
          click: (ev: MouseEvent) => this.pick(l, hd, ev.shiftKey || ev.ctrlKey || ev.metaKey),
          mouseenter: () => this.peek.show(l, hd, el, cmap, why),
          mouseleave: () => this.peek.hide(),
        },
      },
      [canvas, val],
    );
    canvas.addEventListener("mousemove", (ev: MouseEvent) => {
      const r = canvas.getBoundingClientRect();
      if (r.width > 0 && r.height > 0) this.peek.point((ev.clientX - r.left) / r.width, (ev.clientY - r.top) / r.height);
    });
    this.cells.set(l * d.H + hd, { el, val });
    return el;
  }

  /** Under each head: an outlined head's reason (the statistic the headline gives it, whatever the
   *  selected metric), any other head's value of the selected metric. */
  showValues(metric: string): void {
    const { d } = this;
    for (const [i, c] of this.cells) {
      const out = d.outliers.get(i);
      c.val.textContent = out?.short || fmtMetric(metric, metricAt(d, metric, Math.floor(i / d.H), i % d.H));
      if (out?.short) c.val.title = `stands out: ${out.text}`; // cut with an ellipsis when long: readable whole
      else c.val.removeAttribute("title");
      c.val.classList.toggle("nba-reason", Boolean(out?.short));
    }
  }

  markSelected(selected: [number, number][]): void {
    const sel = new Set(selected.map(([l, hd]) => l * this.d.H + hd));
    for (const [i, c] of this.cells) c.el.classList.toggle("nba-selected", sel.has(i));
  }
}
