// Runs side by side (nbdebug/widgets/compare.py, CompareWidget): the loss of two or more runs
// overlaid by step, the first step where each leaves the first run marked, and any row's series
// (chosen in two selects: the kernel answers by setting the `series` trait). Labels and row names
// are untrusted text: textContent only. Charts fill the width (lib/chart.ts): nothing is clipped in a
// narrow notebook; every text colour keeps WCAG AA contrast.
import { Chart, chartCss, type ChartMark, type ChartSeries } from "./lib/chart";
import { h, replaceChildren, styleElement } from "./lib/dom";
import { decode, type WireArray } from "./lib/ndarray";
import type { AnyModel } from "./lib/rpc";
import { withCode } from "./thermometer/cards";
import { Listeners } from "./lib/request";

/** A run's divergence from the first run, as the kernel sends it (None: it never diverged). */
export interface Divergence {
  run: number;
  step: number;
  a: number | null;
  b: number | null;
  scale: number;
  rtol: number;
}

const CSS = `
.nbdebug-compare {
  --nbd-fg: var(--jp-ui-font-color1, #222);
  --nbd-fg2: color-mix(in srgb, var(--nbd-fg) 80%, transparent);
  --nbd-border: var(--jp-border-color2, rgba(127,127,127,0.3));
  --nbd-bg2: var(--jp-layout-color2, rgba(127,127,127,0.08));
  color: var(--nbd-fg); font-family: var(--jp-ui-font-family, system-ui, sans-serif); font-size: var(--jp-ui-font-size1, 13px);
  line-height: 1.35; max-width: 100%; box-sizing: border-box;
}
.nbdebug-compare * { box-sizing: border-box; }
.nbdebug-compare .nbd-cmp-summary { font-weight: 700; font-size: 1.08em; margin: 2px 0 6px; overflow-wrap: anywhere; }
.nbdebug-compare code { font-family: var(--jp-code-font-family, ui-monospace, Menlo, Consolas, monospace); background: var(--nbd-bg2);
  border: 1px solid var(--nbd-border); border-radius: 3px; padding: 0 3px; }
.nbdebug-compare .nbd-cmp-legend { display: flex; flex-wrap: wrap; gap: 4px 14px; margin: 2px 0 4px; }
.nbdebug-compare .nbd-cmp-legend-item { display: inline-flex; gap: 5px; align-items: center; overflow-wrap: anywhere; }
.nbdebug-compare .nbd-cmp-swatch { width: 14px; height: 4px; border-radius: 2px; display: inline-block; flex: none; }
.nbdebug-compare .nbd-cmp-title { font-weight: 600; margin: 8px 0 2px; }
.nbdebug-compare .nbd-cmp-diverge { color: var(--nbd-fg2); overflow-wrap: anywhere; margin: 2px 0; }
.nbdebug-compare .nbd-cmp-controls { display: flex; flex-wrap: wrap; gap: 4px 12px; align-items: center; margin: 8px 0 2px; }
.nbdebug-compare .nbd-cmp-controls label { display: inline-flex; gap: 4px; align-items: center; }
.nbdebug-compare .nbd-cmp-controls select { max-width: 100%; min-width: 0; }
.nbdebug-compare details > summary { cursor: pointer; color: var(--nbd-fg2); }
.nbdebug-compare .nbd-cmp-notes { margin: 2px 0; padding-left: 1.2em; color: var(--nbd-fg2); overflow-wrap: anywhere; }
.nbdebug-compare .nbd-spark-line { fill: none; stroke-width: 1.5; }
.nbdebug-compare .nbd-spark-band { fill: none; stroke-opacity: 0.3; }
.nbdebug-compare .nbd-spark-cursor { stroke: var(--nbd-fg); stroke-opacity: 0.5; }
.nbdebug-compare .nbd-error { color: #b71c1c; white-space: pre-wrap; }
${chartCss(".nbdebug-compare")}
`;

/** Line colours of healthy runs, in order (mirrors PALETTE in nbdebug/widgets/compare.py; the kernel's
 * `colours` trait gives each run its own, red only for a run that went wrong). */
export const PALETTE = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

/** Each run's line colour: the kernel's `colours`, else the palette in order. */
export function runColours(colours: unknown, n: number): string[] {
  const c = Array.isArray(colours) ? colours.map(String) : [];
  return Array.from({ length: n }, (_, k) => c[k] ?? PALETTE[k % PALETTE.length]);
}

/** Row `k` of a float32 [runs, S] wire array (all NaN when absent). */
export function runRow(wire: WireArray | null | undefined, k: number, n: number): Float32Array {
  if (!wire || !wire.view) return new Float32Array(n).fill(NaN);
  const a = decode(wire);
  const s = a.shape[1] ?? 0;
  return Float32Array.from(a.data.subarray(k * s, (k + 1) * s) as Float32Array);
}

