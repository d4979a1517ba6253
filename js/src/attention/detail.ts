// The detail panel of the selected head(s): its matrix fetched on demand (rpc "head", uint8
// sqrt-encoded; above `full_side` tokens only the shown token range, mean-pooled by `stride` when
// wider), a heatmap and a token-to-token line view, and a row of per-head actions.
//
// Per-head actions plug in here: `HeadDetail` takes a list of `HeadAction`s (built in attention.ts)
// and draws one button per action for the first selected head in `.nba-actions`.
import { paintU8 } from "../lib/colormap";
import { fmtPct, h, replaceChildren } from "../lib/dom";
import { rpc, type AnyModel } from "../lib/rpc";
import { Latest } from "../lib/request";
import { fmtMetric, LABELS, metricAt, type AttentionData } from "./data";

export const LINE_MAX = 128; // widest token range drawn as a line view
export const HEAD_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf"];

/** A button in the detail panel acting on one head (e.g. "ablate this head"). */
export interface HeadAction {
  label: string;
  title?: string;
  /** Called with the head's layer and index; the returned promise's rejection is shown as an error. */
  run: (layer: number, head: number) => void | Promise<void>;
}

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

export class HeadDetail {
  readonly el = h("div", { class: "nba-detail" });
  readonly highlight = h("div", { class: "nba-highlight" });
  private cache = new Map<string, HeadData>();
  readonly latest = new Latest();

  constructor(
    private model: AnyModel,
    private d: AttentionData,
    private cmap: () => string,
    private actions: HeadAction[] = [],
  ) {}

  private selected(): [number, number][] {
    return ((this.model.get("selected") || []) as [number, number][]).filter((p) => Array.isArray(p) && p.length === 2);
  }

  // Up to `fullSide` tokens the whole matrix is fetched once; above, the shown range [a, b).
  private async fetchHead(l: number, hd: number, a: number, b: number): Promise<HeadData> {
    const whole = this.d.T <= this.d.fullSide;
    const key = whole ? `${l},${hd}` : `${l},${hd},${a},${b}`;
    const hit = this.cache.get(key);
    if (hit) return hit;
    const params = whole ? { layer: l, head: hd } : { layer: l, head: hd, start: a, end: b };
    const ans = await rpc(this.model, "head", params);
    const arr = ans.arrays.attn;
    const data: HeadData = {
      layer: l, head: hd, name: ans.result.name, start: Number(ans.result.start ?? 0),
      stride: Number(ans.result.stride ?? 1), n: arr.shape[0], p: arr.data as Uint8Array,
    };
    if (this.cache.size > 64) this.cache.clear();
    this.cache.set(key, data);
    return data;
  }

  private range(): [number, number] {
    const T = this.d.T;
    const r = (this.model.get("token_range") || []) as number[];
    const a = Number.isFinite(r[0]) ? Math.max(0, Math.min(T - 1, r[0])) : 0;
    // an end at or before the start (e.g. only the start was moved): the window after the start
    const b = Number.isFinite(r[1]) && r[1] > a ? Math.min(T, r[1]) : Math.min(T, a + LINE_MAX);
    return [a, b];
  }

