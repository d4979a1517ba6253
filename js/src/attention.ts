// Attention-head viewer: a layers × heads grid of thumbnails (uint8, downsampled in the kernel) with
// per-head metrics; clicking a head fetches its T×T matrix (rpc "head", uint8 sqrt-encoded; above
// `full_side` tokens only the shown token range, mean-pooled by `stride` when wider than that)
// and shows it as a token-to-token line view and a heatmap over a token range. Tokens produced by
// generate() (`generated`) are marked. Shift/ctrl-click
// overlays several heads in the line view. Python side: nbdebug/widgets/attention.py.
// Tokens are untrusted model text: textContent only.
import { COLORMAPS, paintU8 } from "./lib/colormap";
import { fmt, fmtPct, h, replaceChildren, styleElement } from "./lib/dom";
import { decode, type NdArray, type WireArray } from "./lib/ndarray";
import { rpc, type AnyModel } from "./lib/rpc";

const LINE_MAX = 128; // widest token range drawn as a line view
const HEAD_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf"];
const MASS = new Set(["first_mass", "sep_mass", "prev_token", "diagonal", "max_mass", "norm_entropy"]);
const LABELS: Record<string, string> = {
  first_mass: "sink: first token",
  sep_mass: "sink: [SEP]/EOS",
  entropy: "entropy (nats)",
  norm_entropy: "entropy / max",
  prev_token: "previous token",
  diagonal: "diagonal (self)",
  max_mass: "most-attended key",
};

const CSS = `
.nbdebug-attention { font: 12px/1.35 system-ui, sans-serif; color: #222; }
.nbdebug-attention .nba-summary { font-weight: 600; margin: 2px 0; }
.nbdebug-attention .nba-path, .nbdebug-attention .nba-note { color: #666; }
.nbdebug-attention .nba-controls { display: flex; gap: 12px; align-items: center; margin: 6px 0; flex-wrap: wrap; }
.nbdebug-attention .nba-grid { display: grid; gap: 3px; overflow: auto; max-height: 560px; align-items: start; justify-content: start; }
.nbdebug-attention .nba-rowlabel, .nbdebug-attention .nba-collabel { color: #666; font-size: 10px; text-align: center; align-self: center; }
.nbdebug-attention .nba-head { border: 2px solid transparent; cursor: pointer; text-align: center; padding: 1px; }
.nbdebug-attention .nba-head canvas { width: 48px; height: 48px; image-rendering: pixelated; display: block; margin: auto; }
.nbdebug-attention .nba-head .nba-val { font-size: 10px; color: #444; }
.nbdebug-attention .nba-head.nba-sink { border-color: #d62728; }
.nbdebug-attention .nba-head.nba-uniform { border-color: #ff7f0e; }
.nbdebug-attention .nba-head.nba-selected { outline: 2px solid #1f77b4; }
.nbdebug-attention .nba-detail { margin-top: 8px; border-top: 1px solid #ddd; padding-top: 6px; }
.nbdebug-attention .nba-views { display: flex; gap: 16px; align-items: flex-start; flex-wrap: wrap; }
.nbdebug-attention .nba-matrix { image-rendering: pixelated; border: 1px solid #ccc; cursor: crosshair; }
.nbdebug-attention .nba-lines { position: relative; display: flex; max-height: 520px; overflow-y: auto; }
.nbdebug-attention .nba-tok { height: 16px; line-height: 16px; white-space: pre; font-family: ui-monospace, monospace;
  font-size: 11px; padding: 0 4px; cursor: default; max-width: 140px; overflow: hidden; text-overflow: ellipsis; }
.nbdebug-attention .nba-left .nba-tok { text-align: right; }
.nbdebug-attention .nba-tok.nba-hot { background: #ffe9a8; }
.nbdebug-attention .nba-tok.nba-mark { background: #cfe3ff; font-weight: 600; }
.nbdebug-attention .nba-highlight { color: #1f4e99; min-height: 16px; }
.nbdebug-attention .nba-status { color: #444; min-height: 16px; font-family: ui-monospace, monospace; white-space: pre; }
.nbdebug-attention .nba-error { color: #b00; }
.nbdebug-attention .nba-tok.nba-gen { color: #8a3ffc; font-style: italic; }
`;

interface HeadData {
  layer: number;
  head: number;
  name: string;
  start: number; // first token of the matrix
  stride: number; // tokens per pixel (1: exact)
  n: number; // side in pixels
  p: Uint8Array; // sqrt-encoded
}

