// Legends shared by the views: a horizontal colour bar with tick labels (the low end on the left),
// and legend entries (a swatch styled like the mark it explains, then its meaning). Text only via
// textContent; include LEGEND_CSS in the view's <style>.
import { lut } from "./colormap";
import { h } from "./dom";

export const LEGEND_CSS = `
.nbd-hbar { display: inline-flex; flex-direction: column; gap: 1px; vertical-align: middle; }
.nbd-hbar canvas { display: block; height: 10px; border: 1px solid #767676; image-rendering: pixelated; }
.nbd-hbar .nbd-hticks { position: relative; height: 14px; font-size: 10px; line-height: 14px; color: #333; }
.nbd-hbar .nbd-hticks span { position: absolute; white-space: nowrap; transform: translateX(-50%); }
.nbd-hbar .nbd-hticks span.nbd-first { transform: none; }
.nbd-hbar .nbd-hticks span.nbd-last { transform: translateX(-100%); }
.nbd-hbar .nbd-htitle { font-size: 11px; color: #333; }
.nbd-legend { display: inline-flex; align-items: center; gap: 4px; white-space: normal; }
.nbd-swatch { display: inline-block; width: 14px; height: 12px; box-sizing: border-box; flex: none; }
`;

export interface Tick {
  /** Position along the bar, 0 (left, the colormap's low end) to 1. */
  at: number;
  text: string;
}

/** RGBA pixels of a 1-pixel-high bar `width` wide: column 0 is the colormap's low end (t = 0). */
export function hBarPixels(cmap: string, width = 256): Uint8ClampedArray {
  const table = lut(cmap);
  const cols = Math.max(1, Math.floor(width));
  const out = new Uint8ClampedArray(cols * 4);
  for (let x = 0; x < cols; x++) {
    const t = cols === 1 ? 0 : Math.round((x * 255) / (cols - 1));
    for (let c = 0; c < 4; c++) out[x * 4 + c] = table[t * 4 + c];
  }
  return out;
}

/** `div.nbd-hbar`: an optional title, the bar (`width` CSS pixels) and its tick labels under it. */
export function hColourBar(cmap: string, ticks: Tick[], width: number, title = ""): HTMLElement {
  const canvas = h("canvas", { class: "nbd-hcanvas", attrs: { width: 256, height: 1 }, style: { width: `${width}px` } });
  const ctx = canvas.getContext("2d");
  if (ctx) {
    const img = ctx.createImageData(256, 1);
    img.data.set(hBarPixels(cmap, 256));
    ctx.putImageData(img, 0, 0);
  }
  const labels = ticks.map((t, i) =>
    h("span", {
      class: i === 0 && t.at <= 0.05 ? "nbd-first" : i === ticks.length - 1 && t.at >= 0.95 ? "nbd-last" : "",
      text: t.text,
      style: { left: `${Math.max(0, Math.min(1, t.at)) * width}px` },
    }),
  );
  return h("div", { class: "nbd-hbar", data: { colormap: cmap } }, [
    title ? h("div", { class: "nbd-htitle", text: title }) : null,
    canvas,
    h("div", { class: "nbd-hticks", style: { width: `${width}px` } }, labels),
  ]);
}

/** `span.nbd-legend`: a swatch (given classes and inline style, so it looks like the mark) and its text. */
export function legendItem(swatchClass: string, text: string, style: Record<string, string> = {}): HTMLElement {
  return h("span", { class: "nbd-legend" }, [h("span", { class: ["nbd-swatch", swatchClass], style }), h("span", { text })]);
}
