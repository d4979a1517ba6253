// @vitest-environment happy-dom
// The grouped view follows the thermometer's step slider and "whole run" (src/thermometer/groups_step.ts):
// a hand-built run of 3 kept steps (3 blocks × [fc, act, the block's own output], plus embed and
// head), the rows' values, flags, strips and residual stream at a chosen step equal to what
// nbdebug/inspectors/groups.py `group_rows` and residual.py `residual_history` give for the same
// numbers (the expected values below were computed there), with no request sent to the kernel.
import { afterEach, describe, expect, it } from "vitest";
import widget from "../src/thermometer";
import { GroupData } from "../src/thermometer/groups_data";
import { groupPosition, groupsAtSlot, groupsWhole } from "../src/thermometer/groups_step";
import { HistoryStore } from "../src/thermometer/history";
import { StatTable } from "../src/thermometer/rows";
import { FakeModel } from "./fakeModel";
import { HOSTILE, historyTrait as buildHistory, slide, thermometerUiTraits, wire } from "./fixtures";
import { mount, tick, unmountAll } from "./mount";

const NAMES = ["embed", ...[0, 1, 2].flatMap((b) => [`layers.${b}.fc`, `layers.${b}.act`, `layers.${b}`]), HOSTILE];
const OWNER = [-1, 0, 0, 0, 1, 1, 1, 2, 2, 2, -1];
const TYPES = ["Embedding", ...[0, 1, 2].flatMap(() => ["Linear", "ReLU", "Block"]), "Linear"];
const ROW_FIELDS = ["mean", "std", "min", "max", "zero_frac", "nan", "inf", "grad_norm", "update_ratio"];
const STATS = ["severity", "std", "absmax", "grad_norm", "zero_frac", "nonfinite", "residual"];
const HIST_FIELDS = ["mean", "std", "min", "max", "zero_frac", "nan", "inf", "grad_norm", "update_ratio"];
const COLUMNS = ["mean", "std", "min", "max", "zero_frac", "near_zero_frac", "nan", "inf", "numel", "grad_norm", "param_grad_norm", "dead_unit_frac", "update_ratio"];
const BITS = { nan_origin_fwd: 1, nonfinite: 4, dead: 8 };
const STEPS = [1, 2, 3];

/** Row r's history values at step s (NaN count 3 on layers.1.act at step 2). */
const val = (s: number, r: number) => [s + r / 4, (s * (r + 1)) / 4, -(s + r), s * r, r / 16, s === 2 && r === 5 ? 3 : 0, 0, r + s, 0.001];
/** dead: layers.1.act at step 2, layers.2.act at step 3. */
const flagAt = (s: number, r: number) => ((s === 2 && r === 5) || (s === 3 && r === 8) ? BITS.dead : 0);

/** The `groups` payload as groups_payload lays it out (names as flat tree nodes), at the last step,
 * with the whole-run residual stream 100/200/300 (distinct from every per-step value). */
function groupsPayload() {
  const strings = [...NAMES, "layers", "layers.0", "layers.1", "layers.2", ...new Set(TYPES)];
  const node = (s: string) => strings.indexOf(s);
  const last = NAMES.map((_, r) => val(3, r));
  return {
    version: 1,
    strings,
    row_fields: ROW_FIELDS,
    strip_stats: STATS,
    flag_codes: ["dead"],
    severity: { raised: 3, nonfinite: 3, nan_origin_fwd: 3, dead: 2, vanishing: 1 },
    residual: { group: 0, d: 4, largest_jump: "layers.1", first_nonfinite: null, notes: [] },
    notes: [],
    step: 3,
    name_parent: wire("int32", strings.map(() => -1)),
    name_suffix: wire("int32", strings.map((_, i) => i)),
    row_name: wire("int32", NAMES.map(node)),
    row_module: wire("int32", NAMES.map(node)),
    row_type: wire("int32", TYPES.map(node)),
    row_owner: wire("int32", OWNER),
    row_flags: wire("uint32", NAMES.map((_, r) => (r === 8 ? 1 : 0))),
    values: wire("float32", last.flat(), [NAMES.length, ROW_FIELDS.length]),
    group_name: wire("int32", [node("layers")]),
    group_parent: wire("int32", [-1]),
    group_first: wire("int32", [1]),
    group_flags: wire("uint32", [1]),
    block_name: wire("int32", [0, 1, 2].map((b) => node(`layers.${b}`))),
    block_group: wire("int32", [0, 0, 0]),
    block_index: wire("int32", [0, 1, 2]),
    block_rows: wire("int32", [3, 3, 3]),
    block_flags: wire("uint32", [0, 0, 1]),
    strip: wire("float32", [0, 1, 2].flatMap((b) => STATS.map((s) => (s === "residual" ? 100 * (b + 1) : s === "severity" ? (b === 2 ? 2 : 0) : -1))), [3, STATS.length]),
    residual_growth: wire("float32", [NaN, 2, 1.5]),
    hist_steps: wire("int32", STEPS),
    hist_stats: ["std", "grad_norm", "residual"],
    hist_blocks: wire("int32", [0, 1, 2]),
    hist_strip: wire("float32", STEPS.flatMap((s) => [0, 1, 2].flatMap((b) => [s, s, s * (b + 1)])), [3, 3, 3]),
  };
}

