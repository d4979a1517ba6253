// The next-token tables: the clean and corrupt runs' top-5 (known up front) and the clicked patched
// run's (fetched from the kernel), then the three runs' logit-lens columns (lens.ts). Tokens are model text: textContent only.
import { fmt, fmtPct, h, replaceChildren } from "../lib/dom";
import { tokenRows, type AnswerToken, type TopToken } from "../lib/tokens";
import { lensTable, type LensColumns } from "./lens";

/** One titled table of next tokens, the answer's row bold when it is among them, and a last row with
 * the answer's p and rank ("answer ␣Paris 3% · rank 7") in every table. */
export function topTable(title: string, tops: TopToken[], cls = "", answer: AnswerToken | null = null): HTMLElement {
  const rows = tokenRows(tops, { pClass: "nbp-p", rowClass: (t) => (answer && t.id === answer.id ? "nbp-is-answer" : "") });
  if (answer) {
    rows.push(h("tr", { class: "nbp-answer", data: { rank: answer.rank } }, [
      h("td", { text: `answer ${answer.token}`, title: `#${answer.id}` }),
      h("td", { class: "nbp-p", text: `${fmtPct(answer.p)} · rank ${answer.rank}` })]));
  }
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
  patched: TopToken[];
  clean: TopToken[];
  corrupt: TopToken[];
  lens?: LensColumns;
  answer?: { clean: AnswerToken | null; corrupt: AnswerToken | null; patched: AnswerToken | null };
}

/** The panel under the grid: clean | corrupt | patched (once a cell was clicked). */
export class Tops {
  readonly el = h("div", { class: "nbp-tops" });

  constructor(private clean: TopToken[], private corrupt: TopToken[], private answers: { clean: AnswerToken | null; corrupt: AnswerToken | null } =
    { clean: null, corrupt: null }) {
    this.show(null, "");
  }

  show(answer: CellAnswer | null, label: string): void {
    const parts = [topTable("clean run", this.clean, "", this.answers.clean), topTable("corrupt run", this.corrupt, "", this.answers.corrupt)];
    if (answer) {
      const title = `patched: ${label} (effect ${Number.isFinite(answer.effect) ? answer.effect.toFixed(2) : "n/a"})`;
      parts.push(topTable(title, answer.patched, "nbp-patched", answer.answer?.patched ?? null));
      if (answer.lens) parts.push(lensTable(answer.lens, label));
    }
    replaceChildren(this.el, parts);
  }
}
