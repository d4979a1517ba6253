// The next-token tables: the clean and corrupt runs' top-5 (known up front) and the clicked patched
// run's (fetched from the kernel), then the three runs' logit-lens columns (lens.ts). Tokens are model text: textContent only.
import { fmt, fmtPct, h, replaceChildren } from "../lib/dom";
import { lensTable, type LensColumns } from "./lens";

export interface Top {
  id: number;
  token: string;
  p: number;
}

/** The answer token in one run: its probability and rank (1 = the most likely). */
export interface AnswerEntry extends Top {
  rank: number;
}

/** One titled table of next tokens, the answer's row bold when it is among them, and a last row with
 * the answer's p and rank ("answer ␣Paris 3% · rank 7") in every table. */
export function topTable(title: string, tops: Top[], cls = "", answer: AnswerEntry | null = null): HTMLElement {
  const rows = tops.map((t) => h("tr", { class: answer && t.id === answer.id ? "nbp-is-answer" : "" },
    [h("td", { text: t.token, title: `#${t.id}` }), h("td", { class: "nbp-p", text: fmtPct(t.p) })]));
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
  patched: Top[];
  clean: Top[];
  corrupt: Top[];
  lens?: LensColumns;
  answer?: { clean: AnswerEntry | null; corrupt: AnswerEntry | null; patched: AnswerEntry | null };
}

/** The panel under the grid: clean | corrupt | patched (once a cell was clicked). */
export class Tops {
  readonly el = h("div", { class: "nbp-tops" });

  constructor(private clean: Top[], private corrupt: Top[], private answers: { clean: AnswerEntry | null; corrupt: AnswerEntry | null } =
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
