// The lens view's header: the finding first (from which block the answer is top-1 and stays), the
// controls, the colour bar of the current metric, the legend of the cell marks, then a details
// toggle with the table's dimensions, the check against the model's logits and the notes.
import { COLORMAPS } from "../lib/colormap";
import { h, replaceChildren, withCode } from "../lib/dom";
import { hColourBar, legendItem, type Tick } from "../lib/legend";
import type { AnyModel } from "../lib/rpc";
import { METRIC_LABELS } from "./columns";

export interface Controls {
  metricSel: HTMLSelectElement;
  cmapSel: HTMLSelectElement;
  rowFrom: HTMLInputElement;
  rowTo: HTMLInputElement;
  posFrom: HTMLInputElement;
  posTo: HTMLInputElement;
}

export class LensHeader {
  readonly elements: HTMLElement[];
  readonly controls: Controls;
  private bar = h("div", { class: "nbl-colourbar" });

  constructor(model: AnyModel, R: number, T: number, k: number) {
    const num = (cls: string, min: number, max: number) => h("input", { class: cls, attrs: { type: "number", min, max } });
    const metricSel = h("select", { class: "nbl-metric" }, Object.entries(METRIC_LABELS).map(([v, t]) => h("option", { attrs: { value: v }, text: t })));
    metricSel.value = model.get("metric") || "top1_prob";
    const cmapSel = h("select", { class: "nbl-cmap" }, COLORMAPS.map((n) => h("option", { attrs: { value: n }, text: n })));
    this.controls = {
      metricSel, cmapSel,
      rowFrom: num("nbl-row-from", 0, R - 1), rowTo: num("nbl-row-to", 0, R - 1),
      posFrom: num("nbl-pos-from", 0, T - 1), posTo: num("nbl-pos-to", 0, T - 1),
    };
    const c = this.controls;
    const targetLabel: string = model.get("target_label") || "";
    const generated: number[] = model.get("generated") || [];
    const nGen = generated.filter((g) => g).length;
    const notes = (model.get("notes") || []) as string[];
    const check: string = model.get("check") || "";
    const finding: string = model.get("headline") || model.get("finding") || "";
    const lensName: string = model.get("lens_name") || "logit lens";
    this.elements = [
      finding ? h("div", { class: "nbl-finding" }, withCode(finding)) : null,
      h("div", { class: "nbl-controls" }, [
        h("label", {}, ["colour ", metricSel]),
        h("label", {}, ["colormap ", cmapSel]),
        h("label", { title: "rows shown, first and last included (0 = the embeddings)" }, ["rows ", c.rowFrom, " – ", c.rowTo]),
        h("label", { title: "positions shown, first and last included" }, ["positions ", c.posFrom, " – ", c.posTo]),
      ]),
      h("div", { class: "nbl-legend-row" }, [
        this.bar,
        h("span", { class: "nbd-legend nbl-legend-target" }, [
          h("span", { class: "nbl-sample nbl-target", text: "tok" }),
          h("span", { text: `bold, underlined: the top-1 is the position's target${targetLabel ? ` (${targetLabel})` : ""}` }),
        ]),
        finding ? h("span", { class: "nbd-legend nbl-legend-onset" }, [
          h("span", { class: "nbl-sample nbl-onset", text: "tok" }),
          h("span", { text: "ringed: where the answer becomes top-1 and stays" }),
        ]) : null,
        legendItem("nbl-sw-pinned", "red outline: pinned (click a cell)"),
        nGen ? h("span", { class: "nbl-note nbl-gen-legend", text: `${nGen} generated tokens: purple italic column headers` }) : null,
        h("span", { class: "nbl-note", text: "hover a cell: its top-" + k + " · hover a column header: the whole token" }),
      ]),
      h("details", { class: "nbl-details" }, [
        h("summary", { text: `details: ${R} rows × ${T} positions${check ? ", check against the model's logits" : ""}${notes.length ? `, ${notes.length} note${notes.length > 1 ? "s" : ""}` : ""}` }),
        h("div", { class: "nbl-title", text: `${lensName} · ${R} rows (embeddings + ${R - 1} blocks) × ${T} positions · top-${k}` }),
        check ? h("div", { class: "nbl-note nbl-check", text: check }) : null,
        targetLabel ? h("div", { class: "nbl-note", text: `target: ${targetLabel}` }) : null,
        ...notes.map((n) => h("div", { class: "nbl-note", text: n })),
      ]),
    ].filter(Boolean) as HTMLElement[];
  }

  /** Redraw the colour bar for the metric and colormap now shown. */
  colourBar(metric: string, cmap: string, ticks: Tick[]): void {
    replaceChildren(this.bar, [hColourBar(cmap, ticks, 220, `colour: ${METRIC_LABELS[metric] ?? metric}`)]);
    this.bar.setAttribute("data-metric", metric);
  }
}
