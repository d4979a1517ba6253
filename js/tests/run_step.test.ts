// @vitest-environment happy-dom
// The run view's spread column follows the shown rank's step slider and "whole run" (src/run/spread.ts)
// from the `spread` trait's per-step and whole-run arrays (nbdebug/widgets/run.py spread_over_time):
// hand-built ranks of 3 kept steps, the spread kept for steps 1 and 3; no request while sliding.
import { afterEach, describe, expect, it } from "vitest";
import widget from "../src/run";
import { spreadOf } from "../src/run/spread";
import { FakeModel, f32View } from "./fakeModel";
import { HOSTILE, historyTrait, slide, wire } from "./fixtures";
import { mount, tick, unmountAll } from "./mount";

const NAMES = ["0", "1", HOSTILE];
const COLUMNS = ["mean", "std", "min", "max", "zero_frac", "nan", "inf", "grad_norm"];
const FIELDS = ["mean", "std", "min", "max", "zero_frac", "nan", "inf", "grad_norm"];
const STEPS = [1, 2, 3];
const SPREAD_STEPS = [1, 3]; // the widget kept evenly spaced steps: none for step 2

/** Rank r's mean of row i at step s: rank 0 positive, rank 1 negative (the spread is ±). */
const mean = (r: number, s: number, i: number) => (r ? -1 : 1) * (s + i / 4);

function rankTraits(r: number) {
  const layers = NAMES.map((name) => ({ name, module: name, type: "Linear", shape: [6, 8], dtype: "float32", flags: [], calls: 3 }));
  return {
    layers,
    columns: COLUMNS,
    stats: wire("float32", NAMES.flatMap((_, i) => COLUMNS.map((c) => (c === "mean" ? 100 * (r ? -1 : 1) : 0))), [3, COLUMNS.length]),
    legend: {},
    diagnoses: [],
    summary: `rank ${r}: 3 steps`,
    notes: [],
    has_grads: true,
    raised: {},
    steps: 3,
    first_nonfinite_step: 0,
    incidents: [],
    events: [],
    history: historyTrait({
      names: NAMES,
      fields: FIELDS,
      steps: STEPS,
      value: (s, i, f) => (f === "mean" ? mean(r, s, i) : f === "std" ? 1 : 0),
      shape: [6, 8],
      flagBits: { dead: 8 },
    }),
  };
}

/** The spread trait as spread_over_time lays it out: fields [mean, nan]; per kept step min/max over ranks. */
function spreadTrait() {
  const per = (s: number) => NAMES.flatMap((_, i) => [[mean(1, s, i), 0], [mean(0, s, i), 0]]);
  const lo = (s: number) => per(s).filter((_, k) => k % 2 === 0).flat();
  const hi = (s: number) => per(s).filter((_, k) => k % 2 === 1).flat();
  return {
    fields: ["mean", "nan"],
    rows: NAMES,
    lo: { view: f32View(NAMES.flatMap(() => [99, 0])), dtype: "float32" as const, shape: [3, 2] }, // "each rank's last step": a sentinel
    hi: { view: f32View(NAMES.flatMap(() => [99, 0])), dtype: "float32" as const, shape: [3, 2] },
    steps: wire("int32", SPREAD_STEPS),
    step_lo: wire("float32", SPREAD_STEPS.flatMap(lo), [2, 3, 2]),
    step_hi: wire("float32", SPREAD_STEPS.flatMap(hi), [2, 3, 2]),
    whole_lo: wire("float32", NAMES.flatMap(() => [-100, 0]), [3, 2]),
    whole_hi: wire("float32", NAMES.flatMap(() => [100, 0]), [3, 2]),
  };
}

function makeModel(): FakeModel {
  const m = new FakeModel({
    ranks: [0, 1].map((rank) => ({ rank, recorded: true, steps: 3, nonfinite: false, error: "", hooks_left: 0 })),
    rank: 1,
    focus: 1,
    world_size: 2,
    summary: "2 rank(s)",
    nonfinite: [],
    diverged: [],
    buffers_differ: [],
    compared_step: 3,
    errors: [],
    notes: [],
    spread: spreadTrait(),
    spread_stat: "mean",
    rank_state: { rank: 1, traits: rankTraits(1) },
    js_error: "",
  });
  m.respond = (c) => (c.type === "request" && c.method === "rank" ? { msg: { type: "response", id: c.id, ok: true, result: { rank: 0, traits: rankTraits(0) }, arrays: {} } } : null);
  return m;
}

