// @vitest-environment happy-dom
// Everything the thermometer shows follows the step slider: the header, the note naming the table's
// step, the diagnoses (the kernel's at its report's step and over the whole run, else decided from
// the step's flags), the histogram's note (values kept at the row's first call, said as such); a
// rank's table (histogram_note) sends no histogram request; with the grouped view shown, a slider
// move does not rebuild the hidden flat table (timings printed, not asserted).
import { afterEach, describe, expect, it } from "vitest";
import widget from "../src/thermometer";
import { FakeModel, f32View } from "./fakeModel";
import { HOSTILE, historyTrait as buildHistory, slide, thermometerUiTraits, wire } from "./fixtures";
import { mount, tick, unmountAll } from "./mount";

const COLUMNS = ["mean", "std", "min", "max", "zero_frac", "near_zero_frac", "nan", "inf", "numel", "grad_norm"];
const FIELDS = ["mean", "std", "min", "max", "zero_frac", "nan", "inf", "grad_norm"];
const BITS = { nonfinite: 4, dead: 8 };
const LEGEND = {
  dead: { label: "dead", color: "#756bb1", description: "always zero: no gradient flows" },
  nonfinite: { label: "NaN/Inf", color: "#fc9272", description: "non-finite values" },
};
const STEP_NOTE = "table and flags at step 3 of 3 (3 kept steps); flags are decided per step, events over the kept steps; numel is one call's, near-zero is only in the whole-run table";

/** Row r at step s: mean = 10 s + r; zero_frac 0.97 for row 1 at step 2 (dead there), else 0.25. */
const value = (s: number, r: number, f: string) =>
  ({ mean: 10 * s + r, std: 1, min: -1, max: 1, zero_frac: s === 2 && r === 1 ? 0.97 : 0.25, nan: 0, inf: 0, grad_norm: 0.5 })[f] ?? NaN;

function historyTrait(names: string[], steps: number[], flagAt: (s: number, r: number) => number) {
  return buildHistory({ names, fields: FIELDS, steps, value, flagBits: BITS, flagAt, loss: steps.map((s) => 1 / s) });
}

/** The final state of a 3-step run of rows `fc`, HOSTILE: the kernel's texts at step 3 and over the run. */
function runModel(extra: Record<string, any> = {}) {
  const names = ["fc", HOSTILE];
  const merged = names.map((_, r) => COLUMNS.map((c) => ({ mean: 100 + r, std: 2, min: -5, max: 5, zero_frac: 0.5, numel: 8, nan: 0, inf: 0, grad_norm: 1 })[c] ?? NaN));
  return new FakeModel({
    layers: names.map((name) => ({ name, module: name, type: "Linear", shape: [2, 4], dtype: "float32", flags: [], calls: 3 })),
    columns: COLUMNS,
    stats: { view: f32View(merged.flat(), 4), dtype: "float32", shape: [2, COLUMNS.length] },
    legend: LEGEND,
    diagnoses: [{ code: "vanishing", severity: "warning", layer: "", message: "the gradient norm at the first layer is 0.01× the last layer's at step 3", suggestion: "" }],
    summary: "step 3: 2 layers: no problems found",
    notes: ["a note of the run", STEP_NOTE],
    report_step: 3,
    run_texts: { summary: "2 layers over 3 steps: no problems found", notes: ["the model ran 3 steps (calls of its forward): stats cover every step, histograms the first"], diagnoses: [] },
    histogram_note: "",
    has_grads: true,
    ...thermometerUiTraits(),
    history: historyTrait(names, [1, 2, 3], (s, r) => (s === 2 && r === 1 ? BITS.dead : 0)),
    ...extra,
  });
}

/** Answers `histogram` requests: 512 exact values kept at step 1. */
function answerHistograms(model: FakeModel) {
  model.respond = (req) => {
    if (req.method !== "histogram") return null;
    const counts = new Float32Array(32);
    counts[3] = 10;
    const edges = Float32Array.from({ length: 33 }, (_, i) => i);
    return {
      msg: {
        type: "response", id: req.id, ok: true,
        result: { name: "fc", min: 0, max: 32, total: 512, sampled: 512, exact: true, first_step: 1, last_step: 1 },
        arrays: { counts: { dtype: "float32", shape: [32], buffer: 0 }, edges: { dtype: "float32", shape: [33], buffer: 1 } },
      },
      buffers: [f32View(counts, 4), f32View(edges, 0)],
    };
  };
}

const text = (el: HTMLElement, sel: string) => el.querySelector(sel)!.textContent;
const texts = (el: HTMLElement, sel: string) => Array.from(el.querySelectorAll(sel)).map((e) => e.textContent);

afterEach(unmountAll);

