// @vitest-environment happy-dom
// The lens view's steering panel against a fake model: without a vector it is one hint line; moving
// the slider sends one debounced rpc "steer" (at most one in flight, the newest setting sent when it
// returns) and the table re-renders with the steered columns; "show original" switches back; the
// next-token top-5 of both runs are drawn as text.
import { afterEach, describe, expect, it } from "vitest";
import logitlens from "../src/logitlens";
import { FakeModel, f32View } from "./fakeModel";

const HOSTILE = "<img src=x onerror=alert(1)>";
const wait = (ms = 0) => new Promise((r) => setTimeout(r, ms));
const R = 2, P = 1, k = 1;

function i32View(values: ArrayLike<number>): DataView {
  const dv = new DataView(new ArrayBuffer(values.length * 4));
  for (let i = 0; i < values.length; i++) dv.setInt32(i * 4, values[i], true);
  return dv;
}

const arrays = (buf0: number) => ({
  top_ids: { dtype: "int32", shape: [R, P, k], buffer: buf0 }, top_probs: { dtype: "float32", shape: [R, P, k], buffer: buf0 + 1 },
  entropy: { dtype: "float32", shape: [R, P], buffer: buf0 + 1 }, kl: { dtype: "float32", shape: [R, P], buffer: buf0 + 1 },
  target_prob: { dtype: "float32", shape: [R, P], buffer: buf0 + 1 }, target_rank: { dtype: "int32", shape: [R, P], buffer: buf0 + 2 },
});

let cleanup: (() => void) | null = null;
afterEach(() => {
  cleanup?.();
  cleanup = null;
  document.body.replaceChildren();
});

function make(steer: boolean, hold: { release: (() => void)[] } | null = null) {
  const m = new FakeModel({
    n_rows: R, n_pos: P, k, row_names: ["embed", "h.0"], tokens: ["a"], raw_tokens: ["a"], targets: [-1], target_label: "",
    check: "", notes: [], metric: "top1_prob", row_range: [0, R - 1], pos_range: [0, P], pinned: [],
    initial: { positions: [0], arrays: {
      top_ids: { view: i32View([5, 6]), dtype: "int32", shape: [R, P, k] },
      top_probs: { view: f32View([0.5, 0.6]), dtype: "float32", shape: [R, P, k] },
      entropy: { view: f32View([1, 1]), dtype: "float32", shape: [R, P] }, kl: { view: f32View([1, 0]), dtype: "float32", shape: [R, P] },
      target_prob: { view: f32View([NaN, NaN]), dtype: "float32", shape: [R, P] },
      target_rank: { view: i32View([-1, -1]), dtype: "int32", shape: [R, P] } } },
    vocab: { "5": "five", "6": "six" },
    steer_layers: steer ? ["h.0", "h.1"] : [], steer_layer: steer ? "h.1" : "", steer_max: 8,
    steer_hint: steer ? "" : "steer this lens: v = nbdebug.steering_vector(...), then add --steer v",
  });
  m.respond = (c) => {
    if (c.method !== "steer") return null;
    const answer = {
      msg: { type: "response", id: c.id, ok: true, arrays: arrays(0),
             result: { layer: c.params.layer, alpha: c.params.alpha, positions: [0], vocab: { "9": HOSTILE },
                       top: { steered: [{ id: 9, token: HOSTILE, p: 0.7 }], original: [{ id: 6, token: "six", p: 0.6 }] } } },
      buffers: [i32View([5, 9]), f32View([0.5, 0.7]), i32View([-1, -1])],
    };
    if (!hold) return answer;
    hold.release.push(() => m.emit("msg:custom", answer.msg, answer.buffers));
    return null;
  };
  const el = document.createElement("div");
  document.body.appendChild(el);
  cleanup = logitlens.render({ model: m, el });
  return { m, root: el.querySelector(".nbdebug-logitlens") as HTMLElement };
}

const topRow = (root: HTMLElement) => Array.from(root.querySelectorAll(".nbl-wrap tbody tr")[0].querySelectorAll("td")).map((t) => t.textContent);

describe("lens steering panel", () => {
  it("without a vector is one line saying how to make one", () => {
    const { root } = make(false);
    expect(root.querySelector(".nbl-steer-hint")!.textContent).toContain("--steer v");
    expect(root.querySelector(".nbl-steer-slider")).toBeNull();
  });

  it("a slider move sends one debounced request and the table shows the steered lens", async () => {
    const { m, root } = make(true);
    expect((root.querySelector(".nbl-steer-layer") as HTMLSelectElement).value).toBe("h.1");
    expect(topRow(root)).toEqual(["six"]);
    const slider = root.querySelector(".nbl-steer-slider") as HTMLInputElement;
    for (const v of ["1", "2", "3.5"]) {
      slider.value = v;
      slider.dispatchEvent(new Event("input"));
    }
    await wait(250);
    const sent = m.sent.filter((s) => s.content.method === "steer");
    expect(sent.length).toBe(1);
    expect(sent[0].content.params).toEqual({ layer: "h.1", alpha: 3.5, start: 0, end: 1 });
    await wait(10);
    expect(topRow(root)).toEqual([HOSTILE]);
    expect(root.getAttribute("data-steer")).toBe("h.1:3.5");
    expect(root.getAttribute("data-showing")).toBe("steered");
    expect(root.querySelector(".nbl-steer-steered")!.textContent).toContain(HOSTILE);
    expect(root.querySelector(".nbl-steer-orig")!.textContent).toContain("six");
    expect(root.querySelector("img")).toBeNull();
    const orig = root.querySelector(".nbl-steer-original") as HTMLInputElement;
    orig.checked = true;
    orig.dispatchEvent(new Event("change"));
    expect(topRow(root)).toEqual(["six"]);
    expect(root.getAttribute("data-showing")).toBe("original");
  });

  it("keeps at most one request in flight and sends the newest setting after it", async () => {
    const hold = { release: [] as (() => void)[] };
    const { m, root } = make(true, hold);
    const slider = root.querySelector(".nbl-steer-slider") as HTMLInputElement;
    const move = async (v: string) => {
      slider.value = v;
      slider.dispatchEvent(new Event("input"));
      await wait(200);
    };
    await move("1");
    await move("2");
    await move("-4");
    const steerSent = () => m.sent.filter((s) => s.content.method === "steer");
    expect(steerSent().length).toBe(1);
    hold.release.shift()!();
    await wait(10);
    expect(steerSent().length).toBe(2);
    expect(steerSent()[1].content.params.alpha).toBe(-4);
    hold.release.shift()!();
    await wait(10);
    expect(root.getAttribute("data-steer")).toBe("h.1:-4");
  });
});
