// @vitest-environment happy-dom
import { afterEach, describe, expect, it } from "vitest";
import widget from "../src/thermometer";
import { drawHistogram } from "../src/thermometer/histogram";
import { FakeModel, f32View } from "./fakeModel";

const COLUMNS = ["mean", "std", "min", "max", "zero_frac", "near_zero_frac", "nan", "inf", "numel", "grad_norm"];
const HOSTILE = "<img src=x onerror=alert(1)>";

const LAYERS = [
  { name: "conv1", module: "conv1", type: "Conv2d", shape: [2, 4, 8, 8], dtype: "float32", flags: [], calls: 1 },
  { name: HOSTILE, module: HOSTILE, type: "ReLU", shape: [2, 4, 8, 8], dtype: "float32", flags: ["dead"], calls: 1 },
  { name: "fc", module: "fc", type: "Linear", shape: [2, 10], dtype: "float32", flags: ["nonfinite"], calls: 2 },
];
// rows: mean, std, min, max, zero_frac, near_zero_frac, nan, inf, numel, grad_norm
const STATS = [
  [0.5, 1.0, -3, 4, 0.0, 0.01, 0, 0, 512, 0.2],
  [0.0, 0.0, 0, 0, 1.0, 1.0, 0, 0, 512, 0.0],
  [NaN, NaN, -1e6, 1e3, 0.1, 0.1, 3, 1, 20, NaN],
];

function makeModel(extra: Record<string, any> = {}) {
  return new FakeModel({
    layers: LAYERS,
    columns: COLUMNS,
    stats: { view: f32View(STATS.flat(), 4), dtype: "float32", shape: [3, COLUMNS.length] },
    legend: {
      dead: { label: "dead", color: "#d62728", description: "always zero" },
      nonfinite: { label: "NaN/Inf", color: "#9467bd", description: "non-finite values" },
      vanishing: { label: "vanishing", color: "#1f77b4", description: "tiny gradients" },
    },
    diagnoses: [
      { code: "dead", severity: "error", layer: HOSTILE, message: "all outputs are `0`", suggestion: "check the init" },
    ],
    summary: "1 dead layer, NaN first appears in `fc` (forward)",
    notes: ["histograms from a sample of 8,192 values"],
    has_grads: true,
    selected: "",
    flagged_only: false,
    sort_by: "",
    sort_desc: true, // the Python default: ignored while sort_by is "" (execution order)
    js_error: "",
    ...extra,
  });
}

const flush = () => new Promise((r) => setTimeout(r, 0));
const rowNames = (el: HTMLElement) =>
  Array.from(el.querySelectorAll<HTMLElement>(".nbd-row")).map((r) => r.querySelector(".nbd-name")!.firstChild!.textContent);
const visibleRows = (el: HTMLElement) =>
  Array.from(el.querySelectorAll<HTMLElement>(".nbd-row")).filter((r) => getComputedStyle(r).display !== "none");

let cleanups: (() => void)[] = [];
afterEach(() => {
  cleanups.forEach((c) => c());
  cleanups = [];
  document.body.textContent = "";
});

function mount(model: FakeModel) {
  const el = document.createElement("div");
  document.body.appendChild(el);
  const cleanup = widget.render({ model, el });
  cleanups.push(cleanup);
  return el;
}

