// Token attribution, "why A, not B?" (nbdebug/widgets/attribution.py, AttributionWidget): the kernel's
// headline first (the finding, or why the scores cannot be read: no better than random, not converged,
// with the next method offered as a button), the input tokens coloured by their score on the patching
// view's scale (patching/colour.ts: blue pushes toward the answer, red against it, in both views; text
// black or white by contrast.ts textOn, AA), a method switch whose
// answer the kernel computes on demand (rpc "attribution"), the deletion curve against the mean of
// random orders, and integrated gradients' completeness gap with a warning and "more steps" / "keep
// the first token" buttons when it misses by more than 5 %. After generate(), the generated tokens are
// listed: clicking one asks the kernel for that token as the answer over its prefix (rpc param "pick";
// -1: the --answer over the prompt). Tokens are model text: textContent only.
import { codeCss, fmt, h, replaceChildren, styleElement, withCode } from "./lib/dom";
import { rpc, type AnyModel } from "./lib/rpc";
import { cssOf, divergingBar, textFor } from "./patching/colour";
import { select } from "./lib/select";
import { Listeners } from "./lib/request";

/** One attribution as the kernel sends it (Attribution.to_dict). */
export interface AttrData {
  method: string;
  label: string;
  tokens: string[];
  scores: number[];
  metric: number;
  metric_baseline: number | null;
  delta: number | null;
  converged: boolean | null;
  relative_delta: number | null;
  steps: number | null;
  baseline: string;
  faithfulness: { deletion?: number; random?: number };
  curves: { deletion?: number[]; random?: number[] };
  notes: string[];
  /** The kernel's headline of this attribution and the method it offers (nbdebug/inspectors/token_headlines.py). */
  headline?: string;
  advice?: { method: string; fix_first: boolean; text: string } | null;
}

export const METHOD_LABELS: Record<string, string> = {
  grad_x_input: "gradient × input",
  integrated_gradients: "integrated gradients",
  occlusion: "occlusion",
};

const CSS = `
.nbdebug-attribution {
  --nbd-fg: var(--jp-ui-font-color1, #222);
  --nbd-fg2: color-mix(in srgb, var(--nbd-fg) 80%, transparent);
  --nbd-border: var(--jp-border-color2, rgba(127,127,127,0.3));
  color: var(--nbd-fg); font-family: var(--jp-ui-font-family, system-ui, sans-serif); font-size: var(--jp-ui-font-size1, 13px);
  line-height: 1.35; max-width: 100%; box-sizing: border-box;
}
.nbdebug-attribution * { box-sizing: border-box; }
.nbdebug-attribution .nbd-attr-head { font-weight: 700; margin: 2px 0 2px; overflow-wrap: anywhere; }
.nbdebug-attribution .nbd-attr-what { color: var(--nbd-fg2); margin: 0 0 6px; overflow-wrap: anywhere; }
.nbdebug-attribution .nbd-attr-advice { margin: 4px 0; }
.nbdebug-attribution .nbp-colourbar { display: flex; gap: 6px; align-items: center; }
.nbdebug-attribution .nbp-bar { width: 160px; height: 10px; display: block; border: 1px solid #999; }
.nbdebug-attribution .nbp-ticks { display: flex; justify-content: space-between; width: 162px; font-size: 10px; }
.nbdebug-attribution .nbd-attr-chart svg { display: block; width: 100%; max-width: 420px; height: 90px; border: 1px solid var(--nbd-border); }
.nbdebug-attribution .nbd-attr-axis { display: flex; justify-content: space-between; max-width: 420px; font-size: 11px; color: var(--nbd-fg2); }
.nbdebug-attribution .nbd-attr-controls { display: flex; flex-wrap: wrap; gap: 4px 12px; align-items: center; margin: 2px 0 6px; }
.nbdebug-attribution .nbd-attr-tokens { display: flex; flex-wrap: wrap; gap: 3px; margin: 6px 0; font-family: var(--jp-code-font-family, ui-monospace, Menlo, Consolas, monospace); }
.nbdebug-attribution .nbd-attr-tok { display: inline-flex; flex-direction: column; align-items: center; padding: 2px 4px; border-radius: 3px;
  border: 1px solid var(--nbd-border); white-space: pre; }
.nbdebug-attribution .nbd-attr-score { font-size: 0.8em; }
.nbdebug-attribution .nbd-attr-warn { margin: 6px 0; padding: 4px 6px; border-left: 4px solid #b35900; background: rgba(179,89,0,0.08); }
.nbdebug-attribution .nbd-attr-ok { margin: 6px 0; color: var(--nbd-fg2); }
.nbdebug-attribution .nbd-attr-warn button { margin: 2px 6px 0 0; }
.nbdebug-attribution .nbd-attr-title { font-weight: 600; margin: 8px 0 2px; }
.nbdebug-attribution .nbd-attr-auc { color: var(--nbd-fg2); }
.nbdebug-attribution .nbd-attr-status { color: var(--nbd-fg2); min-height: 1.2em; }
.nbdebug-attribution .nbd-attr-notes { margin: 2px 0; padding-left: 1.2em; color: var(--nbd-fg2); overflow-wrap: anywhere; }
.nbdebug-attribution .nbd-attr-line { fill: none; stroke-width: 1.5; vector-effect: non-scaling-stroke; }
.nbdebug-attribution .nbd-attr-deletion { stroke: #21669c; }
.nbdebug-attribution .nbd-attr-random { stroke: #7f7f7f; stroke-dasharray: 4 3; }
.nbdebug-attribution .nbd-attr-zero { stroke: #bbb; stroke-width: 1; vector-effect: non-scaling-stroke; }
.nbdebug-attribution .nbd-attr-gen-row { display: flex; flex-wrap: wrap; gap: 3px; align-items: center; margin: 4px 0;
  font-family: var(--jp-code-font-family, ui-monospace, Menlo, Consolas, monospace); }
.nbdebug-attribution .nbd-attr-gen { padding: 1px 4px; border: 1px solid var(--nbd-border); border-radius: 3px; background: transparent;
  color: inherit; font: inherit; white-space: pre; cursor: pointer; }
.nbdebug-attribution .nbd-attr-gen.nbd-attr-picked { border: 2px solid var(--nbd-fg); font-weight: 700; }
.nbdebug-attribution .nbd-attr-gen-label { font-family: var(--jp-ui-font-family, system-ui, sans-serif); color: var(--nbd-fg2); margin-right: 4px; }
.nbdebug-attribution .nbd-error { color: #b71c1c; white-space: pre-wrap; }
`;

