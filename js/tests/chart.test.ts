// @vitest-environment happy-dom
// lib/chart.ts (the loss curve and the compare view's charts) and lib/contrast.ts (chip text colours):
// the readout at the cursor and under the pointer, the log toggle redrawing, marks by step, a click
// picking a step; WCAG contrast ratios against known values.
import { afterEach, describe, expect, it } from "vitest";
import { Chart, nearest, stepColumns } from "../src/lib/chart";
import { contrast, parseColor, textOn } from "../src/lib/contrast";

afterEach(() => document.body.replaceChildren());

const steps = [1, 2, 3, 4];
const loss = [10, 5, 3.3333, 2.5];

describe("chart", () => {
  it("maps steps, columns and the nearest kept step", () => {
    expect(nearest([1, 5, 10], 6)).toBe(1);
    expect(nearest([1, 5, 10], 9)).toBe(2);
    expect(nearest([], 3)).toBe(-1);
    const cols = stepColumns({ label: "a", steps: [1, 2, 3], y: [1, NaN, 3] }, (s) => s * 100, (v) => v);
    expect(cols.map((c) => [c.x, c.y])).toEqual([[100, 1], [200, NaN], [300, 3]]);
  });

  it("reads out the cursor's value, then the one under the pointer; toggles a log scale; picks a step", () => {
    let picked = 0;
    const c = new Chart({ name: "loss", onPick: (s) => (picked = s) });
    document.body.appendChild(c.el);
    c.update([{ label: "loss", steps, y: loss }], { cursor: 4, marks: [{ step: 3, cls: "nbd-mark-nan", title: "first NaN" }] });
    const readout = c.el.querySelector(".nbd-chart-readout")!;
    expect(readout.textContent).toBe("loss 2.5 at step 4");
    expect(c.el.querySelector(".nbd-chart-mark")!.getAttribute("data-step")).toBe("3");
    expect(c.el.querySelector(".nbd-chart-ymax")!.textContent).toBe("10");
    expect(c.el.querySelector(".nbd-chart-x0")!.textContent).toBe("step 1");
    c.hover(2);
    expect(readout.textContent).toBe("loss 5 at step 2");
    expect(c.el.querySelector("line.nbd-chart-hover")).not.toBeNull();
    c.hover(NaN);
    expect(readout.textContent).toBe("loss 2.5 at step 4");
    const svg = c.el.querySelector("svg")!;
    const linear = svg.querySelector("path.nbd-chart-line")!.getAttribute("d");
    const box = c.el.querySelector("input.nbd-chart-log") as HTMLInputElement;
    box.checked = true;
    box.dispatchEvent(new Event("change"));
    expect(svg.getAttribute("data-scale")).toBe("log");
    expect(svg.querySelector("path.nbd-chart-line")!.getAttribute("d")).not.toBe(linear);
    // a click: the step under the pointer (the SVG spans 600 px here)
    svg.getBoundingClientRect = () => ({ left: 0, top: 0, width: 600, height: 80, right: 600, bottom: 80, x: 0, y: 0, toJSON: () => ({}) });
    svg.dispatchEvent(new MouseEvent("click", { clientX: 2 + (2 / 3) * 596 }));
    expect(picked).toBe(3);
    c.destroy();
  });

  it("reads out every series of a comparison at one step", () => {
    const c = new Chart({ name: "loss" });
    c.update([{ label: "a", steps, y: loss }, { label: "b", steps: [1, 2, 4], y: [10, 6, 3] }]);
    expect(c.valuesAt(2)).toBe("step 2: a 5 · b 6");
    expect(c.valuesAt(3)).toBe("step 3: a 3.333 · b NaN"); // b did not keep step 3
  });
});

describe("contrast", () => {
  it("computes WCAG ratios and picks a readable text colour", () => {
    expect(contrast([0, 0, 0, 1], [255, 255, 255, 1])).toBeCloseTo(21, 5);
    expect(contrast(parseColor("#777777")!, [255, 255, 255, 1])).toBeCloseTo(4.48, 2);
    expect(contrast(parseColor("rgba(0, 0, 0, 0.54)")!, parseColor("#eeeeee")!)).toBeLessThan(4.5); // JupyterLab's grey on grey
    expect(parseColor("#abc")).toEqual([170, 187, 204, 1]);
    expect(parseColor("nonsense")).toBeNull();
    expect(textOn("#ff7f0e")).toBe("#000000");
    expect(textOn("#7f0000")).toBe("#ffffff");
    expect(textOn("#969696")).toBe("#000000");
  });
});
