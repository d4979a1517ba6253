// The clicked patched run's logit-lens column beside the clean and corrupt runs': per block (final at
// the top, as in the lens view) the last position's top-1 token, its probability and p(answer),
// computed in the kernel through the model's own final norm and unembedding
// (nbdebug/sessions/lens.py), drawn by the one lens-column table (lib/lenscolumn.ts).
import { h } from "../lib/dom";
import { lensColumnTable, type LensEntry } from "../lib/lenscolumn";

export type { LensEntry };

export interface LensColumns {
  clean: LensEntry[];
  corrupt: LensEntry[];
  patched: LensEntry[];
}

const RUNS: (keyof LensColumns)[] = ["clean", "corrupt", "patched"];

/** The three runs' lens columns as one table (rows: blocks, final first). */
export function lensTable(lens: LensColumns, label: string): HTMLElement {
  return h("div", { class: "nbp-lens" }, [
    h("h4", { text: `logit lens at the last position: ${label}` }),
    lensColumnTable(RUNS.map((name) => ({ name, entries: lens[name] })), { prefix: "nbp", rowHeader: "block", answer: "answer", finalFirst: true }),
  ]);
}
