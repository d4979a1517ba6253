// @vitest-environment happy-dom
// The language views lead with their finding: unusual heads coloured (sinks neutral), the
// "outliers only" filter, token labels on a hovered thumbnail's axes; the lens's finding, colour
// bar, legend, ringed cell, whole tokens on hover, and cell text at ≥ 4.5:1.
import { afterEach, describe, expect, it } from "vitest";
import attention from "../src/attention";
import logitlens from "../src/logitlens";
import { contrastRatio, textColourOn } from "../src/lib/contrast";
import { hBarPixels } from "../src/lib/legend";
import { lut } from "../src/lib/colormap";
import { FakeModel, f32View } from "./fakeModel";
import { mount, tick, unmountAll } from "./mount";

const HOSTILE = "<img src=x onerror=alert(1)>";

function u8View(values: ArrayLike<number>): DataView {
  const dv = new DataView(new ArrayBuffer(values.length));
  for (let i = 0; i < values.length; i++) dv.setUint8(i, values[i]);
  return dv;
}
function i32View(values: ArrayLike<number>): DataView {
  const dv = new DataView(new ArrayBuffer(values.length * 4));
  for (let i = 0; i < values.length; i++) dv.setInt32(i * 4, values[i], true);
  return dv;
}

afterEach(unmountAll);

describe("attention: the finding and the unusual heads", () => {
  const L = 3, H = 2, T = 4, S = 4;
  const names = ["entropy", "norm_entropy", "first_mass", "sep_mass", "prev_token", "diagonal", "max_mass"];
  const FINDING = "1 of 6 heads stands out: L1H0 attends to the previous token (98%; typical head here: 20%).";
  function make(extra: Record<string, unknown> = {}) {
    const m = new FakeModel({
      n_layers: L, n_heads: H, seq_len: T,
      tokens: ["A", HOSTILE, "␣b", "↵"], raw_tokens: ["A", HOSTILE, "Ġb", "Ċ"],
      metric_names: names, metric: "first_mass",
      thumbs: { view: u8View(new Array(L * H * S * S).fill(9)), dtype: "uint8", shape: [L, H, S, S] },
      metrics: { view: f32View(new Array(names.length * L * H).fill(0.2), 0), dtype: "float32", shape: [names.length, L, H] },
      flags: { view: u8View([1, 1, 0, 1, 1, 4]), dtype: "uint8", shape: [L, H] },
      summary: "4 of 6 heads put > 50% on the first token; 1 near-uniform", finding: FINDING,
      outliers: [{ layer: 1, head: 0, kind: "prev_token", value: 0.98, typical: 0.2, z: 15.6, text: "attends to the previous token (98%; typical head here: 20%)", token: -1 }],
      outlier_rule: "robust z-score ...", path: "sdpa + query/key probe", notes: ["kept queries/keys of 3 of 3 layers (1 KB)"], causal: true,
      selected: [], token_range: [], outliers_only: false, ...extra,
    });
    return { m, el: mount(attention.render as any, m) };
  }

  it("states the finding first, marks sinks in grey and colours only the unusual head", () => {
    const { el } = make();
    const root = el.querySelector(".nbdebug-attention")!;
    const texts = Array.from(root.children).map((c) => c.className);
    expect(texts.indexOf("nba-finding nba-has-outliers")).toBeLessThan(texts.indexOf("nba-summary"));
    expect(root.querySelector(".nba-finding")!.textContent).toBe(FINDING);
    expect(root.querySelectorAll(".nba-head.nba-sink").length).toBe(4);
    const out = Array.from(root.querySelectorAll(".nba-head.nba-outlier")) as HTMLElement[];
    expect(out.map((c) => [c.dataset.layer, c.dataset.head])).toEqual([["1", "0"]]);
    expect(out[0].title).toContain("stands out: attends to the previous token");
    // the dimensions, the path and memory notes sit behind the details toggle
    const details = root.querySelector("details.nba-details")!;
    expect(details.hasAttribute("open")).toBe(false);
    expect(details.querySelector(".nba-path")!.textContent).toContain("sdpa + query/key probe");
    expect(details.textContent).toContain("kept queries/keys");
  });

  it("'outliers only' keeps the layers with an unusual head and syncs the trait", () => {
    const { m, el } = make();
    const box = el.querySelector("input.nba-outliers-only") as HTMLInputElement;
    expect(box.disabled).toBe(false);
    expect(box.parentElement!.textContent).toContain("outliers only (1)");
    box.checked = true;
    box.dispatchEvent(new Event("change"));
    expect(m.get("outliers_only")).toBe(true);
    const heads = Array.from(el.querySelectorAll(".nba-head")) as HTMLElement[];
    expect(heads.map((c) => `${c.dataset.layer},${c.dataset.head}`)).toEqual(["1,0"]);
    expect(el.querySelectorAll(".nba-gap").length).toBe(1); // head 1 of layer 1: an empty slot, columns aligned
    expect(Array.from(el.querySelectorAll(".nba-rowlabel")).map((r) => r.textContent)).toEqual(["L1"]);
    m.set("outliers_only", false); // from Python
    expect(el.querySelectorAll(".nba-head").length).toBe(L * H);
  });

  it("an outlined head prints the headline's reason under it, not the selected metric", () => {
    const HEADLINE = "1 of 6 heads stands out: L1H0 attends to the previous token (98%; typical head here: 20%).";
    const { m, el } = make({
      headline: HEADLINE, finding: "",
      outliers: [{ layer: 1, head: 0, kind: "prev_token", value: 0.98, typical: 0.2, z: 15.6, short: "prev 98%",
                   text: "attends to the previous token (98%; typical head here: 20%)", token: -1 }],
    });
    expect(el.querySelector(".nba-finding")!.textContent).toBe(HEADLINE);
    const val = (l: number, hd: number) => el.querySelector(`.nba-head[data-layer="${l}"][data-head="${hd}"] .nba-val`)!;
    // the selected metric (first_mass) is 20% everywhere: the outlined head still says why it is outlined
    expect(val(1, 0).textContent).toBe("prev 98%");
    expect(val(1, 0).classList.contains("nba-reason")).toBe(true);
    expect(val(0, 0).textContent).toBe("20%");
    m.set("metric", "diagonal");
    expect(val(1, 0).textContent).toBe("prev 98%");
    expect(val(0, 1).textContent).toBe("20%");
  });

  it("no unusual head: the filter is disabled", () => {
    const { el } = make({ outliers: [], finding: "No head stands out: each of the 6 heads is close to this model's typical head." });
    const box = el.querySelector("input.nba-outliers-only") as HTMLInputElement;
    expect(box.disabled).toBe(true);
    expect(el.querySelector(".nba-finding")!.classList.contains("nba-has-outliers")).toBe(false);
  });

  it("hovering a thumbnail labels its axes with the tokens, as text", () => {
    const { el } = make();
    const cell = el.querySelector('.nba-head[data-layer="1"][data-head="0"]') as HTMLElement;
    cell.dispatchEvent(new Event("mouseenter"));
    const peek = el.querySelector(".nba-peek") as HTMLElement;
    expect(peek.style.display).toBe("block");
    const ys = Array.from(peek.querySelectorAll(".nba-peek-y")).map((s) => s.textContent);
    const xs = Array.from(peek.querySelectorAll(".nba-peek-x")).map((s) => s.textContent);
    expect(ys).toEqual(["A [0]", `${HOSTILE} [1]`, "␣b [2]", "↵ [3]"]);
    expect(xs).toEqual(ys);
    expect(peek.querySelector(".nba-peek-why")!.textContent).toContain("attends to the previous token");
    expect(peek.querySelector("img")).toBeNull();
    cell.dispatchEvent(new Event("mouseleave"));
    expect(peek.style.display).toBe("none");
  });
});

