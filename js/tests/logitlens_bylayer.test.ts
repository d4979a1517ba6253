// @vitest-environment happy-dom
// The lens view's by-layer strip (p(answer), rank, KL, the compared lens's top-1, computed in Python),
// the headline first, the muted embeddings row and both ranges inclusive on screen.
import { afterEach, describe, expect, it } from "vitest";
import logitlens from "../src/logitlens";
import { FakeModel, f32View } from "./fakeModel";
import { mount, unmountAll } from "./mount";

const i32View = (xs: number[]) => new DataView(new Int32Array(xs).buffer);
const HOSTILE = "<img src=x onerror=alert(1)>";

afterEach(() => unmountAll());

describe("lens view under a fitted lens", () => {
  const R = 3, P = 2, k = 1;
  const rows = [
    { row: 0, name: "embed", top1: "␣a", p_top1: 0.5, p_answer: 0.001, rank: 40, kl_prompt: 9.5, kl_heldout: 8.25, other_top1: "␣a", differs: false },
    { row: 1, name: "h.0", top1: HOSTILE, p_top1: 0.4, p_answer: 0.2, rank: 2, kl_prompt: 1.5, kl_heldout: 1.0, other_top1: "␣b", differs: true },
    { row: 2, name: "h.1", top1: "␣Paris", p_top1: 0.79, p_answer: 0.79, rank: 1, kl_prompt: 0, kl_heldout: 0, other_top1: "␣Paris", differs: false },
  ];
  function make() {
    const m = new FakeModel({
      n_rows: R, n_pos: P, k, row_names: ["embed", "h.0", "h.1"], tokens: ["␣x", "␣y"], raw_tokens: ["Ġx", "Ġy"],
      targets: [9, 7], target_label: "", check: "", notes: [], finding: "the logit lens's own sentence",
      headline: "'␣Paris' is top-1 from block 0 on under the tuned lens, only at the last block under the logit lens; p 79% at the output.",
      finding_cell: { position: 1, answer_id: 7, from_row: 1, first_row: 1, predicted_id: 7, predicted_from_row: 1 },
      initial: {
        positions: [0, 1],
        arrays: {
          top_ids: { view: i32View([5, 5, 6, 6, 7, 7]), dtype: "int32", shape: [R, P, k] },
          top_probs: { view: f32View([0.99, 0.99, 0.4, 0.4, 0.79, 0.79]), dtype: "float32", shape: [R, P, k] },
          entropy: { view: f32View([1, 1, 1, 1, 1, 1]), dtype: "float32", shape: [R, P] },
          kl: { view: f32View([9, 9, 1, 1, 0, 0]), dtype: "float32", shape: [R, P] },
          target_prob: { view: f32View([0, 0, 0.2, 0.2, 0.79, 0.79]), dtype: "float32", shape: [R, P] },
          target_rank: { view: i32View([39, 39, 1, 1, 0, 0]), dtype: "int32", shape: [R, P] },
        },
      },
      vocab: { "5": "␣a", "6": "␣six", "7": "␣Paris" },
      metric: "top1_prob", row_range: [0, R - 1], pos_range: [0, P], pinned: [],
      lens_name: "tuned lens", compare_name: "logit lens", by_layer: rows, kl_positions: [0, 1],
    });
    return { m, el: mount(logitlens.render as any, m) };
  }

  it("leads with the Python headline and draws the strip from the rows under it", () => {
    const { el } = make();
    expect(el.querySelector(".nbl-finding")!.textContent).toContain("under the tuned lens, only at the last block under the logit lens");
    const strip = el.querySelector("table.nbl-bylayer")!;
    const body = Array.from(strip.querySelectorAll("tbody tr")) as HTMLElement[];
    expect(body.map((tr) => tr.dataset.row)).toEqual(["2", "1", "0"]); // the output on top, as in the table
    const cells = (tr: HTMLElement) => Array.from(tr.querySelectorAll("td")).map((td) => td.textContent);
    expect(cells(body[0])).toEqual(["␣Paris", "79%", "#1", "0.00", "0.00", "␣Paris"]);
    expect(cells(body[1])).toEqual([HOSTILE, "20%", "#2", "1.50", "1.00", "␣b"]);
    expect(strip.querySelector("img")).toBeNull(); // model text as text
    expect(body[1].classList.contains("nbl-differs")).toBe(true);
    expect(body.filter((tr) => tr.classList.contains("nbl-differs")).length).toBe(1);
    expect(el.querySelector(".nbl-side")!.textContent).toContain("tuned lens vs logit lens (top-1 differs at 1 of 3 rows)");
  });

  it("mutes the embeddings row and shows both ranges inclusive", () => {
    const { m, el } = make();
    const embed = el.querySelector(".nbl-wrap tr.nbl-embed")!;
    const td = embed.querySelector("td") as HTMLElement;
    expect(td.style.background).toBe("rgb(238, 238, 238)"); // not coloured by the metric although its p is the highest
    const posTo = el.querySelector("input.nbl-pos-to") as HTMLInputElement;
    expect(posTo.value).toBe(String(P - 1)); // the last position shown, as the rows' "to" is the last row shown
    posTo.value = "0";
    posTo.dispatchEvent(new Event("change"));
    expect(m.get("pos_range")).toEqual([0, 1]); // the trait stays [start, end)
  });
});
