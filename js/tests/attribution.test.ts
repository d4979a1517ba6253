// @vitest-environment happy-dom
// The attribution view (js/src/attribution.ts) against a fake model: tokens drawn as text (hostile
// ones too) on diverging colours with readable text, the method switch asking the kernel and drawing
// its answer, the completeness warning with its "more steps" request, the deletion curves.
import { afterEach, describe, expect, it } from "vitest";
import attribution, { deltaText, scoreT, type AttrData } from "../src/attribution";
import { FakeModel } from "./fakeModel";
import { HOSTILE } from "./fixtures";
import { mount, tick, unmountAll } from "./mount";

afterEach(unmountAll);

function data(extra: Partial<AttrData> = {}): AttrData {
  return {
    method: "grad_x_input", label: "logit[' Paris'] - logit[' Rome']", tokens: ["The", HOSTILE, " Tower"], scores: [0.5, -1, 0],
    metric: 2.86, metric_baseline: null, delta: null, converged: null, relative_delta: null, steps: null, baseline: "zero",
    faithfulness: { deletion: 0.2, random: 0.5 }, curves: { deletion: [1, 0.4, 0.1, 0], random: [1, 0.7, 0.3, 0] }, notes: [], ...extra,
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
    expect(el.querySelectorAll(".nbd-chart-line").length).toBe(2);
    expect(el.querySelector(".nbd-attr-warn")).toBeNull();
  });

  it("scales scores around white and says the completeness gap", () => {
    expect(scoreT(0, 2)).toBe(0.5);
    expect(scoreT(2, 2)).toBe(1);
    expect(scoreT(-4, 2)).toBe(0);
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
    expect(Array.from(el.querySelectorAll(".nbd-attr-score")).map((e) => e.textContent)).toEqual(["3", "1", "-2"]);
    expect(el.querySelector(".nbd-attr-warn")!.textContent).toContain("NOT converged");
    el.querySelector<HTMLButtonElement>(".nbd-attr-more")!.click();
    await tick();
    expect(m.sent[1].content.params.steps).toBe(256);
    el.querySelector<HTMLButtonElement>(".nbd-attr-fix")!.click();
    await tick();
    expect(m.sent[2].content.params).toMatchObject({ method: "integrated_gradients", fix_first: true });
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
    expect(Array.from(el.querySelectorAll(".nbd-attr-score")).map((e) => e.textContent)).toEqual(["1", "2", "3", "4", "5"]);
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
