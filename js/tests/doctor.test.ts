// @vitest-environment happy-dom
// The doctor's checklist: one row per check in the order given, status marks and evidence text,
// the overfit curve decoded from the bytes trait (an unaligned DataView), a click syncing
// `selected`, and hostile text (layer names, advice) staying text.
import { afterEach, describe, expect, it } from "vitest";
import doctor, { curveOf, drawCurve, evidenceText } from "../src/doctor";
import { FakeModel, f32View } from "./fakeModel";
import { mount, unmountAll } from "./mount";

afterEach(unmountAll);

const HOSTILE = "<img src=x onerror=alert(1)>";

function reportModel(): FakeModel {
  return new FakeModel({
    checks: [
      { name: "init_loss", status: "pass", advice: "initial loss ≈ ln 10", evidence: [["loss", 2.3371], ["classes", 10]] },
      { name: "overfit_batch", status: "fail", advice: "remove the softmax", evidence: [["floor", 1.4612], ["reached_at", -1]] },
      { name: "dead_units", status: "fail", advice: `units dead in \`${HOSTILE}\``, evidence: [["worst_layer", HOSTILE], ["layers", ["a", "b#2"]]] },
      { name: "input_scale", status: "skip", advice: "integer inputs", evidence: [] },
    ],
    curve: f32View([2.3, 1.9, 1.6, 1.47, 1.4612], 1),
    curve_target: 0.115,
    curve_floor: 1.4612,
    kind: "classification",
    classes: 10,
    elapsed_s: 0.42,
    notes: ["ran on a deep copy"],
    selected: "",
    headline: `overfit_batch failed: the loss only fell to 1.46 in \`${HOSTILE}\` (and 1 more failed)`,
  });
}

