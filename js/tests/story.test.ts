// @vitest-environment happy-dom
// Issue 22 in the thermometer's DOM: the header is the kernel's finding (live from the history
// messages, then the final trait), the ranked findings, one timeline of incidents and events (loss
// spikes at consecutive steps in one entry), each piece of advice once, the update-ratio chip saying
// too high / too low with a readable text colour, absent legend entries hidden, the evidence behind a
// flag in bold, the gradient column named ‖∂L/∂out‖, and hostile text staying text.
import { afterEach, describe, expect, it } from "vitest";
import widget from "../src/thermometer";
import { renderTimeline, Said } from "../src/thermometer/cards";
import { displayFlags } from "../src/thermometer/rows";
import { FakeModel, f32View } from "./fakeModel";
import { HOSTILE, thermometerUiTraits } from "./fixtures";
import { mount, tick, unmountAll } from "./mount";

afterEach(unmountAll);

const COLUMNS = ["mean", "std", "min", "max", "zero_frac", "near_zero_frac", "nan", "inf", "numel", "grad_norm", "update_ratio"];
const LEGEND = {
  dead: { label: "dead", color: "#756bb1", description: "always zero" },
  update_ratio: { label: "update ratio out of range", color: "#ff7f0e", description: "out of range" },
  update_high: { label: "update too high", color: "#ff7f0e", description: "too high" },
  update_low: { label: "update too low", color: "#8c6d31", description: "too low" },
  vanishing: { label: "vanishing", color: "#969696", description: "tiny" },
};
const LAYERS = [
  { name: "0", module: "0", type: "Linear", shape: [4, 8], dtype: "float32", flags: ["update_ratio"], calls: 1 },
  { name: "1", module: "1", type: "ReLU", shape: [4, 8], dtype: "float32", flags: ["dead"], calls: 1 },
  { name: HOSTILE, module: HOSTILE, type: "Linear", shape: [4, 2], dtype: "float32", flags: ["update_ratio"], calls: 1 },
];
const STATS = [
  [0.1, 1, -2, 2, 0.0, 0.0, 0, 0, 32, 0.5, 0.3],
  [0.0, 0, 0, 0, 1.0, 1.0, 0, 0, 32, 0.4, NaN],
  [0.2, 1, -1, 1, 0.0, 0.0, 0, 0, 8, 0.1, 5e-5],
];
const ADVICE = "Lower the learning rate: an update ratio around 1e-3 is healthy (Karpathy's rule of thumb).";
const FINDINGS = [
  { code: "lr_high", severity: "warning", step: 1, rows: ["0"], text: "learning rate too high: update ratio 0.3 at step 1 in `0`", short: "", detail: "learning rate too high: update ratio 0.3 at step 1 in `0`.", advice: ADVICE, cause: -1 },
  { code: "became_dead", severity: "warning", step: 4, rows: ["1"], text: "`1` dead from step 4", short: "`1` dead from step 4", detail: "`1`: 97% of its units dead from step 4.", advice: "", cause: 0 },
];

function model(extra: Record<string, any> = {}): FakeModel {
  return new FakeModel({
    ...thermometerUiTraits(),
    layers: LAYERS,
    columns: COLUMNS,
    stats: { view: f32View(STATS.flat(), 4), dtype: "float32", shape: [3, COLUMNS.length] },
    legend: LEGEND,
    diagnoses: [{ code: "update_ratio", severity: "warning", layer: "0", message: "update ratio too high at step 5 in 1 layer: `0` 0.3.", suggestion: ADVICE }],
    summary: "step 5: 3 layers: 1 dead layer (`1`), update ratio too high in 1 layer",
    headline: "learning rate too high: update ratio 0.3 at step 1 in `0` → `1` dead from step 4",
    findings: FINDINGS,
    events: [
      { step: 1, row: "0", code: "update_ratio", message: "`0`: update ratio of 0.3 at step 1, too large", suggestion: ADVICE },
      { step: 4, row: "1", code: "became_dead", message: `ReLU \`1\`: 97% of units dead from step 4`, suggestion: "LeakyReLU helps" },
    ],
    incidents: [],
    notes: ["a note"],
    has_grads: true,
    ...extra,
  });
}

const texts = (el: HTMLElement, sel: string) => Array.from(el.querySelectorAll(sel)).map((e) => e.textContent);

