// @vitest-environment happy-dom
// Click-to-test in the existing views (issue 20): a feature-map tile picks a channel (shift-click adds),
// "ablate" sends the layer/channels/mode and shows the kernel's Δ p, new top-5 (labels as text) and
// the CAMs before/after; a thermometer row's "ablate" shows Δ loss, or Δ output with the kernel's note.
import { afterEach, describe, expect, it } from "vitest";
import featuremaps from "../src/featuremaps";
import { deltaText, sharedScale } from "../src/featuremaps/ablate";
import type { AblationAnswer } from "../src/lib/ablation";
import { AblateRow, rowAblationText } from "../src/thermometer/ablate";
import { FakeModel, f32View } from "./fakeModel";
import { mount, tick, unmountAll } from "./mount";

afterEach(unmountAll);

const PAGE = {
  result: { layer: "conv", start: 0, total: 3, height: 2, width: 2, page_size: 3, dead: 0, lo: 0, hi: 1, sort: "index" },
  arrays: {
    pixels: { dtype: "uint8", shape: [3, 2, 2], buffer: 0 }, channels: { dtype: "int32", shape: [3], buffer: 1 },
    lo: { dtype: "float32", shape: [3], buffer: 2 }, hi: { dtype: "float32", shape: [3], buffer: 3 },
    mean: { dtype: "float32", shape: [3], buffer: 4 }, sparsity: { dtype: "float32", shape: [3], buffer: 5 },
    dead: { dtype: "uint8", shape: [3], buffer: 6 },
  },
};
const RESULT: AblationAnswer = {
  kind: "channels", targets: [{ layer: "conv", units: [0, 2] }], mode: "mean",
  metric: { label: "p(<b>cat</b>)", kind: "p", clean: 0.5, ablated: 0.25, delta: -0.25, of: { id: 4, label: "<b>cat</b>" } },
  top: { ablated: [{ id: 1, label: "<i>dog</i>", p: 0.4 }, { id: 4, label: "<b>cat</b>", p: 0.25 }], clean: [] },
  note: "", seconds: 0.01, cam: { layer: "act", shape: [2, 2] },
};

function fmModel(can: boolean): FakeModel {
  const lay = { name: "conv", shape: [1, 3, 2, 2], channels: 3, height: 2, width: 2, layout: "3×2×2", samples: 1 };
  const m = new FakeModel({ layers: [lay], layer: "conv", sample: 0, batch: 1, colormap: "viridis", norm: "channel", sort: "index",
                            selected: -1, notes: [], can_ablate: can });
  m.respond = (c) => c.method === "page"
    ? { msg: { type: "response", id: c.id, ok: true, ...PAGE },
        buffers: [new DataView(new Uint8Array(12).buffer), new DataView(new Int32Array([0, 1, 2]).buffer), f32View([0, 0, 0]), f32View([1, 1, 1]),
                  f32View([0.5, 0.5, 0.5]), f32View([0, 0, 0]), new DataView(new Uint8Array(3).buffer)] }
    : { msg: { type: "response", id: c.id, ok: true, result: RESULT,
               arrays: { cam: { dtype: "float32", shape: [2, 2], buffer: 0 }, cam_clean: { dtype: "float32", shape: [2, 2], buffer: 1 } } },
        buffers: [f32View([0, 0.1, 0.2, 0.3]), f32View([0, 0.5, 1, 0.5])] };
  return m;
}

