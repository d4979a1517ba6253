// @vitest-environment happy-dom
// The attribution view (js/src/attribution.ts) against a fake model: tokens drawn as text (hostile
// ones too) on diverging colours with readable text, the method switch asking the kernel and drawing
// its answer, the completeness warning with its "more steps" request, the deletion curves.
import { afterEach, describe, expect, it } from "vitest";
import attribution, { deltaText, deletionChart, scoreDecimals, scoreT, type AttrData } from "../src/attribution";
import { cssOf } from "../src/patching/colour";
import { FakeModel } from "./fakeModel";
import { HOSTILE } from "./fixtures";
import { mount, tick, unmountAll } from "./mount";

afterEach(unmountAll);

function data(extra: Partial<AttrData> = {}): AttrData {
  return {
    method: "grad_x_input", label: "logit[' Paris'] - logit[' Rome']", tokens: ["The", HOSTILE, " Tower"], scores: [0.5, -1, 0],
    metric: 2.86, metric_baseline: null, delta: null, converged: null, relative_delta: null, steps: null, baseline: "zero",
    faithfulness: { deletion: 0.2, random: 0.5 }, curves: { deletion: [1, 0.4, 0.1, 0], random: [1, 0.7, 0.3, 0] }, notes: [],
    headline: "'The' pushes logit[' Paris'] - logit[' Rome'] up most (+0.50) (gradient × input)", advice: null, ...extra,
  };
}

function model(d: AttrData = data()): FakeModel {
  return new FakeModel({ data: d, method: d.method, methods: ["grad_x_input", "integrated_gradients", "occlusion"], steps: 64, fix_first: false, js_error: "" });
}

describe("attribution view", () => {
  it("draws every token as text on a diverging colour", () => {
    const el = mount(attribution.render as any, model());
    expect(el.querySelector(".nbdebug-attribution")!.getAttribute("data-ready")).toBe("1");
    const toks = Array.from(el.querySelectorAll(".nbd-attr-text")).map((e) => e.textContent);
    expect(toks).toEqual(["The", HOSTILE, " Tower"]);
    expect(el.querySelector("img")).toBeNull(); // the hostile token stayed text
    const spans = el.querySelectorAll<HTMLElement>(".nbd-attr-tok");
    expect(spans[1].style.background).not.toBe(spans[0].style.background);
    // the patching view's scale: the strongest push against the answer is its −1 (red), toward it blue
    expect(spans[1].style.background).toBe(cssOf(-1));
    expect(spans[0].style.background).toBe(cssOf(0.5));
    expect(el.querySelectorAll(".nbd-attr-line").length).toBe(2);
    expect(el.querySelector(".nbd-chart-log")).toBeNull(); // no log-scale box on a signed curve
    expect(el.querySelector(".nbd-attr-warn")).toBeNull();
    // the kernel's headline first, the question under it
    expect(el.querySelector(".nbdebug-attribution > :not(style)")!.textContent).toBe(data().headline);
    expect(el.querySelector(".nbd-attr-what")!.textContent).toBe("why? logit[' Paris'] - logit[' Rome'] = 2.86 · gradient × input");
    expect(el.querySelector(".nbd-attr-next")).toBeNull();
  });

  it("scales scores around white and says the completeness gap", () => {
    expect(scoreT(0, 2)).toBe(0);
    expect(scoreT(2, 2)).toBe(1);
    expect(scoreT(-4, 2)).toBe(-1);
    expect(deltaText(data())).toBe("");
    const bad = data({ method: "integrated_gradients", delta: 33.3, relative_delta: 11.66, converged: false, steps: 64, metric_baseline: 0 });
    expect(deltaText(bad)).toContain("NOT converged");
  });

  it("switches method through the kernel and asks for more steps when IG misses completeness", async () => {
    const m = model();
    const ig = data({ method: "integrated_gradients", scores: [3, 1, -2], delta: 33.3, relative_delta: 11.66, converged: false, steps: 64, metric_baseline: 0 });
    m.respond = (c) => (c.type === "request" ? { msg: { type: "response", id: c.id, ok: true, result: c.params.steps === 256 ? { ...ig, steps: 256 } : ig, arrays: {} } } : null);
    const el = mount(attribution.render as any, m);
    const sel = el.querySelector<HTMLSelectElement>(".nbd-attr-method")!;
    sel.value = "integrated_gradients";
    sel.dispatchEvent(new Event("change"));
    await tick();
    expect(m.sent[0].content.method).toBe("attribution");
    expect(m.sent[0].content.params).toEqual({ method: "integrated_gradients", steps: 64, fix_first: false });
    expect(Array.from(el.querySelectorAll(".nbd-attr-score")).map((e) => e.textContent)).toEqual(["3.000", "1.000", "-2.000"]);
    expect(el.querySelector(".nbd-attr-warn")!.textContent).toContain("NOT converged");
    el.querySelector<HTMLButtonElement>(".nbd-attr-more")!.click();
    await tick();
    expect(m.sent[1].content.params.steps).toBe(256);
    el.querySelector<HTMLButtonElement>(".nbd-attr-fix")!.click();
    await tick();
    expect(m.sent[2].content.params).toMatchObject({ method: "integrated_gradients", fix_first: true });
  });
});