describe("thermometer", () => {
  it("renders one row per layer in execution order, hostile names as text", () => {
    const model = makeModel();
    const el = mount(model);
    const root = el.querySelector<HTMLElement>(".nbdebug-thermometer")!;
    expect(root.dataset.ready).toBe("1");
    expect(rowNames(el)).toEqual(["conv1", HOSTILE, "fc"]);
    expect(el.querySelector("img")).toBeNull();
    expect(el.textContent).toContain(HOSTILE);
    expect(model.get("js_error")).toBe("");
    // summary with a code span, notes, legend (absent codes dimmed), diagnoses
    expect(el.querySelector(".nbd-summary code")!.textContent).toBe("fc");
    expect(el.querySelector(".nbd-notes")!.textContent).toContain("8,192");
    const legend = Array.from(el.querySelectorAll<HTMLElement>(".nbd-legend-item"));
    expect(legend.map((l) => l.textContent)).toEqual(["dead", "NaN/Inf", "vanishing"]);
    expect(legend[2].classList.contains("nbd-absent")).toBe(true);
    expect(el.querySelector(".nbd-diagnoses li")!.textContent).toContain("all outputs are 0");
    expect(el.querySelector(".nbd-diagnoses .nbd-suggestion")!.textContent).toBe("check the init");
    // the style element is a constant string
    expect(el.querySelector("style")!.textContent).toContain(".nbdebug-thermometer");
  });

  it("shows the module that raised in a card, as text, and hides it when nothing raised", () => {
    const model = makeModel({
      raised: {
        module: HOSTILE,
        type: "Linear",
        error: "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x800 and 512x10)",
        problems: ["`head` expects 512 input features, got 800 from `flat` (8×10×10)"],
        inputs: ["4×800 float32 cpu, from `flat`"],
        params: ["weight 10×512 float32 cpu", "bias 10 float32 cpu"],
      },
    });
    const el = mount(model);
    const card = el.querySelector<HTMLElement>(".nbd-raised")!;
    expect(card.style.display).toBe("");
    expect(card.querySelector(".nbd-raised-head code")!.textContent).toBe(HOSTILE);
    expect(el.querySelector("img")).toBeNull();
    expect(card.querySelector(".nbd-raised-error")!.textContent).toContain("4x800 and 512x10");
    const li = card.querySelector(".nbd-raised-problems li")!;
    expect(Array.from(li.querySelectorAll("code")).map((c) => c.textContent)).toEqual(["head", "flat"]);
    expect(li.textContent).toBe("head expects 512 input features, got 800 from flat (8×10×10)");
    expect(card.textContent).toContain("parameters: weight 10×512 float32 cpu; bias 10 float32 cpu");
    model.set("raised", {});
    model.save_changes();
    return flush().then(() => {
      expect(card.style.display).toBe("none");
      expect(card.textContent).toBe("");
    });
  });

  it("shows the dtype of integer/bool outputs next to their shape", () => {
    const layers = [...LAYERS.slice(0, 2), { ...LAYERS[2], dtype: "int64" }];
    const el = mount(makeModel({ layers }));
    const shapes = Array.from(el.querySelectorAll<HTMLElement>(".nbd-row .nbd-shape"));
    expect(shapes.map((s) => s.textContent)).toEqual(["[2, 4, 8, 8]", "[2, 4, 8, 8]", "[2, 10] int64"]);
    expect(shapes[0].querySelector(".nbd-dtype")).toBeNull();
  });

  it("shows flags, badges, zero fraction and gradient bars from the stats", () => {
    const el = mount(makeModel());
    const rows = el.querySelectorAll<HTMLElement>(".nbd-row");
    expect(rows[0].classList.contains("nbd-flagged")).toBe(false);
    expect(rows[1].classList.contains("nbd-flagged")).toBe(true);
    expect(rows[1].style.getPropertyValue("--nbd-flag")).toBe("#d62728");
    expect(rows[1].querySelector(".nbd-chip")!.textContent).toBe("dead");
    expect(rows[1].querySelector(".nbd-zero-frac")!.textContent).toBe("100%");
    expect(rows[0].querySelector(".nbd-zero-frac")!.textContent).toBe("0%");
    expect(Array.from(rows[2].querySelectorAll(".nbd-badge")).map((b) => b.textContent)).toEqual(["NaN 3", "Inf 1"]);
    expect(rows[0].querySelectorAll(".nbd-badge")).toHaveLength(0);
    expect(rows[2].querySelector(".nbd-grad")!.textContent).toBe("—");
    expect(rows[0].querySelector(".nbd-grad")!.textContent).toBe("0.2");
    expect(rows[2].querySelector(".nbd-calls")!.textContent).toBe("×2");
    // shared symlog scale over min -1e6 … max 1e3: zero sits at the same place in every row,
    // and the box of row 0 (mean ± std = -0.5 … 1.5) straddles it.
    const zeros = Array.from(rows).map((r) => parseFloat(r.querySelector<HTMLElement>(".nbd-zero")!.style.left));
    expect(new Set(zeros).size).toBe(1);
    const box = rows[0].querySelector<HTMLElement>(".nbd-box")!;
    const left = parseFloat(box.style.left);
    expect(left).toBeLessThan(zeros[0]);
    expect(left + parseFloat(box.style.width)).toBeGreaterThan(zeros[0]);
    expect(zeros[0]).toBeGreaterThan(50); // -1e6 is far further from zero than 1e3
    expect(rows[2].querySelector(".nbd-box")).toBeNull(); // NaN mean: no box
  });

  it("filters flagged rows and syncs flagged_only", () => {
    const model = makeModel();
    const el = mount(model);
    const box = el.querySelector<HTMLInputElement>("input.nbd-only")!;
    expect(visibleRows(el)).toHaveLength(3);
    box.checked = true;
    box.dispatchEvent(new Event("change"));
    expect(model.get("flagged_only")).toBe(true);
    expect(model.saves).toBeGreaterThan(0);
    expect(visibleRows(el).map((r) => r.getAttribute("data-row"))).toEqual(["1", "2"]);
    model.set("flagged_only", false); // from Python
    expect(box.checked).toBe(false);
    expect(visibleRows(el)).toHaveLength(3);
  });

  it("sorts by clicking headers, toggles direction, resets to execution order", () => {
    const model = makeModel();
    const el = mount(model);
    const header = (sort: string) => el.querySelector<HTMLElement>(`.nbd-head [data-sort="${sort}"]`)!;
    header("zero_frac").click();
    expect(model.get("sort_by")).toBe("zero_frac");
    expect(model.get("sort_desc")).toBe(true);
    expect(rowNames(el)).toEqual([HOSTILE, "fc", "conv1"]);
    header("zero_frac").click();
    expect(model.get("sort_desc")).toBe(false);
    expect(rowNames(el)).toEqual(["conv1", "fc", HOSTILE]);
    header("name").click();
    expect(model.get("sort_by")).toBe("name");
    expect(rowNames(el)).toEqual([HOSTILE, "conv1", "fc"]);
    header("mean").click(); // NaN mean sorts last in both directions
    expect(rowNames(el)).toEqual(["conv1", HOSTILE, "fc"]);
    header("mean").click();
    expect(rowNames(el)).toEqual([HOSTILE, "conv1", "fc"]);
    header("").click();
    expect([model.get("sort_by"), model.get("sort_desc")]).toEqual(["", false]);
    expect(rowNames(el)).toEqual(["conv1", HOSTILE, "fc"]);
    // from Python
    model.set("sort_by", "nonfinite");
    model.set("sort_desc", true);
    expect(rowNames(el)[0]).toBe("fc");
    expect(header("nonfinite").classList.contains("nbd-sorted")).toBe(true);
  });

  it("clicking a row selects it and fetches its histogram", async () => {
    const model = makeModel();
    model.respond = (req) => {
      if (req.method !== "histogram") return null;
      const counts = new Float32Array(32);
      counts[3] = 10;
      counts[20] = 4;
      const edges = Float32Array.from({ length: 33 }, (_, i) => -3 + (7 * i) / 32);
      return {
        msg: {
          type: "response", id: req.id, ok: true,
          result: { name: "conv1", min: -3, max: 4, total: 512, sampled: 512, exact: true },
          arrays: { counts: { dtype: "float32", shape: [32], buffer: 0 }, edges: { dtype: "float32", shape: [33], buffer: 1 } },
        },
        buffers: [f32View(counts, 4), f32View(edges, 0)],
      };
    };
    const el = mount(model);
    (el.querySelectorAll<HTMLElement>(".nbd-row")[0].querySelector(".nbd-type") as HTMLElement).click();
    expect(model.get("selected")).toBe("conv1");
    expect(model.sent.map((s) => s.content)).toEqual([
      expect.objectContaining({ type: "request", method: "histogram", params: { row: 0 } }),
    ]);
    expect(el.querySelectorAll(".nbd-row.nbd-selected")).toHaveLength(1);
    await flush();
    const detail = el.querySelector<HTMLElement>(".nbd-detail")!;
    expect(detail.getAttribute("data-histogram")).toBe("ready");
    expect(detail.querySelector("canvas.nbdebug-histogram")).not.toBeNull();
    expect(detail.querySelector(".nbd-hist-note")!.textContent).toBe("exact: all 512 values");
    expect(detail.querySelector(".nbd-hist-axis")!.textContent).toBe("-34");
    expect(detail.querySelector(".nbd-stats")!.textContent).toContain("numel512");
  });

  it("shows histogram errors in the panel and in js_error; Python selection highlights", async () => {
    const model = makeModel();
    model.respond = (req) => ({ msg: { type: "response", id: req.id, ok: false, error: "IndexError: boom" } });
    const el = mount(model);
    model.set("selected", HOSTILE); // from Python
    const rows = el.querySelectorAll<HTMLElement>(".nbd-row");
    expect(rows[1].classList.contains("nbd-selected")).toBe(true);
    expect(model.sent[0].content.params).toEqual({ row: 1 });
    await flush();
    expect(el.querySelector(".nbd-detail .nbd-error")!.textContent).toContain("IndexError: boom");
    expect(model.get("js_error")).toContain("IndexError: boom");
    expect(el.querySelector("img")).toBeNull();
    model.set("selected", "");
    expect(el.querySelectorAll(".nbd-row.nbd-selected")).toHaveLength(0);
  });

  it("re-renders on trait changes, reports bad stats, and cleans up listeners", async () => {
    const model = makeModel();
    const el = mount(model);
    model.set("layers", LAYERS.slice(0, 2));
    model.set("stats", { view: f32View(STATS.slice(0, 2).flat()), dtype: "float32", shape: [2, COLUMNS.length] });
    await flush();
    expect(rowNames(el)).toEqual(["conv1", HOSTILE]);
    model.set("stats", { view: f32View([1, 2, 3]), dtype: "float32", shape: [3] });
    await flush();
    expect(model.get("js_error")).toMatch(/needs|do not match/);
    expect(el.querySelector(".nbd-error")!.textContent).not.toBe("");
    const before = model.listenerCount();
    expect(before).toBeGreaterThan(0);
    cleanups.pop()!();
    expect(model.listenerCount()).toBe(0);
    expect(el.querySelector(".nbdebug-thermometer")).toBeNull();
  });

  it("builds 500 rows and sorts them", () => {
    const n = 500;
    const layers = Array.from({ length: n }, (_, i) => ({ name: `l${i}`, type: "Linear", shape: [4, 8], flags: i % 7 ? [] : ["dead"] }));
    const stats = new Float32Array(n * COLUMNS.length);
    for (let i = 0; i < n; i++) stats.set([i, 1, -i, 2 * i, (i % 10) / 10, 0, 0, 0, 32, i + 1], i * COLUMNS.length);
    const model = makeModel({ layers, stats: { view: new DataView(stats.buffer), dtype: "float32", shape: [n, COLUMNS.length] } });
    const el = mount(model);
    expect(el.querySelectorAll(".nbd-row")).toHaveLength(n);
    model.set("sort_by", "max");
    model.set("sort_desc", true);
    expect(rowNames(el).slice(0, 3)).toEqual(["l499", "l498", "l497"]);
    expect(el.querySelector(".nbd-count")!.textContent).toBe("500 layer outputs, 72 flagged");
  });

  it("moves the selection with the keyboard, skipping hidden rows", () => {
    const model = makeModel({ flagged_only: true });
    const el = mount(model);
    const rows = el.querySelectorAll<HTMLElement>(".nbd-row");
    rows[1].dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
    expect(model.get("selected")).toBe(HOSTILE);
    rows[1].dispatchEvent(new KeyboardEvent("keydown", { key: "ArrowDown", bubbles: true }));
    expect(model.get("selected")).toBe("fc");
    rows[2].dispatchEvent(new KeyboardEvent("keydown", { key: "ArrowUp", bubbles: true }));
    expect(model.get("selected")).toBe(HOSTILE);
    rows[1].dispatchEvent(new KeyboardEvent("keydown", { key: "ArrowUp", bubbles: true })); // conv1 is hidden
    expect(model.get("selected")).toBe(HOSTILE);
    // row 1's histogram is asked for once: answers are kept per row (they do not depend on the step)
    expect(model.sent.map((s) => s.content.params.row)).toEqual([1, 2]);
  });
});

