// Logit-lens table: rows = embeddings and each block's output (final at the top), columns =
// positions. Each cell shows the top-1 token of that layer's residual read through the model's own
// final norm and unembedding, coloured by the chosen metric; hovering shows the top-k, clicking
// pins a cell (its top-20 is fetched with rpc "cell"). The last position arrives with the widget;
// other positions of the visible window are fetched with rpc "columns" (computed then in the
// kernel). Python side: nbdebug/widgets/logitlens.py. Token text is untrusted: textContent only.
import { COLORMAPS, colorAt } from "./lib/colormap";
import { append, fmt, fmtPct, h, replaceChildren, styleElement } from "./lib/dom";
import { decode, type NdArray, type WireArray } from "./lib/ndarray";
import { rpc, type AnyModel } from "./lib/rpc";

const METRIC_LABELS: Record<string, string> = {
  top1_prob: "top-1 probability",
  entropy: "entropy (nats)",
  target_prob: "target probability",
  target_rank: "target rank",
  kl: "KL(final ‖ layer) (nats)",
};

const CSS = `
.nbdebug-logitlens { font: 12px/1.35 system-ui, sans-serif; color: #222; position: relative; }
.nbdebug-logitlens .nbl-title { font-weight: 600; }
.nbdebug-logitlens .nbl-note { color: #666; }
.nbdebug-logitlens .nbl-controls { display: flex; gap: 12px; align-items: center; margin: 6px 0; flex-wrap: wrap; }
.nbdebug-logitlens .nbl-controls input[type=number] { width: 4.5em; }
.nbdebug-logitlens .nbl-wrap { overflow: auto; max-height: 620px; max-width: 100%; }
.nbdebug-logitlens table { border-collapse: collapse; font-family: ui-monospace, monospace; font-size: 11px; }
.nbdebug-logitlens th { font-weight: normal; color: #444; padding: 1px 3px; white-space: pre; position: sticky; top: 0; background: #fff; max-width: 90px; overflow: hidden; text-overflow: ellipsis; }
.nbdebug-logitlens th.nbl-row { position: sticky; left: 0; text-align: right; z-index: 1; }
.nbdebug-logitlens td { padding: 1px 3px; white-space: pre; max-width: 90px; overflow: hidden; text-overflow: ellipsis; border: 1px solid #fff; cursor: pointer; }
.nbdebug-logitlens td.nbl-target { font-weight: 700; text-decoration: underline; }
.nbdebug-logitlens td.nbl-pinned { outline: 2px solid #d62728; }
.nbdebug-logitlens td.nbl-pending { color: #aaa; }
.nbdebug-logitlens .nbl-tip { position: absolute; z-index: 10; background: #fff; border: 1px solid #aaa; padding: 4px 6px;
  box-shadow: 0 2px 6px rgba(0,0,0,.2); pointer-events: none; font-family: ui-monospace, monospace; white-space: pre; }
.nbdebug-logitlens .nbl-pins { display: flex; gap: 12px; flex-wrap: wrap; margin-top: 6px; }
.nbdebug-logitlens .nbl-pin { border: 1px solid #ddd; padding: 4px 6px; font-family: ui-monospace, monospace; white-space: pre; }
.nbdebug-logitlens .nbl-error { color: #b00; }
.nbdebug-logitlens th.nbl-gen { color: #8a3ffc; font-style: italic; border-bottom: 2px solid #8a3ffc; }
`;

