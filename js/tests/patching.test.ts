// @vitest-environment happy-dom
// Patching view against a fake model: the grid is drawn from the binary traits with the diverging
// scale, hostile labels stay text, the site selector and the triage toggle fetch a grid, a click
// fetches the patched run's top-5 and shows it beside the clean and corrupt runs'.
import { afterEach, describe, expect, it } from "vitest";
import patching from "../src/patching";
import { diverging, POSITIVE, NEGATIVE, textFor } from "../src/patching/colour";
import { cellText, commonPrefix } from "../src/patching/grid";
import { contrast } from "../src/lib/contrast";
import { FakeModel, f32View } from "./fakeModel";
import { mount, tick, unmountAll } from "./mount";

const HOSTILE = "<img src=x onerror=alert(1)>";

function u8View(values: ArrayLike<number>): DataView {
  const dv = new DataView(new ArrayBuffer(values.length));
  for (let i = 0; i < values.length; i++) dv.setUint8(i, values[i]);
  return dv;
}

const top = (tok: string, p: number) => ({ id: 1, token: tok, p });

function make(): FakeModel {
  const m = new FakeModel({
    rows: ["model.layers.0", "model.layers.1"], columns: ["The", HOSTILE, "city"], sites: "resid", method: "exact",
    row_labels: ["block 0 input", "block 1 input"], headline: "'␣Paris' is restored by 'city' in blocks 0–1",
    answer_clean: { id: 9, token: "␣Paris", p: 0.5, rank: 1 }, answer_corrupt: { id: 9, token: "␣Paris", p: 0.01, rank: 12 },
    effect: { view: f32View([1, 0.01, NaN, -1, 0.5, 0.25], 4), dtype: "float32", shape: [2, 3] },
    raw: { view: f32View([2, 1, NaN, 0, 1.5, 1.25]), dtype: "float32", shape: [2, 3] },
    identical: { view: u8View([0, 0, 1, 0, 0, 0]), dtype: "uint8", shape: [2, 3] },
    verified: [], grid_notes: [], site_kinds: ["resid", "attn", "mlp", "heads"],
    metric: "logit[' Paris'] - logit[' Rome']", metric_clean: 2, metric_corrupt: 1,
    tokens_clean: ["The", HOSTILE], tokens_corrupt: ["The", "x"],
    top_clean: [top(" Paris", 0.5)], top_corrupt: [top(" Rome", 0.4)], selected: [], clicks: 0,
  });
  m.respond = (c) => {
    if (c.method === "grid") {
      return {
        msg: { type: "response", id: c.id, ok: true, arrays: {
                 effect: { dtype: "float32", shape: [1, 2], buffer: 0 }, raw: { dtype: "float32", shape: [1, 2], buffer: 1 },
                 identical: { dtype: "uint8", shape: [1, 2], buffer: 2 } },
               result: { rows: ["h.0.attn.o_proj"], columns: ["h0", "h1"], sites: c.params.sites, method: c.params.method,
                         verified: [[0, 1, 0.9]], notes: ["n"] } },
        buffers: [f32View([0.1, 0.8]), f32View([1.1, 1.8]), u8View([0, 0])],
      };
    }
    return { msg: { type: "response", id: c.id, ok: true, arrays: {}, result: {
      row: c.params.row, col: c.params.col, site: "model.layers.1", positions: [1], identical: false, metric: 1.5,
      effect: 0.5, patched: [top(HOSTILE, 0.3)], clean: [], corrupt: [],
      answer: { clean: null, corrupt: null, patched: { id: 9, token: "␣Paris", p: 0.2, rank: 2 } } } } };
  };
  return m;
}

afterEach(unmountAll);

describe("patching colours", () => {
  it("is white at 0 and saturated at ±1, clamped beyond", () => {
    expect(diverging(0)).toEqual([255, 255, 255]);
    expect(diverging(1)).toEqual(POSITIVE);
    expect(diverging(-3)).toEqual(NEGATIVE);
    for (const e of [-1, -0.5, 0, 0.4, 1]) {
      const [r, g, b] = diverging(e);
      const fg = textFor(e) === "#000000" ? [0, 0, 0, 1] : [255, 255, 255, 1];
      expect(contrast(fg as any, [r, g, b, 1])).toBeGreaterThanOrEqual(4.5);
    }
  });
  it("prints an effect only where |effect| ≥ 0.05, with two decimals", () => {
    expect([cellText(0.049, false), cellText(-0.05, false), cellText(0.5, false), cellText(NaN, false), cellText(0.9, true)])
      .toEqual(["", "-0.05", "0.50", "", "="]);
  });
  it("strips the rows' shared dotted prefix", () => {
    expect(commonPrefix(["model.layers.0", "model.layers.1"])).toBe("model.layers.");
    expect(commonPrefix(["a"])).toBe("");
  });
});

