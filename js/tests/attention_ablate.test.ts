// @vitest-environment happy-dom
// Attention view → ablate: clicking a head shows "ablate (zero | mean)"; the request carries the
// selected heads (shift-click adds one); the answer's Δ is shown with its sign and colour, the top-5
// and lens tables as text (hostile tokens stay text); loading state, error line, "clear", and the
// one-line note instead of buttons where the kernel cannot ablate.
import { afterEach, describe, expect, it } from "vitest";
import attention from "../src/attention";
import { signed } from "../src/attention/ablate";
import { FakeModel } from "./fakeModel";

const HOSTILE = "<img src=x onerror=alert(1)>";
const tick = async (n = 6) => {
  for (let i = 0; i < n; i++) await new Promise((r) => setTimeout(r, 0));
};

function u8View(values: ArrayLike<number>): DataView {
  const dv = new DataView(new ArrayBuffer(values.length));
  for (let i = 0; i < values.length; i++) dv.setUint8(i, values[i]);
  return dv;
}

let cleanup: (() => void) | null = null;
afterEach(() => {
  cleanup?.();
  cleanup = null;
  document.body.replaceChildren();
});

const L = 2, H = 3, T = 2, S = 2;
const names = ["entropy", "norm_entropy", "first_mass", "sep_mass", "prev_token", "diagonal", "max_mass"];

const lensEntry = ([row, id, token, p]: any[]) => ({ row, id, token, p: p + 0.1, p_answer: p });

function answer(delta: number, targets: { layer: number; units: number[] }[]) {
  return {
    kind: "heads", targets, mode: "zero", note: "",
    metric: { label: "logit['x'] - logit['y']", kind: "metric", clean: 2.5, ablated: 2.5 + delta, delta, of: { id: 7, label: HOSTILE } },
    top: { clean: [{ id: 1, label: HOSTILE, p: 0.5 }, { id: 2, label: "b", p: 0.2 }],
           ablated: [{ id: 2, label: "b", p: 0.4 }, { id: 1, label: HOSTILE, p: 0.3 }] },
    lens: { clean: [["embed", 10, "a", 0.1], ["h.0", 11, "b", 0.2], ["output", 1, HOSTILE, 0.5]].map(lensEntry),
            ablated: [["embed", 10, "a", 0.1], ["h.0", 11, "b", 0.2], ["output", 2, "b", 0.3]].map(lensEntry) },
    seconds: 0.05,
  };
}

function make(opts: { note?: string; fail?: string; delta?: number } = {}) {
  const m = new FakeModel({
    n_layers: L, n_heads: H, seq_len: T, tokens: ["A", "B"], raw_tokens: ["A", "B"], metric_names: names, metric: "first_mass",
    thumbs: { view: u8View(new Array(L * H * S * S).fill(7)), dtype: "uint8", shape: [L, H, S, S] },
    metrics: { view: new DataView(new ArrayBuffer(names.length * L * H * 4)), dtype: "float32", shape: [names.length, L, H] },
    flags: { view: u8View(new Array(L * H).fill(0)), dtype: "uint8", shape: [L, H] },
    summary: "", path: "sdpa", notes: [], causal: true, selected: [], token_range: [], ablate_note: opts.note ?? "",
  });
  const requests: any[] = [];
  let hold: (() => void) | null = null;
  m.respond = (c) => {
    if (c.method === "head") {
      return {
        msg: { type: "response", id: c.id, ok: true, result: { layer: c.params.layer, head: c.params.head, name: "h.attn" },
               arrays: { attn: { dtype: "uint8", shape: [T, T], buffer: 0 } } },
        buffers: [u8View([255, 0, 128, 128])],
      };
    }
    if (c.method !== "ablate") return null;
    requests.push(c.params);
    const msg = opts.fail
      ? { type: "response", id: c.id, ok: false, error: opts.fail }
      : { type: "response", id: c.id, ok: true, result: answer(opts.delta ?? -1.25, c.params.targets) };
    hold = () => m.emit("msg:custom", msg);
    return null; // answered later by release(): the loading state is visible meanwhile
  };
  const el = document.createElement("div");
  document.body.appendChild(el);
  cleanup = attention.render({ model: m, el });
  const release = () => hold?.();
  return { m, el, requests, release };
}