interface Column {
  ids: Int32Array; // R*k
  probs: Float32Array;
  entropy: Float32Array; // R
  kl: Float32Array;
  tprob: Float32Array;
  trank: Int32Array;
}

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const R: number = model.get("n_rows");
  const T: number = model.get("n_pos");
  const k: number = model.get("k");
  const rows: string[] = model.get("row_names") || [];
  const tokens: string[] = model.get("tokens") || [];
  const raw: string[] = model.get("raw_tokens") || tokens;
  const targets: number[] = model.get("targets") || [];
  const generated: number[] = model.get("generated") || [];
  const nGen = generated.filter((g) => g).length;
  const vocab = new Map<number, string>();
  const cols = new Map<number, Column>();
  const pending = new Set<number>();
  let disposed = false;
  let cmap = "viridis";
  const label = (id: number) => vocab.get(id) ?? `#${id}`;
  // Short row labels (full module names in the tooltip): "embed", "L0", "L1", ...
  const rowLabel = (r: number) => (r === 0 ? "embed" : `L${r - 1}`);
  const learn = (v: Record<string, string>) => {
    for (const [id, s] of Object.entries(v || {})) vocab.set(Number(id), s);
  };

  function store(positions: number[], arrays: Record<string, NdArray>): void {
    const P = positions.length;
    positions.forEach((pos, j) => {
      const at = (a: NdArray, width: number) => {
        const out = new (a.data.constructor as any)(R * width);
        for (let r = 0; r < R; r++) out.set(a.data.subarray((r * P + j) * width, (r * P + j + 1) * width), r * width);
        return out;
      };
      cols.set(pos, {
        ids: at(arrays.top_ids, k),
        probs: at(arrays.top_probs, k),
        entropy: at(arrays.entropy, 1),
        kl: at(arrays.kl, 1),
        tprob: at(arrays.target_prob, 1),
        trank: at(arrays.target_rank, 1),
      });
    });
  }
  const initial = model.get("initial") || {};
  learn(model.get("vocab"));
  if (initial.positions && initial.arrays) {
    const arrays: Record<string, NdArray> = {};
    for (const [name, w] of Object.entries(initial.arrays as Record<string, WireArray>)) arrays[name] = decode(w);
    store(initial.positions, arrays);
  }

  const root = h("div", { class: "nbdebug-logitlens" });
  const metricSel = h("select", { class: "nbl-metric" }, Object.entries(METRIC_LABELS).map(([v, t]) => h("option", { attrs: { value: v }, text: t })));
  metricSel.value = model.get("metric") || "top1_prob";
  const cmapSel = h("select", { class: "nbl-cmap" }, COLORMAPS.map((n) => h("option", { attrs: { value: n }, text: n })));
  const num = (cls: string, min: number, max: number) => h("input", { class: cls, attrs: { type: "number", min, max } });
  const rowFrom = num("nbl-row-from", 0, R - 1);
  const rowTo = num("nbl-row-to", 0, R - 1);
  const posFrom = num("nbl-pos-from", 0, T - 1);
  const posTo = num("nbl-pos-to", 1, T);
  const wrap = h("div", { class: "nbl-wrap" });
  const tip = h("div", { class: "nbl-tip", style: { display: "none" } });
  const pins = h("div", { class: "nbl-pins" });
  const status = h("div", { class: "nbl-note nbl-status" });
  const targetLabel: string = model.get("target_label") || "";
  append(root, [
    styleElement(CSS),
    h("div", { class: "nbl-title", text: `Logit lens · ${R} rows (embeddings + ${R - 1} blocks) × ${T} positions · top-${k}` }),
    model.get("check") ? h("div", { class: "nbl-note nbl-check", text: model.get("check") }) : null,
    targetLabel ? h("div", { class: "nbl-note", text: `target: ${targetLabel}` }) : null,
    ...((model.get("notes") || []) as string[]).map((n) => h("div", { class: "nbl-note", text: n })),
    nGen ? h("div", { class: "nbl-note nbl-gen-legend", text: `${nGen} generated tokens: purple italic column headers` }) : null,
    h("div", { class: "nbl-controls" }, [
      h("label", {}, ["colour ", metricSel]),
      h("label", {}, ["colormap ", cmapSel]),
      h("label", {}, ["layers ", rowFrom, " – ", rowTo]),
      h("label", {}, ["positions ", posFrom, " – ", posTo]),
    ]),
    wrap,
    status,
    pins,
    tip,
  ]);
  el.appendChild(root);

  const rowRange = (): [number, number] => {
    const r = (model.get("row_range") || []) as number[];
    const a = Math.max(0, Math.min(R - 1, Number.isFinite(r[0]) ? r[0] : 0));
    const b = Math.max(a, Math.min(R - 1, Number.isFinite(r[1]) ? r[1] : R - 1));
    return [a, b];
  };
  const posRange = (): [number, number] => {
    const r = (model.get("pos_range") || []) as number[];
    const a = Math.max(0, Math.min(T - 1, Number.isFinite(r[0]) ? r[0] : 0));
    const b = Math.max(a + 1, Math.min(T, Number.isFinite(r[1]) ? r[1] : T));
    return [a, b];
  };

  function value(metric: string, c: Column, r: number): number {
    switch (metric) {
      case "entropy": return c.entropy[r];
      case "kl": return c.kl[r];
      case "target_prob": return c.tprob[r];
      case "target_rank": return c.trank[r];
      default: return c.probs[r * k];
    }
  }
  // Colour position in [0, 1]: probabilities as is; entropy/KL over the visible maximum; rank on a log scale.
  function scaler(metric: string, positions: number[], r0: number, r1: number): (v: number) => number {
    if (metric === "top1_prob" || metric === "target_prob") return (v) => v;
    if (metric === "target_rank") return (v) => (v < 0 ? NaN : 1 - Math.min(1, Math.log10(1 + v) / 4));
    let mx = 1e-9;
    for (const p of positions) {
      const c = cols.get(p);
      if (!c) continue;
      for (let r = r0; r <= r1; r++) {
        const v = value(metric, c, r);
        if (Number.isFinite(v)) mx = Math.max(mx, v);
      }
    }
    return (v) => v / mx;
  }
  function fmtValue(metric: string, v: number): string {
    if (metric === "target_rank") return v < 0 ? "–" : `#${v + 1}`;
    if (metric === "top1_prob" || metric === "target_prob") return fmtPct(v);
    return fmt(v);
  }

  function drawTable(): void {
    const [r0, r1] = rowRange();
    const [p0, p1] = posRange();
    rowFrom.value = String(r0);
    rowTo.value = String(r1);
    posFrom.value = String(p0);
    posTo.value = String(p1);
    const positions = Array.from({ length: p1 - p0 }, (_, i) => p0 + i);
    const metric = metricSel.value;
    const sc = scaler(metric, positions, r0, r1);
    const pinned = new Set(((model.get("pinned") || []) as number[][]).map(([r, p]) => `${r},${p}`));
    const head = h("tr", {}, [h("th", { class: "nbl-row", text: "" }), ...positions.map((p) => h("th", { class: generated[p] ? "nbl-gen" : "", text: tokens[p] ?? "", title: `${raw[p] ?? ""} [${p}]${generated[p] ? " (generated)" : ""}` }))]);
    const body: HTMLElement[] = [];
    for (let r = r1; r >= r0; r--) {
      const tds = positions.map((p) => {
        const c = cols.get(p);
        if (!c) return h("td", { class: "nbl-pending", text: "…", data: { row: r, pos: p } });
        const id = c.ids[r * k];
        const v = value(metric, c, r);
        const t = sc(v);
        const [cr, cg, cb] = Number.isFinite(t) ? colorAt(cmap, t) : [238, 238, 238];
        const light = 0.299 * cr + 0.587 * cg + 0.114 * cb > 140;
        return h("td", {
          class: [targets[p] === id && targets[p] >= 0 ? "nbl-target" : "", pinned.has(`${r},${p}`) ? "nbl-pinned" : ""],
          text: label(id),
          data: { row: r, pos: p },
          style: { background: `rgb(${cr}, ${cg}, ${cb})`, color: light ? "#111" : "#fff" },
        });
      });
      body.push(h("tr", {}, [h("th", { class: "nbl-row", text: rowLabel(r), title: rows[r] ?? "" }), ...tds]));
    }
    replaceChildren(wrap, [h("table", {}, [h("thead", {}, [head]), h("tbody", {}, body)])]);
    const missing = positions.filter((p) => !cols.has(p));
    if (missing.length) {
      root.removeAttribute("data-complete");
      void fetchColumns(missing);
    } else root.setAttribute("data-complete", "1");
  }

  async function fetchColumns(missing: number[]): Promise<void> {
    const todo = missing.filter((p) => !pending.has(p));
    if (!todo.length) return;
    todo.forEach((p) => pending.add(p));
    const start = Math.min(...todo);
    const end = Math.max(...todo) + 1;
    status.textContent = `computing positions ${start}–${end - 1}…`;
    try {
      const ans = await rpc(model, "columns", { start, end });
      if (disposed) return;
      learn(ans.result.vocab);
      store(ans.result.positions, ans.arrays);
      status.textContent = "";
    } catch (err) {
      status.textContent = String(err);
      status.classList.add("nbl-error");
      return;
    } finally {
      todo.forEach((p) => pending.delete(p));
    }
    drawTable();
  }

  function cellAt(ev: Event): [number, number] | null {
    const td = (ev.target as HTMLElement).closest?.("td");
    if (!td || !td.hasAttribute("data-row")) return null;
    return [Number(td.getAttribute("data-row")), Number(td.getAttribute("data-pos"))];
  }
  function showTip(ev: MouseEvent): void {
    const at = cellAt(ev);
    const c = at && cols.get(at[1]);
    if (!at || !c) {
      tip.style.display = "none";
      return;
    }
    const [r, p] = at;
    const lines = [`${rowLabel(r)} (${rows[r]}) · position ${p}: ${tokens[p] ?? ""}`];
    for (let i = 0; i < k; i++) lines.push(`${fmtPct(c.probs[r * k + i]).padStart(6)}  ${label(c.ids[r * k + i])}`);
    lines.push(`entropy ${fmt(c.entropy[r])} · KL to final ${fmt(c.kl[r])}`);
    if (targets[p] >= 0) lines.push(`target ${label(targets[p])}: ${fmtPct(c.tprob[r])}, rank ${fmtValue("target_rank", c.trank[r])}`);
    tip.textContent = lines.join("\n");
    const box = root.getBoundingClientRect();
    tip.style.display = "block";
    tip.style.left = `${ev.clientX - box.left + 14}px`;
    tip.style.top = `${ev.clientY - box.top + 14}px`;
  }
  function togglePin(ev: MouseEvent): void {
    const at = cellAt(ev);
    if (!at) return;
    const cur = (model.get("pinned") || []) as number[][];
    const has = cur.some(([r, p]) => r === at[0] && p === at[1]);
    model.set("pinned", has ? cur.filter(([r, p]) => !(r === at[0] && p === at[1])) : [...cur, at]);
    model.save_changes();
  }
  let pinSeq = 0;
  async function drawPins(): Promise<void> {
    const mine = ++pinSeq;
    const cur = (model.get("pinned") || []) as number[][];
    const boxes: HTMLElement[] = [];
    for (const [r, p] of cur) {
      try {
        const ans = await rpc(model, "cell", { row: r, pos: p, k: 20 });
        if (mine !== pinSeq || disposed) return;
        learn(ans.result.vocab);
        const ids = ans.arrays.ids.data;
        const probs = ans.arrays.probs.data;
        const lines = [`${rowLabel(r)} · ${tokens[p] ?? ""} [${p}]`];
        for (let i = 0; i < ids.length; i++) lines.push(`${fmtPct(probs[i] as number).padStart(6)}  ${label(ids[i] as number)}`);
        boxes.push(h("div", { class: "nbl-pin", text: lines.join("\n"), data: { row: r, pos: p } }));
      } catch (err) {
        boxes.push(h("div", { class: "nbl-pin nbl-error", text: String(err) }));
      }
    }
    if (mine === pinSeq && !disposed) {
      replaceChildren(pins, boxes);
      pins.setAttribute("data-ready", "1");
    }
  }

  wrap.addEventListener("mousemove", showTip);
  wrap.addEventListener("mouseleave", () => (tip.style.display = "none"));
  wrap.addEventListener("click", togglePin);
  const setRange = (name: string, a: HTMLInputElement, b: HTMLInputElement) => () => {
    model.set(name, [Number(a.value), Number(b.value)]);
    model.save_changes();
  };
  [rowFrom, rowTo].forEach((i) => i.addEventListener("change", setRange("row_range", rowFrom, rowTo)));
  [posFrom, posTo].forEach((i) => i.addEventListener("change", setRange("pos_range", posFrom, posTo)));
  metricSel.addEventListener("change", () => {
    model.set("metric", metricSel.value);
    model.save_changes();
  });
  cmapSel.addEventListener("change", () => {
    cmap = cmapSel.value;
    drawTable();
  });
  const onMetric = () => {
    metricSel.value = model.get("metric");
    drawTable();
  };
  const onPinned = () => {
    drawTable();
    void drawPins();
  };
  model.on("change:metric", onMetric);
  model.on("change:row_range", drawTable);
  model.on("change:pos_range", drawTable);
  model.on("change:pinned", onPinned);

  drawTable();
  if (((model.get("pinned") || []) as unknown[]).length) void drawPins();
  root.setAttribute("data-ready", "1");
  return () => {
    disposed = true;
    model.off("change:metric", onMetric);
    model.off("change:row_range", drawTable);
    model.off("change:pos_range", drawTable);
    model.off("change:pinned", onPinned);
  };
}

export default { render };
