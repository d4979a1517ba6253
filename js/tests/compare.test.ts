// @vitest-environment happy-dom
// The compare view (js/src/compare.ts) against a fake model: the runs' losses overlaid with the
// divergence marked and said, labels as text, the row/statistic selects writing the synced traits,
// the chosen series drawn once the kernel sends it.
import { afterEach, describe, expect, it } from "vitest";
import compare, { PALETTE, runColours, runRow } from "../src/compare";
import { FakeModel } from "./fakeModel";
import { HOSTILE, wire } from "./fixtures";
import { mount, unmountAll } from "./mount";

afterEach(unmountAll);

const STEPS = [1, 2, 3, 4];
function model(extra: Record<string, any> = {}): FakeModel {
  return new FakeModel({
    labels: ["lr=3.0", HOSTILE],
    steps: wire("int32", STEPS),
    loss: wire("float32", [2.3, 2.1, 1.9, 1.8, 2.3, 2.25, 2.2, 2.15], [2, 4]),
    rows: ["0", "1"],
    fields: ["mean", "dead_unit_frac"],
    row: "",
    field: "mean",
    series: {},
    divergence: { loss: [{ run: 1, step: 2, a: 2.1, b: 2.25, scale: 2.2, rtol: 0.1 }], series: [],
      loss_text: `first divergence in loss: \`${HOSTILE}\` leaves \`lr=3.0\` at step 2: 2.25 vs 2.10`, series_text: "" },
    rtol: 0.1,
    summary: "old summary",
    headline: `\`lr=3.0\` ends at 1.80, 1.2× lower; \`${HOSTILE}\` rises from 2.30 to 2.15`,
    colours: ["#1f77b4", "#d62728"],
    loss_log: false,
    notes: ["first divergence: …"],
    js_error: "",
    ...extra,
  });
}

describe("compare view", () => {
  it("leads with the kernel's headline, overlays the losses, marks and says the first divergence, labels as text", () => {
    const m = model();
    const el = mount(compare.render as any, m);
    expect(el.querySelector(".nbdebug-compare")!.getAttribute("data-ready")).toBe("1");
    const head = el.querySelector(".nbd-cmp-summary")!;
    expect(head).toBe(el.querySelector(".nbdebug-compare > :not(style)"));
    expect(head.textContent).toBe(`lr=3.0 ends at 1.80, 1.2× lower; ${HOSTILE} rises from 2.30 to 2.15`);
    expect(Array.from(head.querySelectorAll("code")).map((c) => c.textContent)).toEqual(["lr=3.0", HOSTILE]);
    expect(Array.from(el.querySelectorAll(".nbd-cmp-legend-item")).map((e) => e.getAttribute("data-colour"))).toEqual(["#1f77b4", "#d62728"]);
    expect(Array.from(el.querySelectorAll(".nbd-cmp-legend-item")).map((e) => e.textContent)).toEqual(["lr=3.0", HOSTILE]);
    expect(el.querySelector("img")).toBeNull();
    const chart = el.querySelector(".nbd-chart")!;
    expect(chart.querySelectorAll("path.nbd-chart-line").length).toBe(2);
    expect(chart.querySelector(".nbd-mark-diverge")!.getAttribute("data-step")).toBe("2");
    expect(chart.querySelector(".nbd-chart-readout")!.textContent).toBe(`step 4: lr=3.0 1.8 · ${HOSTILE} 2.15`);
    expect(el.querySelector(".nbd-cmp-loss-diverge")!.textContent).toBe(`first divergence in loss: ${HOSTILE} leaves lr=3.0 at step 2: 2.25 vs 2.10`);
    expect(chart.querySelector("svg")!.getAttribute("data-scale")).toBe("linear");
    expect((el.querySelector(".nbd-cmp-series") as HTMLElement).style.display).toBe("none");
    expect(m.get("js_error")).toBe("");
  });

  it("writes the chosen row and statistic, and draws the series the kernel sends", () => {
    const m = model();
    const el = mount(compare.render as any, m);
    const row = el.querySelector("select.nbd-cmp-row") as HTMLSelectElement;
    expect(Array.from(row.options).map((o) => o.value)).toEqual(["", "0", "1"]);
    row.value = "1";
    row.dispatchEvent(new Event("change"));
    expect(m.get("row")).toBe("1");
    expect(m.saves).toBe(1);
    m.set("series", wire("float32", [0.1, 0.5, 0.9, 0.9, 0.1, 0.1, 0.2, 0.1], [2, 4]));
    m.set("divergence", { ...m.get("divergence"), series: [null], series_text: `first divergence in mean of \`1\`: \`${HOSTILE}\` stays within 0.1× of \`lr=3.0\`` });
    const box = el.querySelector(".nbd-cmp-series") as HTMLElement;
    expect(box.style.display).toBe("");
    expect(box.querySelector(".nbd-cmp-series-title")!.textContent).toBe("mean of 1");
    expect(box.querySelectorAll("path.nbd-chart-line").length).toBe(2);
    expect(box.querySelector(".nbd-cmp-series-diverge")!.textContent).toContain(`${HOSTILE} stays within 0.1× of lr=3.0`);
    const field = el.querySelector("select.nbd-cmp-field") as HTMLSelectElement;
    field.value = "dead_unit_frac";
    field.dispatchEvent(new Event("change"));
    expect(m.get("field")).toBe("dead_unit_frac");
  });

  it("decodes one run's row of a [runs, steps] array", () => {
    const w = wire("float32", [1, 2, 3, 4, 5, 6], [2, 3]);
    expect(Array.from(runRow(w, 1, 3))).toEqual([4, 5, 6]);
    expect(Array.from(runRow(null, 0, 2)).every(Number.isNaN)).toBe(true);
  });

  it("draws the loss on a log axis when the kernel says its range exceeds 10×", () => {
    const el = mount(compare.render as any, model({ loss_log: true }));
    expect(el.querySelector(".nbd-chart svg")!.getAttribute("data-scale")).toBe("log");
    expect(el.querySelector(".nbd-cmp-loss-title")!.textContent).toContain("log scale");
  });

  it("has no red in the healthy runs' palette; the kernel's colours win", () => {
    expect(PALETTE).not.toContain("#d62728");
    expect(runColours(["#d62728"], 3)).toEqual(["#d62728", PALETTE[1], PALETTE[2]]);
  });
});
