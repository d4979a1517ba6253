// The attention view's header: the finding first (which heads stand out for this model), the sink
// count as a neutral fact, the controls and the legend of the grid's marks, then a details toggle
// with the dimensions, how the probabilities were obtained, memory notes and the outlier rule.
import { COLORMAPS } from "../lib/colormap";
import { h, withCode } from "../lib/dom";
import { legendItem } from "../lib/legend";
import type { AnyModel } from "../lib/rpc";
import { LABELS, type AttentionData } from "./data";

export interface Header {
  elements: HTMLElement[];
  metricSel: HTMLSelectElement;
  cmapSel: HTMLSelectElement;
  outliersOnly: HTMLInputElement;
}

export function header(model: AnyModel, d: AttentionData): Header {
  const metricSel = h("select", { class: "nba-metric" }, d.names.map((n) => h("option", { attrs: { value: n }, text: LABELS[n] || n })));
  metricSel.value = model.get("metric") || "first_mass";
  const cmapSel = h("select", { class: "nba-cmap" }, COLORMAPS.map((n) => h("option", { attrs: { value: n }, text: n })));
  const n = d.outliers.size;
  const outliersOnly = h("input", { class: "nba-outliers-only", attrs: { type: "checkbox", disabled: n === 0 } });
  outliersOnly.checked = n > 0 && Boolean(model.get("outliers_only"));
  const summary: string = model.get("summary") || "";
  const notes = (model.get("notes") || []) as string[];
  const nGen = d.generated.filter((g) => g).length;
  const rule: string = model.get("outlier_rule") || "";
  const dims = `${d.L} layers × ${d.H} heads × ${d.T} tokens`;
  const details = h("details", { class: "nba-details" }, [
    h("summary", { text: `details: ${dims}, how the probabilities were obtained${notes.length ? `, ${notes.length} note${notes.length > 1 ? "s" : ""}` : ""}` }),
    h("div", { class: "nba-path", text: `${dims} · attention path: ${model.get("path") || "?"}${model.get("causal") ? " · causal" : ""}` }),
    ...notes.map((t) => h("div", { class: "nba-note", text: t })),
    rule ? h("div", { class: "nba-note nba-rule", text: rule }) : null,
  ]);
  const elements = [
    h("div", { class: ["nba-finding", n ? "nba-has-outliers" : ""] }, withCode(model.get("headline") || model.get("finding") || "")),
    summary ? h("div", { class: "nba-summary", text: summary }, [h("span", { class: "nba-neutral", text: " · attention sinks are normal in trained models: grey, not coloured" })]) : null,
    h("div", { class: "nba-controls" }, [
      h("label", {}, ["metric ", metricSel]),
      h("label", {}, ["colormap ", cmapSel]),
      h("label", { class: "nba-filter" }, [outliersOnly, n ? ` outliers only (${n})` : " outliers only (none)"]),
    ]),
    h("div", { class: "nba-legend-row" }, [
      legendItem("nba-sw-outlier", "stands out for this model"),
      legendItem("nba-sw-sink", "> 50% on one sink token (normal)"),
      legendItem("nba-sw-uniform", "near-uniform"),
      h("span", { class: "nba-note", text: "hover a head: its tokens · click: its matrix · shift-click: overlay heads" }),
      nGen ? h("span", { class: "nba-note nba-gen-legend", text: `${nGen} generated tokens (purple italic in the token lists)` }) : null,
    ]),
    details,
  ].filter(Boolean) as HTMLElement[];
  return { elements, metricSel, cmapSel, outliersOnly };
}