  async draw(): Promise<void> {
    const { model, d, el } = this;
    const sel = this.selected();
    const isLatest = this.latest.start();
    el.removeAttribute("data-ready");
    if (!sel.length) {
      replaceChildren(el, [h("div", { class: "nba-note", text: "click a head to see its full attention matrix" })]);
      return;
    }
    replaceChildren(el, [h("div", { class: "nba-note", text: `fetching ${sel.map(([l, hd]) => `L${l}h${hd}`).join(", ")}…` })]);
    const [a, b] = this.range();
    let heads: HeadData[];
    try {
      heads = await Promise.all(sel.map(([l, hd]) => this.fetchHead(l, hd, a, b)));
    } catch (err) {
      if (!isLatest()) return;
      replaceChildren(el, [h("div", { class: "nba-error", text: String(err) })]);
      model.set("js_error", String(err));
      model.save_changes();
      return;
    }
    if (!isLatest()) return;
    const status = h("div", { class: "nba-status" });
    const start = h("input", { class: "nba-start", attrs: { type: "number", min: 0, max: d.T - 1, value: a } });
    const end = h("input", { class: "nba-end", attrs: { type: "number", min: 1, max: d.T, value: b } });
    const apply = () => {
      model.set("token_range", [Number(start.value), Number(end.value)]);
      model.save_changes();
    };
    start.addEventListener("change", apply);
    end.addEventListener("change", apply);
    const title = heads
      .map((x, i) => `L${x.layer} h${x.head}` + (heads.length > 1 ? ` (${HEAD_COLORS[i % HEAD_COLORS.length]})` : ""))
      .join(" + ");
    const m0 = heads[0];
    const tipNames = ["first_mass", "prev_token", "diagonal", "entropy"];
    const summary = tipNames.map((n) => `${LABELS[n]} ${fmtMetric(n, metricAt(d, n, m0.layer, m0.head))}`).join(" · ");
    const out = d.outliers.get(m0.layer * d.H + m0.head);
    replaceChildren(el, [
      h("div", { class: "nba-summary", text: `${title} — ${m0.name}` }),
      out ? h("div", { class: "nba-why", text: `stands out for this model: ${out.text}` }) : null,
      h("div", { class: "nba-note", text: summary }),
      this.actionBar(m0.layer, m0.head),
      h("div", { class: "nba-controls" }, [
        h("label", {}, ["tokens from ", start]),
        h("label", {}, [" to ", end]),
        h("span", { class: "nba-note", text: `of ${d.T}` }),
      ]),
      h("div", { class: "nba-views" }, [this.matrixView(m0, a, b, status), this.lineView(heads, a, b, status)]),
      status,
    ]);
    this.markToken();
    el.setAttribute("data-ready", "1");
  }

  private actionBar(layer: number, head: number): HTMLElement | null {
    if (!this.actions.length) return null;
    const err = h("span", { class: "nba-error" });
    const buttons = this.actions.map((a) =>
      h("button", {
        class: "nba-action", text: a.label, title: a.title, data: { layer, head },
        on: {
          click: () => {
            err.textContent = "";
            Promise.resolve()
              .then(() => a.run(layer, head))
              .catch((e) => (err.textContent = String(e)));
          },
        },
      }),
    );
    return h("div", { class: "nba-actions" }, [...buttons, err]);
  }

  // `highlight_token` (set from Python, e.g. by a logit-lens column in a dashboard): mark that position.
  markToken(): void {
    const { d } = this;
    const pos = Number(this.model.get("highlight_token") ?? -1);
    const on = Number.isInteger(pos) && pos >= 0 && pos < d.T;
    this.highlight.textContent = on ? `highlighted token: ${d.tokens[pos] ?? ""} [${pos}]` : "";
    this.highlight.setAttribute("data-pos", on ? String(pos) : "");
    for (const t of Array.from(this.el.querySelectorAll(".nba-tok"))) {
      t.classList.toggle("nba-mark", on && (t as HTMLElement).dataset.pos === String(pos));
    }
  }

  // probability of query i → key j (token positions) in a fetched matrix
  private static at(x: HeadData, i: number, j: number): number {
    return x.p[Math.floor((i - x.start) / x.stride) * x.n + Math.floor((j - x.start) / x.stride)];
  }