describe("drawHistogram", () => {
  it("fills one bar per non-empty bin, heights proportional to counts", () => {
    const rects: number[][] = [];
    const ctx = {
      clearRect() {},
      fillRect: (x: number, y: number, w: number, hh: number) => rects.push([x, y, w, hh]),
      fillStyle: "",
    };
    const canvas = { width: 0, height: 0, getContext: () => ctx } as unknown as HTMLCanvasElement;
    const counts = new Float32Array(32);
    counts[0] = 100;
    counts[31] = 50;
    counts[10] = 0.5; // tiny but non-empty: still at least 2 device pixels
    const edges = Float32Array.from({ length: 33 }, (_, i) => 1 + i); // all positive: no zero line
    expect(drawHistogram(canvas, counts, edges, "#123456")).toBe(true);
    expect(rects).toHaveLength(3);
    const H = canvas.height;
    const W = canvas.width;
    const [first, tiny, last] = rects;
    expect(first[3]).toBeCloseTo(H - 2, 6);
    expect(last[3]).toBeCloseTo((H - 2) / 2, 6);
    expect(tiny[3]).toBe(2);
    expect(first[0]).toBeCloseTo(0.5, 6);
    expect(last[0]).toBeCloseTo((31 * W) / 32 + 0.5, 6);
    expect(ctx.fillStyle).toBe("#123456");
    // edges spanning zero add a zero marker
    rects.length = 0;
    drawHistogram(canvas, counts, Float32Array.from({ length: 33 }, (_, i) => -16 + i), "#000");
    expect(rects).toHaveLength(4);
    expect(rects[3][0]).toBe(Math.round(W / 2));
    // a canvas without a 2D context is reported, not thrown
    expect(drawHistogram({ getContext: () => null } as unknown as HTMLCanvasElement, counts, edges, "#000")).toBe(false);
  });
});
