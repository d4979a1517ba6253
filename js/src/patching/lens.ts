// The clicked patched run's logit-lens column beside the clean and corrupt runs': per block (final at
// the top, as in the lens view) the last position's top-1 token, its probability and p(answer),
// computed in the kernel through the model's own final norm and unembedding
// (nbdebug/sessions/lens.py). Tokens and module names are model text: textContent only.
import { fmtPct, h } from "../lib/dom";

export interface LensEntry {
  row: string; // "embed", then the block whose output this is (the residual entering the next block)
  id: number;
  token: string;
  p: number;
  p_answer: number; // -1: no answer token
}

export interface LensColumns {
  clean: LensEntry[];
  corrupt: LensEntry[];
  patched: LensEntry[];
}

const RUNS: (keyof LensColumns)[] = ["clean", "corrupt", "patched"];

function cells(e: LensEntry | undefined, run: string): HTMLElement[] {
  if (!e) return [h("td", { text: "" }), h("td", { text: "" })];
  return [
    h("td", { class: ["nbp-lens-tok", `nbp-lens-${run}`], text: e.token, title: `${e.token} (#${e.id}) p=${fmtPct(e.p)}` }),
    h("td", { class: "nbp-p", text: e.p_answer >= 0 ? fmtPct(e.p_answer) : "–" }),
  ];
}

/** The three runs' lens columns as one table (rows: blocks, final first). */
export function lensTable(lens: LensColumns, label: string): HTMLElement {
  const n = Math.max(...RUNS.map((r) => (lens[r] || []).length));
  const head = h("tr", {}, [h("th", { text: "block" }), ...RUNS.flatMap((r) => [
    h("th", { text: r === "patched" ? "patched top-1" : `${r} top-1` }), h("th", { text: "p(answer)" })])]);
  const rows: HTMLElement[] = [];
  for (let i = n - 1; i >= 0; i--) {
    const name = (lens.clean[i] || lens.patched[i] || { row: "" }).row;
    rows.push(h("tr", { attrs: { "data-row": String(i) } }, [h("th", { class: "nbp-lens-row", text: name }),
      ...RUNS.flatMap((r) => cells((lens[r] || [])[i], r))]));
  }
  return h("div", { class: "nbp-lens" }, [
    h("h4", { text: `logit lens at the last position: ${label}` }),
    h("table", {}, [h("thead", {}, [head]), h("tbody", {}, rows)]),
  ]);
}
