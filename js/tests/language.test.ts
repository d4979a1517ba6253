// @vitest-environment happy-dom
// Attention viewer and logit-lens table against a fake model: hostile tokens stay text, clicks
// set the synced traits and fetch on demand, answers are drawn.
import { afterEach, describe, expect, it } from "vitest";
import attention from "../src/attention";
import logitlens from "../src/logitlens";
import { FakeModel, f32View } from "./fakeModel";

const HOSTILE = "<img src=x onerror=alert(1)>";
const tick = () => new Promise((r) => setTimeout(r, 0));

function u8View(values: ArrayLike<number>, at = 1): DataView {
  const buf = new ArrayBuffer(at + values.length + 2);
  const dv = new DataView(buf, at, values.length);
  for (let i = 0; i < values.length; i++) dv.setUint8(i, values[i]);
  return dv;
}
function i32View(values: ArrayLike<number>): DataView {
  const dv = new DataView(new ArrayBuffer(values.length * 4));
  for (let i = 0; i < values.length; i++) dv.setInt32(i * 4, values[i], true);
  return dv;
}

let cleanup: (() => void) | null = null;
afterEach(() => {
  cleanup?.();
  cleanup = null;
  document.body.replaceChildren();
});

describe("attention view", () => {
  const L = 2, H = 3, T = 4, S = 4;
  const names = ["entropy", "norm_entropy", "first_mass", "sep_mass", "prev_token", "diagonal", "max_mass"];
  const metrics = Array.from({ length: names.length * L * H }, (_, i) => (i % 7) / 10);
  function make() {
    const m = new FakeModel({
      n_layers: L, n_heads: H, seq_len: T,
      tokens: ["A", HOSTILE, "␣b", "↵"], raw_tokens: ["A", HOSTILE, "Ġb", "Ċ"],
      metric_names: names, metric: "first_mass",
      thumbs: { view: u8View(new Array(L * H * S * S).fill(7)), dtype: "uint8", shape: [L, H, S, S] },
      metrics: { view: f32View(metrics, 4), dtype: "float32", shape: [names.length, L, H] },
      flags: { view: u8View([1, 0, 4, 0, 2, 0]), dtype: "uint8", shape: [L, H] },
      summary: `1 of 6 heads put > 50% on ${HOSTILE}`, path: "eager (switched from sdpa)", notes: [], causal: true,
      selected: [], token_range: [],
    });
    m.respond = (c) =>
      c.method === "head"
        ? {
            msg: { type: "response", id: c.id, ok: true, result: { layer: c.params.layer, head: c.params.head, name: "h.1.attn", encoding: "sqrt" },
                   arrays: { attn: { dtype: "uint8", shape: [T, T], buffer: 0 } } },
            buffers: [u8View([255, 0, 0, 0, 128, 128, 0, 0, 0, 255, 0, 0, 0, 0, 0, 255])],
          }
        : null;
    const el = document.createElement("div");
    document.body.appendChild(el);
    cleanup = attention.render({ model: m, el });
    return { m, el };
  }

  it("draws the grid, flags and summary as text", () => {
    const { el } = make();
    const root = el.querySelector(".nbdebug-attention")!;
    expect(root.getAttribute("data-ready")).toBe("1");
    expect(root.querySelectorAll(".nba-head").length).toBe(L * H);
    expect(root.querySelectorAll(".nba-sink").length).toBe(2);
    expect(root.querySelectorAll(".nba-uniform").length).toBe(1);
    expect(root.querySelector(".nba-summary")!.textContent).toContain(HOSTILE);
    expect(root.querySelector("img")).toBeNull();
    // first_mass of layer 0 head 1: metric index 2 → value at (2 * L + 0) * H + 1
    expect(root.querySelectorAll(".nba-val")[1].textContent).toBe(`${Math.round(metrics[(2 * L) * H + 1] * 100)}%`);
  });

  it("clicking a head syncs `selected`, fetches it and draws tokens as text", async () => {
    const { m, el } = make();
    (el.querySelector('.nba-head[data-layer="1"][data-head="2"]') as HTMLElement).click();
    expect(m.get("selected")).toEqual([[1, 2]]);
    expect(m.sent[m.sent.length - 1].content).toMatchObject({ type: "request", method: "head", params: { layer: 1, head: 2 } });
    for (let i = 0; i < 5; i++) await tick();
    const detail = el.querySelector('.nba-detail[data-ready="1"]')!;
    expect(detail).not.toBeNull();
    const toks = Array.from(detail.querySelectorAll(".nba-left .nba-tok")).map((t) => t.textContent);
    expect(toks).toEqual(["A", HOSTILE, "␣b", "↵"]);
    expect(detail.querySelector("img")).toBeNull();
    (detail.querySelectorAll(".nba-left .nba-tok")[1] as HTMLElement).dispatchEvent(new Event("mouseenter"));
    // row 1 of the sqrt-encoded matrix: [128, 128, 0, 0] → about 25% each on tokens 0 and 1
    expect(detail.querySelector(".nba-status")!.textContent).toBe(`${HOSTILE} attends to: A 25%  ${HOSTILE} 25%`);
  });
});

