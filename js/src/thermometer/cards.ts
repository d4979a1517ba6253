// Incident cards ("step 41: `b` produced NaN from finite inputs; input min −3.2 …") and the events
// of rows that change state over time ("became dead at step k"). Text from the kernel (module
// names, messages) is untrusted: text nodes only, `code` spans for backticked names.
import { h, replaceChildren, type Child } from "../lib/dom";
import type { HistEvent, Incident } from "./history";

/** Text with `code` spans (backticks), as text nodes only. */
export function withCode(text: string): Child[] {
  return String(text ?? "")
    .split("`")
    .map((part, i) => (i % 2 === 1 ? h("code", { text: part }) : part))
    .filter((c) => c !== "");
}

const KIND: Record<string, string> = { nonfinite: "NaN/Inf", loss_spike: "loss spike" };
const PHASE: Record<string, string> = { forward: "forward", output_grad: "output gradient", param_grad: "parameter gradient" };

/** One card per incident; each names its step (data-step) so a click can move the slider there. */
export function renderIncidents(box: HTMLElement, incidents: Incident[]): void {
  const list = Array.isArray(incidents) ? incidents : [];
  replaceChildren(
    box,
    list.map((inc) =>
      h("div", { class: ["nbd-incident", `nbd-incident-${String(inc.kind).replace(/[^a-z_]/gi, "")}`], data: { step: Number(inc.step) || 0 } }, [
        h("div", { class: "nbd-incident-head" }, [
          h("span", { class: "nbd-link", text: `step ${Number(inc.step) || "?"}`, title: "show this step" }),
          ` · ${KIND[inc.kind] ?? String(inc.kind ?? "")}`,
          inc.phase ? ` (${PHASE[String(inc.phase)] ?? String(inc.phase)})` : "",
          inc.row ? " in " : "",
          inc.row ? h("code", { text: String(inc.row) }) : null,
        ]),
        h("div", { class: "nbd-incident-msg" }, withCode(String(inc.message ?? ""))),
      ]),
    ),
  );
  box.style.display = list.length ? "" : "none";
}

/** Events over time, each with its step and row (data-step, data-layer). */
export function renderEvents(box: HTMLElement, events: HistEvent[]): void {
  const list = Array.isArray(events) ? events : [];
  replaceChildren(
    box,
    list.map((e) =>
      h("li", { class: "nbd-event", data: { step: Number(e.step) || 0, layer: String(e.row ?? "") } }, [
        h("span", { class: "nbd-link", text: `step ${Number(e.step) || "?"}`, title: "show this step and row" }),
        " ",
        ...withCode(String(e.message ?? "")),
        e.suggestion ? h("div", { class: "nbd-suggestion" }, withCode(String(e.suggestion))) : null,
      ]),
    ),
  );
  box.style.display = list.length ? "" : "none";
}
