// @vitest-environment happy-dom
// The thermometer over time: live `history` messages (appended slots, replaced slots, resets), the
// step slider redrawing the table from data already in the browser, flags following the slider,
// sparklines, and hostile text staying text.
import { afterEach, describe, expect, it } from "vitest";
import widget from "../src/thermometer";
import { initialize } from "../src/thermometer/live";
import { HistoryStore } from "../src/thermometer/history";
import { columns as sparkColumns } from "../src/lib/sparkline";
import { FakeModel, f32View } from "./fakeModel";
import { HOSTILE, thermometerUiTraits } from "./fixtures";
import { mount, tick, unmountAll } from "./mount";

const COLUMNS = ["mean", "std", "min", "max", "zero_frac", "near_zero_frac", "nan", "inf", "numel", "grad_norm", "param_grad_norm", "dead_unit_frac", "update_ratio"];
const FIELDS = ["mean", "std", "min", "max", "zero_frac", "nan", "inf", "dead_unit_frac", "grad_norm"];
const ROWS = [
  { name: "fc", module: "fc", type: "Linear", shape: [8, 16], dtype: "float32" },
  { name: HOSTILE, module: HOSTILE, type: "ReLU", shape: [8, 16], dtype: "float32" },
];
const BITS = { nan_origin_fwd: 1, nonfinite: 4, dead: 8 };

/** Value of field f for row r at step s (distinct everywhere, so a wrong slot shows). */
const val = (s: number, r: number, f: number) => s * 100 + r * 10 + f;

function u16(values: number[]): ArrayBuffer {
  const a = new Uint16Array(values);
  return a.buffer;
}
function i32(values: number[]): ArrayBuffer {
  return new Int32Array(values).buffer;
}
function f32(values: number[]): DataView {
  return f32View(values, 4); // at an offset inside a larger buffer, like ipywidgets buffers
}

/** A `history` custom message and its buffers for `steps` (rows × fields values from `val`). */
function message(steps: number[], opts: { from?: number; reset?: boolean; flags?: number[]; loss?: number[]; nan?: number; rows?: typeof ROWS; incidents?: any[] } = {}) {
  const rows = opts.rows ?? ROWS;
  const last: number[] = [];
  for (const s of steps) for (let r = 0; r < rows.length; r++) for (let f = 0; f < FIELDS.length; f++) last.push(val(s, r, f));
  const buffers = [i32(steps), f32(last), u16(opts.flags ?? steps.flatMap(() => rows.map(() => 0))), f32(opts.loss ?? steps.map((s) => 10 / s))];
  const content: any = {
    type: "history",
    from: opts.from ?? 0,
    reset: opts.reset ?? false,
    fields: FIELDS,
    flag_bits: BITS,
    total_steps: steps.length ? steps[steps.length - 1] : 0,
    first_nonfinite_step: opts.nan ?? 0,
    group: 1,
    arrays: {
      steps: { dtype: "int32", shape: [steps.length], buffer: 0 },
      last: { dtype: "float32", shape: [steps.length, rows.length, FIELDS.length], buffer: 1 },
      flags: { dtype: "uint16", shape: [steps.length, rows.length], buffer: 2 },
      loss: { dtype: "float32", shape: [steps.length], buffer: 3 },
    },
  };
  if (opts.reset || opts.rows) content.rows = rows;
  if (opts.incidents) content.incidents = opts.incidents;
  return { content, buffers };
}

function liveModel(extra: Record<string, any> = {}) {
  return new FakeModel({
    layers: [],
    columns: COLUMNS,
    stats: { view: f32View([]), dtype: "float32", shape: [0, COLUMNS.length] },
    legend: { dead: { label: "dead", color: "#756bb1" }, nonfinite: { label: "NaN/Inf", color: "#fc9272" } },
    diagnoses: [],
    summary: "running: waiting for the first step",
    notes: [],
    has_grads: false,
    ...thermometerUiTraits(),
    history: {},
    running: true,
    ...extra,
  });
}

