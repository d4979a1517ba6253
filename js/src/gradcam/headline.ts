// The Grad-CAM view's headline: the `headline` trait (computed in Python: nbdebug/inspectors/
// gradcam.py overlay_headline for one method; the CAM panel's verdict with several), shown first and
// following the trait. Text only (class names are model text).
import { h } from "../lib/dom";
import type { AnyModel } from "../lib/rpc";

export function headlineLine(model: AnyModel): { el: HTMLElement; dispose: () => void } {
  const el = h("div", { class: "nbd-headline", text: String(model.get("headline") ?? "") });
  const on = () => {
    el.textContent = String(model.get("headline") ?? "");
    el.style.display = el.textContent ? "" : "none";
  };
  on();
  model.on("change:headline", on);
  return { el, dispose: () => model.off("change:headline", on) };
}

/** A class as the view writes it: its name, or "class 285" when the name is only the index. */
export function classLabel(name: string, index: number): string {
  return String(name) === String(index) ? `class ${index}` : name;
}
