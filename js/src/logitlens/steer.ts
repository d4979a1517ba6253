// The lens view's steering panel (`--steer VAR`): a layer selector, a strength slider (alpha; 0 =
// off) and a "steered / original" switch. Moving the slider asks the kernel (rpc "steer") for the
// cell's input run again with alpha·vector added to the chosen block's output: the lens columns of
// the visible window and the next-token top-5 of both runs. Requests are debounced and at most one is
// in flight: while one runs, later moves only remember the newest setting, sent when it returns.
// Without a vector the panel is one line saying how to make one (`steer_hint`).
// Python side: nbdebug/widgets/logitlens.py (rpc "steer"), nbdebug/sessions/steer.py.
import { h, replaceChildren } from "../lib/dom";
import type { NdArray } from "../lib/ndarray";
import { rpc, type AnyModel } from "../lib/rpc";
import { tokenRows, type TopToken } from "../lib/tokens";


export interface SteerAnswer {
  layer: string;
  alpha: number;
  positions: number[];
  vocab: Record<string, string>;
  top: { steered: TopToken[]; original: TopToken[] };
}

export interface SteerHost {
  /** The visible positions `[start, end)`. */
  window(): [number, number];
  /** A steered lens arrived (its columns, vocabulary and top-5s). */
  steered(ans: SteerAnswer, arrays: Record<string, NdArray>): void;
  /** The "steered / original" switch changed. */
  showOriginal(original: boolean): void;
}

function topList(title: string, tops: TopToken[], cls: string): HTMLElement {
  const rows = tokenRows(tops, { pClass: "nbl-steer-p" });
  return h("div", { class: ["nbl-steer-top", cls] }, [h("div", { class: "nbl-title", text: title }), h("table", {}, [h("tbody", {}, rows)])]);
}

export class SteerPanel {
  readonly el: HTMLElement;
  readonly enabled: boolean;
  readonly layerSel: HTMLSelectElement;
  readonly slider: HTMLInputElement;
  readonly original: HTMLInputElement;
  private value = h("span", { class: "nbl-steer-alpha", text: "0" });
  private tops = h("div", { class: "nbl-steer-tops" });
  private status = h("div", { class: "nbl-note nbl-steer-status" });
  private timer: ReturnType<typeof setTimeout> | null = null;
  private inFlight = false;
  private again = false;
  disposed = false;
  /** Requests sent (for tests). */
  sent = 0;

  constructor(private model: AnyModel, private host: SteerHost, private debounceMs = 150) {
    const layers: string[] = model.get("steer_layers") || [];
    const max = Number(model.get("steer_max")) || 8;
    this.enabled = layers.length > 0;
    this.layerSel = h("select", { class: "nbl-steer-layer", attrs: { "aria-label": "steered layer" } },
      layers.map((n) => h("option", { text: n, attrs: { value: n } })));
    this.layerSel.value = model.get("steer_layer") || layers[0] || "";
    this.slider = h("input", { class: "nbl-steer-slider", attrs: { type: "range", min: -max, max, step: 0.5, value: 0, "aria-label": "steering strength" } });
    this.slider.value = "0";
    this.original = h("input", { class: "nbl-steer-original", attrs: { type: "checkbox" } });
    if (!this.enabled) {
      this.el = h("div", { class: "nbl-note nbl-steer-hint", text: model.get("steer_hint") || "" });
      return;
    }
    this.el = h("div", { class: "nbl-steer" }, [
      h("div", { class: "nbl-controls" }, [
        h("span", { class: "nbl-title", text: "steer" }),
        h("label", {}, ["add α·vector to the output of ", this.layerSel]),
        h("label", {}, ["α ", this.slider, " ", this.value]),
        h("label", { title: "show the unsteered run's lens (the steered one stays computed)" }, [this.original, " show original"]),
      ]),
      this.status, this.tops,
    ]);
    this.slider.addEventListener("input", () => this.changed());
    this.slider.addEventListener("change", () => this.changed());
    this.layerSel.addEventListener("change", () => this.changed());
    this.original.addEventListener("change", () => host.showOriginal(this.original.checked));
  }

  get alpha(): number {
    return Number(this.slider.value);
  }

  /** The slider or the layer moved: one request after `debounceMs` of quiet. */
  changed(): void {
    this.value.textContent = String(this.alpha);
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.send();
    }, this.debounceMs);
  }

  /** Ask for the current setting now (or once the request in flight returns). */
  async send(): Promise<void> {
    if (!this.enabled || this.disposed) return;
    if (this.inFlight) {
      this.again = true;
      return;
    }
    this.inFlight = true;
    this.again = false;
    const layer = this.layerSel.value, alpha = this.alpha;
    const [start, end] = this.host.window();
    this.status.textContent = `running the cell's input steered at ${layer}, α = ${alpha}…`;
    this.status.classList.remove("nbl-error");
    this.sent++;
    try {
      const ans = await rpc<SteerAnswer>(this.model, "steer", { layer, alpha, start, end }, 300_000);
      if (this.disposed) return;
      if (!this.again) {
        this.status.textContent = alpha === 0 ? "α = 0: the original run" : `steered at ${ans.result.layer}, α = ${ans.result.alpha}`;
        this.showTops(ans.result);
        this.host.steered(ans.result, ans.arrays);
      }
    } catch (err) {
      if (this.disposed) return;
      this.status.textContent = String((err as Error).message || err);
      this.status.classList.add("nbl-error");
    } finally {
      this.inFlight = false;
    }
    if (this.again && !this.disposed) void this.send();
  }

  private showTops(ans: SteerAnswer): void {
    replaceChildren(this.tops, [
      topList(`next token, steered (α = ${ans.alpha})`, ans.top.steered, "nbl-steer-steered"),
      topList("next token, original", ans.top.original, "nbl-steer-orig"),
    ]);
  }
}
