// Colour contrast (WCAG 2.x): relative luminance, contrast ratios, and the text colour that reads on
// a given background. The views pick chip text colours with it; the browser tests hold every text
// node to AA (4.5:1) with their own measurement of the rendered colours.
//
//   textOn("#ff7f0e")  → "#000000"  (8.6:1; white would be 2.4:1)

export type RGBA = [number, number, number, number];

/** "#rgb", "#rrggbb", "#rrggbbaa", "rgb(…)" / "rgba(…)" → [r, g, b, a] (0–255, alpha 0–1); null otherwise. */
export function parseColor(c: string): RGBA | null {
  const s = String(c ?? "").trim().toLowerCase();
  let m = /^#([0-9a-f]{3})$/.exec(s);
  if (m) return [0, 1, 2].map((i) => parseInt(m![1][i] + m![1][i], 16)).concat(1) as RGBA;
  m = /^#([0-9a-f]{6})([0-9a-f]{2})?$/.exec(s);
  if (m) {
    const rgb = [0, 2, 4].map((i) => parseInt(m![1].slice(i, i + 2), 16));
    return [rgb[0], rgb[1], rgb[2], m[2] ? parseInt(m[2], 16) / 255 : 1];
  }
  m = /^rgba?\(\s*([\d.]+)[,\s]+([\d.]+)[,\s]+([\d.]+)(?:\s*[,/]\s*([\d.]+%?))?\s*\)$/.exec(s);
  if (m) {
    const a = m[4] === undefined ? 1 : m[4].endsWith("%") ? parseFloat(m[4]) / 100 : parseFloat(m[4]);
    return [Number(m[1]), Number(m[2]), Number(m[3]), a];
  }
  return null;
}

/** `fg` (with its alpha) drawn over the opaque `bg`. */
export function composite(fg: RGBA, bg: RGBA): RGBA {
  const a = fg[3];
  return [0, 1, 2].map((i) => fg[i] * a + bg[i] * (1 - a)).concat(1) as RGBA;
}

/** WCAG relative luminance of an opaque colour. */
export function luminance(c: RGBA): number {
  const lin = (v: number) => {
    const x = v / 255;
    return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4);
  };
  return 0.2126 * lin(c[0]) + 0.7152 * lin(c[1]) + 0.0722 * lin(c[2]);
}

/** The contrast ratio (1–21) of text `fg` on background `bg` (bg opaque; fg composited over it). */
export function contrast(fg: RGBA, bg: RGBA): number {
  const f = luminance(composite(fg, bg));
  const b = luminance(bg);
  return (Math.max(f, b) + 0.05) / (Math.min(f, b) + 0.05);
}

/** Black or white, whichever reads better on the opaque colour `bg` (white on an unparsable one). */
export function textOn(bg: string): "#000000" | "#ffffff" {
  const c = parseColor(bg);
  if (!c) return "#ffffff";
  const o = composite(c, [255, 255, 255, 1]);
  return contrast([0, 0, 0, 1], o) >= contrast([255, 255, 255, 1], o) ? "#000000" : "#ffffff";
}

export type RGB = [number, number, number];

/** Contrast ratio (1–21) between two opaque colours; WCAG AA asks ≥ 4.5 for normal text. */
export function contrastRatio(a: RGB, b: RGB): number {
  return contrast([...a, 1], [...b, 1]);
}

/** Pure black or pure white, whichever contrasts more with `bg` (never below 4.58:1 on any colour). */
export function textColourOn(bg: RGB): "#000" | "#fff" {
  return contrastRatio(bg, [0, 0, 0]) >= contrastRatio(bg, [255, 255, 255]) ? "#000" : "#fff";
}