function marks(divs: (Divergence | null)[], labels: string[]): ChartMark[] {
  return (Array.isArray(divs) ? divs : []).filter((d): d is Divergence => !!d).map((d) => ({
    step: d.step,
    cls: "nbd-mark-diverge",
    title: `${labels[0] ?? "run 1"} and ${labels[d.run] ?? `run ${d.run + 1}`} part at step ${d.step}`,
  }));
}

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const summary = h("div", { class: "nbd-cmp-summary nbd-headline" });
  const runCss = styleElement("");
  const lossTitle = h("div", { class: "nbd-cmp-title nbd-cmp-loss-title", text: "loss" });
  const legend = h("div", { class: "nbd-cmp-legend" });
  const lossChart = new Chart({ name: "loss", height: 110 });
  const lossDiv = h("div", { class: "nbd-cmp-diverge nbd-cmp-loss-diverge" });
  const rowSel = h("select", { class: "nbd-cmp-row", attrs: { "aria-label": "row" } });
  const fieldSel = h("select", { class: "nbd-cmp-field", attrs: { "aria-label": "statistic" } });
  const seriesTitle = h("div", { class: "nbd-cmp-title nbd-cmp-series-title" });
  const seriesChart = new Chart({ name: "value", height: 90 });
  const seriesDiv = h("div", { class: "nbd-cmp-diverge nbd-cmp-series-diverge" });
  const seriesBox = h("div", { class: "nbd-cmp-series" }, [seriesTitle, seriesChart.el, seriesDiv]);
  const notes = h("ul", { class: "nbd-cmp-notes" });
  const errorBox = h("div", { class: "nbd-error" });
  const root = h("div", { class: "nbdebug-compare" }, [
    styleElement(CSS),
    runCss,
    summary,
    legend,
    lossTitle,
    lossChart.el,
    lossDiv,
    h("div", { class: "nbd-cmp-controls" }, [h("label", {}, ["row ", rowSel]), h("label", {}, ["statistic ", fieldSel])]),
    seriesBox,
    h("details", { class: "nbd-cmp-notes-box" }, [h("summary", { text: "notes" }), notes]),
    errorBox,
  ]);
  el.appendChild(root);

  const draw = () => {
    try {
      const labels: string[] = (model.get("labels") ?? []).map(String);
      const stepsWire = model.get("steps");
      const steps = stepsWire && stepsWire.view ? Array.from(decode(stepsWire).data) : [];
      const div = model.get("divergence") ?? {};
      replaceChildren(summary, withCode(String(model.get("headline") || model.get("summary") || "")));
      const colours = runColours(model.get("colours"), labels.length);
      runCss.textContent = colours.map((c, k) => `.nbdebug-compare .nbd-cmp-run-${k} { stroke: ${c}; }`).join("\n");
      replaceChildren(legend, labels.map((l, k) => h("span", { class: "nbd-cmp-legend-item", data: { run: k, colour: colours[k] } }, [
        h("span", { class: "nbd-cmp-swatch", style: { background: colours[k] } }),
        l,
      ])));
      const series = (wire: WireArray | null | undefined): ChartSeries[] =>
        labels.map((l, k) => ({ label: l, steps, y: runRow(wire, k, steps.length), cls: `nbd-cmp-run-${k}` }));
      lossChart.log = Boolean(model.get("loss_log"));
      lossTitle.textContent = lossChart.log ? "loss (log scale: it spans more than 10×)" : "loss";
      lossChart.update(series(model.get("loss")), { marks: marks(div.loss ?? [], labels) });
      replaceChildren(lossDiv, withCode(String(div.loss_text ?? "")));
      const row = String(model.get("row") ?? "");
      const field = String(model.get("field") ?? "mean");
      const rows: string[] = (model.get("rows") ?? []).map(String);
      replaceChildren(rowSel, [h("option", { text: "(none)", attrs: { value: "", selected: !row } }),
        ...rows.map((r) => h("option", { text: r, attrs: { value: r, selected: r === row } }))]);
      rowSel.value = row;
      replaceChildren(fieldSel, ((model.get("fields") ?? []) as string[]).map((f) => h("option", { text: f, attrs: { value: f, selected: f === field } })));
      fieldSel.value = field;
      const wire = model.get("series");
      seriesBox.style.display = row && wire && wire.view ? "" : "none";
      if (row && wire && wire.view) {
        replaceChildren(seriesTitle, [`${field} of `, h("code", { text: row })]);
        seriesChart.log = Boolean(div.series_log);
        seriesChart.update(series(wire), { marks: marks(div.series ?? [], labels) });
        replaceChildren(seriesDiv, withCode(String(div.series_text ?? "")));
      }
      replaceChildren(notes, ((model.get("notes") ?? []) as string[]).map((n) => h("li", {}, withCode(String(n)))));
      errorBox.textContent = "";
    } catch (err) {
      const msg = `nbdebug compare: ${err instanceof Error ? err.message : String(err)}`;
      errorBox.textContent = msg;
      model.set("js_error", msg);
      model.save_changes();
    }
    root.dataset.ready = "1";
  };

  const onRow = () => {
    model.set("row", rowSel.value);
    model.save_changes();
  };
  const onField = () => {
    model.set("field", fieldSel.value);
    model.save_changes();
  };
  rowSel.addEventListener("change", onRow);
  fieldSel.addEventListener("change", onField);
  const events = "change:labels change:steps change:loss change:rows change:fields change:row change:field change:series change:divergence change:summary change:notes change:headline change:colours change:loss_log";
  const listeners = new Listeners(); // every model listener, removed by one dispose()
  listeners.model(model, events, draw);
  draw();
  return () => {
    listeners.dispose();
    rowSel.removeEventListener("change", onRow);
    fieldSel.removeEventListener("change", onField);
    lossChart.destroy();
    seriesChart.destroy();
    root.remove();
  };
}

export default { render };
