// Next-token lists as the kernel sends them (`nbdebug.workbench.metric.top_tokens`: `{id, token, p}`),
// and their table rows: the token (model text: textContent only, its id in the tooltip) and its
// probability written as everywhere (`fmtPct`). The attention view's ablation, the patching view and
// the lens view's steering panel draw their tables with it.
import { fmtPct, h } from "./dom";

/** One entry of a top-k next-token list. */
export interface TopToken {
  id: number;
  token: string;
  p: number;
}

/** The answer token in one run: its probability and its rank (1 = the most likely). */
export interface AnswerToken extends TopToken {
  rank: number;
}

export interface TokenRowOptions {
  /** class of the probability cell */
  pClass?: string;
  /** class of the token cell */
  tokenClass?: string;
  /** class of a row, from its entry and index (e.g. a changed or the answer's row) */
  rowClass?: (t: TopToken, i: number) => string;
}

/** One `<tr>` per entry: the token (`#id` as its title) and its probability. */
export function tokenRows(tops: TopToken[], opts: TokenRowOptions = {}): HTMLElement[] {
  return tops.map((t, i) => h("tr", { class: opts.rowClass ? opts.rowClass(t, i) : "" }, [
    h("td", { class: opts.tokenClass ?? "", text: t.token, title: `#${t.id}` }),
    h("td", { class: opts.pClass ?? "", text: fmtPct(t.p) }),
  ]));
}
