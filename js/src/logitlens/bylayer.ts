// The by-layer strip beside the lens table, at the finding's position (the last one): per row (the
// output on top, as in the table) the lens's top-1, the answer's p and rank, how far the row is from
// the model's output (KL(final ‖ row) in nats on this prompt, and on held-out text when the lens was
// fitted here), and with a second lens its top-1, marked where the two lenses' top-1 differ.
// Computed in Python (nbdebug/inspectors/lens_finding.py layer_rows); token text: textContent only.
import { fmtPct, h } from "../lib/dom";
import type { AnyModel } from "../lib/rpc";
import type { LensPanel } from "./side";

export interface LayerRow {
  row: number;
  name: string;
  top1: string;
  p_top1: number;
  p_answer: number | null;
  rank: number;
  kl_prompt: number | null;
  kl_heldout: number | null;
  other_top1?: string;
  differs?: boolean;
}

const kl = (v: number | null | undefined) => (v === null || v === undefined || !Number.isFinite(v) ? "–" : v.toFixed(2));

/** The strip as a table element (exported for tests). */
export function layerTable(rows: LayerRow[], lensName: string, compareName: string, rowLabel: (r: number) => string): HTMLElement {
  const other = compareName !== "";
  const held = rows.some((r) => r.kl_heldout !== null && r.kl_heldout !== undefined);
  const head = h("tr", {}, [
    h("th", { text: "row" }),
    h("th", { text: "top-1", title: `${lensName}: the row's top-1 token` }),
    h("th", { text: "p(answer)", title: "the answer's probability at this row" }),
    h("th", { text: "rank", title: "the answer's rank at this row (1 = top-1)" }),
    h("th", { text: "KL here", title: "KL(final ‖ row) in nats on this prompt, at this position" }),
    held ? h("th", { text: "KL held-out", title: "KL(final ‖ row) in nats on held-out text (measured when the lens was fitted)" }) : null,
    other ? h("th", { text: `${compareName} top-1`, title: "the compared lens's top-1 (bold: differs)" }) : null,
  ].filter(Boolean) as HTMLElement[]);
  const body = [...rows].reverse().map((r) =>
    h("tr", { class: [r.row === 0 ? "nbl-embed" : "", r.differs ? "nbl-differs" : ""], data: { row: r.row } }, [
      h("th", { class: "nbl-row", text: rowLabel(r.row), title: r.name }),
      h("td", { text: r.top1, title: `p ${fmtPct(r.p_top1)}` }),
      h("td", { class: "nbl-num", text: r.p_answer === null ? "–" : fmtPct(r.p_answer) }),
      h("td", { class: "nbl-num", text: r.rank > 0 ? `#${r.rank}` : "–" }),
      h("td", { class: "nbl-num", text: kl(r.kl_prompt) }),
      held ? h("td", { class: "nbl-num", text: kl(r.kl_heldout) }) : null,
      other ? h("td", { class: r.differs ? "nbl-diff" : "", text: r.other_top1 ?? "" }) : null,
    ].filter(Boolean) as HTMLElement[]),
  );
  return h("table", { class: "nbl-bylayer" }, [h("thead", {}, [head]), h("tbody", {}, body)]);
}

/** The panel: drawn once from the synced `by_layer` (it does not depend on the pinned cells). */
export function byLayerPanel(model: AnyModel, rowLabel: (r: number) => string): LensPanel | null {
  const rows = (model.get("by_layer") || []) as LayerRow[];
  if (!rows.length) return null;
  const lensName: string = model.get("lens_name") || "logit lens";
  const compareName: string = model.get("compare_name") || "";
  const n = rows.filter((r) => r.differs).length;
  const title = compareName
    ? `by layer, last position: ${lensName} vs ${compareName} (top-1 differs at ${n} of ${rows.length} rows)`
    : `by layer, last position: ${lensName}`;
  return { title, el: layerTable(rows, lensName, compareName, rowLabel), update: () => undefined };
}