describe("logit-lens table", () => {
  const R = 3, P = 2, k = 2;
  // one initial column (position 1): ids/probs per row
  function make() {
    const m = new FakeModel({
      n_rows: R, n_pos: P, k, row_names: ["embed", "h.0", "h.1"], tokens: [HOSTILE, "␣b"], raw_tokens: [HOSTILE, "Ġb"],
      targets: [7, 9], target_label: "next input token", check: "final row vs model logits: top-1 matches", notes: [],
      initial: {
        positions: [1],
        arrays: {
          top_ids: { view: i32View([5, 6, 7, 5, 9, 7]), dtype: "int32", shape: [R, 1, k] },
          top_probs: { view: f32View([0.5, 0.2, 0.6, 0.3, 0.9, 0.05]), dtype: "float32", shape: [R, 1, k] },
          entropy: { view: f32View([3, 2, 0.4]), dtype: "float32", shape: [R, 1] },
          kl: { view: f32View([2, 1, 0]), dtype: "float32", shape: [R, 1] },
          target_prob: { view: f32View([0.01, 0.1, 0.9]), dtype: "float32", shape: [R, 1] },
          target_rank: { view: i32View([40, 3, 0]), dtype: "int32", shape: [R, 1] },
        },
      },
      vocab: { "5": "<b>x</b>", "6": "␣six", "7": "␣seven", "9": "␣nine" },
      metric: "top1_prob", row_range: [0, R - 1], pos_range: [0, P], pinned: [],
    });
    m.respond = (c) => {
      if (c.method !== "columns") return null;
      return {
        msg: { type: "response", id: c.id, ok: true, result: { positions: [0], vocab: { "11": "␣eleven" } },
               arrays: { top_ids: { dtype: "int32", shape: [R, 1, k], buffer: 0 }, top_probs: { dtype: "float32", shape: [R, 1, k], buffer: 1 },
                         entropy: { dtype: "float32", shape: [R, 1], buffer: 2 }, kl: { dtype: "float32", shape: [R, 1], buffer: 2 },
                         target_prob: { dtype: "float32", shape: [R, 1], buffer: 2 }, target_rank: { dtype: "int32", shape: [R, 1], buffer: 3 } } },
        buffers: [i32View([11, 5, 11, 5, 7, 5]), f32View([0.4, 0.1, 0.5, 0.1, 0.7, 0.1]), f32View([1, 1, 1]), i32View([1, 1, 0])],
      };
    };
    const el = document.createElement("div");
    document.body.appendChild(el);
    cleanup = logitlens.render({ model: m, el });
    return { m, el };
  }

  it("shows the first column at once, fetches the missing one, keeps text as text", async () => {
    const { m, el } = make();
    const root = el.querySelector(".nbdebug-logitlens")!;
    expect(root.getAttribute("data-ready")).toBe("1");
    expect(m.sent[0].content).toMatchObject({ method: "columns", params: { start: 0, end: 1 } });
    expect(root.querySelectorAll("td.nbl-pending").length).toBe(R);
    for (let i = 0; i < 5; i++) await tick();
    expect(root.getAttribute("data-complete")).toBe("1");
    const headers = Array.from(root.querySelectorAll("thead th")).map((t) => t.textContent);
    expect(headers).toEqual(["", HOSTILE, "␣b"]);
    // final row first: position 0 → id 7, position 1 → id 9 (the target: bold)
    const top = Array.from(root.querySelectorAll("tbody tr")[0].querySelectorAll("td"));
    expect(top.map((t) => t.textContent)).toEqual(["␣seven", "␣nine"]);
    expect(top[1].classList.contains("nbl-target")).toBe(true);
    const embed = Array.from(root.querySelectorAll("tbody tr")[2].querySelectorAll("td")).map((t) => t.textContent);
    expect(embed).toEqual(["␣eleven", "<b>x</b>"]);
    expect(root.querySelector("b, img")).toBeNull();
    expect(Array.from(root.querySelectorAll("tbody th")).map((t) => t.textContent)).toEqual(["L1", "L0", "embed"]);
  });

  it("hover lists the top-k, click pins, the layer range filters rows", async () => {
    const { m, el } = make();
    for (let i = 0; i < 5; i++) await tick();
    const root = el.querySelector(".nbdebug-logitlens")!;
    const cell = root.querySelectorAll("tbody tr")[1].querySelectorAll("td")[1] as HTMLElement; // row h.0, position 1
    cell.dispatchEvent(new MouseEvent("mousemove", { bubbles: true }));
    const tip = root.querySelector(".nbl-tip") as HTMLElement;
    expect(tip.style.display).toBe("block");
    const lines = tip.textContent!.split("\n");
    expect(lines[1].trim()).toBe("60%  ␣seven");
    expect(lines[2].trim()).toBe("30%  <b>x</b>");
    expect(lines[4]).toContain("rank #4");
    cell.click();
    expect(m.get("pinned")).toEqual([[1, 1]]);
    m.set("row_range", [1, 2]);
    expect(root.querySelectorAll("tbody tr").length).toBe(2);
    m.set("metric", "target_rank");
    expect((root.querySelector("select.nbl-metric") as HTMLSelectElement).value).toBe("target_rank");
  });
});