/** The `history` trait (wire arrays inline), every row of shape [2, 4]. */
function historyTrait() {
  return buildHistory({
    names: NAMES,
    fields: HIST_FIELDS,
    steps: STEPS,
    value: (s, r, _f, k) => val(s, r)[k],
    types: TYPES,
    flagBits: BITS,
    flagAt,
    firstNonfiniteStep: 2,
    loss: [3, 2, 1],
  });
}

/** Merged rows over the run (the `layers`/`stats` traits): std = 10 + r, mean = -r, min/max ±(r + 1). */
function mergedTraits() {
  const layers = NAMES.map((name, r) => ({ name, module: name, type: TYPES[r], shape: [2, 4], dtype: "float32", flags: r === 2 ? ["dead"] : [], calls: 3 }));
  const row = (r: number) => COLUMNS.map((c) => ({ mean: -r, std: 10 + r, min: -(r + 1), max: r + 1, grad_norm: 1, nan: 0, inf: 0, zero_frac: 0.5 })[c] ?? NaN);
  return { layers, stats: wire("float32", NAMES.flatMap((_, r) => row(r)), [NAMES.length, COLUMNS.length]) };
}

function thermometerModel() {
  return new FakeModel({
    ...mergedTraits(),
    columns: COLUMNS,
    legend: { dead: { label: "dead", color: "#756bb1" } },
    diagnoses: [],
    summary: "3 steps",
    notes: [],
    has_grads: true,
    ...thermometerUiTraits(),
    history: historyTrait(),
    groups: groupsPayload(),
    group_stat: "",
  });
}

const f32 = Math.fround;
const cellTitles = (el: HTMLElement) => Array.from(el.querySelectorAll(".nbd-groups-panel .nbd-grp .nbd-cell")).map((c) => c.getAttribute("title"));

afterEach(unmountAll);

