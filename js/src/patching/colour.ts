// The one "toward the answer" scale of the patching grid and the attribution view: white at 0,
// saturated blue at +1 (the patch restores the clean answer; the token pushes the answer over the wrong
// one), saturated red at −1 (the other way); |t| > 1 is clamped, NaN grey.
// nbdebug/widgets/patching.py's `diverging` is the same function (both static snapshots use it).
import { textOn } from "../lib/contrast";
import { fmt, h } from "../lib/dom";

export const POSITIVE: [number, number, number] = [33, 102, 172];
export const NEGATIVE: [number, number, number] = [178, 24, 43];
export const MISSING: [number, number, number] = [224, 224, 224];

/** RGB of an effect on the diverging scale. */
export function diverging(effect: number): [number, number, number] {
  if (!Number.isFinite(effect)) return MISSING;
  const t = Math.min(1, Math.abs(effect));
  const end = effect >= 0 ? POSITIVE : NEGATIVE;
  return end.map((c) => Math.round(255 + (c - 255) * t)) as [number, number, number];
}

/** CSS `rgb(…)` of an effect. */
export function cssOf(effect: number): string {
  const [r, g, b] = diverging(effect);
  return `rgb(${r}, ${g}, ${b})`;
}

/** Black or white text on the colour of `effect` (WCAG AA either way: textOn picks the better one). */
export function textFor(effect: number): string {
  const [r, g, b] = diverging(effect);
  const hex = (v: number) => v.toString(16).padStart(2, "0");
  return textOn(`#${hex(r)}${hex(g)}${hex(b)}`);
}

/** A horizontal colour bar from −1 to +1 with its ticks (a canvas, then the labels under it); `label`,
 * `title` and the three tick texts can be the attribution view's. */
export function divergingBar(width = 160, label = "effect",
                             title = "effect: 1 = the patch restores the clean metric, 0 = no change, −1 = the opposite",
                             ticks: [string, string, string] = [fmt(-1), "0", `+${fmt(1)}`]): HTMLElement {
  const canvas = h("canvas", { class: "nbp-bar", attrs: { width, height: 1 } });
  const ctx = canvas.getContext("2d");
  if (ctx) {
    const img = ctx.createImageData(width, 1);
    for (let x = 0; x < width; x++) {
      const [r, g, b] = diverging(-1 + (2 * x) / Math.max(1, width - 1));
      img.data.set([r, g, b, 255], x * 4);
    }
    ctx.putImageData(img, 0, 0);
  }
  const tickRow = h("div", { class: "nbp-ticks" }, ticks.map((t) => h("span", { text: t })));
  return h("div", { class: "nbp-colourbar", title }, [
    h("span", { class: "nbp-bar-label", text: label }),
    h("div", {}, [canvas, tickRow]),
  ]);
}
