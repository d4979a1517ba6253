// Hovering a head's thumbnail opens a larger copy with token labels on both axes (rows: queries,
// columns: keys); moving over the thumbnail names the query → key pair under the pointer. The
// thumbnail is mean-pooled into s × s bins of the T tokens (adaptive pooling: bin i covers tokens
// floor(i·T/s) … ceil((i+1)·T/s) − 1), so above s tokens a label names a bin's first token.
import { paintU8 } from "../lib/colormap";
import { h, replaceChildren } from "../lib/dom";
import { tokenAt, type AttentionData } from "./data";

const SIDE = 160; // CSS pixels of the enlarged thumbnail
const LABEL_PX = 12; // at least this far apart

export class Peek {
  readonly el = h("div", { class: "nba-peek", style: { display: "none" }, attrs: { "aria-hidden": "true" } });
  private at = h("div", { class: "nba-peek-at" });
  private s: number;

  constructor(private d: AttentionData, private root: HTMLElement) {
    this.s = d.thumbs ? d.thumbs.shape[2] : 0;
  }

  /** Tokens `[a, b)` pooled into bin `i` of the thumbnail. */
  bin(i: number): [number, number] {
    const { T } = this.d;
    const s = this.s;
    return [Math.floor((i * T) / s), Math.max(Math.floor((i * T) / s) + 1, Math.ceil(((i + 1) * T) / s))];
  }

  private binLabel(i: number): string {
    const [a, b] = this.bin(i);
    return b - a > 1 ? `${tokenAt(this.d, a)} … [${b - 1}]` : tokenAt(this.d, a);
  }

  show(l: number, hd: number, cell: HTMLElement, cmap: string, why: string): void {
    const { d, s } = this;
    if (!d.thumbs || s === 0) return;
    const canvas = h("canvas", { class: "nba-peek-map", attrs: { width: s, height: s }, style: { width: `${SIDE}px`, height: `${SIDE}px` } });
    const g = canvas.getContext("2d");
    const off = (l * d.H + hd) * s * s;
    if (g) paintU8((d.thumbs.data as Uint8Array).subarray(off, off + s * s), s, s, cmap, g);
    const step = Math.max(1, Math.ceil(s / Math.floor(SIDE / LABEL_PX)));
    const ys: HTMLElement[] = [];
    const xs: HTMLElement[] = [];
    for (let i = 0; i < s; i += step) {
      const pos = ((i + 0.5) * SIDE) / s;
      const text = this.binLabel(i);
      ys.push(h("span", { class: "nba-peek-y", text, title: text, style: { top: `${pos}px` } }));
      xs.push(h("span", { class: "nba-peek-x", text, title: text, style: { left: `${pos}px` } }));
    }
    this.at.textContent = "";
    replaceChildren(this.el, [
      h("div", { class: "nba-peek-title", text: `L${l}H${hd} · rows: queries · columns: keys` }),
      why ? h("div", { class: "nba-peek-why", text: why }) : null,
      h("div", { class: "nba-peek-body" }, [
        h("div", { class: "nba-peek-ylabels", style: { height: `${SIDE}px` } }, ys),
        canvas,
        h("div", { class: "nba-peek-corner" }),
        h("div", { class: "nba-peek-xlabels", style: { width: `${SIDE}px` } }, xs),
      ]),
      this.at,
    ]);
    this.el.style.display = "block";
    // beside the cell, inside the widget (never past its right edge: narrow notebooks)
    const box = this.root.getBoundingClientRect();
    const r = cell.getBoundingClientRect();
    const w = this.el.offsetWidth || 320;
    let left = r.right - box.left + 6;
    if (left + w > this.root.clientWidth) left = r.left - box.left - w - 6;
    this.el.style.left = `${Math.max(0, Math.min(left, this.root.clientWidth - w))}px`;
    this.el.style.top = `${Math.max(0, r.top - box.top)}px`;
  }

  /** The query → key pair under the pointer at fractions (fx, fy) of the thumbnail. */
  point(fx: number, fy: number): void {
    const s = this.s;
    if (!s) return;
    const j = Math.min(s - 1, Math.max(0, Math.floor(fx * s)));
    const i = Math.min(s - 1, Math.max(0, Math.floor(fy * s)));
    this.at.textContent = `${this.binLabel(i)} → ${this.binLabel(j)}`;
  }

  hide(): void {
    this.el.style.display = "none";
  }
}
