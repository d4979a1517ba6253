// @vitest-environment happy-dom
// The Grad-CAM view with several methods, --faithfulness and --sanity: one small multiple per method
// (a click shows it large and syncs `method`), the ranking table and one chart per metric from the
// float32 curves, the sanity flags; model text (class names, layer names) stays text.
import { afterEach, describe, expect, it } from "vitest";
import gradcam from "../src/gradcam";
import { curvePoints, rankTable } from "../src/gradcam/checks";
import { FakeModel, f32View } from "./fakeModel";
import { mount, tick, unmountAll } from "./mount";

afterEach(unmountAll);

const HOSTILE = "<img src=x onerror=window.__pwned=1>";

function model(): FakeModel {
  return new FakeModel({
    layers: ["act"], layer: "act", auto_layer: "act", method: "gradcam", methods: ["gradcam", "eigencam"], batch: 1, sample: 0,
    class_rank: 0, classes: [[{ index: 3, name: HOSTILE, score: 2, prob: 0.7 }]], opacity: 0.5, colormap: "inferno", notes: [],
    image_note: "", sanity_threshold: 0.9,
    headline: "gradcam is the most faithful of the methods that pass the sanity check; eigencam fails it",
    ranks: [{ method: "gradcam", rank: 1, tied: [], failed: false, score: 0.15, rho: 0.31 },
            { method: "eigencam", rank: 2, tied: [], failed: true, score: 0.8, rho: 1.0 }],
    faithfulness: { ranking: ["gradcam", "eigencam"], target: 3, target_name: HOSTILE, lower_is_better: ["deletion", "road_morf"],
                    auc: { gradcam: { deletion: 0.4, insertion: 0.5, road_morf: 0.45, road_lerf: 0.5 },
                           eigencam: { deletion: 0.2, insertion: 0.7, road_morf: 0.3, road_lerf: 0.6 } } },
    sanity: [{ method: "gradcam", rho: 0.31, flagged: false, cascade: [["fc", 0.5], [HOSTILE, 0.31]] },
             { method: "eigencam", rho: 1.0, flagged: true, cascade: [["fc", 1.0], [HOSTILE, 1.0]] }],
  });
}

function answer(m: FakeModel): void {
  m.respond = (c) => {
    if (c.method === "curves") {
      const curves = new Float32Array(2 * 4 * 3).fill(NaN);
      for (let i = 0; i < 2; i++) for (let j = 0; j < 4; j++) curves.set(j >= 2 ? [0.7, 0.5] : [0.7, 0.4, 0.1], (i * 4 + j) * 3);
      const fractions = new Float32Array([0, 0.5, 1, 0, 0.5, 1, 0, 0.1, NaN, 0, 0.1, NaN]);
      return { msg: { type: "response", id: c.id, ok: true, result: { methods: ["gradcam", "eigencam"], metrics: ["deletion", "insertion", "road_morf", "road_lerf"] },
                      arrays: { curves: { dtype: "float32", shape: [2, 4, 3], buffer: 0 }, fractions: { dtype: "float32", shape: [4, 3], buffer: 1 } } },
               buffers: [f32View(curves), f32View(fractions)] };
    }
    return { msg: { type: "response", id: c.id, ok: true,
                    result: { layer: "act", sample: 0, zero_grad: false, note: "", grid: "2×2×2", low_hw: [2, 2], method: c.params.method, methods: ["gradcam", "eigencam"] },
                    arrays: { cams: { dtype: "uint8", shape: [1, 2, 2], buffer: 0 }, peak: { dtype: "float32", shape: [1], buffer: 1 },
                              all_cams: { dtype: "uint8", shape: [2, 1, 2, 2], buffer: 2 }, all_peak: { dtype: "float32", shape: [2, 1], buffer: 3 } } },
             buffers: [new DataView(new Uint8Array([0, 64, 128, 255]).buffer), f32View([0.25]),
                       new DataView(new Uint8Array([0, 64, 128, 255, 255, 0, 0, 9]).buffer), f32View([0.25, 4])] };
  };
}

