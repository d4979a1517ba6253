// The thermometer's story: the header (the top finding, root cause first), the ranked findings, and
// one timeline of what happened when (incidents: NaN/Inf, loss spikes; events: units died, a
// gradient fell, an update ratio left its range). Each piece of advice is said once: `Said` keeps
// the texts already shown, in document order. Text from the kernel (module names, messages) is
// untrusted: text nodes only, `code` spans for backticked names (a name like `3` reads as a name).
import { h, replaceChildren, withCode, type Child } from "../lib/dom";
import type { Finding, HistEvent, Incident } from "./history";

export type { Finding };

export { withCode };

/** Advice already shown: a later repeat of the same text is left out. */
export class Said {
  private texts = new Set<string>();
  /** The advice element for `text`, or null when it is empty or was shown already. */
  advice(text: string | undefined | null): HTMLElement | null {
    const t = String(text ?? "").trim();
    if (!t || this.texts.has(t)) return null;
    this.texts.add(t);
    return h("div", { class: "nbd-suggestion" }, withCode(t));
  }
}

const stepLink = (step: number, layer?: string) =>
  h("span", { class: "nbd-link nbd-step-link", text: `step ${step}`, title: "show this step", data: layer ? { step, layer } : { step } });

/** The header: the kernel's headline (live or final); hidden when there is none. */
export function renderHeadline(box: HTMLElement, headline: string): void {
  replaceChildren(box, withCode(headline));
  box.style.display = headline ? "" : "none";
}

/** The ranked findings (root causes first; what follows from one is marked so), advice once. */
export function renderFindings(list: HTMLElement, findings: Finding[], said: Said): void {
  let roots = 0; // root causes are numbered 1, 2, …; what follows from one is marked "→", not counted
  const items = (Array.isArray(findings) ? findings : []).map((f) => {
    const row = f.rows?.[0];
    const li = h("li", { class: ["nbd-finding-item", `nbd-sev-${String(f.severity).replace(/[^a-z]/g, "")}`, f.cause >= 0 && "nbd-follows"], data: { code: String(f.code) } }, [
      f.cause >= 0 ? h("span", { class: "nbd-follows-mark", text: "→ ", title: "follows from the finding above it" }) : null,
      f.step > 0 ? stepLink(Number(f.step), row) : null,
      f.step > 0 ? " " : null,
      ...withCode(String(f.detail || f.text)),
      said.advice(f.advice),
    ]);
    if (!(f.cause >= 0)) (li as HTMLLIElement).value = ++roots;
    return li;
  });
  replaceChildren(list, items);
  list.style.display = items.length ? "" : "none";
}

const KIND: Record<string, string> = { nonfinite: "NaN/Inf", loss_spike: "loss spike" };
const PHASE: Record<string, string> = { forward: "forward", output_grad: "output gradient", param_grad: "parameter gradient" };

type Entry = { step: number; order: number; el: HTMLElement };

/** Loss spikes at consecutive steps, as runs (one timeline entry each). */
function spikeRuns(spikes: Incident[]): Incident[][] {
  const runs: Incident[][] = [];
  for (const inc of [...spikes].sort((a, b) => Number(a.step) - Number(b.step))) {
    const run = runs[runs.length - 1];
    if (run && Number(inc.step) - Number(run[run.length - 1].step) <= 1) run.push(inc);
    else runs.push([inc]);
  }
  return runs;
}

function incidentEntry(inc: Incident, run: Incident[] = [inc]): HTMLElement {
  const step = Number(inc.step) || 0;
  const last = Number(run[run.length - 1].step) || step;
  const kind = KIND[inc.kind] ?? String(inc.kind ?? "");
  return h("li", { class: ["nbd-incident", `nbd-incident-${String(inc.kind).replace(/[^a-z_]/gi, "")}`], data: { step } }, [
    h("div", { class: "nbd-incident-head" }, [
      h("span", { class: "nbd-link", text: `step ${step || "?"}`, title: "show this step" }),
      ` · ${run.length > 1 ? `${kind}s at ${run.length} steps, to step ${last}` : kind}`,
      inc.phase ? ` (${PHASE[String(inc.phase)] ?? String(inc.phase)})` : "",
      inc.row ? " in " : "",
      inc.row ? h("code", { text: String(inc.row) }) : null,
    ]),
    h("div", { class: "nbd-incident-msg" }, withCode(String(inc.message ?? ""))),
  ]);
}

/**
 * The one timeline: incidents and events in step order (an incident before an event of its step);
 * loss spikes at consecutive steps in one entry (the largest one's message); events of one kind at
 * one step in one entry. Each entry names its step (data-step) so a click moves the slider there.
 */
export function renderTimeline(list: HTMLElement, incidents: Incident[], events: HistEvent[], said: Said): void {
  const entries: Entry[] = [];
  const incs = Array.isArray(incidents) ? incidents : [];
  for (const inc of incs) if (inc.kind !== "loss_spike") entries.push({ step: Number(inc.step) || 0, order: 0, el: incidentEntry(inc) });
  for (const run of spikeRuns(incs.filter((i) => i.kind === "loss_spike"))) {
    const top = run.reduce((a, b) => (Number(b.value ?? 0) > Number(a.value ?? 0) ? b : a));
    entries.push({ step: Number(run[0].step) || 0, order: 0, el: incidentEntry({ ...top, step: run[0].step }, run) });
  }
  const groups = new Map<string, HistEvent[]>();
  for (const e of Array.isArray(events) ? events : []) {
    const key = `${e.code}:${e.step}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key)!.push(e);
  }
  for (const group of groups.values()) {
    const e = group[0];
    const step = Number(e.step) || 0;
    const body: Child[] = [];
    group.forEach((x, i) => {
      if (i) body.push("; ");
      body.push(...withCode(String(x.message ?? "")));
    });
    entries.push({
      step,
      order: 1,
      el: h("li", { class: "nbd-event", data: { step, layer: String(e.row ?? ""), code: String(e.code ?? "") } }, [
        h("span", { class: "nbd-link", text: `step ${step || "?"}`, title: "show this step and row" }),
        " ",
        ...body,
        said.advice(e.suggestion),
      ]),
    });
  }
  entries.sort((a, b) => a.step - b.step || a.order - b.order);
  replaceChildren(list, entries.map((e) => e.el));
  list.style.display = entries.length ? "" : "none";
}