/** Position on the shared "toward the answer" scale (−1 … +1, patching/colour.ts) of `score` with the
 * largest |score| `peak`: +1 the strongest push toward the answer. */
export function scoreT(score: number, peak: number): number {
  if (!(peak > 0) || !Number.isFinite(score)) return 0;
  return Math.max(-1, Math.min(1, score / peak));
}

/** The decimals every score of one attribution is written with: fixed across the tokens, enough for
 * the largest |score| `peak` to keep four significant digits (at least two). */
export function scoreDecimals(peak: number): number {
  if (!(peak > 0) || !Number.isFinite(peak)) return 2;
  return Math.min(12, Math.max(2, 3 - Math.floor(Math.log10(peak))));
}

const NS = "http://www.w3.org/2000/svg";

/** The deletion chart: the normalised metric after k tokens replaced (k = 0 … T), most attributed first
 * against the mean of random orders, its axes written out (no log scale: the curve is signed). */
export function deletionChart(del: number[], rnd: number[]): HTMLElement {
  const all = [...del, ...rnd, 0, 1].filter(Number.isFinite);
  const lo = Math.min(...all), hi = Math.max(...all);
  const n = Math.max(del.length, rnd.length) - 1;
  const W = 300, H = 90;
  const y = (v: number) => (H - 4 - ((v - lo) / (hi - lo || 1)) * (H - 8)).toFixed(1);
  const x = (k: number) => (2 + (k / Math.max(1, n)) * (W - 4)).toFixed(1);
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "deletion curve against random orders");
  const line = (ys: number[], cls: string) => {
    const p = document.createElementNS(NS, "polyline");
    p.setAttribute("points", ys.map((v, k) => (Number.isFinite(v) ? `${x(k)},${y(v)}` : "")).filter(Boolean).join(" "));
    p.setAttribute("class", cls);
    svg.appendChild(p);
  };
  const zero = document.createElementNS(NS, "line");
  Object.entries({ x1: 0, x2: W, y1: y(0), y2: y(0), class: "nbd-attr-zero" }).forEach(([k, v]) => zero.setAttribute(k, String(v)));
  svg.appendChild(zero);
  if (rnd.length) line(rnd, "nbd-attr-line nbd-attr-random");
  if (del.length) line(del, "nbd-attr-line nbd-attr-deletion");
  return h("div", { class: "nbd-attr-chart" }, [
    h("div", { class: "nbd-attr-axis" }, [h("span", { text: `y: share of m(x) − m(baseline) left, ${hi.toFixed(2)} at the top, ${lo.toFixed(2)} at the bottom (1 = nothing replaced)` })]),
    svg,
    h("div", { class: "nbd-attr-axis" }, [h("span", { text: "x: 0 tokens replaced" }), h("span", { text: `${n} (all)` })]),
  ]);
}

