// @vitest-environment happy-dom
// The grouped thermometer (src/thermometer/groups.ts) on a fake Llama-like payload built the way
// nbdebug/inspectors/groups.py's groups_payload lays it out (names as a tree, float32 arrays).
import { afterEach, describe, expect, it } from "vitest";
import { GroupData, GroupView, MAX_DRAWN } from "../src/thermometer/groups";
import { GroupsPanel, renderGroups } from "../src/thermometer/groups_widget";
import { FakeModel } from "./fakeModel";
import { mount, tick, unmountAll } from "./mount";

const HOSTILE = "<img src=x onerror=alert(1)>";
const PER = ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "mlp.act_fn", "mlp.down_proj"];
const FIELDS = ["mean", "std", "min", "max", "zero_frac", "nan", "inf", "grad_norm", "update_ratio"];
const STATS = ["severity", "std", "absmax", "grad_norm", "zero_frac", "nonfinite", "residual"];

const wire = (dtype: "int32" | "uint32" | "float32", values: number[], shape = [values.length]) => {
  const a = dtype === "float32" ? Float32Array.from(values) : dtype === "int32" ? Int32Array.from(values) : Uint32Array.from(values);
  return { view: new DataView(a.buffer), dtype, shape };
};

/**
 * A payload for `model.embed_tokens`, `blocks` × PER rows under `model.layers.N`, `lm_head` (and a
 * hostile top-level row): flags `dead` on model.layers.2.mlp.act_fn; per-row std = block index + 1.
 */
function payload(blocks: number, per: string[] = PER) {
  const strings: string[] = [];
  const sid = (s: string) => (strings.includes(s) ? strings.indexOf(s) : strings.push(s) - 1);
  const parent: number[] = [];
  const suffix: number[] = [];
  const nodes = new Map<string, number>();
  const node = (path: string): number => {
    if (nodes.has(path)) return nodes.get(path)!;
    const k = path.lastIndexOf(".");
    const p = k > 0 && !path.includes("<") ? node(path.slice(0, k)) : -1;
    parent.push(p);
    suffix.push(sid(p >= 0 ? path.slice(k) : path));
    nodes.set(path, parent.length - 1);
    return parent.length - 1;
  };
  const names = ["model.embed_tokens", HOSTILE];
  const owner = [-1, -1];
  for (let b = 0; b < blocks; b++) for (const p of per) (names.push(`model.layers.${b}.${p}`), owner.push(b));
  names.push("lm_head");
  owner.push(-1);
  const rowName = names.map(node);
  const types = names.map((n) => (n.endsWith("proj") || n === "lm_head" ? "Linear" : n === HOSTILE ? HOSTILE : "Other"));
  const flags = names.map((n) => (n === "model.layers.2.mlp.act_fn" ? 1 : 0));
  const values = names.flatMap((_, r) => FIELDS.map((f) => (f === "std" ? owner[r] + 1 : f === "grad_norm" ? 0.5 : 0)));
  const strip = Array.from({ length: blocks }, (_, b) => STATS.map((s) => (s === "severity" ? (b === 2 ? 2 : 0) : s === "std" ? b + 1 : s === "residual" ? 10 * (b + 1) : 0)));
  return {
    version: 1,
    strings: [...strings, ...new Set(types)].filter((s, i, a) => a.indexOf(s) === i),
    row_fields: FIELDS,
    strip_stats: STATS,
    flag_codes: ["dead"],
    severity: { dead: 2 },
    residual: { group: 0, d: 16, largest_jump: "model.layers.1", first_nonfinite: null, notes: [] },
    notes: [],
    _types: types,
    name_parent: wire("int32", parent),
    name_suffix: wire("int32", suffix),
    row_name: wire("int32", rowName),
    row_module: wire("int32", rowName),
    row_owner: wire("int32", owner),
    row_flags: wire("uint32", flags),
    values: wire("float32", values, [names.length, FIELDS.length]),
    group_name: wire("int32", [node("model.layers")]),
    group_parent: wire("int32", [-1]),
    group_first: wire("int32", [2]),
    group_flags: wire("uint32", [1]),
    block_name: wire("int32", Array.from({ length: blocks }, (_, b) => node(`model.layers.${b}`))),
    block_group: wire("int32", Array(blocks).fill(0)),
    block_index: wire("int32", Array.from({ length: blocks }, (_, b) => b)),
    block_rows: wire("int32", Array(blocks).fill(per.length)),
    block_flags: wire("uint32", Array.from({ length: blocks }, (_, b) => (b === 2 ? 1 : 0))),
    strip: wire("float32", strip.flat(), [blocks, STATS.length]),
    residual_growth: wire("float32", Array.from({ length: blocks }, (_, b) => (b ? (b + 1) / b : NaN))),
  };
}