describe("attribution no better than random", () => {
  it("leads with the kernel's warning and offers the next method as a button", async () => {
    const bad = data({ faithfulness: { deletion: 0.283, random: 0.061 },
      headline: "gradient × input is no better than random here: …; try integrated gradients with the first token kept in the baseline",
      advice: { method: "integrated_gradients", fix_first: true, text: "integrated gradients with the first token kept in the baseline" } });
    const m = model(bad);
    m.respond = (c) => (c.type === "request" ? { msg: { type: "response", id: c.id, ok: true, result: data({ method: "integrated_gradients" }), arrays: {} } } : null);
    const el = mount(attribution.render as any, m);
    expect(el.querySelector(".nbd-attr-head")!.textContent).toBe(bad.headline);
    const next = el.querySelector<HTMLButtonElement>(".nbd-attr-next")!;
    expect(next.textContent).toBe("try integrated gradients with the first token kept in the baseline");
    next.click();
    await tick();
    expect(m.sent[0].content.params).toMatchObject({ method: "integrated_gradients", fix_first: true });
    expect(el.querySelector(".nbd-attr-next")).toBeNull(); // the answer offers nothing more
  });

  it("writes every score with the same decimals, four significant digits of the largest", () => {
    expect([scoreDecimals(3), scoreDecimals(0.0308), scoreDecimals(250), scoreDecimals(0)]).toEqual([3, 5, 2, 2]);
  });

  it("writes the chart's axes out", () => {
    const c = deletionChart([1, 0.4, -0.2], [1, 0.7, 0.3]);
    expect(c.textContent).toContain("y: share of m(x) − m(baseline) left, 1.00 at the top, -0.20 at the bottom");
    expect(c.textContent).toContain("x: 0 tokens replaced2 (all)");
  });
});

describe("attribution view after generate()", () => {
  it("lists the generated tokens as text and asks the kernel for the clicked one as the answer", async () => {
    const m = new FakeModel({ data: data(), method: "grad_x_input", methods: ["grad_x_input", "occlusion"], steps: 64, fix_first: false,
      js_error: "", generated: [" Paris", HOSTILE, "."], pick: -1 });
    const picked = data({ label: "logit['.'] - logit[' Rome']", tokens: ["The", HOSTILE, " Tower", " Paris", HOSTILE], scores: [1, 2, 3, 4, 5] });
    m.respond = (c) => (c.type === "request" ? { msg: { type: "response", id: c.id, ok: true, result: picked, arrays: {} } } : null);
    const el = mount(attribution.render as any, m);
    const chips = Array.from(el.querySelectorAll<HTMLButtonElement>(".nbd-attr-gen"));
    expect(chips.map((c) => c.textContent)).toEqual(["--answer", " Paris", HOSTILE, "."]);
    expect(el.querySelector("img")).toBeNull();
    expect(chips[0].classList.contains("nbd-attr-picked")).toBe(true);
    chips[3].click();
    await tick();
    expect(m.sent[0].content.params).toEqual({ method: "grad_x_input", steps: 64, fix_first: false, pick: 2 });
    expect(Array.from(el.querySelectorAll(".nbd-attr-score")).map((e) => e.textContent)).toEqual(["1.000", "2.000", "3.000", "4.000", "5.000"]);
    const now = Array.from(el.querySelectorAll<HTMLButtonElement>(".nbd-attr-gen"));
    expect(now[3].classList.contains("nbd-attr-picked")).toBe(true);
    expect(now[0].classList.contains("nbd-attr-picked")).toBe(false);
    // the method switch keeps the picked token
    const sel = el.querySelector<HTMLSelectElement>(".nbd-attr-method")!;
    sel.value = "occlusion";
    sel.dispatchEvent(new Event("change"));
    await tick();
    expect(m.sent[1].content.params).toMatchObject({ method: "occlusion", pick: 2 });
  });

  it("shows no generated row without a generation", () => {
    const el = mount(attribution.render as any, model());
    expect(el.querySelectorAll(".nbd-attr-gen").length).toBe(0);
  });
});
