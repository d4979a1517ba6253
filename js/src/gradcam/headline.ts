// The Grad-CAM view's headline: the `headline` trait (computed in Python: nbdebug/inspectors/
// gradcam.py overlay_headline for one method; the CAM panel's verdict with several), shown first and
// following the trait. Text nodes only (class names are model text).
import { h, replaceChildren, withCode } from "../lib/dom";
import { Listeners } from "../lib/request";
import type { AnyModel } from "../lib/rpc";

export function headlineLine(model: AnyModel): { el: HTMLElement; dispose: () => void } {
  const el = h("div", { class: "nbd-headline" });
  const on = () => {
    const text = String(model.get("headline") ?? "");
    replaceChildren(el, withCode(text));  // `layer` as a code span, as every view writes names
    el.style.display = text ? "" : "none";
  };
  on();
  const listeners = new Listeners();
  listeners.model(model, "change:headline", on);
  return { el, dispose: () => listeners.dispose() };
}

/** A class as the view writes it: its name, or "class 285" when the name is only the index. */
export function classLabel(name: string, index: number): string {
  return String(name) === String(index) ? `class ${index}` : name;
}
