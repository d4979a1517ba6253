// The time axis of the thermometer: the loss curve on top (ticks at incidents and events, the values
// under the pointer, a log-scale toggle; a click picks that step), then a step slider over the kept
// steps (the last one by default), a "whole run" choice (the merged rows), the step of the first
// NaN/Inf marked on the slider, and the live step counter. Everything is drawn from the
// HistoryStore already in the browser: the kernel cannot answer while the cell runs.
import { Chart, type ChartMark } from "../lib/chart";
import { fmtInt, h, replaceChildren } from "../lib/dom";
import { slotX, type Mark } from "../lib/sparkline";
import type { Finding, HistEvent, HistoryStore, Incident } from "./history";

/** Where the table is: a kept slot, or the whole run (merged rows). */
export interface Position {
  slot: number;
  whole: boolean;
}

const LOSS_H = 72;
const EVENT_WORDS: Record<string, string> = { became_dead: "units died", grad_fell: "gradient fell", update_ratio: "update ratio out of range" };

/** The loss curve's marks: the first NaN/Inf, skipped steps, incidents (loss spikes), events, and the
 * header's root cause (findings[0], the finding the header says, when it is a warning or an error with a step;
 * never another root in its place) at its step. */
export function lossMarks(store: HistoryStore, incidents: Incident[], events: HistEvent[], findings: Finding[] = []): ChartMark[] {
  const marks: ChartMark[] = timeMarks(store).map((m) => ({ step: store.step(m.at), cls: m.cls, title: m.title }));
  const first = findings[0];
  const root = first && first.severity !== "note" && !(Number(first.cause) >= 0) && Number(first.step) > 0 ? first : undefined;
  if (root) marks.push({ step: Number(root.step), cls: "nbd-mark-root", title: `step ${root.step}: the root cause: ${String(root.text).replace(/`/g, "")}` });
  for (const inc of incidents) {
    if (inc.kind === "loss_spike") marks.push({ step: Number(inc.step), cls: "nbd-mark-spike", title: String(inc.message ?? "") });
  }
  const seen = new Set<string>();
  for (const e of events) {
    const key = `${e.code}:${e.step}`;
    if (seen.has(key) || e.code === "update_ratio") continue;
    seen.add(key);
    marks.push({ step: Number(e.step), cls: "nbd-mark-event", title: `step ${e.step}: ${EVENT_WORDS[e.code] ?? e.code} (\`${e.row}\`)` });
  }
  return marks;
}

/** Marks of the first non-finite step and of skipped steps, by slot. */
export function timeMarks(store: HistoryStore): Mark[] {
  const marks: Mark[] = [];
  const skipped = store.scalar("skipped");
  skipped.forEach((s, i) => {
    if (s > 0) marks.push({ at: i, cls: "nbd-mark-skip", title: `step ${store.step(i)}: optimizer step skipped (GradScaler found inf/NaN gradients)` });
  });
  if (store.firstNonfinite > 0) {
    const at = store.slotOf(store.firstNonfinite);
    marks.push({ at, cls: "nbd-mark-nan", title: `first NaN/Inf at step ${store.firstNonfinite}` });
  }
  return marks;
}

export class Timeline {
  readonly el: HTMLElement;
  private slider: HTMLInputElement;
  private label: HTMLElement;
  private counter: HTMLElement;
  private whole: HTMLButtonElement;
  private nanBtn: HTMLButtonElement;
  private ticks: HTMLElement;
  private loss: HTMLElement;
  private chart: Chart;

  constructor(private onPick: (pos: Position) => void) {
    this.slider = h("input", { class: "nbd-slider", attrs: { type: "range", min: 0, max: 0, step: 1, value: 0, "aria-label": "step" } });
    this.label = h("span", { class: "nbd-step-label" });
    this.counter = h("span", { class: "nbd-step-count" });
    this.whole = h("button", { class: "nbd-whole", text: "whole run", title: "show every step merged (the run's min/max, mean over all steps)", attrs: { type: "button", "aria-pressed": "false" } });
    this.nanBtn = h("button", { class: "nbd-goto-nan", attrs: { type: "button" } });
    this.ticks = h("div", { class: "nbd-slider-ticks" });
    this.chart = new Chart({
      name: "loss",
      height: LOSS_H,
      readoutClass: "nbd-loss-label",
      onPick: (step) => this.store && this.onPick({ slot: this.store.slotOf(step), whole: false }),
    });
    this.loss = h("div", { class: "nbd-loss", title: "loss per kept step (band: min/max of merged steps); click: show that step" }, [this.chart.el]);
    this.el = h("div", { class: "nbd-timeline" }, [
      this.loss,
      h("div", { class: "nbd-slider-row" }, [
        this.counter,
        h("div", { class: "nbd-slider-box" }, [this.slider, this.ticks]),
        this.label,
        this.whole,
        this.nanBtn,
      ]),
    ]);
    this.slider.addEventListener("input", this.onInput);
    this.whole.addEventListener("click", this.onWhole);
    this.nanBtn.addEventListener("click", this.onNan);
  }