describe("patching view", () => {
  it("draws the grid from the traits, labels as text", () => {
    const el = mount(patching.render as any, make());
    const cells = el.querySelectorAll(".nbp-cell");
    expect(cells.length).toBe(6);
    expect((cells[0] as HTMLElement).style.background).toContain("33, 102, 172");
    expect(Array.from(cells).map((c) => c.textContent)).toEqual(["1.00", "", "=", "-1.00", "0.50", "0.25"]);
    // the finding first; rows named for what they are (the module name on hover)
    expect(el.querySelector(".nbdebug-patching > :not(style)")!.textContent).toBe("'␣Paris' is restored by 'city' in blocks 0–1");
    const labels = Array.from(el.querySelectorAll(".nbp-rowlabel")).slice(1);
    expect(labels.map((l) => l.textContent)).toEqual(["block 0 input", "block 1 input"]);
    expect(labels[1].getAttribute("title")).toBe("model.layers.1");
    // the answer's p and rank under each top-5, bold where it is among them
    const tops = el.querySelectorAll(".nbp-top");
    expect(tops[1].querySelector("tr.nbp-answer")!.textContent).toBe("answer ␣Paris1% · rank 12");
    expect(cells[2].classList.contains("nbp-same")).toBe(true);
    expect(el.querySelector("img")).toBeNull();
    expect(el.textContent).toContain(HOSTILE);
  });

  it("hover names the cell, the effect and the raw metric", () => {
    const el = mount(patching.render as any, make());
    const cell = el.querySelectorAll(".nbp-cell")[4] as HTMLElement;
    cell.dispatchEvent(new Event("mouseover", { bubbles: true }));
    const tip = el.querySelector(".nbp-tip")!.textContent!;
    expect(tip).toContain("block 1 input @ " + HOSTILE);
    expect(tip).toContain("effect 0.5");
    expect(tip).toContain("= 1.5");
  });

  it("fetches another site kind and the triage estimate", async () => {
    const m = make();
    const el = mount(patching.render as any, m);
    const sel = el.querySelector("select.nbp-sites") as HTMLSelectElement;
    sel.value = "heads";
    sel.dispatchEvent(new Event("change"));
    await tick();
    expect(m.sent[m.sent.length - 1].content).toMatchObject({ method: "grid", params: { sites: "heads", method: "exact" } });
    expect(el.querySelectorAll(".nbp-cell").length).toBe(2);
    const tri = el.querySelector("input.nbp-triage") as HTMLInputElement;
    tri.checked = true;
    tri.dispatchEvent(new Event("change"));
    await tick();
    expect(m.sent[m.sent.length - 1].content.params).toEqual({ sites: "heads", method: "attribution" });
    expect(el.querySelectorAll(".nbp-cell.nbp-verified").length).toBe(1);
  });

  it("a click runs the patch in the kernel and shows its top-5 beside the others", async () => {
    const m = make();
    const el = mount(patching.render as any, m);
    (el.querySelectorAll(".nbp-cell")[4] as HTMLElement).click();
    await tick();
    expect(m.sent[m.sent.length - 1].content).toMatchObject({ method: "cell", params: { row: 1, col: 1, sites: "resid" } });
    const tables = el.querySelectorAll(".nbp-top");
    expect(tables.length).toBe(3);
    expect(tables[2].textContent).toContain(HOSTILE);
    expect(el.querySelector("img")).toBeNull();
    expect(el.querySelector(".nbdebug-patching")!.getAttribute("data-clicked")).toBe("1,1");
    expect(tables[2].querySelector("tr.nbp-answer")!.textContent).toBe("answer ␣Paris20% · rank 2");
    // one sentence about a cell: the click's, in the tip line; hovering the clicked cell keeps it
    const tip = el.querySelector(".nbp-tip")!;
    expect(tip.textContent).toBe("block 1 input @ " + HOSTILE + ": effect 0.50 (logit[' Paris'] - logit[' Rome'] = 1.50), measured exactly");
    (el.querySelectorAll(".nbp-cell")[4] as HTMLElement).dispatchEvent(new Event("mouseover", { bubbles: true }));
    expect(tip.textContent).toContain("measured exactly");
    expect(el.querySelector(".nbp-status")!.textContent).not.toContain("effect 0.5");
    (el.querySelectorAll(".nbp-cell")[2] as HTMLElement).click();  // identical: nothing to run
    await tick();
    expect(m.sent.filter((s) => s.content.method === "cell").length).toBe(1);
  });

  it("a click shows the three runs' lens columns, final block on top, tokens as text", async () => {
    const m = make();
    const entry = (row: string, token: string, p: number, pa: number) => ({ row, id: 7, token, p, p_answer: pa });
    const base = m.respond!;
    m.respond = (c) => {
      const out = base(c);
      if (out && c.method === "cell") {
        out.msg.result.lens = {
          clean: [entry("embed", "a", 0.1, 0.01), entry("model.layers.0", " Paris", 0.6, 0.6)],
          corrupt: [entry("embed", "a", 0.1, 0.01), entry("model.layers.0", " Rome", 0.5, 0.02)],
          patched: [entry("embed", "a", 0.1, -1), entry("model.layers.0", HOSTILE, 0.4, 0.3)],
        };
      }
      return out;
    };
    const el = mount(patching.render as any, m);
    (el.querySelectorAll(".nbp-cell")[4] as HTMLElement).click();
    await tick();
    const lens = el.querySelector(".nbp-lens")!;
    expect(lens).not.toBeNull();
    expect(el.querySelectorAll(".nbp-top").length).toBe(3);  // the next-token tables; the lens is apart
    const rows = lens.querySelectorAll("tbody tr");
    expect(rows.length).toBe(2);
    expect(rows[0].querySelector("th")!.textContent).toBe("model.layers.0");  // the final block first
    const cells = Array.from(rows[0].querySelectorAll("td")).map((td) => td.textContent);
    expect(cells).toEqual([" Paris", "60%", " Rome", "2%", HOSTILE, "30%"]);
    expect(Array.from(rows[1].querySelectorAll("td")).map((td) => td.textContent)[5]).toBe("–");  // no answer probability
    expect(el.querySelector("img")).toBeNull();
  });
});
