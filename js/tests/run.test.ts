// @vitest-environment happy-dom
import { afterEach, describe, expect, it } from "vitest";
import widget from "../src/run";
import { restoreArrays } from "../src/run/local";
import { differs, spreadOf } from "../src/run/spread";
import { FakeModel, f32View } from "./fakeModel";
import { mount, tick, unmountAll } from "./mount";

const HOSTILE = "<img src=x onerror=alert(1)>";
const COLUMNS = ["mean", "std", "min", "max", "zero_frac", "nan", "inf", "grad_norm"];
const NAMES = ["0", "1", HOSTILE];
const layers = NAMES.map((name) => ({ name, module: name, type: name === "1" ? "Scale" : "Linear", shape: [6, 8], dtype: "float32", flags: [], calls: 1 }));
// per rank: rows × columns (mean first); rank 1's row "1" is NaN
const STATS: Record<number, number[][]> = {
  0: [
    [0.25, 1, -2, 2, 0, 0, 0, 0.5],
    [0.5, 1, -2, 2, 0, 0, 0, 0.5],
    [0.75, 1, -2, 2, 0, 0, 0, 0.5],
  ],
  1: [
    [-0.125, 1, -2, 2, 0, 0, 0, 0.5],
    [NaN, NaN, NaN, NaN, 0, 48, 0, NaN],
    [0.375, 1, -2, 2, 0, 0, 0, 0.5],
  ],
};

function traits(rank: number, stats: unknown) {
  return { layers, columns: COLUMNS, stats, legend: {}, diagnoses: [], summary: `rank ${rank} table`, notes: [], has_grads: true, raised: {}, steps: 4, first_nonfinite_step: 0, history: {}, incidents: [], events: [] };
}
const wire = (rank: number) => ({ view: f32View(STATS[rank].flat(), 4), dtype: "float32", shape: [3, COLUMNS.length] });

function makeModel(extra: Record<string, unknown> = {}): FakeModel {
  const m = new FakeModel({
    ranks: [
      { rank: 0, recorded: true, steps: 4, nonfinite: true, error: "", hooks_left: 0 },
      { rank: 1, recorded: true, steps: 4, nonfinite: true, error: `RuntimeError: ${HOSTILE}`, hooks_left: 0 },
      { rank: 2, recorded: false, steps: 0, nonfinite: false, error: "", hooks_left: 0 },
    ],
    rank: 1,
    focus: 1,
    world_size: 3,
    summary: "3 rank(s); first NaN/Inf: rank 1, step 3, `1` (forward)",
    nonfinite: [
      { rank: 1, step: 3, phase: "forward", module: "1", row: "1", message: "step 3: `1` produced NaN from finite inputs" },
      { rank: 0, step: 3, phase: "param_grad", module: "0", row: null, message: "" },
    ],
    diverged: [{ name: `${HOSTILE}.weight`, step: 2 }],
    buffers_differ: [{ name: "bn.running_mean", step: 1 }],
    compared_step: 4,
    errors: [{ rank: 1, error: `RuntimeError: ${HOSTILE}`, traceback: "Traceback …" }],
    notes: ["rank(s) 2 never entered nbdebug.debug"],
    spread: {
      fields: ["mean", "nan"],
      rows: ["0", "1", HOSTILE],
      lo: { view: f32View([-0.125, 0, 0.5, 0, 0.375, 0], 4), dtype: "float32", shape: [3, 2] },
      hi: { view: f32View([0.25, 0, 0.5, 48, 0.75, 0]), dtype: "float32", shape: [3, 2] },
    },
    spread_stat: "mean",
    rank_state: { rank: 1, traits: traits(1, wire(1)) },
    js_error: "",
    ...extra,
  });
  m.respond = (c) => {
    if (c.type !== "request") return null;
    if (c.method === "rank") {
      const r = Number(c.params.rank);
      if (!STATS[r]) return { msg: { type: "response", id: c.id, ok: false, error: `LookupError: rank ${r} recorded nothing` } };
      return {
        msg: { type: "response", id: c.id, ok: true, result: { rank: r, traits: traits(r, { __array__: "stats" }) }, arrays: { stats: { dtype: "float32", shape: [3, COLUMNS.length], buffer: 0 } } },
        buffers: [f32View(STATS[r].flat(), 8)],
      };
    }
    if (c.method === "rank_request") return { msg: { type: "response", id: c.id, ok: false, error: `ValueError: histograms are not kept across processes (rank ${c.params.rank})` } };
    return null;
  };
  return m;
}