  private store: HistoryStore | null = null;
  private onInput = () => this.onPick({ slot: Number(this.slider.value), whole: false });
  private onWhole = () => {
    const n = this.store?.length ?? 0;
    const pressed = this.whole.getAttribute("aria-pressed") === "true";
    this.onPick({ slot: Number(this.slider.value) || n - 1, whole: !pressed });
  };
  private onNan = () => {
    if (this.store) this.onPick({ slot: this.store.slotOf(this.store.firstNonfinite), whole: false });
  };

  /** Redraw for `store` with the table at `pos`; `running` while the cell still runs; `merged`
   * when the whole run's merged rows exist (they come with the final state). */
  update(store: HistoryStore, pos: Position, running: boolean, merged = true, incidents: Incident[] = [], events: HistEvent[] = [], findings: Finding[] = []): void {
    this.store = store;
    const n = store.length;
    const total = store.totalSteps || (n ? store.step(n - 1) : 0);
    this.counter.textContent = `${fmtInt(total)} step${total === 1 ? "" : "s"}${running ? " (running…)" : ""}`;
    this.el.style.display = n >= 1 ? "" : "none";
    this.slider.max = String(Math.max(0, n - 1));
    this.slider.value = String(Math.max(0, pos.slot));
    this.slider.disabled = n < 2;
    this.whole.style.display = merged ? "" : "none";
    this.whole.setAttribute("aria-pressed", pos.whole ? "true" : "false");
    this.whole.classList.toggle("nbd-on", pos.whole);
    if (pos.whole) {
      this.label.textContent = `whole run (${fmtInt(total)} steps merged)`;
    } else {
      const step = store.step(pos.slot);
      const skipped = store.scalar("skipped")[pos.slot] > 0;
      const bucket = pos.slot > 0 ? step - store.step(pos.slot - 1) : 1;
      this.label.textContent =
        `step ${fmtInt(step)} of ${fmtInt(total)}` +
        (bucket > 1 && store.banded() ? ` (last of ${fmtInt(bucket)} steps)` : "") +
        (skipped ? " — skipped by GradScaler" : "");
    }
    const nan = store.firstNonfinite;
    this.nanBtn.style.display = nan > 0 ? "" : "none";
    this.nanBtn.textContent = `first NaN/Inf: step ${fmtInt(nan)}`;
    const marks = timeMarks(store);
    replaceChildren(
      this.ticks,
      marks.map((m) =>
        h("span", {
          class: ["nbd-tick", m.cls],
          title: m.title ?? "",
          data: { slot: m.at },
          style: { left: `${((slotX(m.at, n, 1000) / 1000) * 100).toFixed(2)}%` },
        }),
      ),
    );
    this.drawLoss(store, pos, lossMarks(store, incidents, events, findings));
  }

  private drawLoss(store: HistoryStore, pos: Position, marks: ChartMark[]): void {
    const loss = store.scalar("loss");
    if (!loss.some((v) => Number.isFinite(v))) {
      this.loss.style.display = "none";
      return;
    }
    this.loss.style.display = "";
    this.chart.update([{ label: "loss", steps: store.steps(), y: loss, lo: store.scalar("lossLo"), hi: store.scalar("lossHi") }], {
      marks,
      cursor: pos.whole ? undefined : store.step(pos.slot),
    });
  }

  destroy(): void {
    this.chart.destroy();
    this.slider.removeEventListener("input", this.onInput);
    this.whole.removeEventListener("click", this.onWhole);
    this.nanBtn.removeEventListener("click", this.onNan);
  }
}