/** The payload with its row_type array filled from `_types` (string indices into `strings`). */
function full(blocks: number, per?: string[]) {
  const p: any = payload(blocks, per);
  p.row_type = wire("int32", p._types.map((t: string) => p.strings.indexOf(t)));
  return p;
}

const lines = (el: HTMLElement, cls: string) => Array.from(el.querySelectorAll<HTMLElement>(`.${cls}`));
const names = (el: HTMLElement) => lines(el, "nbd-grow").map((l) => l.querySelector(".nbd-gname")!.textContent);

afterEach(unmountAll);

describe("grouped thermometer", () => {
  it("decodes names from the tree and orders items like the Python side", () => {
    const d = new GroupData(full(3));
    expect(d.name(2)).toBe("model.layers.0.input_layernorm");
    expect(d.name(1)).toBe(HOSTILE);
    expect(d.type(3)).toBe("Linear");
    expect(d.groups.map((g) => [g.name, g.blocks])).toEqual([["model.layers", [0, 1, 2]]]);
    expect(d.top.map((it) => `${it.kind}${it.i}`)).toEqual(["row0", "row1", "group0", "row17"]);
    expect(d.blocks[1].items.map((it) => d.name(it.i))).toEqual(PER.map((p) => `model.layers.1.${p}`));
    expect(d.flags(2 + 2 * PER.length + 3)).toEqual(["dead"]);
    expect(d.match("flag:dead").map((r) => d.name(r))).toEqual(["model.layers.2.mlp.act_fn"]);
    expect(d.match("layers.1. type:linear").map((r) => d.name(r))).toEqual(["model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj", "model.layers.1.mlp.down_proj"]);
  });

  it("draws one line per group with a strip across blocks, hostile names as text", () => {
    const model = new FakeModel({ groups: full(4), selected: "", legend: { dead: { label: "dead", color: "#756bb1" } } });
    const el = mount(renderGroups, model);
    expect(el.querySelector<HTMLElement>(".nbdebug-groups")!.dataset.ready).toBe("1");
    expect(names(el)).toEqual(["model.embed_tokens", HOSTILE, "lm_head"]);
    expect(el.querySelector("img")).toBeNull();
    expect(el.textContent).toContain(HOSTILE);
    const grp = lines(el, "nbd-grp");
    expect(grp).toHaveLength(1);
    expect(grp[0].querySelector(".nbd-gname")!.textContent).toBe("model.layers");
    expect(grp[0].querySelector(".nbd-gcount")!.textContent).toBe("×4");
    // residual stream is the default strip; each cell says its block's full name and value
    const cells = lines(grp[0], "nbd-cell");
    expect(cells.map((c) => c.getAttribute("title"))).toEqual([
      "model.layers.0: residual stream norm 10 (×NaN vs previous block)",
      "model.layers.1: residual stream norm 20 (×2 vs previous block)",
      "model.layers.2: residual stream norm 30 (×1.5 vs previous block)",
      "model.layers.3: residual stream norm 40 (×1.33 vs previous block)",
    ]);
    // the colour grows with the value (magma: darker → brighter)
    const bg = cells.map((c) => c.style.background);
    expect(new Set(bg).size).toBe(4);
    expect(grp[0].querySelector(".nbd-gnote")!.textContent).toBe("largest jump: model.layers.1");
    expect(grp[0].querySelector(".nbd-chip")!.textContent).toBe("dead");
    expect(cells[2].classList.contains("nbd-cell-flagged")).toBe(true);
    // nothing inside the collapsed group is drawn
    expect(el.querySelectorAll(".nbd-blk")).toHaveLength(0);
  });

  it("expands a group to its blocks and a block to its rows, full names in title", () => {
    const el = mount(renderGroups, new FakeModel({ groups: full(4), selected: "" }));
    lines(el, "nbd-grp")[0].click();
    const blocks = lines(el, "nbd-blk");
    expect(blocks.map((b) => b.querySelector(".nbd-gname")!.textContent)).toEqual(["0", "1", "2", "3"]);
    expect(blocks[2].querySelector(".nbd-gcount")!.textContent).toBe("5 rows");
    expect(blocks[2].querySelector(".nbd-chip")!.textContent).toBe("dead");
    blocks[1].click();
    const rows = lines(el, "nbd-grow").filter((l) => l.closest(".nbd-blk-body"));
    expect(rows.map((l) => l.querySelector(".nbd-gname")!.textContent)).toEqual(PER);
    expect(rows[1].querySelector(".nbd-gname")!.getAttribute("title")).toBe("model.layers.1.self_attn.q_proj\nLinear");
    expect(rows[1].querySelector(".nbd-gstat")!.textContent).toBe("0 ± 2");
    // keyboard: Enter on a block line closes it, focus stays on the line
    blocks[1].dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
    expect(lines(el, "nbd-grow").filter((l) => l.closest(".nbd-blk-body"))).toHaveLength(0);
    expect((document.activeElement as HTMLElement).getAttribute("data-block")).toBe("1");
    blocks[1].dispatchEvent(new KeyboardEvent("keydown", { key: " ", bubbles: true }));
    expect(lines(el, "nbd-grow").filter((l) => l.closest(".nbd-blk-body"))).toHaveLength(PER.length);
    // closing the group removes its lines
    lines(el, "nbd-grp")[0].click();
    expect(el.querySelectorAll(".nbd-blk")).toHaveLength(0);
    // a click on strip cell 3 opens block 3 directly
    lines(el, "nbd-cell")[3].click();
    expect(lines(el, "nbd-blk").filter((b) => b.classList.contains("nbd-open")).map((b) => b.getAttribute("data-block"))).toEqual(["1", "3"]);
  });

  it("the filter finds a row inside a collapsed group and by type or flag", () => {
    const el = mount(renderGroups, new FakeModel({ groups: full(4), selected: "" }));
    const box = el.querySelector<HTMLInputElement>(".nbd-group-filter")!;
    box.value = "act_fn flag:dead";
    box.dispatchEvent(new Event("input"));
    expect(names(el)).toEqual(["mlp.act_fn"]);
    expect(lines(el, "nbd-grow")[0].querySelector(".nbd-gname")!.getAttribute("title")).toContain("model.layers.2.mlp.act_fn");
    expect(lines(el, "nbd-blk").map((b) => b.getAttribute("data-block"))).toEqual(["2"]);
    expect(el.querySelector(".nbd-gmatch")!.textContent).toBe("1 match");
    expect(el.querySelector(".nbd-group-count")!.textContent).toBe("1 of 23 rows match");
    box.value = "img";
    box.dispatchEvent(new Event("input"));
    expect(names(el)).toEqual([HOSTILE]);
    expect(el.querySelectorAll(".nbd-grp")).toHaveLength(0);
    box.value = "type:linear";
    box.dispatchEvent(new Event("input"));
    expect(names(el)).toHaveLength(4 * 3 + 1);
    box.value = "nothing-like-this";
    box.dispatchEvent(new Event("input"));
    expect(el.querySelector(".nbd-group-none")!.textContent).toBe("no row matches the filter");
    box.value = "";
    box.dispatchEvent(new Event("input"));
    expect(names(el)).toEqual(["model.embed_tokens", HOSTILE, "lm_head"]);
  });

  it("changes the strip statistic and syncs it; clicking a row selects it", async () => {
    const model = new FakeModel({ groups: full(4), selected: "", group_stat: "" });
    const el = mount(renderGroups, model);
    const sel = el.querySelector<HTMLSelectElement>(".nbd-group-stat")!;
    expect(Array.from(sel.options).map((o) => o.value)).toEqual(["severity", "std", "absmax", "grad_norm", "zero_frac", "nonfinite", "residual"]);
    sel.value = "severity";
    sel.dispatchEvent(new Event("change"));
    expect(model.get("group_stat")).toBe("severity");
    const titles = lines(el, "nbd-cell").map((c) => c.getAttribute("title"));
    expect(titles[2]).toBe("model.layers.2: worst flag 2");
    lines(el, "nbd-cell")[0].click();
    lines(el, "nbd-grow").find((l) => l.getAttribute("data-row") === "3")!.click();
    expect(model.get("selected")).toBe("model.layers.0.self_attn.q_proj");
    // selection from Python opens the block holding the row
    model.set("selected", "model.layers.3.mlp.down_proj");
    await tick();
    const sel3 = el.querySelector<HTMLElement>(".nbd-grow.nbd-selected")!;
    expect(sel3.querySelector(".nbd-gname")!.getAttribute("title")).toBe("model.layers.3.mlp.down_proj\nLinear");
  });

  it("stays incremental at 1,600 rows: few lines drawn, a bounded filter result", () => {
    const per = Array.from({ length: 50 }, (_, j) => `sub${j}.lin`);
    const data = new GroupData(full(32, per));
    expect(data.rowCount).toBe(32 * 50 + 3);
    const view = new GroupView(data, {});
    document.body.appendChild(view.el);
    expect(view.el.querySelectorAll(".nbd-grow, .nbd-grp, .nbd-blk")).toHaveLength(4);
    view.toggleBlock(7, true);
    expect(view.el.querySelectorAll(".nbd-blk")).toHaveLength(32);
    expect(view.el.querySelectorAll(".nbd-blk-body .nbd-grow")).toHaveLength(50);
    view.setFilter("sub");
    expect(view.el.querySelectorAll(".nbd-grow")).toHaveLength(MAX_DRAWN);
    expect(view.el.querySelector(".nbd-group-more")!.textContent).toBe(`… ${1600 - MAX_DRAWN} more matches: refine the filter`);
    view.destroy();
  });

  it("as a panel inside another view: hides the flat table while grouped, nothing without groups", () => {
    const model = new FakeModel({ groups: {}, selected: "", group_stat: "" });
    const table = document.createElement("div");
    const panel = new GroupsPanel(model, [table]);
    document.body.append(panel.el, table);
    panel.sync({});
    expect(panel.el.style.display).toBe("none");
    expect(table.style.display).toBe("");
    model.set("groups", full(4));
    panel.sync({});
    expect(panel.active).toBe(true);
    expect(table.style.display).toBe("none");
    expect(panel.el.querySelectorAll(".nbd-grp")).toHaveLength(1);
    panel.select("model.layers.1.mlp.act_fn");
    expect(panel.el.querySelector(".nbd-grow.nbd-selected .nbd-gname")!.textContent).toBe("mlp.act_fn");
    const toggle = panel.el.querySelector<HTMLInputElement>(".nbd-grouped-toggle")!;
    toggle.checked = false;
    toggle.dispatchEvent(new Event("change"));
    expect(table.style.display).toBe("");
    expect(panel.active).toBe(false);
    model.set("groups", {});
    panel.sync({});
    expect(panel.el.style.display).toBe("none");
    panel.destroy();
  });

  it("with a history: a sparkline per block and per group of the strip statistic over kept steps", () => {
    const p = full(3);
    // 4 kept steps × 3 blocks × [std, grad_norm, residual]; residual of block b at step k = (b + 1) * (k + 1)
    const K = 4;
    const hist: number[] = [];
    for (let k = 0; k < K; k++) for (let b = 0; b < 3; b++) hist.push(b + 1, NaN, (b + 1) * (k + 1));
    p.hist_steps = wire("int32", [1, 5, 9, 13]);
    p.hist_stats = ["std", "grad_norm", "residual"];
    p.hist_blocks = wire("int32", [0, 1, 2]);
    p.step = 13;
    p.hist_strip = wire("float32", hist, [K, 3, 3]);
    const d = new GroupData(p);
    expect(Array.from(d.series(2, "residual")!)).toEqual([3, 6, 9, 12]);
    expect(d.series(0, "severity")).toBeNull();
    const el = mount(renderGroups, new FakeModel({ groups: p, selected: "" }));
    expect(el.querySelector(".nbd-group-count")!.textContent).toBe("18 rows, 1 group of repeated blocks (values and flags at step 13)");
    const gspark = el.querySelector(".nbd-grp svg.nbd-gspark")!;
    expect(gspark.querySelector("title")!.textContent).toBe("model.layers: largest residual stream norm over its blocks over 4 kept steps (1–13)");
    lines(el, "nbd-grp")[0].click();
    expect(el.querySelectorAll(".nbd-blk svg.nbd-gspark")).toHaveLength(3);
    expect(el.querySelector(".nbd-blk svg.nbd-gspark title")!.textContent).toContain("model.layers.0: residual stream norm");
    // a statistic without a series: no sparklines
    const sel = el.querySelector<HTMLSelectElement>(".nbd-group-stat")!;
    sel.value = "severity";
    sel.dispatchEvent(new Event("change"));
    expect(el.querySelectorAll("svg.nbd-gspark")).toHaveLength(0);
  });

  it("a group without values of the chosen statistic shows the mean std instead of empty cells", () => {
    const p = full(3);
    const strip = Array.from({ length: 3 }, (_, b) => STATS.map((s) => (s === "std" ? b + 1 : NaN)));
    p.strip = wire("float32", strip.flat(), [3, STATS.length]);
    const view = new GroupView(new GroupData(p), { stat: "residual" });
    document.body.appendChild(view.el);
    const cells = Array.from(view.el.querySelectorAll<HTMLElement>(".nbd-cell"));
    expect(cells.map((c) => c.getAttribute("title"))).toEqual(["model.layers.0: mean std 1", "model.layers.1: mean std 2", "model.layers.2: mean std 3"]);
    expect(cells.filter((c) => c.classList.contains("nbd-cell-nan"))).toHaveLength(0);
    view.destroy();
  });
});