const rowMean = (el: HTMLElement, name: string) => {
  const row = Array.from(el.querySelectorAll<HTMLElement>(".nbd-row")).find((r) => r.querySelector(".nbd-name")!.firstChild!.textContent === name)!;
  return row.querySelector(".nbd-therm")?.getAttribute("title") ?? "";
};
const spreadText = (el: HTMLElement, name: string) => {
  const row = Array.from(el.querySelectorAll<HTMLElement>(".nbd-row")).find((r) => r.querySelector(".nbd-name")!.firstChild!.textContent === name)!;
  return row.querySelector(".nbd-spread-cell")!.textContent;
};
const requests = (m: FakeModel, method: string) => m.sent.filter((s) => s.content?.type === "request" && s.content.method === method);

afterEach(unmountAll);

describe("run view", () => {
  it("draws the focus rank from the trait, without a request, with the rank selector and cards", async () => {
    const m = makeModel();
    const el = mount(widget.render, m);
    const root = el.querySelector<HTMLElement>(".nbdebug-run")!;
    expect(root.dataset.ready).toBe("1");
    expect(root.dataset.rank).toBe("1");
    expect(m.sent).toEqual([]);
    const btns = Array.from(el.querySelectorAll<HTMLButtonElement>(".nbd-rank-btn"));
    expect(btns.map((b) => b.getAttribute("data-rank"))).toEqual(["0", "1", "2"]);
    expect(btns[1].classList.contains("nbd-rank-active")).toBe(true);
    expect(btns[1].querySelector(".nbd-rank-nan")!.textContent).toBe("NaN");
    expect(btns[1].querySelector(".nbd-rank-error")).not.toBeNull();
    expect(btns[2].disabled).toBe(true);
    expect(el.querySelector(".nbd-run-nonfinite")!.textContent).toBe(
      "first NaN/Inf: rank 1, step 3, 1 (forward); also rank 0 at step 3 (parameter gradient)step 3: 1 produced NaN from finite inputs",
    );
    expect(el.querySelector(".nbd-run-diverged-list")!.textContent).toBe(`${HOSTILE}.weight from step 2`);
    expect(el.querySelector(".nbd-run-buffers-list")!.textContent).toBe("bn.running_mean from step 1");
    expect(el.querySelector(".nbd-run-errors")!.textContent).toContain(`rank 1 raised RuntimeError: ${HOSTILE}`);
    expect(el.querySelector(".nbd-run-notes")!.textContent).toBe("rank(s) 2 never entered nbdebug.debug");
    expect(rowMean(el, "0")).toContain("mean -0.125");
    expect(el.querySelector("img")).toBeNull();
    expect(m.get("js_error")).toBe("");
  });

  it("adds the spread column to every row, and follows the chosen stat", async () => {
    const m = makeModel();
    const el = mount(widget.render, m);
    expect(el.querySelector(".nbd-h-spread")!.textContent).toBe("mean across ranks");
    expect(spreadText(el, "0")).toBe("-0.125 … 0.25");
    expect(spreadText(el, "1")).toBe("0.5");
    expect(spreadText(el, HOSTILE)).toBe("0.375 … 0.75");
    expect(el.querySelectorAll(".nbd-spread-differs").length).toBe(2);
    const sel = el.querySelector<HTMLSelectElement>(".nbd-spread-stat")!;
    sel.value = "nan";
    sel.dispatchEvent(new Event("change"));
    expect(m.get("spread_stat")).toBe("nan");
    expect(el.querySelector(".nbd-h-spread")!.textContent).toBe("nan across ranks");
    expect(spreadText(el, "1")).toBe("0 … 48");
    expect(el.querySelectorAll(".nbd-spread-cell").length).toBe(3); // one per row, not added twice
    // a sort redraws the rows: they keep their cells
    (el.querySelector('.nbd-head [data-sort="name"]') as HTMLElement).click();
    await tick();
    expect(el.querySelectorAll(".nbd-row .nbd-spread-cell").length).toBe(3);
  });

  it("choosing another rank fetches it through the RPC and redraws its table; back is cached", async () => {
    const m = makeModel();
    const el = mount(widget.render, m);
    el.querySelector<HTMLButtonElement>('.nbd-rank-btn[data-rank="0"]')!.click();
    expect(requests(m, "rank").map((s) => s.content.params)).toEqual([{ rank: 0 }]);
    expect(el.querySelector(".nbd-run-status")!.textContent).toBe("loading rank 0…");
    await tick();
    await tick();
    expect(m.get("rank")).toBe(0);
    expect(el.querySelector<HTMLElement>(".nbdebug-run")!.dataset.rank).toBe("0");
    expect(rowMean(el, "0")).toContain("mean 0.25");
    expect(rowMean(el, "1")).toContain("mean 0.5");
    expect(el.querySelector(".nbd-summary")!.textContent).toBe("rank 0 table");
    expect(spreadText(el, "0")).toBe("-0.125 … 0.25"); // the spread column on the new rank's rows
    expect(el.querySelectorAll(".nbdebug-thermometer").length).toBe(1);
    el.querySelector<HTMLButtonElement>('.nbd-rank-btn[data-rank="1"]')!.click();
    await tick();
    expect(requests(m, "rank").length).toBe(1);
    expect(rowMean(el, "0")).toContain("mean -0.125");
    // the rank trait set from Python moves the view too
    m.set("rank", 0);
    await tick();
    expect(el.querySelector<HTMLElement>(".nbdebug-run")!.dataset.rank).toBe("0");
  });

  it("the NaN card's rank link shows that rank at that step with the row selected", async () => {
    const m = makeModel({ rank: 1 });
    const el = mount(widget.render, m);
    const links = el.querySelectorAll<HTMLElement>(".nbd-run-nonfinite .nbd-rank-link");
    links[1].click(); // rank 0 at step 3
    await tick();
    await tick();
    expect(m.get("rank")).toBe(0);
    expect(el.querySelector<HTMLElement>(".nbdebug-run")!.dataset.rank).toBe("0");
    links[0].click();
    await tick();
    expect(el.querySelector(".nbd-row.nbd-selected .nbd-name")!.firstChild!.textContent).toBe("1");
  });

  it("a rank's histogram request goes to the kernel as rank_request and its error is shown", async () => {
    const m = makeModel();
    const el = mount(widget.render, m);
    (el.querySelector(".nbd-row") as HTMLElement).click();
    await tick();
    await tick();
    const req = requests(m, "rank_request");
    expect(req.length).toBe(1);
    expect(req[0].content.params).toEqual({ rank: 1, method: "histogram", params: { row: 0 } });
    expect(el.querySelector(".nbd-detail")!.getAttribute("data-histogram")).toBe("error");
    expect(el.querySelector(".nbd-detail")!.textContent).toContain("histograms are not kept across processes (rank 1)");
    expect(m.get("js_error")).toMatch(/^rank 1: histogram of 0: .*not kept across processes/);
  });

  it("a failed fetch is reported and the shown rank stays", async () => {
    const m = makeModel();
    m.respond = (c) => ({ msg: { type: "response", id: c.id, ok: false, error: "LookupError: rank 0 recorded nothing" } });
    const el = mount(widget.render, m);
    el.querySelector<HTMLButtonElement>('.nbd-rank-btn[data-rank="0"]')!.click();
    await tick();
    await tick();
    expect(el.querySelector(".nbd-run-error-box")!.textContent).toBe("nbdebug run: rank 0: LookupError: rank 0 recorded nothing");
    expect(m.get("js_error")).toContain("rank 0 recorded nothing");
    expect(rowMean(el, "0")).toContain("mean -0.125");
  });

  it("cleanup removes every listener it added", () => {
    const m = makeModel();
    const before = m.listenerCount();
    mount(widget.render, m);
    unmountAll();
    expect(m.listenerCount()).toBe(before);
  });
});

