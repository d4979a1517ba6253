// The time axis of the thermometer: a step slider over the kept steps (the last one by default), a
// "whole run" choice (the merged rows), the step of the first NaN/Inf marked on the slider, the loss
// curve with skipped steps (GradScaler) and the live step counter. Everything is drawn from the
// HistoryStore already in the browser: the kernel cannot answer while the cell runs.
import { fmt, fmtInt, h, replaceChildren } from "../lib/dom";
import { slotX, sparkline, type Mark } from "../lib/sparkline";
import type { HistoryStore } from "./history";

/** Where the table is: a kept slot, or the whole run (merged rows). */
export interface Position {
  slot: number;
  whole: boolean;
}

export const LOSS_W = 560;
const LOSS_H = 64;

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

  constructor(private onPick: (pos: Position) => void) {
    this.slider = h("input", { class: "nbd-slider", attrs: { type: "range", min: 0, max: 0, step: 1, value: 0, "aria-label": "step" } });
    this.label = h("span", { class: "nbd-step-label" });
    this.counter = h("span", { class: "nbd-step-count" });
    this.whole = h("button", { class: "nbd-whole", text: "whole run", title: "show every step merged (the run's min/max, mean over all steps)", attrs: { type: "button", "aria-pressed": "false" } });
    this.nanBtn = h("button", { class: "nbd-goto-nan", attrs: { type: "button" } });
    this.ticks = h("div", { class: "nbd-slider-ticks" });
    this.loss = h("div", { class: "nbd-loss" });
    this.el = h("div", { class: "nbd-timeline" }, [
      h("div", { class: "nbd-slider-row" }, [
        this.counter,
        h("div", { class: "nbd-slider-box" }, [this.slider, this.ticks]),
        this.label,
        this.whole,
        this.nanBtn,
      ]),
      this.loss,
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
  update(store: HistoryStore, pos: Position, running: boolean, merged = true): void {
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
    this.drawLoss(store, pos, marks);
  }

  private drawLoss(store: HistoryStore, pos: Position, marks: Mark[]): void {
    const loss = store.scalar("loss");
    if (!loss.some((v) => Number.isFinite(v))) {
      replaceChildren(this.loss, []);
      this.loss.style.display = "none";
      return;
    }
    this.loss.style.display = "";
    const at = pos.whole ? loss.length - 1 : pos.slot;
    const svg = sparkline(loss, {
      width: LOSS_W,
      height: LOSS_H,
      lo: store.scalar("lossLo"),
      hi: store.scalar("lossHi"),
      marks,
      cursor: pos.whole ? undefined : pos.slot,
      cls: "nbd-spark nbd-loss-curve",
      title: "loss per kept step (band: min/max of merged steps)",
    });
    replaceChildren(this.loss, [
      h("div", { class: "nbd-loss-label", text: `loss ${fmt(loss[at], 4)} at step ${fmtInt(store.step(at))}` }),
      svg,
    ]);
  }

  destroy(): void {
    this.slider.removeEventListener("input", this.onInput);
    this.whole.removeEventListener("click", this.onWhole);
    this.nanBtn.removeEventListener("click", this.onNan);
  }
}