describe("grouped view over time", () => {
  it("aggregates the rows of a kept slot exactly as groups.py (step 2 of 3)", () => {
    const store = new HistoryStore();
    store.applyTrait(historyTrait());
    const d = groupsAtSlot(new GroupData(groupsPayload()), store, 1);
    expect(d.step).toBe(2);
    expect(d.at).toBe("at step 2");
    const strip = (b: number) => Object.fromEntries(STATS.map((s) => [s, d.stripValue(b, s)]));
    // from group_rows(names, table=<step 2>, columns, flags) and residual_history (float32)
    expect(strip(1)).toEqual({ severity: 2, std: 3, absmax: 12, grad_norm: f32(12.206555366516113), zero_frac: 0.3125, nonfinite: 3, residual: f32(9.585144756340407) });
    expect(strip(0)).toEqual({ severity: 0, std: 1.5, absmax: 6, grad_norm: f32(7.071067810058594), zero_frac: 0.125, nonfinite: 0, residual: f32(6.652067347825035) });
    expect(strip(2).residual).toBe(f32(12.639224659764539));
    expect(Array.from(d.growth)).toEqual([NaN, f32(9.585144756340407 / 6.652067347825035), f32(12.639224659764539 / 9.585144756340407)]);
    expect(d.residual!.largest_jump).toBe("layers.1");
    // rows' values and flags at step 2; flags ORed upward (block 1 and the group now, not block 2)
    expect(d.value(5, "mean")).toBe(3.25);
    expect(d.value(5, "nan")).toBe(3);
    expect(d.flags(5)).toEqual(["dead"]);
    expect(d.flags(8)).toEqual([]);
    expect(d.blocks.map((b) => d.codes(b.flags))).toEqual([[], ["dead"], []]);
    expect(d.codes(d.groups[0].flags)).toEqual(["dead"]);
    // the group sparklines' cursor: step 2 is the 2nd of the blocks' kept steps
    expect(d.histCursor()).toBe(1);
    // the payload itself is unchanged (the last step)
    const base = new GroupData(groupsPayload());
    expect(base.stripValue(1, "std")).toBe(-1);
    expect(base.flags(8)).toEqual(["dead"]);
  });

  it("over the whole run: the merged rows and flags, the payload's residual stream", () => {
    const { layers, stats } = mergedTraits();
    const d = groupsWhole(new GroupData(groupsPayload()), layers, new StatTable(stats, COLUMNS, layers.length));
    expect(d.whole).toBe(true);
    expect(d.at).toBe("over the whole run");
    expect(d.histCursor()).toBeUndefined();
    expect(d.stripValue(1, "std")).toBe(15); // rows 4, 5, 6: 14, 15, 16
    expect(d.stripValue(1, "absmax")).toBe(7);
    expect(d.stripValue(1, "grad_norm")).toBe(f32(Math.sqrt(3)));
    expect(d.stripValue(2, "residual")).toBe(300);
    expect(d.flags(2)).toEqual(["dead"]);
    expect(d.blocks.map((b) => d.codes(b.flags))).toEqual([["dead"], [], []]);
    expect(d.stripValue(0, "severity")).toBe(2);
  });

  it("the position follows the thermometer's step trait; while running, the last slot or the slider's", () => {
    const store = new HistoryStore();
    store.applyTrait(historyTrait());
    const model = thermometerModel();
    expect(groupPosition(model, store)).toEqual({ kind: "slot", slot: 2 });
    model.set("step", 2);
    expect(groupPosition(model, store)).toEqual({ kind: "slot", slot: 1 });
    model.set("step", -1);
    expect(groupPosition(model, store)).toEqual({ kind: "whole" });
    model.set("running", true);
    expect(groupPosition(model, store)).toEqual({ kind: "slot", slot: 2 }); // no merged rows yet
    model.set("step", 2);
    expect(groupPosition(model, store)).toEqual({ kind: "slot", slot: 1 });
    expect(groupPosition(model, new HistoryStore())).toEqual({ kind: "payload" });
    model.set("running", false);
    expect(groupPosition(model, new HistoryStore())).toEqual({ kind: "payload" });
  });

  it("while the cell runs: the live tree (groups_live, no values) filled from the pushed history slots", async () => {
    const live: any = groupsPayload();
    const nan = (w: { shape: number[] }) => wire("float32", Array(w.shape.reduce((a, b) => a * b, 1)).fill(NaN), w.shape);
    Object.assign(live, { values: nan(live.values), strip: nan(live.strip), step: null, live: true, flag_codes: [], residual_growth: nan(live.residual_growth) });
    live.row_flags = wire("uint32", NAMES.map(() => 0));
    live.block_flags = wire("uint32", [0, 0, 0]);
    live.group_flags = wire("uint32", [0]);
    live.residual = { group: 0, d: 4, largest_jump: null, first_nonfinite: null, notes: [] };
    for (const k of ["hist_steps", "hist_stats", "hist_blocks", "hist_strip"]) delete live[k];
    const model = thermometerModel();
    for (const [k, v] of Object.entries({ running: true, history: {}, layers: [], groups: live, group_stat: "std" })) model.set(k, v);
    const el = mount(widget.render, model);
    const h = historyTrait();
    const msg = (steps: number[], from: number) => {
      const buffers = [new Int32Array(steps).buffer, new Float32Array(steps.flatMap((s) => NAMES.flatMap((_, r) => val(s, r)))).buffer, new Uint16Array(steps.flatMap((s) => NAMES.map((_, r) => flagAt(s, r)))).buffer];
      const content = {
        type: "history", from, reset: from === 0, fields: HIST_FIELDS, rows: from === 0 ? h.rows : undefined, flag_bits: BITS, total_steps: steps[steps.length - 1], first_nonfinite_step: 0, group: 1,
        arrays: { steps: { dtype: "int32", shape: [steps.length], buffer: 0 }, last: { dtype: "float32", shape: [steps.length, NAMES.length, HIST_FIELDS.length], buffer: 1 }, flags: { dtype: "uint16", shape: [steps.length, NAMES.length], buffer: 2 } },
      };
      model.emit("msg:custom", content, buffers);
    };
    msg([1, 2], 0);
    await tick();
    const panel = el.querySelector<HTMLElement>(".nbd-groups-panel")!;
    expect(panel.style.display).toBe("");
    expect(cellTitles(el)).toEqual(["layers.0: mean std 1.5", "layers.1: mean std 3", "layers.2: mean std 4.5"]); // step 2, the last so far
    expect(panel.querySelector(".nbd-group-count")!.textContent).toBe("11 rows, 1 group of repeated blocks (values and flags at step 2)");
    expect(panel.querySelector(".nbd-grp .nbd-gflags")!.textContent).toBe("dead");
    msg([3], 2);
    await tick();
    expect(cellTitles(el)[1]).toBe("layers.1: mean std 4.5"); // follows the live step
    await slide(el, 0); // the slider while the kernel is busy: step 1, from the pushed slots
    expect(model.get("step")).toBe(1);
    expect(cellTitles(el)).toEqual(["layers.0: mean std 0.75", "layers.1: mean std 1.5", "layers.2: mean std 2.25"]);
    const sel = panel.querySelector<HTMLSelectElement>(".nbd-group-stat")!;
    sel.value = "residual";
    sel.dispatchEvent(new Event("change"));
    expect(cellTitles(el)[1]).toBe("layers.1: residual stream norm 5.98 (×1.51 vs previous block)"); // residual_history at step 1
    expect(model.sent).toEqual([]);
    expect(model.get("js_error")).toBe("");
  });

  it("in the thermometer: the slider moves the strips, rows and flags; no request reaches the kernel", async () => {
    const model = thermometerModel();
    const el = mount(widget.render, model);
    const panel = el.querySelector<HTMLElement>(".nbd-groups-panel")!;
    expect(panel.style.display).toBe("");
    expect(el.querySelector("img")).toBeNull();
    // the last step by default: residual stream at step 3 (not the payload's whole-run 100/200/300)
    expect(cellTitles(el)[1]).toBe("layers.1: residual stream norm 13.3 (×1.42 vs previous block)");
    expect(panel.querySelector(".nbd-group-count")!.textContent).toBe("11 rows, 1 group of repeated blocks (values and flags at step 3)");
    await slide(el, 1);
    expect(model.get("step")).toBe(2); // the slider still syncs its step to the kernel
    expect(cellTitles(el)).toEqual([
      "layers.0: residual stream norm 6.65 (×NaN vs previous block)",
      "layers.1: residual stream norm 9.59 (×1.44 vs previous block)",
      "layers.2: residual stream norm 12.6 (×1.32 vs previous block)",
    ]);
    expect(panel.querySelector(".nbd-group-count")!.textContent).toBe("11 rows, 1 group of repeated blocks (values and flags at step 2)");
    expect(panel.querySelector(".nbd-grp .nbd-gflags")!.textContent).toBe("dead");
    const cursor = panel.querySelector(".nbd-grp svg.nbd-gspark line.nbd-spark-cursor")!;
    expect(cursor).not.toBeNull();
    // another statistic, then open block 1: its rows at step 2
    const sel = panel.querySelector<HTMLSelectElement>(".nbd-group-stat")!;
    sel.value = "std";
    sel.dispatchEvent(new Event("change"));
    expect(cellTitles(el)).toEqual(["layers.0: mean std 1.5", "layers.1: mean std 3", "layers.2: mean std 4.5"]);
    (panel.querySelectorAll<HTMLElement>(".nbd-cell")[1]).click();
    const act = panel.querySelector<HTMLElement>('.nbd-grow[data-row="5"]')!;
    expect(act.querySelector(".nbd-gstat")!.textContent).toBe("3.25 ± 3");
    expect(act.querySelector(".nbd-chip")!.textContent).toBe("dead");
    // step 3: layers.1.act is no longer dead, layers.2 is; the open block stays open
    await slide(el, 2);
    expect(cellTitles(el)).toEqual(["layers.0: mean std 2.25", "layers.1: mean std 4.5", "layers.2: mean std 6.75"]);
    const act3 = panel.querySelector<HTMLElement>('.nbd-grow[data-row="5"]')!;
    expect(act3.querySelector(".nbd-gstat")!.textContent).toBe("4.25 ± 4.5");
    expect(act3.querySelector(".nbd-chip")).toBeNull();
    expect(panel.querySelector('.nbd-blk[data-block="2"] .nbd-gflags')!.textContent).toBe("dead");
    // whole run: the merged rows
    (el.querySelector(".nbd-whole") as HTMLButtonElement).click();
    await tick();
    expect(model.get("step")).toBe(-1);
    expect(cellTitles(el)).toEqual(["layers.0: mean std 12", "layers.1: mean std 15", "layers.2: mean std 18"]);
    expect(panel.querySelector(".nbd-group-count")!.textContent).toBe("11 rows, 1 group of repeated blocks (values and flags over the whole run)");
    expect(panel.querySelector(".nbd-grp svg.nbd-gspark line.nbd-spark-cursor")).toBeNull();
    sel.value = "residual";
    sel.dispatchEvent(new Event("change"));
    expect(cellTitles(el)[2]).toBe("layers.2: residual stream norm 300 (×1.5 vs previous block)");
    expect(model.sent).toEqual([]); // everything from the browser's data
    expect(model.get("js_error")).toBe("");
  });
});
