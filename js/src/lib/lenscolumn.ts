// THE lens column as the kernel sends it (nbdebug.sessions.lens.LensEntry: per row its name, the top-1
// token with its id and probability, and p(answer), -1 without one) and its one table: a row per block,
// a "top-1 | p(answer)" pair of cells per run. The patching view (clean, corrupt, patched; final block on
// top) and the attention view's ablation (clean, ablated; embeddings on top, rows whose top-1 changed
// marked) draw it here. Tokens and row names are model text: textContent only.
import { fmtPct, h } from "./dom";

export interface LensEntry {
  row: string;
  id: number;
  token: string;
  p: number;
  p_answer: number; // -1: no answer token
}

/** One run's column: its name (classes, the "<name> top-1" header) and its rows. */
export interface LensRun {
  name: string;
  entries: LensEntry[] | undefined;
}

export interface LensTableOptions {
  /** class prefix of the view: `${prefix}-lens-row` (row name), `${prefix}-lens-tok` and `${prefix}-lens-<run>`
   *  (top-1 token), `${prefix}-p` (p(answer)), `${prefix}-changed` (a row whose top-1 differs between runs) */
  prefix: string;
  /** the first header cell ("block") */
  rowHeader: string;
  /** what p_answer is the probability of ("answer", a token) */
  answer: string;
  /** the last row first (the lens view's order) */
  finalFirst?: boolean;
  /** mark the rows where the first two runs' top-1 tokens differ */
  markChanged?: boolean;
  /** a row name's tooltip (its index, the number of rows) */
  rowTitle?: (row: string, i: number, n: number) => string;
  /** the table's own classes */
  cls?: string | string[];
}

function cells(e: LensEntry | undefined, run: string, prefix: string): HTMLElement[] {
  if (!e) return [h("td", { text: "" }), h("td", { text: "" })];
  return [
    h("td", { class: [`${prefix}-lens-tok`, `${prefix}-lens-${run}`], text: e.token, title: `${e.token} (#${e.id}) p=${fmtPct(e.p)}` }),
    h("td", { class: `${prefix}-p`, text: e.p_answer >= 0 ? fmtPct(e.p_answer) : "–" }),
  ];
}

/** The runs' lens columns as one table: a header row, then a row per block (`data-row`: its index). */
export function lensColumnTable(runs: LensRun[], o: LensTableOptions): HTMLElement {
  const cols = runs.map((r) => r.entries ?? []);
  const n = Math.max(0, ...cols.map((c) => c.length));
  const head = h("tr", {}, [h("th", { text: o.rowHeader }),
    ...runs.flatMap((r) => [h("th", { text: `${r.name} top-1` }), h("th", { text: `p(${o.answer})` })])]);
  const rows: HTMLElement[] = [];
  for (let k = 0; k < n; k++) {
    const i = o.finalFirst ? n - 1 - k : k;
    const name = cols.map((c) => c[i]).find((e) => e !== undefined)?.row ?? "";
    const changed = o.markChanged && cols.length > 1 && cols[0][i] && cols[1][i] && cols[0][i].id !== cols[1][i].id;
    rows.push(h("tr", { class: changed ? `${o.prefix}-changed` : "", attrs: { "data-row": String(i) } }, [
      h("th", { class: `${o.prefix}-lens-row`, text: name, title: o.rowTitle?.(name, i, n) }),
      ...runs.flatMap((r, j) => cells(cols[j][i], r.name, o.prefix)),
    ]));
  }
  return h("table", { class: o.cls ?? "" }, [h("thead", {}, [head]), h("tbody", {}, rows)]);
}
