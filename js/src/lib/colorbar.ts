// A vertical colour bar (the colormap, high end on top) with tick labels, shared by the views.
import { lut } from "./colormap";
import { fmt, h } from "./dom";

/** RGBA pixels of a 1-pixel-wide bar of `height` rows: row 0 is the colormap's top (t = 1). */
export function colourBarPixels(cmap: string, height = 256): Uint8ClampedArray {
  const table = lut(cmap);
  const rows = Math.max(1, Math.floor(height));
  const out = new Uint8ClampedArray(rows * 4);
  for (let y = 0; y < rows; y++) {
    const t = rows === 1 ? 255 : Math.round(255 - (y * 255) / (rows - 1));
    for (let c = 0; c < 4; c++) out[y * 4 + c] = table[t * 4 + c];
  }
  return out;
}

export interface ColourBarSize {
  /** CSS width of the bar itself, e.g. "12px". */
  width: string;
  /** CSS height of the bar and its ticks, e.g. "256px" (the image's height next to it). */
  height: string;
}

/** `div.nbd-bar`: the bar canvas and `div.nbd-ticks` with `ticks` top to bottom (numbers through fmt). */
export function colourBar(cmap: string, ticks: (number | string)[], size: ColourBarSize): HTMLElement {
  const canvas = h("canvas", { class: "nbd-colourbar", attrs: { width: 1, height: 256 }, style: { width: size.width, height: size.height } });
  const ctx = canvas.getContext("2d");
  if (ctx) {
    const img = ctx.createImageData(1, 256);
    img.data.set(colourBarPixels(cmap, 256));
    ctx.putImageData(img, 0, 0);
  }
  const labels = ticks.map((t) => h("span", { text: typeof t === "number" ? fmt(t) : t }));
  return h("div", { class: "nbd-bar", data: { colormap: cmap } }, [canvas, h("div", { class: "nbd-ticks", style: { height: size.height } }, labels)]);
}
