// The grid itself: one DOM cell per patch (rows = sites, columns = positions or heads), coloured on
// the diverging scale with its effect written in it; the hover line gives the effect, the raw metric
// and the verified exact effect; a click calls `pick(row, col)`. Labels are model text: textContent.
import { fmt, h, replaceChildren } from "../lib/dom";
import { decode, type NdArray, type WireArray } from "../lib/ndarray";
import { cssOf, textFor } from "./colour";

/** Effects below this (in absolute value) are coloured but not printed (mirrors SHOWN in
 * nbdebug/inspectors/token_headlines.py): two thirds of a real grid's numbers are noise. */
export const SHOWN = 0.05;

/** The text of a cell: "=" where clean and corrupt are identical, the effect with two decimals where
 * |effect| ≥ SHOWN, else nothing. */
export function cellText(effect: number, same: boolean): string {
  if (same) return "=";
  return Number.isFinite(effect) && Math.abs(effect) >= SHOWN ? effect.toFixed(2) : "";
}

/** One grid as the kernel sends it (traits or the `grid` request's answer). */
export interface GridData {
  rows: string[];
  /** What each row is ("block 3 input"); the module name is its title. */
  rowLabels?: string[];
  columns: string[];
  sites: string;
  method: string;
  verified: [number, number, number][];
  notes: string[];
  effect: NdArray;
  raw: NdArray;
  identical: NdArray;
}

/** A GridData from the widget's traits. */
export function gridFromTraits(get: (name: string) => any): GridData {
  return {
    rows: get("rows") || [],
    rowLabels: get("row_labels") || [],
    columns: get("columns") || [],
    sites: get("sites") || "resid",
    method: get("method") || "exact",
    verified: get("verified") || [],
    notes: get("grid_notes") || [],
    effect: decode(get("effect") as WireArray),
    raw: decode(get("raw") as WireArray),
    identical: decode(get("identical") as WireArray),
  };
}

/** The longest dotted prefix every row name shares ("model.layers."), "" for one row. */
export function commonPrefix(names: string[]): string {
  if (names.length < 2) return "";
  let p = names[0];
  for (const n of names) while (!n.startsWith(p)) p = p.slice(0, -1);
  const cut = p.lastIndexOf(".");
  return cut >= 0 ? p.slice(0, cut + 1) : "";
}

export interface Metric {
  label: string;
  clean: number;
  corrupt: number;
}

export class GridView {
  readonly el = h("div", { class: "nbp-grid", attrs: { role: "grid" } });
  readonly tip = h("div", { class: "nbp-tip", attrs: { "aria-live": "polite" } });
  private data: GridData | null = null;
  private cells: HTMLElement[] = [];
  private selected = -1;
  /** The clicked cell's sentence, kept in the tip until the pointer moves to another cell. */
  private pinned: { index: number; text: string } | null = null;

  constructor(private metric: Metric, private pick: (row: number, col: number) => void) {
    this.el.addEventListener("mouseover", (ev) => this.hover(ev.target as HTMLElement));
    this.el.addEventListener("click", (ev) => {
      const cell = (ev.target as HTMLElement).closest?.(".nbp-cell") as HTMLElement | null;
      if (!cell || cell.classList.contains("nbp-same")) return;
      this.pick(Number(cell.dataset.row), Number(cell.dataset.col));
    });
  }

  /** Draw `d` (replaces the previous grid). */
  draw(d: GridData): void {
    this.data = d;
    const R = d.rows.length, C = d.columns.length;
    const named = (d.rowLabels?.length ?? 0) === R;
    const prefix = named ? "" : commonPrefix(d.rows);
    const verified = new Map(d.verified.map(([r, c, v]) => [r * C + c, v]));
    this.el.style.gridTemplateColumns = `auto repeat(${C}, minmax(40px, max-content))`;
    const kids: HTMLElement[] = [h("div", { class: "nbp-rowlabel", text: prefix, title: prefix })];
    for (const c of d.columns) kids.push(h("div", { class: "nbp-collabel", text: c, title: c }));
    this.cells = [];
    for (let r = 0; r < R; r++) {
      kids.push(h("div", { class: "nbp-rowlabel", text: named ? d.rowLabels![r] : d.rows[r].slice(prefix.length), title: d.rows[r] }));
      for (let c = 0; c < C; c++) {
        const i = r * C + c;
        const e = d.effect.data[i];
        const same = d.identical.data[i] !== 0;
        const cell = h("div", {
          class: ["nbp-cell", same && "nbp-same", verified.has(i) && "nbp-verified"],
          data: { row: r, col: c },
          attrs: { role: "gridcell" },
          style: { background: cssOf(e), color: textFor(e) },
          text: cellText(e, same),
          title: same ? "identical" : fmt(e, 3),
        });
        this.cells.push(cell);
        kids.push(cell);
      }
    }
    replaceChildren(this.el, kids);
    this.selected = -1;
    this.pinned = null;
    this.tip.textContent = "";
  }

  /** Say `text` of the clicked cell in the tip line (the one sentence about a cell on screen). */
  pin(row: number, col: number, text: string): void {
    const C = this.data?.columns.length ?? 0;
    this.pinned = { index: row * C + col, text };
    this.tip.textContent = text;
  }

  /** Mark the clicked cell. */
  select(row: number, col: number): void {
    const C = this.data?.columns.length ?? 0;
    this.cells[this.selected]?.classList.remove("nbp-selected");
    this.selected = row * C + col;
    this.cells[this.selected]?.classList.add("nbp-selected");
  }

  /** The hover sentence of cell (row, col). */
  describe(row: number, col: number): string {
    const d = this.data;
    if (!d) return "";
    const C = d.columns.length;
    const i = row * C + col;
    const where = `${d.rowLabels?.[row] ?? d.rows[row]} @ ${d.columns[col]}`;
    if (d.identical.data[i] !== 0) return `${where}: clean and corrupt activations are identical here (nothing to patch)`;
    const est = d.method === "attribution" ? "estimated " : "";
    const v = d.verified.find(([r, c]) => r === row && c === col);
    const exact = v ? `; verified exactly: ${fmt(v[2])}` : "";
    return `${where}: ${est}effect ${fmt(d.effect.data[i])} (${this.metric.label} = ${fmt(d.raw.data[i])}; clean ${fmt(this.metric.clean)}, corrupt ${fmt(this.metric.corrupt)})${exact}`;
  }

  private hover(target: HTMLElement): void {
    const cell = target.closest?.(".nbp-cell") as HTMLElement | null;
    if (!cell) return;
    const row = Number(cell.dataset.row), col = Number(cell.dataset.col);
    const C = this.data?.columns.length ?? 0;
    if (this.pinned && this.pinned.index === row * C + col) return; // the click's sentence stays
    this.pinned = null;
    const text = this.describe(row, col);
    this.tip.textContent = text;
    cell.title = text;
  }
}
