// The one ablation request/answer (src/lib/ablation.ts = nbdebug/sessions/ablation_io.py): the guard
// accepts an answer of each kind (heads with its lens diff, channels with the CAM, rows with the
// agreement) and refuses planted wrong ones (a missing field, the old per-view shapes, a token list in
// `{id, token, p}`, a wrong type); heads are grouped by layer in click order; askAblation sends the
// request as it is and rejects an answer of another shape or kind.
import { describe, expect, it } from "vitest";
import { askAblation, headTargets, isAblationAnswer, targetPairs, type AblationAnswer } from "../src/lib/ablation";
import { FakeModel } from "./fakeModel";

const tick = () => new Promise((r) => setTimeout(r, 0));

const HEADS: AblationAnswer = {
  kind: "heads", targets: [{ layer: 1, units: [2] }, { layer: 2, units: [0, 3] }], mode: "zero", note: "", seconds: 0.02,
  metric: { label: "p(␣Paris)", kind: "metric", clean: 0.5, ablated: 0.25, delta: -0.25, of: { id: 5, label: "␣Paris" } },
  top: { clean: [{ id: 5, label: "␣Paris", p: 0.5 }], ablated: [{ id: 6, label: "␣Rome", p: 0.3 }] },
  lens: { clean: [{ row: "embed", id: 1, token: "a", p: 0.3, p_answer: 0.1 }, { row: "output", id: 5, token: "␣Paris", p: 0.5, p_answer: 0.5 }],
          ablated: [{ row: "embed", id: 1, token: "a", p: 0.3, p_answer: 0.1 }, { row: "output", id: 6, token: "␣Rome", p: 0.3, p_answer: 0.25 }] },
};
const CHANNELS: AblationAnswer = {
  kind: "channels", targets: [{ layer: "layer4", units: [3, 7] }], mode: "mean", note: "", seconds: 0.1,
  metric: { label: "p(cat)", kind: "p", clean: 0.5, ablated: 0.4, delta: -0.1, of: { id: 3, label: "cat" } },
  top: { clean: [{ id: 3, label: "cat", p: 0.5 }], ablated: [{ id: 3, label: "cat", p: 0.4 }] }, cam: { layer: "layer4", shape: [7, 7] },
};
const ROWS: AblationAnswer = {
  kind: "modules", targets: [{ layer: "net.2", units: [] }], mode: "zero", note: "no loss", seconds: 0.01, top: null,
  metric: { label: "mean |logits|", kind: "output", clean: 1, ablated: 0.5, delta: 0.25, of: null }, agreement: 0.75,
};

describe("the one ablation answer", () => {
  it("accepts an answer of each kind, and a NaN that arrived as null", () => {
    for (const a of [HEADS, CHANNELS, ROWS]) expect(isAblationAnswer(a)).toBe(true);
    expect(isAblationAnswer({ ...ROWS, agreement: null, metric: { ...ROWS.metric, delta: null } })).toBe(true);
  });

  it("refuses planted wrong answers", () => {
    const { note: _n, ...noNote } = ROWS;
    const wrong: unknown[] = [
      null, [], noNote,
      { ...HEADS, kind: "rows" },
      { ...HEADS, delta: -0.25, metric: undefined },                                   // the old heads shape
      { module: "net.2", mode: "zero", kind: "loss", clean: 1, ablated: 1.5, delta: 0.5, note: "" }, // the old row shape
      { ...HEADS, top: { clean: [{ id: 5, token: "␣Paris", p: 0.5 }], ablated: [] } },   // {id, token, p}
      { ...HEADS, targets: [{ layer: 1, units: ["2"] }] },
      { ...HEADS, metric: { ...HEADS.metric, kind: "logit" } },
      { ...HEADS, metric: { ...HEADS.metric, of: { id: 5 } } },
      { ...HEADS, lens: { ...HEADS.lens, clean: [{ row: "embed", id: 1, token: "a", p: 0.3, p_answer: "10%" }] } },
      { ...HEADS, lens: { rows: ["embed"], target: "a", clean_top: ["a"], clean_p: [0.1], ablated_top: ["a"], ablated_p: [0.1] } }, // the old lens diff
      { ...CHANNELS, cam: { layer: "layer4" } },
      { ...ROWS, agreement: "75%" },
      { ...ROWS, seconds: undefined },
    ];
    for (const w of wrong) expect(isAblationAnswer(w), JSON.stringify(w)).toBe(false);
  });

  it("groups heads by layer in click order, and back", () => {
    const t = headTargets([[1, 2], [0, 1], [1, 0], [1, 2]]);
    expect(t).toEqual([{ layer: 1, units: [2, 0] }, { layer: 0, units: [1] }]);
    expect(targetPairs(t)).toEqual([[1, 2], [1, 0], [0, 1]]);
    expect(targetPairs(ROWS.targets)).toEqual([]);
  });
});

describe("askAblation", () => {
  function kernel(result: unknown): FakeModel {
    const m = new FakeModel({});
    m.respond = (c) => ({ msg: { type: "response", id: c.id, ok: true, result } });
    return m;
  }

  it("sends the request as it is and resolves with the answer", async () => {
    const m = kernel(ROWS);
    const req = { kind: "modules" as const, targets: [{ layer: "net.2", units: [] }], mode: "zero" };
    const got = await askAblation(m, req);
    expect(m.sent[0].content.method).toBe("ablate");
    expect(m.sent[0].content.params).toEqual(req);
    expect(got.result).toEqual(ROWS);
  });

  it("rejects an answer of the old shape or of another kind", async () => {
    const old = kernel({ module: "net.2", mode: "zero", kind: "loss", clean: 1, ablated: 1.5, delta: 0.5, note: "" });
    await expect(askAblation(old, { kind: "modules", targets: [{ layer: "net.2", units: [] }], mode: "zero" }))
      .rejects.toThrow("not a modules answer");
    await tick();
    await expect(askAblation(kernel(HEADS), { kind: "channels", targets: [{ layer: "x", units: [1] }], mode: "zero" }))
      .rejects.toThrow("not a channels answer");
  });
});
