// The card shown when the cell raised inside the model: the module that raised, what does not fit,
// its inputs next to its parameters. Python side: ThermometerWidget.raised (empty dict: no card).
// Model text only ever goes through textContent (via h()).
import { h, replaceChildren, withCode } from "../lib/dom";

/** Mirrors `_raised_trait` in nbdebug/widgets/thermometer.py. */
export interface Raised {
  module: string;
  type: string;
  error: string;
  problems: string[];
  inputs: string[];
  params: string[];
  suggestion?: string;
}


function list(label: string, items: string[]): HTMLElement {
  return h("div", { class: "nbd-raised-list" }, [
    h("span", { class: "nbd-raised-label", text: label }),
    items.length ? items.join("; ") : "none",
  ]);
}

/** Fill `box` from the `raised` trait; hide it when the cell did not raise inside the model. */
export function renderRaised(box: HTMLElement, raised: Partial<Raised> | null | undefined): void {
  if (!raised || !raised.error) {
    replaceChildren(box, []);
    box.style.display = "none";
    return;
  }
  const problems = raised.problems ?? [];
  replaceChildren(box, [
    h("div", { class: "nbd-raised-head" }, [
      "raised in ",
      h("code", { text: raised.module || "(model)" }),
      ` (${raised.type ?? ""}): `,
      h("span", { class: "nbd-raised-error", text: raised.error }),
    ]),
    problems.length ? h("ul", { class: "nbd-raised-problems" }, problems.map((p) => h("li", {}, withCode(p)))) : null,
    list("inputs: ", raised.inputs ?? []),
    list("parameters: ", raised.params ?? []),
  ]);
  box.style.display = "";
}
