// @vitest-environment happy-dom
import { describe, expect, it, vi } from "vitest";
import { colourBar, colourBarPixels } from "../src/lib/colorbar";
import { lut } from "../src/lib/colormap";
import { sampleSelect, select } from "../src/lib/select";

describe("select", () => {
  it("builds options as text, picks the value and reports changes", () => {
    const onChange = vi.fn();
    const s = select([["a#2", "<b>a</b> (2nd call)"], ["b", "b"]], "a#2", "nbd-layer", onChange);
    expect(s.className).toBe("nbd-layer");
    expect(s.value).toBe("a#2");
    const opts = Array.from(s.querySelectorAll("option"));
    expect(opts.map((o) => o.value)).toEqual(["a#2", "b"]);
    expect(opts[0].textContent).toBe("<b>a</b> (2nd call)"); // model text is never parsed
    expect(s.querySelector("b")).toBeNull();
    s.value = "b";
    s.dispatchEvent(new Event("change"));
    expect(onChange).toHaveBeenCalledWith("b");
  });

  it("offers one sample per batch item and is disabled for a single sample", () => {
    const onChange = vi.fn();
    const s = sampleSelect(3, 1, onChange);
    expect(Array.from(s.querySelectorAll("option")).map((o) => o.textContent)).toEqual(["sample 0", "sample 1", "sample 2"]);
    expect(s.value).toBe("1");
    expect(s.disabled).toBe(false);
    s.value = "2";
    s.dispatchEvent(new Event("change"));
    expect(onChange).toHaveBeenCalledWith(2);
    expect(sampleSelect(1, 0, onChange).disabled).toBe(true);
  });
});

describe("colour bar", () => {
  it("puts the colormap's top on the first row and its bottom on the last", () => {
    const table = lut("viridis");
    const px = colourBarPixels("viridis", 256);
    expect(px.length).toBe(256 * 4);
    expect(Array.from(px.slice(0, 4))).toEqual(Array.from(table.slice(255 * 4, 256 * 4)));
    expect(Array.from(px.slice(255 * 4))).toEqual(Array.from(table.slice(0, 4)));
    const small = colourBarPixels("gray", 3); // top, middle, bottom
    const gray = lut("gray");
    expect([small[0], small[4], small[8]]).toEqual([gray[255 * 4], gray[128 * 4], gray[0]]);
  });

  it("labels the ticks top to bottom, numbers formatted", () => {
    const bar = colourBar("magma", [6.0001, "mid", 0], { width: "12px", height: "200px" });
    expect(bar.className).toBe("nbd-bar");
    expect(Array.from(bar.querySelectorAll(".nbd-ticks span")).map((s) => s.textContent)).toEqual(["6", "mid", "0"]);
    const canvas = bar.querySelector("canvas") as HTMLCanvasElement;
    expect(canvas.style.width).toBe("12px");
    expect((bar.querySelector(".nbd-ticks") as HTMLElement).style.height).toBe("200px");
  });
});