const send = (m: FakeModel, msg: { content: any; buffers: any[] }) => m.emit("msg:custom", msg.content, msg.buffers);
/** The mean shown in row `i` (the thermometer cell's tooltip starts with "mean X"). */
const meanOf = (el: HTMLElement, i: number) => {
  const title = el.querySelector(`.nbd-row[data-row="${i}"] .nbd-therm`)!.getAttribute("title")!;
  return Number(/^mean (\S+)/.exec(title)![1]);
};

afterEach(unmountAll);

describe("thermometer over time", () => {
  it("appends live slots, replaces changed ones, and resets", async () => {
    const model = liveModel();
    const el = mount(widget.render, model);
    send(model, message([1, 2], { reset: true }));
    await tick();
    expect(el.querySelector(".nbd-step-count")!.textContent).toBe("2 steps (running…)");
    expect(el.querySelector(".nbd-step-label")!.textContent).toBe("step 2 of 2");
    expect((el.querySelector(".nbd-whole") as HTMLElement).style.display).toBe("none"); // merged rows come at the end
    expect(el.querySelector(".nbd-summary")!.textContent).toBe("running: 2 steps so far");
    expect(meanOf(el, 0)).toBe(val(2, 0, 0)); // the last step by default
    // only the new slot arrives; earlier ones stay
    send(model, message([3], { from: 2 }));
    await tick();
    expect(el.querySelector(".nbd-step-count")!.textContent).toBe("3 steps (running…)");
    expect(meanOf(el, 1)).toBe(val(3, 1, 0));
    expect((el.querySelector(".nbd-slider") as HTMLInputElement).max).toBe("2");
    // a changed slot (late gradients) is resent from its index: slots after it are replaced
    send(model, message([3, 4], { from: 2 }));
    await tick();
    expect((el.querySelector(".nbd-slider") as HTMLInputElement).max).toBe("3");
    // a reset (the kernel decimated) replaces everything
    send(model, message([2, 4, 6], { reset: true }));
    await tick();
    expect((el.querySelector(".nbd-slider") as HTMLInputElement).max).toBe("2");
    expect(el.querySelector(".nbd-step-label")!.textContent).toBe("step 6 of 6");
    expect(model.get("js_error")).toBe("");
    // an update for slots this view never got (it loaded late): kept, and said
    send(model, message([9], { from: 5 }));
    await tick();
    expect(el.querySelector(".nbd-step-label")!.textContent).toBe("step 9 of 9");
    expect(el.querySelector(".nbd-summary")!.textContent).toBe("running: 9 steps so far (earlier steps appear when the cell ends)");
  });

  it("names the rows from the live_rows trait when the first push (the one with the rows) was lost", async () => {
    // The race: the kernel's first push reaches the browser before the view's module has loaded
    // (nobody listens yet: lost); the trait set before it is kept by the model.
    const model = liveModel({ live_rows: ROWS });
    send(model, message([1, 2], { reset: true }));
    const dispose = initialize({ model });
    const el = mount(widget.render, model);
    await tick();
    send(model, message([3], { from: 2 }));
    await tick();
    expect(el.querySelectorAll(".nbd-row").length).toBe(2);
    expect(meanOf(el, 0)).toBe(val(3, 0, 0));
    expect(meanOf(el, 1)).toBe(val(3, 1, 0));
    expect(el.querySelector(".nbd-summary")!.textContent).toBe("running: 3 steps so far (earlier steps appear when the cell ends)");
    // a row that appears later: the trait grows first, then the push carries its values
    const more = [...ROWS, { name: "late", module: "late", type: "ReLU", shape: [8, 16], dtype: "float32" }];
    model.set("live_rows", more);
    send(model, message([4], { from: 3, rows: more }));
    await tick();
    expect(el.querySelectorAll(".nbd-row").length).toBe(3);
    expect(meanOf(el, 2)).toBe(val(4, 2, 0));
    expect(model.get("js_error")).toBe("");
    dispose();
  });

  it("redraws the table at an earlier step from pushed data, and the whole run from the traits", async () => {
    const model = liveModel();
    const el = mount(widget.render, model);
    send(model, message([1, 2, 3], { reset: true, flags: [0, 0, 0, BITS.dead, 0, 0] }));
    await tick();
    const slider = el.querySelector(".nbd-slider") as HTMLInputElement;
    slider.value = "0";
    slider.dispatchEvent(new Event("input"));
    await tick();
    expect(model.get("step")).toBe(1); // synced to the kernel
    expect(meanOf(el, 0)).toBe(val(1, 0, 0));
    expect(meanOf(el, 1)).toBe(val(1, 1, 0));
    expect(el.querySelector(".nbd-step-label")!.textContent).toBe("step 1 of 3");
    // flags follow the slider: row 1 is dead at step 2 only
    expect(el.querySelectorAll(".nbd-row.nbd-flagged").length).toBe(0);
    slider.value = "1";
    slider.dispatchEvent(new Event("input"));
    await tick();
    expect(model.get("step")).toBe(2);
    const flagged = el.querySelectorAll(".nbd-row.nbd-flagged");
    expect(flagged.length).toBe(1);
    expect(flagged[0].querySelector(".nbd-chip")!.textContent).toBe("dead");
    // the last slot means "follow the last step"
    slider.value = "2";
    slider.dispatchEvent(new Event("input"));
    await tick();
    expect(model.get("step")).toBe(0);
    // the cell ended: merged rows in the traits; "whole run" shows them
    model.set("layers", ROWS.map((r) => ({ ...r, flags: [], calls: 3 })));
    model.set("stats", { view: f32View(COLUMNS.flatMap(() => 0).concat(COLUMNS.map(() => 0)).map((_, i) => (i === 0 ? 42 : 7))), dtype: "float32", shape: [2, COLUMNS.length] });
    model.set("running", false);
    await tick();
    (el.querySelector(".nbd-whole") as HTMLButtonElement).click();
    await tick();
    expect(model.get("step")).toBe(-1);
    expect(el.querySelector(".nbd-step-label")!.textContent).toBe("whole run (3 steps merged)");
    expect(meanOf(el, 0)).toBe(42);
    expect(el.querySelector(".nbd-step-count")!.textContent).toBe("3 steps");
  });

  it("draws a sparkline per row and the loss curve, with the first NaN marked", async () => {
    const model = liveModel();
    const el = mount(widget.render, model);
    send(model, message([1, 2, 3, 4], { reset: true, nan: 3 }));
    await tick();
    const sparks = el.querySelectorAll(".nbd-body .nbd-spark-cell svg");
    expect(sparks.length).toBe(2);
    expect(sparks[0].querySelector("path.nbd-spark-line")!.getAttribute("d")).toMatch(/^M/);
    expect(sparks[0].querySelectorAll("line.nbd-mark-nan").length).toBe(1);
    expect(el.querySelector(".nbd-h-spark")!.textContent).toBe("mean over time");
    expect(el.querySelector(".nbd-loss svg path.nbd-spark-line")).not.toBeNull();
    expect(el.querySelector(".nbd-loss-label")!.textContent).toBe("loss 2.5 at step 4");
    const tick3 = el.querySelector(".nbd-slider-ticks .nbd-mark-nan") as HTMLElement;
    expect(tick3.getAttribute("data-slot")).toBe("2");
    // "first NaN" jumps the table to that step
    (el.querySelector(".nbd-goto-nan") as HTMLButtonElement).click();
    await tick();
    expect(model.get("step")).toBe(3);
    expect(meanOf(el, 0)).toBe(val(3, 0, 0));
    // another statistic for the over-time column
    const sel = el.querySelector(".nbd-spark-stat") as HTMLSelectElement;
    expect(Array.from(sel.options).map((o) => o.value)).toEqual(["mean", "std", "max", "min", "zero_frac", "dead_unit_frac", "grad_norm", "nan"]);
    sel.value = "grad_norm";
    sel.dispatchEvent(new Event("change"));
    await tick();
    expect(model.get("spark_stat")).toBe("grad_norm");
    expect(el.querySelector(".nbd-h-spark")!.textContent).toBe("grad_norm over time");
  });

  it("keeps hostile row names, incident and event text as text", async () => {
    const model = liveModel();
    const el = mount(widget.render, model);
    const incidents = [{ kind: "nonfinite", step: 2, module: HOSTILE, row: HOSTILE, phase: "forward", message: `step 2: \`${HOSTILE}\` produced NaN from finite inputs; input min −3.2` }];
    send(model, message([1, 2], { reset: true, incidents }));
    await tick();
    const card = el.querySelector(".nbd-incident")!;
    expect(card.textContent).toContain(`step 2 · NaN/Inf (forward) in ${HOSTILE}`);
    expect(card.querySelector(".nbd-incident-msg code")!.textContent).toBe(HOSTILE);
    model.set("events", [{ step: 1, row: HOSTILE, code: "became_dead", message: `ReLU \`${HOSTILE}\`: 97% of units dead from step 1`, suggestion: "<b>lower</b> the lr" }]);
    await tick();
    const ev = el.querySelector(".nbd-events li")!;
    expect(ev.textContent).toContain("<b>lower</b> the lr");
    expect(el.querySelector("img")).toBeNull();
    expect(el.querySelector(".nbd-events b")).toBeNull();
    expect(el.querySelectorAll(".nbd-name")[1].firstChild!.textContent).toBe(HOSTILE);
    // a click on the event's step shows that step and selects the row
    (ev.querySelector(".nbd-link") as HTMLElement).click();
    await tick();
    expect(model.get("step")).toBe(1);
    expect(model.get("selected")).toBe(HOSTILE);
  });

  it("reads the final history from the trait, with min/max bands when steps were merged", async () => {
    const steps = [4, 8];
    const n = steps.length * ROWS.length * FIELDS.length;
    const wire = (vals: number[]) => ({ view: f32(vals), dtype: "float32", shape: [2, ROWS.length, FIELDS.length] });
    const last = Array.from({ length: n }, (_, i) => i);
    const history = {
      fields: FIELDS, rows: ROWS, flag_bits: BITS, total_steps: 8, first_nonfinite_step: 0, group: 1,
      steps: { view: new DataView(i32(steps)), dtype: "int32", shape: [2] },
      last: wire(last), lo: wire(last.map((v) => v - 5)), hi: wire(last.map((v) => v + 5)),
      flags: { view: new DataView(u16([0, 0, 0, 0])), dtype: "uint16", shape: [2, 2] },
    };
    const model = liveModel({ history, running: false });
    const el = mount(widget.render, model);
    await tick();
    expect(el.querySelector(".nbd-step-label")!.textContent).toBe("step 8 of 8 (last of 4 steps)");
    expect(el.querySelectorAll(".nbd-body path.nbd-spark-band").length).toBe(2);
    expect(meanOf(el, 1)).toBe(last[1 * ROWS.length * FIELDS.length + 1 * FIELDS.length]);
  });
});

