// @vitest-environment happy-dom
// The "N more ▾" cue of a box with a max-height (lib/more.ts): layout is faked (happy-dom has none).
import { describe, expect, it } from "vitest";
import { h } from "../src/lib/dom";
import { MoreCue } from "../src/lib/more";

function box(bottoms: number[], clientHeight = 100): HTMLElement {
  const items = bottoms.map((b) => {
    const li = h("li", { text: `item ${b}` });
    li.getBoundingClientRect = () => ({ bottom: b, top: b - 20, height: 20 }) as DOMRect;
    return li;
  });
  const el = h("ul", {}, items);
  Object.defineProperty(el, "scrollHeight", { value: Math.max(...bottoms, 0) });
  Object.defineProperty(el, "clientHeight", { value: clientHeight });
  el.getBoundingClientRect = () => ({ bottom: clientHeight, top: 0, height: clientHeight }) as DOMRect;
  return el;
}

describe("MoreCue", () => {
  it("counts the items below the fold, in the singular for one", () => {
    const many = new MoreCue(box([40, 80, 140, 200]), ":scope > li", "event");
    many.update();
    expect(many.el.hidden).toBe(false);
    expect(many.el.textContent).toBe("2 more events ▾");
    expect(many.el.hasAttribute("data-more")).toBe(true);
    const one = new MoreCue(box([40, 80, 140]), ":scope > li", "row");
    one.update();
    expect(one.el.textContent).toBe("1 more row ▾");
  });

  it("is hidden when the content fits, and a click unfolds the box and folds it back", () => {
    const fits = new MoreCue(box([40, 80]), ":scope > li", "row");
    fits.update();
    expect(fits.el.hidden).toBe(true);
    const b = box([40, 80, 140]);
    const cue = new MoreCue(b, ":scope > li", "row");
    cue.update();
    cue.el.dispatchEvent(new Event("click"));
    expect(b.classList.contains("nbd-unfolded")).toBe(true);
    expect(cue.el.textContent).toBe("show fewer ▴");
    cue.el.dispatchEvent(new Event("click"));
    expect(b.classList.contains("nbd-unfolded")).toBe(false);
    expect(cue.el.textContent).toBe("1 more row ▾");
    cue.dispose();
  });
});