describe("logit lens: finding, colour bar, legend, readable cells", () => {
  const R = 3, P = 2, k = 2;
  const FINDING = "' seven' is top-1 from block 0 on (the last 2 of 2 blocks); p = 0.90 at the output.";
  function make() {
    const m = new FakeModel({
      n_rows: R, n_pos: P, k, row_names: ["embed", "h.0", "h.1"], tokens: [HOSTILE, "␣b"], raw_tokens: [HOSTILE, "Ġb"],
      targets: [9, 7], target_label: "next input token", check: "final row vs model logits: top-1 matches", notes: ["a note"],
      finding: FINDING, finding_cell: { position: 1, answer_id: 7, from_row: 1, first_row: 1, predicted_id: 7, predicted_from_row: 1 },
      initial: {
        positions: [0, 1],
        arrays: {
          top_ids: { view: i32View([5, 6, 5, 6, 9, 7, 7, 5, 9, 6, 7, 5]), dtype: "int32", shape: [R, P, k] },
          top_probs: { view: f32View([0.5, 0.2, 0.3, 0.1, 0.6, 0.3, 0.55, 0.1, 0.9, 0.05, 0.9, 0.01]), dtype: "float32", shape: [R, P, k] },
          entropy: { view: f32View([3, 2, 2, 1, 0.4, 0.3]), dtype: "float32", shape: [R, P] },
          kl: { view: f32View([2, 1, 1, 0.5, 0, 0]), dtype: "float32", shape: [R, P] },
          target_prob: { view: f32View([0.01, 0.02, 0.1, 0.55, 0.9, 0.9]), dtype: "float32", shape: [R, P] },
          target_rank: { view: i32View([40, 30, 3, 0, 0, 0]), dtype: "int32", shape: [R, P] },
        },
      },
      vocab: { "5": "<b>x</b>", "6": "␣six", "7": "␣seven", "9": "␣a-rather-long-token-that-a-cell-truncates" },
      metric: "top1_prob", row_range: [0, R - 1], pos_range: [0, P], pinned: [],
    });
    return { m, el: mount(logitlens.render as any, m) };
  }

  it("leads with the finding, rings its cell and explains the marks", () => {
    const { el } = make();
    const root = el.querySelector(".nbdebug-logitlens")!;
    expect(root.children[1].className).toBe("nbl-finding");
    expect(root.querySelector(".nbl-finding")!.textContent).toBe(FINDING);
    const ringed = Array.from(root.querySelectorAll("td.nbl-onset")) as HTMLElement[];
    expect(ringed.map((td) => [td.dataset.row, td.dataset.pos])).toEqual([["1", "1"]]);
    const legend = root.querySelector(".nbl-legend-row")!.textContent!;
    expect(legend).toContain("bold, underlined: the top-1 is the position's target (next input token)");
    expect(legend).toContain("ringed: where the answer becomes top-1 and stays");
    const details = root.querySelector("details.nbl-details")!;
    expect(details.textContent).toContain("top-1 matches");
    expect(details.textContent).toContain("a note");
  });

  it("draws a colour bar whose ticks follow the metric", () => {
    const { m, el } = make();
    const ticks = () => Array.from(el.querySelectorAll(".nbl-colourbar .nbd-hticks span")).map((s) => s.textContent);
    expect(ticks()).toEqual(["0%", "50%", "100%"]);
    expect(el.querySelector(".nbl-colourbar .nbd-htitle")!.textContent).toBe("colour: top-1 probability");
    m.set("metric", "target_rank");
    expect(ticks()).toEqual(["≥ #10k", "#1k", "#100", "#10", "#1"]);
    m.set("metric", "entropy");
    expect(ticks()).toEqual(["0", "1", "2"]); // 0 to the visible maximum of the blocks' rows (the embeddings row, 3, left out)
    // the bar's pixels run from the colormap's low end (left) to its high end (right)
    const px = hBarPixels("viridis", 256);
    const table = lut("viridis");
    expect(Array.from(px.slice(0, 3))).toEqual(Array.from(table.slice(0, 3)));
    expect(Array.from(px.slice(255 * 4, 255 * 4 + 3))).toEqual(Array.from(table.slice(255 * 4, 255 * 4 + 3)));
  });

  it("cells use the text colour with the higher contrast (≥ 4.5:1) and hover shows whole tokens", () => {
    const { el } = make();
    const rgb = (s: string) => (s.match(/\d+/g) || []).slice(0, 3).map(Number) as [number, number, number];
    for (const td of Array.from(el.querySelectorAll("tbody td")) as HTMLElement[]) {
      const bg = rgb(td.style.background);
      const fg: [number, number, number] = td.style.color === "rgb(0, 0, 0)" || td.style.color === "#000" ? [0, 0, 0] : [255, 255, 255];
      expect(contrastRatio(bg, fg)).toBeGreaterThanOrEqual(4.5);
    }
    const long = Array.from(el.querySelectorAll("tbody td")).find((td) => td.textContent!.startsWith("␣a-rather")) as HTMLElement;
    long.dispatchEvent(new MouseEvent("mousemove", { bubbles: true }));
    const tip = el.querySelector(".nbl-tip") as HTMLElement;
    expect(tip.textContent).toContain("␣a-rather-long-token-that-a-cell-truncates");
    const th = el.querySelectorAll("thead th")[1] as HTMLElement;
    th.dispatchEvent(new MouseEvent("mousemove", { bubbles: true }));
    expect(tip.style.display).toBe("block");
    expect(tip.textContent).toBe(`position 0: ${HOSTILE}\nraw token: ${HOSTILE}`);
    expect(el.querySelector("img, b")).toBeNull();
    // no raw id where the vocabulary knows the text: the targets' labels came with the widget
    (el.querySelectorAll("tbody td")[0] as HTMLElement).dispatchEvent(new MouseEvent("mousemove", { bubbles: true }));
    expect(tip.textContent).toContain("target ␣a-rather-long-token-that-a-cell-truncates");
    expect(tip.textContent).not.toMatch(/%\s+#\d+$|target #\d/m); // a label "#id": the text was unknown
  });

  it("the readable text colour never falls below 4.58:1 on any colour", () => {
    let worst = 21;
    for (let r = 0; r < 256; r += 15) for (let g = 0; g < 256; g += 15) for (let b = 0; b < 256; b += 15) {
      const bg: [number, number, number] = [r, g, b];
      worst = Math.min(worst, contrastRatio(bg, textColourOn(bg) === "#000" ? [0, 0, 0] : [255, 255, 255]));
    }
    expect(worst).toBeGreaterThanOrEqual(4.58);
  });
});