describe("HistoryStore and sparkline columns", () => {
  it("maps steps to slots and rows × fields to values", () => {
    const s = new HistoryStore();
    const m = message([2, 5, 9], { reset: true });
    s.applyMessage(m.content, m.buffers);
    expect(s.steps()).toEqual([2, 5, 9]);
    expect(s.slotOf(5)).toBe(1);
    expect(s.slotOf(6)).toBe(2); // inside the bucket that ends at 9
    expect(s.get(1, 1, "max")).toBe(val(5, 1, 3));
    expect(s.get(1, 7, "max")).toBeNaN(); // a row the slot does not have
    expect(s.tableAt(0, ["zero_frac", "numel"]).get(1, "zero_frac")).toBe(val(2, 1, 4));
    expect(() => s.applyMessage({ ...m.content, arrays: { ...m.content.arrays, last: { dtype: "float32", shape: [3, 2, 4], buffer: 1 } } }, m.buffers)).toThrow();
  });

  it("merges slots that share a pixel column into a band and leaves gaps at non-finite values", () => {
    const cols = sparkColumns([1, 5, 2, NaN, 3], 4); // x = 1, 2, 2, 3, 3
    expect(cols.map((c) => c.x)).toEqual([1, 2, 3]);
    expect(cols[1]).toMatchObject({ y: 2, lo: 2, hi: 5 }); // the column's last value, its band
    expect(cols[2]).toMatchObject({ y: 3, lo: 3, hi: 3 }); // NaN skipped within a column
    const gap = sparkColumns([1, NaN, 3], 100);
    expect(gap.map((c) => c.y)).toEqual([1, NaN, 3]);
  });
});
