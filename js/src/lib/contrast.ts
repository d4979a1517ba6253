// WCAG 2 contrast: relative luminance of sRGB colours, the contrast ratio of two colours, and the
// text colour (black or white) that reads best on a background. Shared by views that colour cells.

export type RGB = [number, number, number];

/** WCAG relative luminance of an sRGB colour with channels 0–255. */
export function luminance([r, g, b]: RGB): number {
  const lin = (c: number) => {
    const s = c / 255;
    return s <= 0.04045 ? s / 12.92 : Math.pow((s + 0.055) / 1.055, 2.4);
  };
  return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
}

/** Contrast ratio (1–21) between two colours; WCAG AA asks ≥ 4.5 for normal text. */
export function contrastRatio(a: RGB, b: RGB): number {
  const la = luminance(a);
  const lb = luminance(b);
  return (Math.max(la, lb) + 0.05) / (Math.min(la, lb) + 0.05);
}

/** Pure black or pure white, whichever contrasts more with `bg` (never below 4.58:1 on any colour). */
export function textColourOn(bg: RGB): "#000" | "#fff" {
  return contrastRatio(bg, [0, 0, 0]) >= contrastRatio(bg, [255, 255, 255]) ? "#000" : "#fff";
}