const cell = (el: HTMLElement, name: string) => {
  const row = Array.from(el.querySelectorAll<HTMLElement>(".nbd-row")).find((r) => r.querySelector(".nbd-name")!.firstChild!.textContent === name)!;
  return row.querySelector<HTMLElement>(".nbd-spread-cell")!;
};
const texts = (el: HTMLElement) => NAMES.map((n) => cell(el, n).textContent);

afterEach(unmountAll);

describe("run view over time", () => {
  it("reads the spread at a kept step, over the whole run, and says when a step was not kept", () => {
    const sp = spreadTrait();
    expect(spreadOf(sp, "1", "mean", { kind: "step", step: 3 })).toEqual([-3.25, 3.25]);
    expect(spreadOf(sp, "1", "mean", { kind: "step", step: 1 })).toEqual([-1.25, 1.25]);
    expect(spreadOf(sp, "1", "mean", { kind: "step", step: 2 }).every(Number.isNaN)).toBe(true);
    expect(spreadOf(sp, "1", "mean", { kind: "whole" })).toEqual([-100, 100]);
    expect(spreadOf(sp, "1", "mean")).toEqual([99, 99]);
    expect(() => spreadOf({ ...sp, steps: wire("int32", [1, 2, 3]) }, "1", "mean", { kind: "step", step: 1 })).toThrow(/does not match 3 steps/);
  });

  it("the spread column follows the rank's step slider and whole run, then the next rank at the same step", async () => {
    const m = makeModel();
    const el = mount(widget.render, m);
    // the last kept step (3), not the 'each rank's last step' arrays
    expect(texts(el)).toEqual(["-3 … 3", "-3.25 … 3.25", "-3.5 … 3.5"]);
    expect(cell(el, "0").title).toBe("mean across ranks at step 3: min -3, max 3");
    expect(el.querySelector(".nbd-h-spread")!.getAttribute("title")).toBe("min … max over the ranks at step 3 (bold: the ranks differ)");
    await slide(el, 0);
    expect(el.querySelector(".nbd-step-label")!.textContent).toBe("step 1 of 3");
    expect(texts(el)).toEqual(["-1 … 1", "-1.25 … 1.25", "-1.5 … 1.5"]); // each = min/max of the ranks' series at step 1
    expect(el.querySelector(".nbd-h-spread")!.getAttribute("title")).toBe("min … max over the ranks at step 1 (bold: the ranks differ)");
    await slide(el, 1); // step 2: not kept in the spread
    expect(texts(el)).toEqual(["—", "—", "—"]);
    expect(cell(el, HOSTILE).title).toBe("no spread across ranks kept for step 2 (the widget keeps evenly spaced steps)");
    (el.querySelector(".nbd-whole") as HTMLButtonElement).click();
    await tick();
    expect(texts(el)).toEqual(["-100 … 100", "-100 … 100", "-100 … 100"]);
    expect(cell(el, "0").title).toBe("mean across ranks over the whole run (merged rows): min -100, max 100");
    expect(m.sent).toEqual([]); // all from the browser's data
    // back to step 1, then rank 0: fetched once, shown at the same step with the same spread
    await slide(el, 0);
    el.querySelector<HTMLButtonElement>('.nbd-rank-btn[data-rank="0"]')!.click();
    await tick();
    await tick();
    expect(el.querySelector<HTMLElement>(".nbdebug-run")!.dataset.rank).toBe("0");
    expect(el.querySelector(".nbd-step-label")!.textContent).toBe("step 1 of 3");
    expect(el.querySelector(".nbd-row .nbd-therm")!.getAttribute("title")).toMatch(/^mean 1 ±/);
    expect(texts(el)).toEqual(["-1 … 1", "-1.25 … 1.25", "-1.5 … 1.5"]);
    expect(el.querySelector("img")).toBeNull();
    expect(m.get("js_error")).toBe("");
  });
});