describe("the thermometer's story", () => {
  it("numbers the root causes 1, 2, … (what follows from one is marked, not counted)", () => {
    const note = { code: "update_high", severity: "note", step: 1, rows: ["0"], text: "update ratios above 0.01", short: "", detail: "update ratios above 0.01, with no harm seen.", advice: "", cause: -1 };
    const el = mount(widget.render as any, model({ findings: [...FINDINGS, note] }));
    const items = Array.from(el.querySelectorAll(".nbd-findings > li")) as HTMLLIElement[];
    expect(items.map((li) => (li.classList.contains("nbd-follows") ? "→" : String(li.value)))).toEqual(["1", "→", "2"]);
    expect(items[2].classList.contains("nbd-sev-note")).toBe(true);
  });

  it("leads with the finding, ranks the findings and says each piece of advice once", () => {
    const el = mount(widget.render as any, model());
    const root = el.querySelector(".nbdebug-thermometer")!;
    const head = el.querySelector(".nbd-finding") as HTMLElement;
    expect(root.children[1]).toBe(head); // right after the <style>: the first thing the view says
    expect(head.textContent).toBe("learning rate too high: update ratio 0.3 at step 1 in 0 → 1 dead from step 4");
    expect(texts(head, "code")).toEqual(["0", "1"]); // module names as names (code), never bare numbers
    const items = el.querySelectorAll(".nbd-findings > li");
    expect(items.length).toBe(2);
    expect(items[1].classList.contains("nbd-follows")).toBe(true);
    expect(items[0].querySelector(".nbd-step-link")!.getAttribute("data-step")).toBe("1");
    // the advice: once, at the root cause; not again under the event or the flag at the step
    expect(texts(el, ".nbd-suggestion")).toEqual([ADVICE, "LeakyReLU helps"]);
    expect((root.textContent ?? "").split("Karpathy").length - 1).toBe(1);
    // notes and the per-step flags are behind details toggles
    expect(el.querySelector("details.nbd-notes-box .nbd-notes li")!.textContent).toBe("a note");
    const flags = el.querySelector("details.nbd-diag-box") as HTMLDetailsElement;
    expect(flags.querySelector("summary")!.textContent).toBe("flags: 1");
    expect(flags.open).toBe(false); // the findings above say it
  });

  it("shows the live finding while the cell runs, then the final one", async () => {
    const m = model({ running: true, headline: "", findings: [], history: {} });
    const el = mount(widget.render as any, m);
    m.emit("msg:custom", { type: "history", reset: true, from: 0, fields: ["mean"], rows: [{ name: "0" }], flag_bits: {}, total_steps: 3,
                           first_nonfinite_step: 0, group: 1, arrays: {}, headline: "learning rate too high: live", findings: [FINDINGS[0]] });
    await tick();
    expect(el.querySelector(".nbd-finding")!.textContent).toBe("learning rate too high: live");
    expect(el.querySelectorAll(".nbd-findings > li").length).toBe(1);
    m.set("headline", "the final finding");
    m.set("running", false);
    await tick();
    expect(el.querySelector(".nbd-finding")!.textContent).toBe("the final finding");
  });

  it("flags the update ratio as too high or too low, in a chip whose text reads", () => {
    const el = mount(widget.render as any, model());
    const chips = (i: number) => Array.from(el.querySelectorAll(`.nbd-row[data-row="${i}"] .nbd-chip`)) as HTMLElement[];
    expect(chips(0).map((c) => c.textContent)).toEqual(["update too high"]);
    expect(chips(2).map((c) => c.textContent)).toEqual(["update too low"]);
    expect(chips(0)[0].style.color).toMatch(/#000000|rgb\(0, 0, 0\)/); // black on orange (8.6:1), not white (2.4:1)
    // the legend lists what is shown; the generic and absent codes are hidden
    const absent = Array.from(el.querySelectorAll(".nbd-legend-item.nbd-absent")).map((e) => e.getAttribute("data-code"));
    expect(absent.sort()).toEqual(["update_ratio", "vanishing"]);
    // the evidence behind a flag is bold; the gradient column says what it is
    expect(el.querySelector('.nbd-row[data-row="1"] .nbd-zero-frac')!.classList.contains("nbd-evidence")).toBe(true);
    expect(el.querySelector('.nbd-row[data-row="0"] .nbd-zero-frac')!.classList.contains("nbd-evidence")).toBe(false);
    expect(el.querySelectorAll(".nbd-head > div")[7].textContent).toBe("‖∂L/∂out‖");
    expect(displayFlags(["update_ratio"], NaN, LEGEND)).toEqual(["update_ratio"]);
    expect(displayFlags(["dead", "update_ratio"], 0.02, {})).toEqual(["dead", "update_ratio"]); // an older kernel's legend
  });

  it("keeps one timeline: incidents and events by step, spikes at consecutive steps in one entry", () => {
    const list = document.createElement("ul");
    const spike = (step: number, value: number) => ({ kind: "loss_spike", step, message: `step ${step}: loss ${value}`, value });
    renderTimeline(list, [spike(12, 50), spike(13, 900), spike(14, 70), { kind: "nonfinite", step: 25, row: HOSTILE, phase: "forward", message: `\`${HOSTILE}\` made Inf` }, spike(30, 40)],
      [{ step: 17, row: "3", code: "became_dead", message: "`3` died", suggestion: "x" }, { step: 50, row: "0", code: "grad_fell", message: "`0` fell", suggestion: "y" },
       { step: 50, row: "2", code: "grad_fell", message: "`2` fell", suggestion: "y" }], new Said());
    const entries = Array.from(list.children) as HTMLElement[];
    expect(entries.map((e) => e.getAttribute("data-step"))).toEqual(["12", "17", "25", "30", "50"]);
    expect(entries[0].querySelector(".nbd-incident-head")!.textContent).toBe("step 12 · loss spikes at 3 steps, to step 14");
    expect(entries[0].querySelector(".nbd-incident-msg")!.textContent).toBe("step 13: loss 900"); // the largest one's message
    expect(entries[2].querySelector(".nbd-incident-head code")!.textContent).toBe(HOSTILE);
    expect(list.querySelector("img")).toBeNull();
    expect(entries[4].textContent).toBe("step 50 0 fell; 2 fell" + "y"); // one entry, the advice once
  });
});