describe("feature-map channel ablation", () => {
  it("click picks, shift-click adds, ablate sends them and shows Δ p, top-5 and both CAMs", async () => {
    const m = fmModel(true);
    const el = mount(featuremaps.render as any, m);
    await tick();
    await tick();
    const tiles = el.querySelectorAll(".nbd-tile");
    (tiles[1] as HTMLElement).dispatchEvent(new MouseEvent("click"));
    (tiles[0] as HTMLElement).dispatchEvent(new MouseEvent("click"));
    (tiles[2] as HTMLElement).dispatchEvent(new MouseEvent("click", { shiftKey: true }));
    const panel = el.querySelector(".nbd-ablate") as HTMLElement;
    expect(panel.getAttribute("data-channels")).toBe("0,2");
    const mode = panel.querySelector("select.nbd-ablate-mode") as HTMLSelectElement;
    mode.value = "mean";
    mode.dispatchEvent(new Event("change"));
    (panel.querySelector(".nbd-ablate-go") as HTMLButtonElement).click();
    await tick();
    await tick();
    const sent = m.sent.map((s) => s.content).filter((c) => c.method === "ablate");
    expect(sent.map((c) => c.params)).toEqual([{ kind: "channels", targets: [{ layer: "conv", units: [0, 2] }], mode: "mean" }]);
    expect(panel.querySelector(".nbd-delta")!.textContent).toBe("Δ p(<b>cat</b>) = −25 points (50% → 25%)");
    expect(panel.querySelectorAll("b, i").length).toBe(0); // model text stays text
    expect(Array.from(panel.querySelectorAll("ol li")).map((li) => li.textContent)).toEqual(["<i>dog</i>: 40%", "<b>cat</b>: 25%"]);
    expect(panel.querySelectorAll(".nbd-cams canvas").length).toBe(2);
    expect(panel.getAttribute("data-delta")).toBe("-0.25");
    (panel.querySelector(".nbd-ablate-clear") as HTMLButtonElement).click();
    expect(panel.getAttribute("data-channels")).toBe("");
    expect(panel.querySelector(".nbd-delta")).toBeNull();
  });

  it("has no ablate panel when the kernel kept no model call", async () => {
    const el = mount(featuremaps.render as any, fmModel(false));
    await tick();
    expect(el.querySelector(".nbd-ablate")).toBeNull();
  });

  it("puts both maps on one scale and signs the delta", () => {
    const [a, b] = sharedScale([0, 0.5], [0, 1]);
    expect(Array.from(a)).toEqual([0, 128]);
    expect(Array.from(b)).toEqual([0, 255]);
    expect(deltaText({ ...RESULT, metric: { ...RESULT.metric, delta: 0.125, ablated: 0.625 } })).toBe("Δ p(<b>cat</b>) = +12.5 points (50% → 63%)");
  });
});

describe("thermometer row ablation", () => {
  it("ablates the selected row's module and shows Δ loss", async () => {
    const m = new FakeModel({ can_ablate: true });
    m.respond = (c) => ({ msg: { type: "response", id: c.id, ok: true,
                                 result: { kind: "modules", targets: c.params.targets, mode: c.params.mode, top: null, note: "", seconds: 0.01,
                                           metric: { label: "loss", kind: "loss", clean: 1, ablated: 1.5, delta: 0.5, of: null } } } });
    const row = new AblateRow(m);
    document.body.appendChild(row.el);
    expect(row.el.style.display).toBe("none");
    row.show("net.<2>");
    expect(row.el.style.display).toBe("");
    expect(row.el.querySelector(".nbd-ablate-row")!.textContent).toBe("net.<2>");
    (row.el.querySelector(".nbd-ablate-go") as HTMLButtonElement).click();
    await tick();
    await tick();
    expect(m.sent[0].content.params).toEqual({ kind: "modules", targets: [{ layer: "net.<2>", units: [] }], mode: "zero" });
    expect(row.el.querySelector(".nbd-delta")!.textContent).toBe("Δ loss = +0.5 (1 → 1.5)");
    expect(row.el.getAttribute("data-delta")).toBe("0.5");
    row.show("other");
    expect(row.el.querySelector(".nbd-delta")).toBeNull();
    row.el.remove();
  });

  it("says when it shows the output's change instead of the loss", () => {
    const r: AblationAnswer = { kind: "modules", targets: [{ layer: "fc", units: [] }], mode: "zero", top: null, seconds: 0.01,
                                metric: { label: "mean |logits|", kind: "output", clean: 1, ablated: 0.5, delta: 0.25, of: null }, agreement: 0.8, note: "no loss" };
    expect(rowAblationText(r)).toBe("mean |Δ logits| = 0.25, top-1 agrees on 80%");
    expect(new AblateRow(new FakeModel({ can_ablate: false })).el.style.display).toBe("none");
  });
});