  private matrixView(x: HeadData, a: number, b: number, status: HTMLElement): HTMLElement {
    const { d } = this;
    const st = x.stride;
    const n = Math.ceil((b - a) / st); // pixels per side
    const sub = new Uint8Array(n * n);
    for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) sub[i * n + j] = HeadDetail.at(x, a + i * st, a + j * st);
    // Colours span the window's own range (long inputs spread attention thinly: 1/T is dark on a 0–1 scale).
    let vmax = 1;
    for (let i = 0; i < sub.length; i++) if (sub[i] > vmax) vmax = sub[i];
    const shown = vmax >= 255 ? sub : sub.map((v) => Math.round((v * 255) / vmax));
    const canvas = h("canvas", { class: "nba-matrix", attrs: { width: n, height: n } });
    const g = canvas.getContext("2d");
    if (g) paintU8(shown, n, n, this.cmap(), g);
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
      const gen = (t: number) => (d.generated[t] ? " (generated)" : "");
      status.textContent = st > 1
        ? `queries ${qi}–${Math.min(b, qi + st) - 1} → keys ${kj}–${Math.min(b, kj + st) - 1}: mean ${fmtPct(decodeP(sub[i * n + j]))}`
        : `${d.tokens[qi]} [${qi}]${gen(qi)} → ${d.tokens[kj]} [${kj}]${gen(kj)}: ${fmtPct(decodeP(sub[i * n + j]))}`;
    });
    const scale = vmax >= 255 ? "" : `, up to ${fmtPct(decodeP(vmax))}`;
    const pooled = st > 1 ? ` · ${st}×${st} tokens per pixel (mean); narrow the range for exact values` : "";
    return h("div", { class: "nba-matrix-box" }, [h("div", { class: "nba-note nba-pooled", text: `rows: queries · columns: keys (colour: √p${scale})${pooled}` }), canvas]);
  }

  private lineView(heads: HeadData[], a: number, b: number, status: HTMLElement): HTMLElement {
    const { d } = this;
    const at = HeadDetail.at;
    const n = b - a;
    if (n > LINE_MAX || heads.some((x) => x.stride > 1)) return h("div", { class: "nba-note", text: `line view: narrow the range to ≤ ${LINE_MAX} tokens` });
    const rowH = 16;
    const width = 160;
    const canvas = h("canvas", { attrs: { width, height: n * rowH }, style: { width: `${width}px`, height: `${n * rowH}px` } });
    const ctx = canvas.getContext("2d");
    const left: HTMLElement[] = [];
    const right: HTMLElement[] = [];
    const draw = (focus: { side: "q" | "k"; i: number } | null) => {
      if (!ctx) return;
      ctx.clearRect(0, 0, width, n * rowH);
      heads.forEach((x, hi) => {
        ctx.strokeStyle = HEAD_COLORS[hi % HEAD_COLORS.length];
        for (let i = 0; i < n; i++) {
          if (focus && focus.side === "q" && focus.i !== i) continue;
          let rowMax = 1e-12;
          for (let j = 0; j < n; j++) rowMax = Math.max(rowMax, decodeP(at(x, a + i, a + j)));
          for (let j = 0; j < n; j++) {
            if (focus && focus.side === "k" && focus.i !== j) continue;
            const p = decodeP(at(x, a + i, a + j)) / rowMax;
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
        const x = heads[0];
        const parts: string[] = [];
        for (let j = 0; j < n; j++) {
          const p = decodeP(side === "q" ? at(x, a + i, a + j) : at(x, a + j, a + i));
          if (p >= 0.05) parts.push(`${d.tokens[a + j]} ${fmtPct(p)}`);
        }
        status.textContent = `${d.tokens[a + i]} ${side === "q" ? "attends to" : "is attended by"}: ${parts.join("  ")}`;
      }
    };
    for (let i = 0; i < n; i++) {
      const t = d.tokens[a + i] ?? "";
      const tip = `${d.rawTokens[a + i] ?? t} [${a + i}]${d.generated[a + i] ? " (generated)" : ""}`;
      const gen = d.generated[a + i] ? "nba-gen" : "";
      left.push(h("div", { class: ["nba-tok", "nba-q", gen], text: t, title: tip, attrs: { "data-pos": a + i }, on: { mouseenter: () => hover("q", i, true), mouseleave: () => hover("q", i, false) } }));
      right.push(h("div", { class: ["nba-tok", "nba-k", gen], text: t, title: tip, attrs: { "data-pos": a + i }, on: { mouseenter: () => hover("k", i, true), mouseleave: () => hover("k", i, false) } }));
    }
    draw(null);
    return h("div", {}, [
      h("div", { class: "nba-note", text: "queries → keys · opacity relative to each query's strongest link shown" }),
      h("div", { class: "nba-lines" }, [h("div", { class: "nba-left" }, left), canvas, h("div", { class: "nba-right" }, right)]),
    ]);
  }
}
