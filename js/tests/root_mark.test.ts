// Issue 26: the header's root cause gets a tick on the loss chart at its step (a red line whose
// title is the finding, as text); notes and the findings that follow from a cause get none.
import { describe, expect, it } from "vitest";
import type { Finding, HistoryStore } from "../src/thermometer/history";
import { lossMarks } from "../src/thermometer/timeline";

const store = { scalar: () => new Float32Array(4), firstNonfinite: 0, step: (i: number) => i + 1, slotOf: (s: number) => s - 1 } as unknown as HistoryStore;
const f = (code: string, severity: string, step: number, cause: number, text = code): Finding =>
  ({ code, severity, step, rows: [], text, short: "", detail: "", advice: "", cause }) as Finding;

describe("the root cause's tick", () => {
  it("marks the header's finding (the ranked first, a warning or an error), at its step, its text as the title", () => {
    const marks = lossMarks(store, [], [], [f("lr_high", "warning", 3, -1, "learning rate too high in `0<b>`"), f("became_dead", "warning", 17, 0), f("update_high", "note", 1, -1)]);
    const roots = marks.filter((m) => m.cls === "nbd-mark-root");
    expect(roots).toEqual([{ step: 3, cls: "nbd-mark-root", title: "step 3: the root cause: learning rate too high in 0<b>" }]);
  });
  it("draws none for a quiet run (notes only) or a finding with no step", () => {
    expect(lossMarks(store, [], [], [f("update_high", "note", 1, -1)]).some((m) => m.cls === "nbd-mark-root")).toBe(false);
    expect(lossMarks(store, [], [], [f("torch_warning", "warning", 0, -1)]).some((m) => m.cls === "nbd-mark-root")).toBe(false);
  });
  it("never ticks another root in place of a header finding without a step (review T4)", () => {
    const marks = lossMarks(store, [], [], [f("raised", "error", 0, -1), f("lr_high", "warning", 3, -1)]);
    expect(marks.some((m) => m.cls === "nbd-mark-root")).toBe(false);
  });
});