describe("Grad-CAM methods, faithfulness and sanity", () => {
  it("shows every method small and switches the large one on click, locally", async () => {
    const m = model();
    answer(m);
    const el = mount(gradcam.render as any, m);
    await tick();
    await tick();
    const thumbs = Array.from(el.querySelectorAll("button.nbd-method"));
    expect(thumbs.map((b) => b.querySelector(".nbd-method-name")?.textContent)).toEqual(["gradcam", "eigencam"]);
    expect(thumbs[1].querySelector(".nbd-flag")?.textContent).toBe("does not depend on the class decision");
    expect(thumbs[0].classList.contains("nbd-focus")).toBe(true);
    const big = el.querySelector("canvas.nbd-overlay") as HTMLCanvasElement;
    expect(big.getAttribute("data-method")).toBe("gradcam");
    const sent = m.sent.length;
    (thumbs[1] as HTMLElement).dispatchEvent(new Event("click"));
    expect(m.get("method")).toBe("eigencam");
    expect(big.getAttribute("data-method")).toBe("eigencam");
    expect(thumbs[1].classList.contains("nbd-focus")).toBe(true);
    expect(m.sent.length).toBe(sent); // no request: every method's CAMs are in the browser already
    expect((el.querySelector(".nbd-info") as HTMLElement).textContent).toContain("eigencam on act");
    expect((el.querySelector(".nbd-info") as HTMLElement).textContent).toContain("CAM max 4");
    expect((el.querySelector("select.nbd-method-select") as HTMLSelectElement).value).toBe("eigencam");
  });

  it("ranks the methods and draws one chart per metric from the curves", async () => {
    const m = model();
    answer(m);
    const el = mount(gradcam.render as any, m);
    await tick();
    await tick();
    const root = el.querySelector(".nbdebug-gradcam") as HTMLElement;
    expect(root.getAttribute("data-curves")).toBe("1");
    // the headline first; sanity before rank: eigencam (best areas, fails sanity) greyed after gradcam
    expect(root.querySelector(":scope > :not(style)")!.textContent).toBe(m.get("headline"));
    const rows = Array.from(el.querySelectorAll("table.nbd-rank tr[data-method]"));
    expect(rows.map((r) => r.getAttribute("data-method"))).toEqual(["gradcam", "eigencam"]);
    expect(rows[1].classList.contains("nbd-failed")).toBe(true);
    expect(rows[1].textContent).toBe("2eigencamfails sanity0.2000.7000.3000.600");
    expect(rows[0].querySelector("td")!.textContent).toBe("1");
    const charts = Array.from(el.querySelectorAll("svg.nbd-curve"));
    expect(charts.map((c) => c.getAttribute("data-metric"))).toEqual(["deletion", "insertion", "road_morf", "road_lerf"]);
    const lines = charts[2].querySelectorAll("polyline");
    expect(lines.length).toBe(2);
    expect((lines[0].getAttribute("points") ?? "").split(" ").length).toBe(2); // the NaN padding is not drawn
    (rows[0] as HTMLElement).dispatchEvent(new Event("click"));
    expect(m.get("method")).toBe("gradcam");
    const focused = el.querySelector('svg.nbd-curve[data-metric="deletion"] polyline[data-method="gradcam"]') as SVGElement;
    expect(focused.getAttribute("stroke-width")).toBe("2.5");
    // sanity: flagged rows say why; model text stays text
    const flagged = el.querySelector('.nbd-sanity tr.nbd-flagged[data-method="eigencam"]') as HTMLElement;
    expect(flagged.querySelector(".nbd-flag")?.textContent).toBe("does not depend on the class decision");
    expect(el.querySelector(".nbd-sanity .nbd-cascade")?.textContent).toBe(`fc 0.50 → ${HOSTILE} 0.31`);
    expect(el.querySelector(".nbd-faith .nbd-caption")?.textContent).toContain(HOSTILE);
    expect(el.querySelectorAll("img").length).toBe(0);
    expect((window as any).__pwned).toBeUndefined();
  });

  it("skips NaN points of a curve", () => {
    expect(curvePoints([0, 0.5, NaN], [1, 0, NaN], 104, 104, 1)).toBe("2.0,2.0 52.0,102.0");
  });
});

describe("CAM ranking ties", () => {
  it("writes a shared rank with = and names the tied methods", () => {
    const f = { ranking: ["a", "b"], target: 0, target_name: "x", lower_is_better: ["deletion"],
                auc: { a: { deletion: 0.675 }, b: { deletion: 0.675 } } };
    const t = rankTable(f as any, ["deletion"], ["a", "b"], "a", () => undefined,
      [{ method: "a", rank: 1, tied: ["b"], failed: false, score: 1, rho: 0.1 }, { method: "b", rank: 1, tied: ["a"], failed: false, score: 1, rho: 0.1 }]);
    const cells = Array.from(t.querySelectorAll("tr[data-method] td:first-child"));
    expect(cells.map((c) => c.textContent)).toEqual(["1=", "1="]);
    expect(cells[0].getAttribute("title")).toBe("tied with b: the same pixel order");
  });
});
