// The next-token tables: the clean and corrupt runs' top-5 (known up front) and the clicked patched
// run's (fetched from the kernel), then the three runs' logit-lens columns (lens.ts). Tokens are model text: textContent only.
import { fmt, fmtPct, h, replaceChildren } from "../lib/dom";
import { lensTable, type LensColumns } from "./lens";

export interface Top {
  id: number;
  token: string;
  p: number;
}

/** One titled table of next tokens. */
export function topTable(title: string, tops: Top[], cls = ""): HTMLElement {
  const rows = tops.map((t) => h("tr", {}, [h("td", { text: t.token, title: `#${t.id}` }), h("td", { class: "nbp-p", text: fmtPct(t.p) })]));
  return h("div", { class: ["nbp-top", cls] }, [h("h4", { text: title }), h("table", {}, [h("tbody", {}, rows)])]);
}

export interface CellAnswer {
  row: number;
  col: number;
  site: string;
  positions: number[];
  identical: boolean;
  metric: number;
  effect: number;
  patched: Top[];
  clean: Top[];
  corrupt: Top[];
  lens?: LensColumns;
}

/** The panel under the grid: clean | corrupt | patched (once a cell was clicked). */
export class Tops {
  readonly el = h("div", { class: "nbp-tops" });

  constructor(private clean: Top[], private corrupt: Top[]) {
    this.show(null, "");
  }

  show(answer: CellAnswer | null, label: string): void {
    const parts = [topTable("clean run", this.clean), topTable("corrupt run", this.corrupt)];
    if (answer) {
      const title = `patched: ${label} (effect ${fmt(answer.effect)})`;
      parts.push(topTable(title, answer.patched, "nbp-patched"));
      if (answer.lens) parts.push(lensTable(answer.lens, label));
    }
    replaceChildren(this.el, parts);
  }
}
