// A box with a max-height never hides content silently (issue 27: overlay scrollbars draw nothing
// until scrolled, so a cut list looks complete). While the box's content is taller than the box, a
// cue right after it says how many of its items are below the fold ("12 more rows ▾"); a click shows
// them all (the max-height lifted), another folds the box back ("show fewer ▴"). The cue carries
// `data-more`: the browser tier's scroll-box check (tests/browser/scrollboxes.py) accepts a box
// that hides content only when such a cue is visible beside it.
import { h } from "./dom";

export const MORE_CSS = `
.nbd-more { display: block; margin: 2px 0 4px; padding: 1px 8px; font: inherit; font-size: 0.9em; cursor: pointer;
  color: var(--jp-content-link-color, #1a5fb4); background: none; border: 1px solid currentColor; border-radius: 3px; }
.nbd-more[hidden] { display: none; }
.nbd-unfolded { max-height: none !important; }
`;

export class MoreCue {
  readonly el: HTMLButtonElement;
  private open = false;
  private queued = false;
  private readonly observers: { disconnect(): void }[] = [];

  /** `box`: the element with a max-height; `items`: selector of the rows counted inside it; `noun`:
   * what one is ("row", "event"; an "s" is added for several). Insert `el` right after `box`. */
  constructor(private readonly box: HTMLElement, private readonly items: string, private readonly noun: string) {
    this.el = h("button", {
      class: "nbd-more", attrs: { type: "button", "data-more": "", hidden: true },
      on: { click: () => { this.open = !this.open; this.update(); } },
    }) as HTMLButtonElement;
    box.addEventListener("scroll", this.schedule, { passive: true });
    const g = globalThis as any;
    if (typeof g.ResizeObserver === "function") {
      const ro = new g.ResizeObserver(this.schedule);
      ro.observe(box);
      this.observers.push(ro);
    }
    if (typeof g.MutationObserver === "function") {
      const mo = new g.MutationObserver(this.schedule);
      mo.observe(box, { childList: true, subtree: true, attributes: true, attributeFilter: ["style", "hidden"] });
      this.observers.push(mo);
    }
  }

  private readonly schedule = (): void => {
    if (this.queued) return;
    this.queued = true;
    const run = () => { this.queued = false; this.update(); };
    if (typeof requestAnimationFrame === "function") requestAnimationFrame(run);
    else setTimeout(run, 0);
  };

  /** Show, word or hide the cue for the box as it is now laid out. */
  update(): void {
    this.box.classList.toggle("nbd-unfolded", this.open);
    const over = this.box.scrollHeight > this.box.clientHeight + 1;
    if (this.open) {
      this.el.textContent = "show fewer ▴";
      this.el.hidden = false;
      return;
    }
    if (!over) {
      this.el.hidden = true;
      return;
    }
    const bottom = this.box.getBoundingClientRect().bottom;
    let below = 0;
    for (const it of Array.from(this.box.querySelectorAll(this.items))) {
      const r = it.getBoundingClientRect();
      if (r.height > 0 && r.bottom > bottom + 1) below++;
    }
    this.el.textContent = below ? `${below} more ${below === 1 ? this.noun : `${this.noun}s`} ▾` : "show all ▾";
    this.el.hidden = false;
  }

  dispose(): void {
    this.box.removeEventListener("scroll", this.schedule);
    for (const o of this.observers) o.disconnect();
  }
}
