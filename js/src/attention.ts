// Attention-head viewer: the finding first (heads unusual for this model, nbdebug/inspectors/
// attention_findings.py), then a layers × heads grid of thumbnails (uint8, downsampled in the
// kernel) with per-head metrics; hovering a thumbnail labels its axes with tokens; clicking a head
// fetches its T×T matrix (rpc "head") for a heatmap and a token-to-token line view. Tokens produced
// by generate() (`generated`) are marked. Shift/ctrl-click overlays several heads in the line view.
// Python side: nbdebug/widgets/attention.py. Tokens are untrusted model text: textContent only.
//
// Parts: attention/data.ts (traits read once), header.ts (finding, legend, details), grid.ts (the
// thumbnails, "outliers only"), peek.ts (the hover copy with token axes), detail.ts (the selected
// heads, and the per-head action buttons: add a `HeadAction` in `actionsFor` below), ablate.ts (the
// selected heads ablated in the kernel: Δ metric, top-5, lens diff).
import { codeCss, h, styleElement } from "./lib/dom";
import type { AnyModel } from "./lib/rpc";
import { AblatePanel, ABLATE_CSS } from "./attention/ablate";
import { readData } from "./attention/data";
import { HeadDetail, HEAD_COLORS, type HeadAction } from "./attention/detail";
import { HeadGrid } from "./attention/grid";
import { header } from "./attention/header";
import { Peek } from "./attention/peek";
import { CSS } from "./attention/style";
import { Listeners } from "./lib/request";

/** Per-head actions shown in the detail panel of the selected head: ablate the selected heads. */
function actionsFor(ablate: AblatePanel): HeadAction[] {
  if (!ablate.enabled) return [];
  const tip = "run the prompt again with the selected heads' outputs set to ";
  return [
    { label: "ablate (zero)", title: tip + "0", run: () => ablate.run("zero") },
    { label: "ablate (mean)", title: tip + "their mean over the positions", run: () => ablate.run("mean") },
  ];
}

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const d = readData(model);
  let cmap = "viridis";
  const root = h("div", { class: "nbdebug-attention" });
  const head = header(model, d);
  const peek = new Peek(d, root);
  const selected = (): [number, number][] =>
    ((model.get("selected") || []) as [number, number][]).filter((p) => Array.isArray(p) && p.length === 2);
  const pick = (l: number, hd: number, add: boolean): void => {
    let sel = selected();
    if (add) {
      const has = sel.some(([a, b]) => a === l && b === hd);
      sel = has ? sel.filter(([a, b]) => !(a === l && b === hd)) : [...sel, [l, hd] as [number, number]].slice(-HEAD_COLORS.length);
    } else sel = [[l, hd]];
    model.set("selected", sel);
    model.save_changes();
  };
  const grid = new HeadGrid(d, peek, pick);
  const ablate = new AblatePanel(model, selected);
  const detail = new HeadDetail(model, d, () => cmap, actionsFor(ablate));
  root.append(styleElement(CSS + ABLATE_CSS + codeCss(".nbdebug-attention")), ...head.elements, detail.highlight, grid.el, detail.el, ablate.el, peek.el);
  el.appendChild(root);

  const only = () => head.outliersOnly.checked && d.outliers.size > 0;
  const drawGrid = () => grid.draw(cmap, only(), head.metricSel.value, selected());

  head.metricSel.addEventListener("change", () => {
    model.set("metric", head.metricSel.value);
    model.save_changes();
    grid.showValues(head.metricSel.value);
  });
  head.cmapSel.addEventListener("change", () => {
    cmap = head.cmapSel.value;
    drawGrid();
    void detail.draw();
  });
  head.outliersOnly.addEventListener("change", () => {
    model.set("outliers_only", head.outliersOnly.checked);
    model.save_changes();
    drawGrid();
  });
  const onSel = () => {
    grid.markSelected(selected());
    ablate.showSelection();
    void detail.draw();
  };
  const onMetric = () => {
    head.metricSel.value = model.get("metric");
    grid.showValues(head.metricSel.value);
  };
  const onOnly = () => {
    head.outliersOnly.checked = d.outliers.size > 0 && Boolean(model.get("outliers_only"));
    drawGrid();
  };
  const onRange = () => void detail.draw();
  const onToken = () => detail.markToken();
  const listeners = new Listeners(); // every model listener, removed by one dispose()
  listeners.model(model, "change:selected", onSel);
  listeners.model(model, "change:metric", onMetric);
  listeners.model(model, "change:token_range", onRange);
  listeners.model(model, "change:highlight_token", onToken);
  listeners.model(model, "change:outliers_only", onOnly);

  drawGrid();
  detail.markToken();
  void detail.draw();
  root.setAttribute("data-ready", "1");
  return () => {
    detail.latest.dispose();
    ablate.latest.dispose();
    listeners.dispose();
  };
}

export default { render };