describe("the thermometer's texts follow the step slider", () => {
  it("header, step note and diagnoses at step 2 of 3; the kernel's at step 3 and over the whole run", async () => {
    const model = runModel();
    const el = mount(widget.render, model);
    await tick();
    // the last step: the kernel's report
    expect(text(el, ".nbd-summary")).toBe("step 3: 2 layers: no problems found");
    expect(texts(el, ".nbd-notes li")).toEqual(["a note of the run", STEP_NOTE]);
    expect(texts(el, ".nbd-diagnoses li")).toEqual(["warningvanishingthe gradient norm at the first layer is 0.01× the last layer's at step 3"]);
    await slide(el, 1);
    expect(model.get("step")).toBe(2);
    expect(text(el, ".nbd-summary")).toBe("step 2: 2 layers: dead in 1 layer");
    expect(texts(el, ".nbd-notes li")).toEqual([
      "a note of the run",
      "table and flags at step 2 of 3 (3 kept steps); flags are decided per step, events over the kept steps; numel is one call's, " +
        "near-zero is only in the whole-run table; the header and diagnoses are this position's flags, decided in the browser " +
        "(diagnose(result, step=2) gives the kernel's full report of this step)",
    ]);
    const diag = el.querySelectorAll(".nbd-diagnoses li");
    expect(diag).toHaveLength(1);
    expect(diag[0].textContent).toBe(`warningdead${HOSTILE} — dead at step 2 in 1 layer: ${HOSTILE} (zeros 97%).always zero: no gradient flows`);
    expect(diag[0].querySelector(".nbd-link")!.getAttribute("data-layer")).toBe(HOSTILE); // a link to the row
    expect(el.querySelector("img")).toBeNull();
    // step 1: no flags
    await slide(el, 0);
    expect(text(el, ".nbd-summary")).toBe("step 1: 2 layers: no flags");
    expect(texts(el, ".nbd-diagnoses li")).toEqual([]);
    expect(texts(el, ".nbd-notes li")[1]).toMatch(/^table and flags at step 1 of 3 \(3 kept steps\)/);
    // the whole run: the kernel's merged report
    (el.querySelector(".nbd-whole") as HTMLButtonElement).click();
    await tick();
    expect(text(el, ".nbd-summary")).toBe("2 layers over 3 steps: no problems found");
    expect(texts(el, ".nbd-notes li")).toEqual(["the model ran 3 steps (calls of its forward): stats cover every step, histograms the first"]);
    expect(texts(el, ".nbd-diagnoses li")).toEqual([]);
    expect(model.sent).toEqual([]); // all from the browser's data
    expect(model.get("js_error")).toBe("");
  });

  it("names the step a histogram's values were kept at, and asks the kernel once per row", async () => {
    // the run's merged rows in another order than the history's: requests by the run's index, stats by the step's
    const model = runModel();
    model.set("layers", [...model.get("layers")].reverse());
    answerHistograms(model);
    const el = mount(widget.render, model);
    await tick();
    await slide(el, 1);
    model.set("selected", "fc");
    await tick();
    await tick();
    expect(text(el, ".nbd-detail-title")).toBe("layer fc at step 2");
    expect(text(el, ".nbd-hist-note")).toBe("exact: all 512 values");
    expect(text(el, ".nbd-hist-when")).toBe("histogram of the values kept at step 1 (the row's first call), not step 2's: histograms are kept for the first call only");
    // the detail's statistics are step 2's
    expect(el.querySelector(".nbd-stats")!.textContent).toContain("mean20");
    await slide(el, 0);
    await tick();
    expect(text(el, ".nbd-detail-title")).toBe("layer fc at step 1");
    expect(text(el, ".nbd-hist-when")).toBe("histogram of step 1's values (the row's first call)");
    (el.querySelector(".nbd-whole") as HTMLButtonElement).click();
    await tick();
    await tick();
    expect(text(el, ".nbd-hist-when")).toBe("histogram of the values kept at step 1 (the row's first call), not the whole run's: histograms are kept for the first call only");
    expect(model.sent.filter((s) => s.content.method === "histogram").map((s) => s.content.params.row)).toEqual([1]);
  });

  it("a rank's table (histogram_note): a row click sends no request, says why quietly, no error", async () => {
    const note = "no histogram: values are not kept across processes (each rank's spool carries per-step statistics only)";
    const model = runModel({ histogram_note: note });
    const el = mount(widget.render, model);
    await tick();
    (el.querySelectorAll<HTMLElement>(".nbd-row")[0].querySelector(".nbd-type") as HTMLElement).click();
    await tick();
    expect(model.get("selected")).toBe("fc");
    expect(el.querySelector(".nbd-detail")!.getAttribute("data-histogram")).toBe("none");
    expect(text(el, ".nbd-hist-note")).toBe(note);
    expect(el.querySelector(".nbd-detail .nbd-error")).toBeNull();
    expect(model.sent).toEqual([]);
    expect(model.get("js_error")).toBe("");
  });
});