describe("run helpers", () => {
  it("restores placeholders as wire arrays and reads spreads", () => {
    const data = new Float32Array([1, 2, 3]);
    const out = restoreArrays({ a: { __array__: "x" }, b: [{ c: { __array__: "x" } }], d: 1 }, { x: { data, shape: [3], dtype: "float32" } });
    expect(out.a.shape).toEqual([3]);
    expect(new Float32Array(out.b[0].c.view.buffer)[2]).toBe(3);
    expect(out.d).toBe(1);
    expect(() => restoreArrays({ a: { __array__: "y" } }, {})).toThrow(/lacks array y/);
    const sp = { fields: ["mean"], rows: ["a", "b"], lo: { view: f32View([NaN, 1]), dtype: "float32" as const, shape: [2, 1] }, hi: { view: f32View([NaN, 2]), dtype: "float32" as const, shape: [2, 1] } };
    expect(spreadOf(sp, "a", "mean").every(Number.isNaN)).toBe(true);
    expect(spreadOf(sp, "b", "mean")).toEqual([1, 2]);
    expect(spreadOf(sp, "c", "mean").every(Number.isNaN)).toBe(true);
    expect(() => spreadOf({ ...sp, rows: ["a"] }, "a", "mean")).toThrow(/does not match/);
    expect(differs(1, 1 + 1e-9)).toBe(false);
    expect(differs(1, 1.01)).toBe(true);
  });
});
