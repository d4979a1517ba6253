// Channel ablation panel of the feature-map view (issue 20): click a tile to pick its channel (shift-click
// adds more), "ablate" asks the kernel (the one ablation request of lib/ablation.ts, kind "channels";
// nbdebug/widgets/featuremaps.py) to re-run the
// cell's first sample with those channels zeroed or mean-replaced; the answer shows the change of the
// clean top-1 class's probability, the new top-5 and the Grad-CAM map before/after on one scale.
// Class labels are model text: textContent only.
import { askAblation, type AblationAnswer } from "../lib/ablation";
import { paintU8 } from "../lib/colormap";
import { fmtPct, h, replaceChildren } from "../lib/dom";
import type { NdArray } from "../lib/ndarray";
import type { AnyModel } from "../lib/rpc";
import { Latest } from "../lib/request";
import { select } from "../lib/select";

export const ABLATE_CSS = `
.nbdebug-featuremaps .nbd-ablate { margin: 4px 0; padding: 4px; border: 1px solid #ccc; font-size: 12px; }
.nbdebug-featuremaps .nbd-ablate button { margin-left: 4px; }
.nbdebug-featuremaps .nbd-ablate .nbd-delta { font-weight: bold; }
.nbdebug-featuremaps .nbd-ablate .nbd-cams { display: flex; gap: 8px; align-items: flex-start; }
.nbdebug-featuremaps .nbd-ablate ol { margin: 2px 0 2px 18px; padding: 0; }
`;

/** The Δ line of an answer, probabilities written as everywhere (fmtPct) and the change in
 *  percentage points: "Δ p(label) = −12.3 points (45.6% → 33.3%)". */
export function deltaText(r: AblationAnswer): string {
  const m = r.metric;
  const sign = m.delta > 0 ? "+" : m.delta < 0 ? "−" : "±";
  const pts = Number((Math.abs(m.delta) * 100).toFixed(1));
  return `Δ p(${m.of?.label ?? ""}) = ${sign}${pts} point${pts === 1 ? "" : "s"} (${fmtPct(m.clean)} → ${fmtPct(m.ablated)})`;
}

/** Two maps as uint8 on one scale (0 … the larger maximum), so a weaker map looks weaker. */
export function sharedScale(a: ArrayLike<number>, b: ArrayLike<number>): [Uint8Array, Uint8Array] {
  let hi = 0;
  for (const m of [a, b]) for (let i = 0; i < m.length; i++) if (m[i] > hi) hi = m[i];
  const conv = (m: ArrayLike<number>) => {
    const out = new Uint8Array(m.length);
    for (let i = 0; i < m.length; i++) out[i] = hi > 0 ? Math.max(0, Math.min(255, Math.round((m[i] / hi) * 255))) : 0;
    return out;
  };
  return [conv(a), conv(b)];
}

export interface AblatePanel {
  el: HTMLElement;
  /** A tile was clicked: channel `ch` alone, or added/removed with `add` (shift-click). */
  pick(ch: number, add: boolean): void;
  /** Forget the picked channels and the last answer (a new layer). */
  reset(): void;
  chosen(): number[];
}

export function ablatePanel(model: AnyModel, layer: () => string, onError: (err: unknown) => void): AblatePanel {
  const el = h("div", { class: "nbd-ablate" });
  const picked = h("span", { class: "nbd-picked" });
  const out = h("div", { class: "nbd-ablate-out" });
  let chosen: number[] = [];
  let mode = "zero";
  const latest = new Latest();
  const modeSel = select([["zero", "zero"], ["mean", "mean"]], mode, "nbd-ablate-mode", (v) => {
    mode = v;
  });
  const go = h("button", { class: "nbd-ablate-go", text: "ablate", title: "re-run the first sample with these channels ablated", on: { click: () => void run() } });
  const clear = h("button", { class: "nbd-ablate-clear", text: "clear", on: { click: () => reset() } });
  replaceChildren(el, [h("span", { text: "ablate channels " }), picked, " ", modeSel, go, clear, out]);

  function show(): void {
    picked.textContent = chosen.length ? chosen.join(", ") : "(click a tile; shift-click adds)";
    (go as HTMLButtonElement).disabled = chosen.length === 0;
    el.setAttribute("data-channels", chosen.join(","));
  }

  function pick(ch: number, add: boolean): void {
    if (!add) chosen = [ch];
    else chosen = chosen.includes(ch) ? chosen.filter((c) => c !== ch) : [...chosen, ch].sort((a, b) => a - b);
    show();
  }

  function reset(): void {
    chosen = [];
    latest.cancel();
    replaceChildren(out, []);
    el.removeAttribute("data-delta");
    show();
  }

  function camCanvas(u8: Uint8Array, shape: number[], title: string): HTMLElement {
    const [hh, ww] = shape;
    const canvas = h("canvas", { attrs: { width: ww, height: hh } });
    const s = 128 / Math.max(hh, ww, 1);
    canvas.style.width = `${Math.round(ww * s)}px`;
    canvas.style.height = `${Math.round(hh * s)}px`;
    const ctx = canvas.getContext("2d");
    if (ctx) paintU8(u8, ww, hh, "inferno", ctx);
    return h("figure", { style: { margin: "0" } }, [canvas, h("figcaption", { text: title })]);
  }

  function render(r: AblationAnswer, arrays: Record<string, NdArray>): void {
    const [before, after] = sharedScale(arrays.cam_clean.data as ArrayLike<number>, arrays.cam.data as ArrayLike<number>);
    const tops = h("ol", {}, (r.top?.ablated ?? []).map((t) => h("li", { text: `${t.label}: ${fmtPct(t.p)}` })));
    const [{ layer, units }] = r.targets;
    const cam = r.cam ?? { layer: "", shape: arrays.cam.shape };
    replaceChildren(out, [
      h("div", { class: "nbd-delta", text: deltaText(r) }),
      h("div", { text: `${r.mode} ablation of ${layer} channel${units.length > 1 ? "s" : ""} ${units.join(", ")}; new top-5:` }),
      tops,
      h("div", { class: "nbd-cams" }, [
        camCanvas(before, cam.shape, `Grad-CAM (${cam.layer}) before`),
        camCanvas(after, cam.shape, "after ablation"),
      ]),
    ]);
    el.setAttribute("data-delta", String(r.metric.delta));
  }

  async function run(): Promise<void> {
    if (!chosen.length) return;
    const isLatest = latest.start();
    replaceChildren(out, [h("div", { text: "re-running…" })]);
    try {
      const answer = await askAblation(model, { kind: "channels", targets: [{ layer: layer(), units: chosen }], mode });
      if (!isLatest()) return;
      render(answer.result, answer.arrays);
    } catch (err) {
      if (!isLatest()) return;
      replaceChildren(out, [h("div", { class: "nbd-error", text: err instanceof Error ? err.message : String(err) })]);
      onError(err);
    }
  }

  show();
  return { el, pick, reset, chosen: () => chosen.slice() };
}
