// The space beside the lens table for panels that act on the pinned cells (none yet). A panel is
// handed the pinned `[row, pos]` cells whenever they change; `.nbl-side` stays hidden while empty.
import { h } from "../lib/dom";

export interface LensPanel {
  /** Heading of the panel. */
  title: string;
  /** The panel's own content (model text only through textContent). */
  el: HTMLElement;
  /** Called with the pinned cells (`[row, pos]`, oldest first) at start and whenever they change. */
  update: (pinned: number[][]) => void;
}

export class SidePanels {
  readonly el = h("div", { class: "nbl-side" });

  constructor(private panels: LensPanel[]) {
    for (const p of panels) this.el.append(h("div", { class: "nbl-side-panel" }, [h("div", { class: "nbl-title", text: p.title }), p.el]));
  }

  update(pinned: number[][]): void {
    for (const p of this.panels) p.update(pinned);
  }
}