const click = (el: HTMLElement, l: number, hd: number, shift = false) =>
  (el.querySelector(`.nba-head[data-layer="${l}"][data-head="${hd}"]`) as HTMLElement)
    .dispatchEvent(new MouseEvent("click", { shiftKey: shift, bubbles: true }));
const button = (el: HTMLElement, label: string) =>
  Array.from(el.querySelectorAll("button")).find((b) => b.textContent === label) as HTMLButtonElement | undefined;

describe("attention view: ablate the clicked heads", () => {
  it("sends the selected heads, shows loading, then Δ with sign and colour and the tables as text", async () => {
    const { m, el, requests, release } = make();
    click(el, 1, 2);
    click(el, 0, 1, true); // shift-click adds a head
    expect(m.get("selected")).toEqual([[1, 2], [0, 1]]);
    await tick();
    button(el, "ablate (zero)")!.click();
    await tick();
    expect(requests).toEqual([{ kind: "heads", targets: [{ layer: 1, units: [2] }, { layer: 0, units: [1] }], mode: "zero" }]);
    const panel = el.querySelector(".nba-ablate")!;
    expect(panel.getAttribute("data-state")).toBe("loading");
    expect(panel.querySelector(".nba-ablate-status")!.textContent).toContain("ablating L1h2 + L0h1 (zero)");
    release();
    await tick();
    expect(panel.getAttribute("data-state")).toBe("done");
    const delta = panel.querySelector(".nba-delta")!;
    expect(delta.textContent).toBe("Δ −1.250");
    expect(delta.classList.contains("nba-down")).toBe(true);
    expect(Number(delta.getAttribute("data-value"))).toBe(-1.25);
    const top = Array.from(panel.querySelectorAll(".nba-ablate-top td.nba-tk")).map((t) => t.textContent);
    expect(top).toEqual([HOSTILE, "b", "b", HOSTILE]);
    expect(panel.querySelectorAll(".nba-ablate-top tr.nba-changed").length).toBe(2);
    const lensRows = panel.querySelectorAll(".nba-ablate-lens tr");
    expect(lensRows.length).toBe(4);
    expect(lensRows[0].textContent).toContain(`p(${HOSTILE})`);
    expect(lensRows[3].classList.contains("nba-changed")).toBe(true);
    expect(panel.querySelector("img")).toBeNull();
  });

  it("a positive Δ is green with a plus sign; mean mode is sent as such", async () => {
    const { el, requests, release } = make({ delta: 0.5 });
    click(el, 0, 0);
    await tick();
    button(el, "ablate (mean)")!.click();
    await tick();
    release();
    await tick();
    expect(requests[0]).toEqual({ kind: "heads", targets: [{ layer: 0, units: [0] }], mode: "mean" });
    const delta = el.querySelector(".nba-delta")!;
    expect(delta.textContent).toBe("Δ +0.5000");
    expect(delta.classList.contains("nba-up")).toBe(true);
  });

  it("a kernel error is an error line; clear empties the selection and the answer", async () => {
    const { m, el, release } = make({ fail: "the model was deleted; re-run the cell" });
    click(el, 0, 0);
    await tick();
    button(el, "ablate (zero)")!.click();
    await tick();
    release();
    await tick();
    const panel = el.querySelector(".nba-ablate")!;
    expect(panel.getAttribute("data-state")).toBe("error");
    const status = panel.querySelector(".nba-ablate-status")!;
    expect(status.classList.contains("nba-error")).toBe(true);
    expect(status.textContent).toContain("re-run the cell");
    button(el, "clear")!.click();
    expect(m.get("selected")).toEqual([]);
    expect(panel.getAttribute("data-state")).toBeNull();
    expect(panel.querySelector(".nba-ablate-body")!.childNodes.length).toBe(0);
  });

  it("where the kernel cannot ablate: the one-line note, no buttons", async () => {
    const { el } = make({ note: "Heads are not ablated in this view: BertModel is an encoder, with no next-token output to measure a head's effect on." });
    click(el, 0, 0);
    await tick();
    expect(button(el, "ablate (zero)")).toBeUndefined();
    expect(el.querySelector(".nba-ablate-off")!.textContent).toContain("BertModel is an encoder");
  });

  it("signed() keeps the sign visible", () => {
    expect(signed(0.001234)).toBe("+0.001234");
    expect(signed(-2)).toBe("−2.000");
    expect(signed(0)).toBe("±0.000");
    expect(signed(-1e-5)).toBe("−1.00e-5");
  });
});