/** A `groups` payload (groups_payload's layout, every name its own node) over `names`: one group
 * `model.layers` of `blocks` blocks of `per` rows each (rows 1 … blocks·per), rows 0 and last top-level. */
function groupsPayload(names: string[], blocks: number, per: number) {
  const strings = [...names, "model.layers", ...Array.from({ length: blocks }, (_, b) => `model.layers.${b}`), "Linear"];
  const node = (s: string) => strings.indexOf(s);
  const owner = names.map((_, r) => (r === 0 || r === names.length - 1 ? -1 : Math.floor((r - 1) / per)));
  const stats = ["severity", "std", "absmax", "grad_norm", "zero_frac", "nonfinite", "residual"];
  const rowFields = ["mean", "std", "min", "max", "zero_frac", "nan", "inf", "grad_norm", "update_ratio"];
  return {
    version: 1, strings, row_fields: rowFields, strip_stats: stats, flag_codes: [], severity: { dead: 2, nonfinite: 3 },
    residual: null, notes: [], step: 3,
    name_parent: wire("int32", strings.map(() => -1)),
    name_suffix: wire("int32", strings.map((_, i) => i)),
    row_name: wire("int32", names.map(node)),
    row_module: wire("int32", names.map(node)),
    row_type: wire("int32", names.map(() => node("Linear"))),
    row_owner: wire("int32", owner),
    row_flags: wire("uint32", names.map(() => 0)),
    values: wire("float32", names.flatMap(() => rowFields.map(() => 1)), [names.length, rowFields.length]),
    group_name: wire("int32", [node("model.layers")]),
    group_parent: wire("int32", [-1]),
    group_first: wire("int32", [1]),
    group_flags: wire("uint32", [0]),
    block_name: wire("int32", Array.from({ length: blocks }, (_, b) => node(`model.layers.${b}`))),
    block_group: wire("int32", Array(blocks).fill(0)),
    block_index: wire("int32", Array.from({ length: blocks }, (_, b) => b)),
    block_rows: wire("int32", Array(blocks).fill(per)),
    block_flags: wire("uint32", Array(blocks).fill(0)),
    strip: wire("float32", Array(blocks * stats.length).fill(1), [blocks, stats.length]),
  };
}

describe("a slider move with the grouped view shown (1,602 rows)", () => {
  it("leaves the hidden flat table alone and draws it at the current step when shown again", async () => {
    const blocks = 320;
    const per = 5;
    const names = ["model.embed_tokens", ...Array.from({ length: blocks * per }, (_, i) => `model.layers.${Math.floor(i / per)}.p${i % per}`), "lm_head"];
    const steps = Array.from({ length: 40 }, (_, i) => i + 1);
    const merged = names.map(() => COLUMNS.map(() => 1));
    const model = runModel({
      layers: names.map((name) => ({ name, module: name, type: "Linear", shape: [2, 4], dtype: "float32", flags: [], calls: 40 })),
      stats: { view: f32View(merged.flat(), 0), dtype: "float32", shape: [names.length, COLUMNS.length] },
      history: historyTrait(names, steps, () => 0),
      report_step: 40,
      summary: "step 40: 1602 layers: no problems found",
      notes: [],
      diagnoses: [],
      groups: groupsPayload(names, blocks, per),
      group_stat: "",
    });
    const el = mount(widget.render, model);
    await tick();
    const toggle = el.querySelector<HTMLInputElement>(".nbd-grouped-toggle")!;
    expect(toggle.checked).toBe(true);
    const before = el.querySelector(".nbd-body .nbd-row");
    for (const slot of [20, 9, 4]) await slide(el, slot);
    expect(text(el, ".nbd-summary")).toBe("step 5: 1602 layers: no flags");
    expect(el.querySelector(".nbd-body .nbd-row")).toBe(before); // the hidden rows were not rebuilt
    // shown again: drawn at step 5
    toggle.checked = false;
    toggle.dispatchEvent(new Event("change"));
    const row = el.querySelector<HTMLElement>('.nbd-body .nbd-row[data-row="3"] .nbd-therm')!;
    expect(row.getAttribute("title")).toMatch(/^mean 53 /); // 10 × step 5 + row 3
    expect(el.querySelector(".nbd-body .nbd-row")).not.toBe(before);
    for (const slot of [20, 9, 4]) await slide(el, slot);
    expect(model.get("js_error")).toBe("");
  }, 120_000);
});