describe("doctor checklist", () => {
  it("draws one row per check with its status, evidence and advice, the failed ones first", () => {
    const m = reportModel();
    const el = mount(doctor.render as any, m);
    const root = el.querySelector(".nbdebug-doctor") as HTMLElement;
    expect(root.getAttribute("data-ready")).toBe("1");
    const rows = Array.from(el.querySelectorAll(".nbd-check"));
    // failed first (issue 22), then the others, each in checklist order
    expect(rows.map((r) => [r.getAttribute("data-check"), r.getAttribute("data-status")])).toEqual([
      ["overfit_batch", "fail"], ["dead_units", "fail"], ["init_loss", "pass"], ["input_scale", "skip"],
    ]);
    expect(rows.map((r) => r.querySelector(".nbd-status")!.textContent)).toEqual(["✗", "✗", "✓", "–"]);
    expect(Array.from(rows[2].querySelectorAll(".nbd-evidence span")).map((s) => s.textContent)).toEqual(["loss = 2.34", "classes = 10"]);
    expect(rows[0].querySelector(".nbd-advice")!.textContent).toBe("remove the softmax");
    // "2 failed" is the first thing in the header, in its own prominent element
    const verdict = el.querySelector(".nbd-head .nbd-verdict") as HTMLElement;
    expect(verdict.textContent).toBe("2 failed");
    expect((el.querySelector(".nbd-head") as HTMLElement).firstElementChild).toBe(verdict);
    expect(el.querySelector(".nbd-notes li")!.textContent).toBe("ran on a deep copy");
    // the Python-computed headline under the verdict, as text (a layer name is never markup): the
    // backticked name as a code span holding the hostile text, as every view writes names
    const headline = el.querySelector(".nbd-head .nbd-headline") as HTMLElement;
    expect(headline.textContent).toBe(m.get("headline").replace(/`/g, ""));
    expect(Array.from(headline.children).map((c) => [c.tagName, c.textContent])).toEqual([["CODE", HOSTILE]]);
    // the curve row only on overfit_batch, with its legend
    expect(el.querySelectorAll("canvas.nbd-curve").length).toBe(1);
    expect(rows[0].querySelector("canvas.nbd-curve")).not.toBeNull();
    expect(rows[0].querySelector(".nbd-legend")!.textContent).toBe("loss per step (5 points) · green: target 0.115 · red: double-softmax floor 1.46");
    // nothing failed: said so in the same place
    m.set("checks", [{ name: "init_loss", status: "pass", advice: "ok", evidence: [] }]);
    expect((el.querySelector(".nbd-head .nbd-verdict") as HTMLElement).textContent).toBe("nothing failed");
    expect(el.querySelector(".nbd-head .nbd-headline")).toBeNull();
  });

  it("lists a check worth a look ('warn') after the failed ones and before the passed, and counts it in the header", () => {
    const m = reportModel();
    m.set("checks", [
      { name: "init_loss", status: "warn", advice: "initial loss 1.98 is above ln 4", evidence: [["loss", 1.98]] },
      { name: "gradient_flow", status: "pass", advice: "ok", evidence: [] },
      { name: "overfit_batch", status: "fail", advice: "remove the softmax", evidence: [] },
    ]);
    const el = mount(doctor.render as any, m);
    const rows = Array.from(el.querySelectorAll(".nbd-check"));
    expect(rows.map((r) => [r.getAttribute("data-check"), r.getAttribute("data-status")])).toEqual([
      ["overfit_batch", "fail"], ["init_loss", "warn"], ["gradient_flow", "pass"],
    ]);
    expect(rows.map((r) => r.querySelector(".nbd-status")!.textContent)).toEqual(["✗", "!", "✓"]);
    expect((el.querySelector(".nbd-head .nbd-verdict") as HTMLElement).textContent).toBe("1 failed");
    expect((el.querySelector(".nbd-head .nbd-look") as HTMLElement).textContent).toBe("1 worth a look");
    // nothing failed, one to look at: the verdict stays green and the count stays beside it
    m.set("checks", [{ name: "init_loss", status: "warn", advice: "above ln 4", evidence: [] }]);
    expect((el.querySelector(".nbd-head .nbd-verdict") as HTMLElement).textContent).toBe("nothing failed");
    expect((el.querySelector(".nbd-head .nbd-look") as HTMLElement).textContent).toBe("1 worth a look");
    m.set("checks", [{ name: "init_loss", status: "pass", advice: "ok", evidence: [] }]);
    expect(el.querySelector(".nbd-head .nbd-look")).toBeNull();
  });

  it("keeps hostile names and advice as text", () => {
    const el = mount(doctor.render as any, reportModel());
    expect(el.querySelector("img")).toBeNull();
    const row = el.querySelector('[data-check="dead_units"]') as HTMLElement;
    expect(row.querySelector(".nbd-advice")!.textContent).toBe(`units dead in \`${HOSTILE}\``);
    expect(Array.from(row.querySelectorAll(".nbd-evidence span")).map((s) => s.textContent)).toEqual([
      `worst_layer = ${HOSTILE}`, "layers = a, b#2",
    ]);
  });

  it("a click sets `selected` and marks the row; a second click clears it", () => {
    const m = reportModel();
    const el = mount(doctor.render as any, m);
    (el.querySelector('[data-check="overfit_batch"]') as HTMLElement).click();
    expect(m.get("selected")).toBe("overfit_batch");
    expect(m.saves).toBe(1);
    expect(el.querySelector(".nbd-selected")!.getAttribute("data-check")).toBe("overfit_batch");
    (el.querySelector('[data-check="overfit_batch"]') as HTMLElement).click();
    expect(m.get("selected")).toBe("");
    expect(el.querySelector(".nbd-selected")).toBeNull();
  });

  it("redraws when the checks change and stops listening after cleanup", () => {
    const m = reportModel();
    const el = mount(doctor.render as any, m);
    m.set("checks", [{ name: "nonfinite", status: "fail", advice: "NaN in `fc`", evidence: [["origin", "fc"]] }]);
    expect(Array.from(el.querySelectorAll(".nbd-check")).map((r) => r.getAttribute("data-check"))).toEqual(["nonfinite"]);
    expect(m.listenerCount()).toBeGreaterThan(0);
    unmountAll();
    expect(m.listenerCount()).toBe(0);
  });
});

describe("doctor helpers", () => {
  it("decodes the curve from an unaligned DataView and formats evidence", () => {
    const m = reportModel();
    expect(Array.from(curveOf(m)).map((v) => Number(v.toFixed(4)))).toEqual([2.3, 1.9, 1.6, 1.47, 1.4612]);
    expect(curveOf(new FakeModel({ curve: new DataView(new ArrayBuffer(0)) })).length).toBe(0);
    expect(evidenceText(0.000123456)).toBe("1.23e-4");
    expect(evidenceText(-1)).toBe("-1");
    expect(evidenceText("NaN")).toBe("NaN");
    expect(evidenceText([1, 2.5, "x"])).toBe("1, 2.5, x");
    expect(evidenceText(true)).toBe("yes");
  });

  it("counts the finite points it draws on a 2D context", () => {
    const calls: string[] = [];
    const ctx = new Proxy({}, { get: (_t, k) => (k === "setLineDash" || typeof k !== "string" ? () => {} : (...a: unknown[]) => calls.push(`${String(k)}(${a.length})`)), set: () => true });
    const canvas = { width: 100, height: 40, getContext: () => ctx } as unknown as HTMLCanvasElement;
    expect(drawCurve(canvas, new Float32Array([3, NaN, 2, 1]), [{ y: 0.5, colour: "green" }])).toBe(3);
    expect(calls.filter((c) => c.startsWith("lineTo")).length).toBe(2); // the target line, then 2 → 1 (the NaN breaks the pen)
    expect(drawCurve(canvas, new Float32Array(0), [])).toBe(0);
  });
});
