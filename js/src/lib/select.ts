// <select> helpers shared by the views (Grad-CAM, feature maps): option labels are model text
// (layer and class names), so they only ever go through textContent (see dom.ts).
import { h } from "./dom";

/** A <select> with `options` as [value, label] pairs, `value` chosen, `onChange(value)` on change. */
export function select(options: [string, string][], value: string, cls: string, onChange: (v: string) => void): HTMLSelectElement {
  const s = h("select", { class: cls, on: { change: () => onChange(s.value) } });
  for (const [v, label] of options) s.appendChild(h("option", { attrs: { value: v }, text: label }));
  s.value = value;
  return s;
}

/** The "sample i" chooser of a batch (disabled when there is only one sample). */
export function sampleSelect(batch: number, value: number, onChange: (sample: number) => void): HTMLSelectElement {
  const n = Math.max(1, Math.floor(batch));
  const s = select(Array.from({ length: n }, (_, i) => [String(i), `sample ${i}`] as [string, string]), String(value), "nbd-sample", (v) => onChange(Number(v)));
  s.disabled = n <= 1;
  return s;
}