const decodeP = (v: number) => (v / 255) * (v / 255);

function wire(model: AnyModel, name: string): NdArray | null {
  const w = model.get(name) as WireArray | undefined;
  return w && w.view ? decode(w) : null;
}

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const L: number = model.get("n_layers");
  const H: number = model.get("n_heads");
  const T: number = model.get("seq_len");
  const tokens: string[] = model.get("tokens") || [];
  const rawTokens: string[] = model.get("raw_tokens") || tokens;
  const names: string[] = model.get("metric_names") || [];
  const generated: number[] = model.get("generated") || [];
  const nGen = generated.filter((g) => g).length;
  const fullSide: number = model.get("full_side") || 1024;
  const thumbs = wire(model, "thumbs");
  const metrics = wire(model, "metrics");
  const flags = wire(model, "flags");
  const cache = new Map<string, HeadData>();
  let disposed = false;
  let cmap = "viridis";

  const root = h("div", { class: "nbdebug-attention" });
  const metricSel = h("select", { class: "nba-metric" }, names.map((n) => h("option", { attrs: { value: n }, text: LABELS[n] || n })));
  metricSel.value = model.get("metric") || "first_mass";
  const cmapSel = h("select", { class: "nba-cmap" }, COLORMAPS.map((n) => h("option", { attrs: { value: n }, text: n })));
  const grid = h("div", { class: "nba-grid", style: { "grid-template-columns": `auto repeat(${H}, 56px)` } });
  const detail = h("div", { class: "nba-detail" });
  const notes = (model.get("notes") || []) as string[];
  const highlight = h("div", { class: "nba-highlight" });
  root.append(
    styleElement(CSS),
    h("div", { class: "nba-summary", text: model.get("summary") || "" }),
    h("div", { class: "nba-path", text: `${L} layers × ${H} heads × ${T} tokens · attention path: ${model.get("path") || "?"}${model.get("causal") ? " · causal" : ""}` }),
    ...notes.map((n) => h("div", { class: "nba-note", text: n })),
    ...(nGen ? [h("div", { class: "nba-note nba-gen-legend", text: `${nGen} generated tokens (purple italic in the token lists)` })] : []),
    h("div", { class: "nba-controls" }, [
      h("label", {}, ["metric ", metricSel]),
      h("label", {}, ["colormap ", cmapSel]),
      h("span", { class: "nba-note", text: "red border: > 50% on one sink token · orange: near-uniform · shift-click: overlay heads" }),
    ]),
    highlight,
    grid,
    detail,
  );
  el.appendChild(root);

  const metricAt = (name: string, l: number, hd: number): number => {
    const m = names.indexOf(name);
    return metrics && m >= 0 ? (metrics.data[(m * L + l) * H + hd] as number) : NaN;
  };
  const fmtMetric = (name: string, v: number) => (MASS.has(name) ? fmtPct(v) : fmt(v));

  // -- overview grid ----------------------------------------------------------------------------
  const cells: HTMLElement[] = [];
  const values: HTMLElement[] = [];
  function drawGrid(): void {
    replaceChildren(grid, [h("div", { class: "nba-collabel", text: "" })]);
    for (let hd = 0; hd < H; hd++) grid.appendChild(h("div", { class: "nba-collabel", text: `h${hd}` }));
    cells.length = 0;
    values.length = 0;
    const s = thumbs ? thumbs.shape[2] : 0;
    for (let l = 0; l < L; l++) {
      grid.appendChild(h("div", { class: "nba-rowlabel", text: `L${l}` }));
      for (let hd = 0; hd < H; hd++) {
        const f = flags ? (flags.data[l * H + hd] as number) : 0;
        const canvas = h("canvas", { attrs: { width: s, height: s } });
        const g = canvas.getContext("2d"); // null where canvases are unsupported: metrics still show
        if (thumbs && s > 0 && g) {
          const off = (l * H + hd) * s * s;
          paintU8((thumbs.data as Uint8Array).subarray(off, off + s * s), s, s, cmap, g);
        }
        const val = h("div", { class: "nba-val" });
        const tip = names.map((n) => `${LABELS[n] || n}: ${fmtMetric(n, metricAt(n, l, hd))}`).join("\n");
        const cell = h(
          "div",
          {
            class: ["nba-head", f & 3 ? "nba-sink" : "", f & 4 ? "nba-uniform" : ""],
            data: { layer: l, head: hd },
            title: `layer ${l}, head ${hd}\n${tip}`,
            on: { click: (ev: MouseEvent) => pick(l, hd, ev.shiftKey || ev.ctrlKey || ev.metaKey) },
          },
          [canvas, val],
        );
        cells.push(cell);
        values.push(val);
        grid.appendChild(cell);
      }
    }
    showValues();
    markSelected();
  }
  function showValues(): void {
    const name = metricSel.value;
    for (let i = 0; i < values.length; i++) values[i].textContent = fmtMetric(name, metricAt(name, Math.floor(i / H), i % H));
  }
  function selected(): [number, number][] {
    return ((model.get("selected") || []) as [number, number][]).filter((p) => Array.isArray(p) && p.length === 2);
  }
  function markSelected(): void {
    const sel = new Set(selected().map(([l, hd]) => l * H + hd));
    cells.forEach((c, i) => c.classList.toggle("nba-selected", sel.has(i)));
  }
  function pick(l: number, hd: number, add: boolean): void {
    let sel = selected();
    if (add) {
      const has = sel.some(([a, b]) => a === l && b === hd);
      sel = has ? sel.filter(([a, b]) => !(a === l && b === hd)) : [...sel, [l, hd] as [number, number]].slice(-HEAD_COLORS.length);
    } else sel = [[l, hd]];
    model.set("selected", sel);
    model.save_changes();
  }

  // -- detail -----------------------------------------------------------------------------------
  // Up to `fullSide` tokens the whole matrix is fetched once; above, the shown range [a, b).
  async function fetchHead(l: number, hd: number, a: number, b: number): Promise<HeadData> {
    const whole = T <= fullSide;
    const key = whole ? `${l},${hd}` : `${l},${hd},${a},${b}`;
    const hit = cache.get(key);
    if (hit) return hit;
    const params = whole ? { layer: l, head: hd } : { layer: l, head: hd, start: a, end: b };
    const ans = await rpc(model, "head", params);
    const arr = ans.arrays.attn;
    const data: HeadData = {
      layer: l, head: hd, name: ans.result.name, start: Number(ans.result.start ?? 0),
      stride: Number(ans.result.stride ?? 1), n: arr.shape[0], p: arr.data as Uint8Array,
    };
    if (cache.size > 64) cache.clear();
    cache.set(key, data);
    return data;
  }
  // probability of query i → key j (token positions) in a fetched matrix
  const at = (d: HeadData, i: number, j: number): number =>
    d.p[Math.floor((i - d.start) / d.stride) * d.n + Math.floor((j - d.start) / d.stride)];
  function range(): [number, number] {
    const r = (model.get("token_range") || []) as number[];
    const a = Number.isFinite(r[0]) ? Math.max(0, Math.min(T - 1, r[0])) : 0;
    // an end at or before the start (e.g. only the start was moved): the window after the start
    const b = Number.isFinite(r[1]) && r[1] > a ? Math.min(T, r[1]) : Math.min(T, a + LINE_MAX);
    return [a, b];
  }
  let seq = 0;
  async function drawDetail(): Promise<void> {
    const sel = selected();
    const mine = ++seq;
    detail.removeAttribute("data-ready");
    if (!sel.length) {
      replaceChildren(detail, [h("div", { class: "nba-note", text: "click a head to see its full attention matrix" })]);
      return;
    }
    replaceChildren(detail, [h("div", { class: "nba-note", text: `fetching ${sel.map(([l, hd]) => `L${l}h${hd}`).join(", ")}…` })]);
    const [a, b] = range();
    let heads: HeadData[];
    try {
      heads = await Promise.all(sel.map(([l, hd]) => fetchHead(l, hd, a, b)));
    } catch (err) {
      if (mine !== seq || disposed) return;
      replaceChildren(detail, [h("div", { class: "nba-error", text: String(err) })]);
      model.set("js_error", String(err));
      model.save_changes();
      return;
    }
    if (mine !== seq || disposed) return;
    const status = h("div", { class: "nba-status" });
    const start = h("input", { class: "nba-start", attrs: { type: "number", min: 0, max: T - 1, value: a } });
    const end = h("input", { class: "nba-end", attrs: { type: "number", min: 1, max: T, value: b } });
    const apply = () => {
      model.set("token_range", [Number(start.value), Number(end.value)]);
      model.save_changes();
    };
    start.addEventListener("change", apply);
    end.addEventListener("change", apply);
    const title = heads
      .map((d, i) => `L${d.layer} h${d.head}` + (heads.length > 1 ? ` (${HEAD_COLORS[i % HEAD_COLORS.length]})` : ""))
      .join(" + ");
    const m0 = heads[0];
    const tipNames = ["first_mass", "prev_token", "diagonal", "entropy"];
    const summary = tipNames.map((n) => `${LABELS[n]} ${fmtMetric(n, metricAt(n, m0.layer, m0.head))}`).join(" · ");
    replaceChildren(detail, [
      h("div", { class: "nba-summary", text: `${title} — ${m0.name}` }),
      h("div", { class: "nba-note", text: summary }),
      h("div", { class: "nba-controls" }, [
        h("label", {}, ["tokens from ", start]),
        h("label", {}, [" to ", end]),
        h("span", { class: "nba-note", text: `of ${T}` }),
      ]),
      h("div", { class: "nba-views" }, [matrixView(m0, a, b, status), lineView(heads, a, b, status)]),
      status,
    ]);
    markToken();
    detail.setAttribute("data-ready", "1");
  }

  // `highlight_token` (set from Python, e.g. by a logit-lens column in a dashboard): mark that position.
  function markToken(): void {
    const pos = Number(model.get("highlight_token") ?? -1);
    const on = Number.isInteger(pos) && pos >= 0 && pos < T;
    highlight.textContent = on ? `highlighted token: ${tokens[pos] ?? ""} [${pos}]` : "";
    highlight.setAttribute("data-pos", on ? String(pos) : "");
    for (const t of Array.from(detail.querySelectorAll(".nba-tok"))) {
      t.classList.toggle("nba-mark", on && (t as HTMLElement).dataset.pos === String(pos));
    }
  }

  function matrixView(d: HeadData, a: number, b: number, status: HTMLElement): HTMLElement {
    const st = d.stride;
    const n = Math.ceil((b - a) / st); // pixels per side
    const sub = new Uint8Array(n * n);
    for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) sub[i * n + j] = at(d, a + i * st, a + j * st);
    // Colours span the window's own range (long inputs spread attention thinly: 1/T is dark on a 0–1 scale).
    let vmax = 1;
    for (let i = 0; i < sub.length; i++) if (sub[i] > vmax) vmax = sub[i];
    const shown = vmax >= 255 ? sub : sub.map((v) => Math.round((v * 255) / vmax));
    const canvas = h("canvas", { class: "nba-matrix", attrs: { width: n, height: n } });
    const g = canvas.getContext("2d");
    if (g) paintU8(shown, n, n, cmap, g);
    const px = n > 480 ? Math.min(n, 1024) : Math.max(240, Math.min(480, n * 8)); // ≥ 1 px per token up to 1024
    canvas.style.width = `${px}px`;
    canvas.style.height = `${px}px`;
    canvas.addEventListener("mousemove", (ev: MouseEvent) => {
      const r = canvas.getBoundingClientRect();
      const j = Math.floor(((ev.clientX - r.left) / r.width) * n);
      const i = Math.floor(((ev.clientY - r.top) / r.height) * n);
      if (i < 0 || j < 0 || i >= n || j >= n) return;
      const qi = a + i * st;
      const kj = a + j * st;
      const gen = (t: number) => (generated[t] ? " (generated)" : "");
      status.textContent = st > 1
        ? `queries ${qi}–${Math.min(b, qi + st) - 1} → keys ${kj}–${Math.min(b, kj + st) - 1}: mean ${fmtPct(decodeP(sub[i * n + j]))}`
        : `${tokens[qi]} [${qi}]${gen(qi)} → ${tokens[kj]} [${kj}]${gen(kj)}: ${fmtPct(decodeP(sub[i * n + j]))}`;
    });
    const scale = vmax >= 255 ? "" : `, up to ${fmtPct(decodeP(vmax))}`;
    const pooled = st > 1 ? ` · ${st}×${st} tokens per pixel (mean); narrow the range for exact values` : "";
    return h("div", {}, [h("div", { class: "nba-note nba-pooled", text: `rows: queries · columns: keys (colour: √p${scale})${pooled}` }), canvas]);
  }

  function lineView(heads: HeadData[], a: number, b: number, status: HTMLElement): HTMLElement {
    const n = b - a;
    if (n > LINE_MAX || heads.some((d) => d.stride > 1)) return h("div", { class: "nba-note", text: `line view: narrow the range to ≤ ${LINE_MAX} tokens` });
    const rowH = 16;
    const width = 160;
    const canvas = h("canvas", { attrs: { width, height: n * rowH }, style: { width: `${width}px`, height: `${n * rowH}px` } });
    const ctx = canvas.getContext("2d");
    const left: HTMLElement[] = [];
    const right: HTMLElement[] = [];
    const draw = (focus: { side: "q" | "k"; i: number } | null) => {
      if (!ctx) return;
      ctx.clearRect(0, 0, width, n * rowH);
      heads.forEach((d, hi) => {
        ctx.strokeStyle = HEAD_COLORS[hi % HEAD_COLORS.length];
        for (let i = 0; i < n; i++) {
          if (focus && focus.side === "q" && focus.i !== i) continue;
          let rowMax = 1e-12;
          for (let j = 0; j < n; j++) rowMax = Math.max(rowMax, decodeP(at(d, a + i, a + j)));
          for (let j = 0; j < n; j++) {
            if (focus && focus.side === "k" && focus.i !== j) continue;
            const p = decodeP(at(d, a + i, a + j)) / rowMax;
            if (p < 0.05) continue;
            ctx.globalAlpha = Math.min(1, focus ? 0.15 + p : p);
            ctx.lineWidth = focus ? 2 : 1.5;
            ctx.beginPath();
            ctx.moveTo(0, i * rowH + rowH / 2);
            ctx.lineTo(width, j * rowH + rowH / 2);
            ctx.stroke();
          }
        }
      });
      ctx.globalAlpha = 1;
    };
    const hover = (side: "q" | "k", i: number, on: boolean) => {
      (side === "q" ? left : right)[i].classList.toggle("nba-hot", on);
      draw(on ? { side, i } : null);
      if (on) {
        const d = heads[0];
        const parts: string[] = [];
        for (let j = 0; j < n; j++) {
          const p = decodeP(side === "q" ? at(d, a + i, a + j) : at(d, a + j, a + i));
          if (p >= 0.05) parts.push(`${tokens[a + j]} ${fmtPct(p)}`);
        }
        status.textContent = `${tokens[a + i]} ${side === "q" ? "attends to" : "is attended by"}: ${parts.join("  ")}`;
      }
    };
    for (let i = 0; i < n; i++) {
      const t = tokens[a + i] ?? "";
      const tip = `${rawTokens[a + i] ?? t} [${a + i}]${generated[a + i] ? " (generated)" : ""}`;
      const gen = generated[a + i] ? "nba-gen" : "";
      left.push(h("div", { class: ["nba-tok", "nba-q", gen], text: t, title: tip, attrs: { "data-pos": a + i }, on: { mouseenter: () => hover("q", i, true), mouseleave: () => hover("q", i, false) } }));
      right.push(h("div", { class: ["nba-tok", "nba-k", gen], text: t, title: tip, attrs: { "data-pos": a + i }, on: { mouseenter: () => hover("k", i, true), mouseleave: () => hover("k", i, false) } }));
    }
    draw(null);
    return h("div", {}, [
      h("div", { class: "nba-note", text: "queries → keys · opacity relative to each query's strongest link shown" }),
      h("div", { class: "nba-lines" }, [h("div", { class: "nba-left" }, left), canvas, h("div", { class: "nba-right" }, right)]),
    ]);
  }

  metricSel.addEventListener("change", () => {
    model.set("metric", metricSel.value);
    model.save_changes();
    showValues();
  });
  cmapSel.addEventListener("change", () => {
    cmap = cmapSel.value;
    drawGrid();
    void drawDetail();
  });
  const onSel = () => {
    markSelected();
    void drawDetail();
  };
  const onMetric = () => {
    metricSel.value = model.get("metric");
    showValues();
  };
  const onRange = () => void drawDetail();
  model.on("change:selected", onSel);
  model.on("change:metric", onMetric);
  model.on("change:token_range", onRange);
  model.on("change:highlight_token", markToken);

  drawGrid();
  markToken();
  void drawDetail();
  root.setAttribute("data-ready", "1");
  return () => {
    disposed = true;
    model.off("change:selected", onSel);
    model.off("change:metric", onMetric);
    model.off("change:token_range", onRange);
    model.off("change:highlight_token", markToken);
  };
}

export default { render };
