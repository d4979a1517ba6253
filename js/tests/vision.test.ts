// @vitest-environment happy-dom
// The vision views with the shared select/colour-bar helpers: a Grad-CAM answer draws the colour
// bar with its peak, a "model was deleted" answer is shown as text in the view (not thrown), and
// call names (act#2) pass through the layer dropdowns unchanged.
import { afterEach, describe, expect, it } from "vitest";
import featuremaps from "../src/featuremaps";
import gradcam from "../src/gradcam";
import { FakeModel, f32View } from "./fakeModel";
import { mount, tick, unmountAll } from "./mount";

const GONE = "the model was deleted (or garbage-collected) after the cell ran; re-run the cell to inspect it again";

afterEach(unmountAll);

function camModel(): FakeModel {
  return new FakeModel({
    layers: ["act", "act#2"], layer: "act#2", auto_layer: "act#2", method: "gradcam", batch: 2, sample: 0, class_rank: 0,
    classes: [[{ index: 3, name: "cat", score: 2, prob: 0.7 }], [{ index: 1, name: "dog", score: 1, prob: 0.6 }]],
    opacity: 0.5, colormap: "inferno", notes: [], image_note: "",
  });
}

describe("Grad-CAM view", () => {
  it("draws the CAM's colour bar from 0 to its peak and keeps call names in the dropdown", async () => {
    const m = camModel();
    m.respond = (c) => ({
      msg: { type: "response", id: c.id, ok: true,
             result: { layer: c.params.layer, sample: 0, zero_grad: false, note: "", grid: "6×4×4", low_hw: [4, 4] },
             arrays: { cams: { dtype: "uint8", shape: [1, 2, 2], buffer: 0 }, peak: { dtype: "float32", shape: [1], buffer: 1 } } },
      buffers: [new DataView(new Uint8Array([0, 64, 128, 255]).buffer), f32View([0.25])],
    });
    const el = mount(gradcam.render as any, m);
    await tick();
    await tick();
    const root = el.querySelector(".nbdebug-gradcam") as HTMLElement;
    expect(root.getAttribute("data-ready")).toBe("1");
    expect(Array.from(el.querySelectorAll(".nbd-bar .nbd-ticks span")).map((s) => s.textContent)).toEqual(["0.25", "0"]);
    const layers = el.querySelector("select.nbd-layer") as HTMLSelectElement;
    expect(Array.from(layers.options).map((o) => [o.value, o.textContent])).toEqual([["act", "act"], ["act#2", "act#2 (auto)"]]);
    const sample = el.querySelector("select.nbd-sample") as HTMLSelectElement;
    expect(sample.disabled).toBe(false);
    sample.value = "1";
    sample.dispatchEvent(new Event("change"));
    expect(m.get("sample")).toBe(1);
  });

  it("leads with the headline and writes a class without a name as 'class N', not a bare id", async () => {
    const m = camModel();
    const HEAD = "gradcam on `act#2` for class 285 (#1, p 79%): 12% of the image is at half the map's peak or more.";
    m.set("headline", HEAD);
    m.set("classes", [[{ index: 285, name: "285", score: 2, prob: 0.79 }, { index: 3, name: "cat", score: 1, prob: 0.2 }], []]);
    m.respond = () => ({ msg: { type: "response", id: 0, ok: false, error: "no maps in this test" } });
    const el = mount(gradcam.render as any, m);
    await tick();
    const root = el.querySelector(".nbdebug-gradcam") as HTMLElement;
    // one grammar: the backticked layer as a code span (as the thermometer and compare write names)
    const first = Array.from(root.children).find((c) => c.tagName !== "STYLE")!;
    expect(first.textContent).toBe(HEAD.replace(/`/g, ""));
    expect(Array.from(first.querySelectorAll("code")).map((c) => c.textContent)).toEqual(["act#2"]);
    const cls = el.querySelector("select.nbd-class") as HTMLSelectElement;
    expect(Array.from(cls.options).map((o) => o.textContent)).toEqual(["1. class 285 (79%)", "2. cat (20%, #3)"]);
    m.set("headline", "gradcam on `act#2` for 'cat' (#2, p 20%): 30% of the image is at half the map's peak or more.");
    expect(root.querySelector(".nbd-headline")!.textContent).toContain("'cat' (#2, p 20%)");
  });

  it("shows a deleted model's message as text in the view", async () => {
    const m = camModel();
    m.respond = (c) => ({ msg: { type: "response", id: c.id, ok: false, error: GONE } });
    const el = mount(gradcam.render as any, m);
    await tick();
    await tick();
    expect((el.querySelector(".nbd-error") as HTMLElement).textContent).toBe(GONE);
    expect(m.get("js_error")).toBe(GONE);
    expect((el.querySelector(".nbdebug-gradcam") as HTMLElement).getAttribute("data-ready")).toBe("1");
  });
});

describe("feature grid", () => {
  it("opens the layer Python chose and enlarges a channel with a lo/mid/hi colour bar", async () => {
    const lay = (name: string) => ({ name, shape: [1, 2, 2, 2], channels: 2, height: 2, width: 2, layout: "2×2×2", samples: 1 });
    const m = new FakeModel({ layers: [lay("pad"), lay("act#2")], layer: "act#2", sample: 0, batch: 1, colormap: "viridis",
                              norm: "channel", sort: "index", selected: -1, notes: [] });
    m.respond = (c) => ({
      msg: { type: "response", id: c.id, ok: true,
             result: { layer: c.params.layer, start: 0, total: 2, height: 2, width: 2, page_size: 2, dead: 0, lo: -1, hi: 3, sort: "index" },
             arrays: {
               pixels: { dtype: "uint8", shape: [2, 2, 2], buffer: 0 }, channels: { dtype: "int32", shape: [2], buffer: 1 },
               lo: { dtype: "float32", shape: [2], buffer: 2 }, hi: { dtype: "float32", shape: [2], buffer: 3 },
               mean: { dtype: "float32", shape: [2], buffer: 4 }, sparsity: { dtype: "float32", shape: [2], buffer: 5 },
               dead: { dtype: "uint8", shape: [2], buffer: 6 },
             } },
      buffers: [new DataView(new Uint8Array(8).buffer), new DataView(new Int32Array([0, 1]).buffer), f32View([-1, 0]), f32View([1, 3]),
                f32View([0, 1]), f32View([0, 0.5]), new DataView(new Uint8Array(2).buffer)],
    });
    const el = mount(featuremaps.render as any, m);
    expect(m.sent.map((s) => s.content.params.layer)).toEqual(["act#2"]);
    await tick();
    await tick();
    const tiles = el.querySelectorAll(".nbd-tile");
    expect(tiles.length).toBe(2);
    (tiles[1] as HTMLElement).dispatchEvent(new Event("click"));
    expect(m.get("selected")).toBe(1);
    expect(Array.from(el.querySelectorAll(".nbd-big .nbd-ticks span")).map((s) => s.textContent)).toEqual(["3", "1.5", "0"]);
  });

  it("puts the flagged evidence in bold: the silent count and a silent channel's hover line", async () => {
    const lay = { name: "act", shape: [1, 2, 2, 2], channels: 2, height: 2, width: 2, layout: "2×2×2", samples: 1 };
    const HEADLINE = "`act`: 1 of 2 channels is silent on this input (every value 0): 0.";
    const m = new FakeModel({ layers: [lay], layer: "act", sample: 0, batch: 1, colormap: "viridis", norm: "channel", sort: "index", selected: -1, notes: [],
                              headline: HEADLINE });
    m.respond = (c) => ({
      msg: { type: "response", id: c.id, ok: true,
             result: { layer: "act", start: 0, total: 2, height: 2, width: 2, page_size: 2, dead: 1, lo: 0, hi: 3, sort: "index" },
             arrays: {
               pixels: { dtype: "uint8", shape: [2, 2, 2], buffer: 0 }, channels: { dtype: "int32", shape: [2], buffer: 1 },
               lo: { dtype: "float32", shape: [2], buffer: 2 }, hi: { dtype: "float32", shape: [2], buffer: 3 },
               mean: { dtype: "float32", shape: [2], buffer: 4 }, sparsity: { dtype: "float32", shape: [2], buffer: 5 },
               dead: { dtype: "uint8", shape: [2], buffer: 6 },
             } },
      buffers: [new DataView(new Uint8Array(8).buffer), new DataView(new Int32Array([0, 1]).buffer), f32View([0, 0]), f32View([0, 3]),
                f32View([0, 1]), f32View([1, 0.5]), new DataView(new Uint8Array([1, 0]).buffer)],
    });
    const el = mount(featuremaps.render as any, m);
    await tick();
    await tick();
    // the headline (Python's sentence) first, and it follows the trait
    const root = el.querySelector(".nbdebug-featuremaps")!;
    expect(Array.from(root.children).find((c) => c.tagName !== "STYLE")!.className).toBe("nbd-headline");
    expect(root.querySelector(".nbd-headline")!.textContent).toBe(HEADLINE.replace(/`/g, ""));
    expect(root.querySelector(".nbd-headline code")!.textContent).toBe("act");  // the layer name as code, as everywhere
    m.set("headline", "`act`: all 2 channels respond to sample 1; channel 1 peaks highest (max 3; 50% of all values are 0).");
    expect(root.querySelector(".nbd-headline")!.textContent).toContain("respond to sample 1");
    expect(Array.from(root.children).filter((c) => c.tagName !== "STYLE").map((c) => c.textContent).join(" ")).not.toContain("dead");
    const info = el.querySelector(".nbd-info")!;
    expect(info.textContent).toBe("act: 2×2×2 · channels 0–1 of 2 · 1 silent on this input · values 0 … 3");
    expect(info.querySelector(".nbd-flag")!.textContent).toBe("1 silent on this input");
    const dead = el.querySelector(".nbd-tile.nbd-dead") as HTMLElement;
    dead.dispatchEvent(new Event("mouseenter"));
    const hover = el.querySelector(".nbd-hover")!;
    expect(hover.textContent).toBe("channel 0: min 0, max 0, mean 0, zeros 100% (silent on this input: all zero)");
    expect(hover.querySelector(".nbd-flag")!.textContent).toBe("(silent on this input: all zero)");
    (el.querySelectorAll(".nbd-tile")[1] as HTMLElement).dispatchEvent(new Event("mouseenter"));
    expect(hover.querySelector(".nbd-flag")).toBeNull();
  });
});