/** The completeness sentence of integrated gradients ("" for other methods). */
export function deltaText(d: AttrData): string {
  if (d.delta === null || d.delta === undefined) return "";
  const rel = d.relative_delta ?? NaN;
  const pct = Number.isFinite(rel) ? `${(rel * 100).toFixed(rel < 0.1 ? 1 : 0)} %` : "∞";
  const base = `completeness: Σ scores − (m(x) − m(baseline)) = ${fmt(d.delta)} (${pct} of m(x) − m(baseline), ${d.steps} steps, baseline ${d.baseline})`;
  return d.converged ? base : `${base}: NOT converged (> 5 %), the scores do not add up to the metric's change`;
}

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const root = h("div", { class: "nbdebug-attribution" });
  root.appendChild(styleElement(CSS + codeCss(".nbdebug-attribution")));
  const head = h("div", { class: "nbd-attr-head nbd-headline" });
  const what = h("div", { class: "nbd-attr-what" });
  const advice = h("div", { class: "nbd-attr-advice" });
  const chartBox = h("div", {});
  const status = h("div", { class: "nbd-attr-status" });
  const tokens = h("div", { class: "nbd-attr-tokens" });
  const legend = h("div", { class: "nbd-attr-legend" });
  const completeness = h("div", {});
  const auc = h("div", { class: "nbd-attr-auc" });
  const notes = h("ul", { class: "nbd-attr-notes" });
  const errorBox = h("div", { class: "nbd-error" });
  let data: AttrData = model.get("data");
  let busy = false;

  const genRow = h("div", { class: "nbd-attr-gen-row" });
  let pick = Number(model.get("pick") ?? -1);

  const ask = (params: { method: string; steps?: number; fix_first?: boolean; pick?: number }) => {
    if (busy) return;
    busy = true;
    status.textContent = `computing ${METHOD_LABELS[params.method] ?? params.method} in the kernel…`;
    const gen = (model.get("generated") ?? []).length > 0; // pick is sent only after a generation
    const full: { method: string; steps: number; fix_first: boolean; pick?: number } = {
      steps: Number(model.get("steps") ?? 64), fix_first: Boolean(model.get("fix_first")), ...(gen ? { pick } : {}), ...params };
    rpc<AttrData>(model, "attribution", full, 600_000)
      .then((answer) => {
        data = answer.result;
        pick = full.pick ?? -1;
        status.textContent = "";
        draw();
      })
      .catch((err) => {
        status.textContent = "";
        errorBox.textContent = `nbdebug attribution: ${err instanceof Error ? err.message : String(err)}`;
      })
      .finally(() => {
        busy = false;
      });
  };
  const methods: string[] = (model.get("methods") ?? Object.keys(METHOD_LABELS)).map(String);
  const methodSel = select(methods.map((m) => [m, METHOD_LABELS[m] ?? m]), data?.method ?? methods[0], "nbd-attr-method",
    (m) => ask({ method: m }));

  root.append(head, what, advice, h("div", { class: "nbd-attr-controls" }, [h("label", {}, ["method ", methodSel])]), genRow, status, tokens, legend,
    completeness, h("div", { class: "nbd-attr-title", text: "deletion: m while tokens are replaced by the baseline, most attributed first (blue) vs the mean of random orders (grey, dashed)" }),
    chartBox, auc, notes, errorBox);
  el.appendChild(root);

  /** The generated tokens as buttons (none without a generation); the picked one outlined. */
  function drawGenerated(): void {
    const gen: string[] = (model.get("generated") ?? []).map(String);
    if (!gen.length) {
      replaceChildren(genRow, []);
      return;
    }
    const chip = (text: string, k: number, title: string) => h("button", {
      class: k === pick ? "nbd-attr-gen nbd-attr-picked" : "nbd-attr-gen", text, data: { index: k }, attrs: { title },
      on: { click: () => ask({ method: data.method, pick: k }) },
    });
    replaceChildren(genRow, [
      h("span", { class: "nbd-attr-gen-label", text: "generated — click a token to explain it (over the tokens before it):" }),
      chip("--answer", -1, "the --answer token over the prompt"),
      ...gen.map((t, k) => chip(t, k, `explain generated token ${k + 1} over the prompt and the ${k} tokens generated before it`)),
    ]);
  }

  function draw(): void {
    try {
      const d = data;
      methodSel.value = d.method;
      drawGenerated();
      replaceChildren(head, withCode(String(d.headline ?? model.get("headline") ?? "")));
      what.textContent = `why? ${d.label} = ${d.metric.toFixed(2)} · ${METHOD_LABELS[d.method] ?? d.method}`;
      const offer = d.advice === undefined ? model.get("advice") : d.advice;
      replaceChildren(advice, offer ? [h("button", { class: "nbd-attr-next", text: `try ${offer.text}`, data: { method: offer.method },
        on: { click: () => ask({ method: offer.method, fix_first: offer.fix_first }) } })] : []);
      const peak = Math.max(0, ...d.scores.map((s) => Math.abs(s)).filter(Number.isFinite));
      const dec = scoreDecimals(peak);
      replaceChildren(tokens, d.tokens.map((t, i) => {
        const tt = scoreT(d.scores[i], peak);
        return h("span", { class: "nbd-attr-tok", style: { background: cssOf(tt), color: textFor(tt) }, attrs: { title: `${t}: ${fmt(d.scores[i])}` },
          data: { index: i, t: tt.toFixed(4) } }, [
          h("span", { class: "nbd-attr-text", text: t }),
          h("span", { class: "nbd-attr-score", text: d.scores[i].toFixed(dec) }),
        ]);
      }));
      replaceChildren(legend, [divergingBar(160, "score", "blue: pushes toward the answer, red: against it (the patching view's colours)",
        [(-peak).toFixed(dec), "0", `+${peak.toFixed(dec)}`])]);
      const text = deltaText(d);
      completeness.className = !text ? "" : d.converged ? "nbd-attr-ok" : "nbd-attr-warn";
      const kids: (HTMLElement | string)[] = text ? [h("div", { text })] : [];
      if (text && !d.converged) {
        const steps = (d.steps ?? 64) * 4;
        kids.push(h("button", { class: "nbd-attr-more", text: `more steps (${steps})`, on: { click: () => ask({ method: d.method, steps }) } }));
        if (!d.baseline.includes("first token fixed")) {
          kids.push(h("button", { class: "nbd-attr-fix", text: "keep the first token in the baseline",
            on: { click: () => ask({ method: d.method, steps: d.steps ?? undefined, fix_first: true }) } }));
        }
      }
      replaceChildren(completeness, kids);
      const del = d.curves?.deletion ?? [];
      const rnd = d.curves?.random ?? [];
      replaceChildren(chartBox, del.length ? [deletionChart(del, rnd)] : []);
      const f = d.faithfulness ?? {};
      auc.textContent = f.deletion === undefined ? "" : `area: deletion ${f.deletion.toFixed(3)} (lower is more faithful) vs random ${(f.random ?? NaN).toFixed(3)}`;
      replaceChildren(notes, (d.notes ?? []).map((n) => h("li", { text: n })));
      errorBox.textContent = "";
    } catch (err) {
      const msg = `nbdebug attribution: ${err instanceof Error ? err.message : String(err)}`;
      errorBox.textContent = msg;
      model.set("js_error", msg);
      model.save_changes();
    }
    root.dataset.ready = "1";
  }

  const onData = () => {
    data = model.get("data");
    draw();
  };
  const listeners = new Listeners(); // every model listener, removed by one dispose()
  listeners.model(model, "change:data", onData);
  listeners.model(model, "change:headline", draw);
  draw();
  return () => {
    listeners.dispose();
    root.remove();
  };
}

export default { render };
