// @vitest-environment happy-dom
// What a dashboard's Python-side linking relies on in the front-ends: a `layer` set from Python
// moves the feature grid's and Grad-CAM's layer dropdowns (and refetches once), and
// `highlight_token` marks a token in the attention view (as text).
import { afterEach, describe, expect, it } from "vitest";
import attention from "../src/attention";
import featuremaps from "../src/featuremaps";
import gradcam from "../src/gradcam";
import { FakeModel, f32View } from "./fakeModel";
import { mount, tick, unmountAll } from "./mount";

const HOSTILE = "<img src=x onerror=alert(1)>";

afterEach(unmountAll);

const requests = (m: FakeModel, method: string) => m.sent.filter((s) => s.content?.method === method).map((s) => s.content.params);

describe("layer set from Python", () => {
  it("feature grid: dropdown follows and the new layer's page is fetched once", () => {
    const lay = (name: string) => ({ name, shape: [1, 4, 8, 8], channels: 4, height: 8, width: 8, layout: "nchw", samples: 1 });
    const m = new FakeModel({ layers: [lay("0"), lay("1"), lay("2")], layer: "0", sample: 0, batch: 1, colormap: "viridis", norm: "channel", sort: "index", selected: -1, notes: [] });
    const el = mount(featuremaps.render as any, m);
    expect(requests(m, "page").map((p) => p.layer)).toEqual(["0"]);
    m.set("layer", "2");
    expect((el.querySelector("select.nbd-layer") as HTMLSelectElement).value).toBe("2");
    expect(requests(m, "page").map((p) => p.layer)).toEqual(["0", "2"]);
    // the user's own pick: one request, not two
    const sel = el.querySelector("select.nbd-layer") as HTMLSelectElement;
    sel.value = "1";
    sel.dispatchEvent(new Event("change"));
    expect(m.get("layer")).toBe("1");
    expect(requests(m, "page").map((p) => p.layer)).toEqual(["0", "2", "1"]);
    unmountAll();
    expect(m.handlers.get("change:layer") ?? []).toEqual([]);
  });

  it("Grad-CAM: dropdown follows and the new layer's CAMs are fetched once", () => {
    const m = new FakeModel({
      layers: ["a", "b"], layer: "b", auto_layer: "b", method: "gradcam", batch: 1, sample: 0, class_rank: 0,
      classes: [[{ index: 0, name: "cat", score: 1, prob: 0.5 }]], opacity: 0.5, colormap: "inferno", notes: [], image_note: "",
    });
    const el = mount(gradcam.render as any, m);
    expect(requests(m, "view").map((p) => p.layer)).toEqual(["b"]);
    m.set("layer", "a");
    expect((el.querySelector("select.nbd-layer") as HTMLSelectElement).value).toBe("a");
    expect(requests(m, "view").map((p) => p.layer)).toEqual(["b", "a"]);
    const sel = el.querySelector("select.nbd-layer") as HTMLSelectElement;
    sel.value = "b";
    sel.dispatchEvent(new Event("change"));
    expect(requests(m, "view").map((p) => p.layer)).toEqual(["b", "a", "b"]);
    unmountAll();
    expect(m.handlers.get("change:layer") ?? []).toEqual([]);
  });
});

describe("attention highlight_token", () => {
  it("marks the token in the header and the detail, as text", async () => {
    const L = 1, H = 1, T = 3, S = 2;
    const u8 = (n: number, v: number) => new DataView(new Uint8Array(n).fill(v).buffer);
    const m = new FakeModel({
      n_layers: L, n_heads: H, seq_len: T, tokens: ["A", HOSTILE, "c"], raw_tokens: ["A", HOSTILE, "c"],
      metric_names: ["first_mass"], metric: "first_mass",
      thumbs: { view: u8(L * H * S * S, 9), dtype: "uint8", shape: [L, H, S, S] },
      metrics: { view: f32View([0.5]), dtype: "float32", shape: [1, L, H] },
      flags: { view: u8(L * H, 0), dtype: "uint8", shape: [L, H] },
      summary: "", path: "eager", notes: [], causal: true, selected: [[0, 0]], token_range: [], highlight_token: -1,
    });
    m.respond = (c) => ({
      msg: { type: "response", id: c.id, ok: true, result: { layer: 0, head: 0, name: "h.0.attn", encoding: "sqrt" },
             arrays: { attn: { dtype: "uint8", shape: [T, T], buffer: 0 } } },
      buffers: [u8(T * T, 100)],
    });
    const el = mount(attention.render as any, m);
    for (let i = 0; i < 5; i++) await tick();
    const bar = el.querySelector(".nba-highlight")!;
    expect(bar.textContent).toBe("");
    expect(el.querySelectorAll(".nba-tok").length).toBe(2 * T);
    m.set("highlight_token", 1);
    expect(bar.textContent).toBe(`highlighted token: ${HOSTILE} [1]`);
    expect(el.querySelector("img")).toBeNull();
    const marked = Array.from(el.querySelectorAll(".nba-tok.nba-mark"));
    expect(marked.map((t) => [t.classList.contains("nba-q") ? "q" : "k", t.textContent])).toEqual([["q", HOSTILE], ["k", HOSTILE]]);
    m.set("highlight_token", -1);
    expect(el.querySelectorAll(".nba-tok.nba-mark").length).toBe(0);
    expect(bar.textContent).toBe("");
  });
});
