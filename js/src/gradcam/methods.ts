// The CAM methods side by side: one small overlay per method (same class, colormap and opacity as
// the large one); clicking one shows it large. Method names and flags are set as text.
import { h, replaceChildren } from "../lib/dom";
import { paint } from "./overlay";

export interface Multiples {
  /** The strip's element (empty with a single method). */
  el: HTMLElement;
  /** Redraw every small multiple: `cams(m)` is method m's H×W uint8 CAM of the shown class. */
  draw(image: Uint8Array | null, cams: (m: number) => Uint8Array, width: number, height: number, cmap: string, alpha: number): void;
  /** Mark the method shown large. */
  focus(method: string): void;
}

/** Small multiples of `methods`; `flags[m]` a short warning under method m's name; `onPick(method)` on click. */
export function multiples(methods: string[], flags: Record<string, string>, onPick: (method: string) => void): Multiples {
  const el = h("div", { class: "nbd-methods" });
  const canvases: HTMLCanvasElement[] = [];
  const cells: HTMLElement[] = [];
  if (methods.length > 1) {
    replaceChildren(el, methods.map((m) => {
      const canvas = h("canvas", { class: "nbd-thumb", attrs: { width: 1, height: 1 }, data: { method: m } });
      canvases.push(canvas);
      const cell = h("button", { class: "nbd-method", attrs: { type: "button" }, data: { method: m }, on: { click: () => onPick(m) } },
        [canvas, h("span", { class: "nbd-method-name", text: m }), flags[m] ? h("span", { class: "nbd-flag", text: flags[m] }) : null]);
      cells.push(cell);
      return cell;
    }));
  }
  return {
    el,
    draw(image, cams, width, height, cmap, alpha) {
      canvases.forEach((c, i) => paint(c, image, cams(i), width, height, cmap, alpha, 150, 110));
    },
    focus(method) {
      cells.forEach((c) => c.classList.toggle("nbd-focus", c.getAttribute("data-method") === method));
    },
  };
}
