// Grad-CAM overlay: the input image and the CAM of one target class blended in the browser, the
// CAM methods side by side (small multiples; a click shows one large), the faithfulness ranking and
// curves, the sanity flags. The image and the CAMs of every target class and method of a
// sample/layer arrive together (one rpc, uint8 buffers) from GradCamWidget
// (nbdebug/widgets/gradcam.py, `@rpc("view")`), so switching class, method, colormap or opacity
// redraws locally; the curves come once (`@rpc("curves")`, float32). The opacity slider sends
// nothing while it moves; its final value is synced to the `opacity` trait when released.
import { colourBar } from "./lib/colorbar";
import { COLORMAPS } from "./lib/colormap";
import { codeCss, fmt, fmtPct, h, replaceChildren, styleElement } from "./lib/dom";
import { rpc, type AnyModel } from "./lib/rpc";
import { Latest, Listeners } from "./lib/request";
import { sampleSelect, select } from "./lib/select";
import { faithPanel, sanityTable, type CamRank, type Faithfulness, type SanityRow } from "./gradcam/checks";
import { classLabel, headlineLine } from "./gradcam/headline";
import { multiples, type Multiples } from "./gradcam/methods";
import { paint } from "./gradcam/overlay";

export { blend } from "./gradcam/overlay";

interface ClassInfo {
  index: number;
  name: string;
  score: number;
  prob: number;
}

interface ViewInfo {
  layer: string;
  sample: number;
  zero_grad: boolean;
  note: string;
  grid: string;
  low_hw: number[];
  method?: string;
  methods?: string[];
}

interface View {
  info: ViewInfo;
  cams: Uint8Array; // K×H×W of info.method
  peak: Float32Array;
  all: Uint8Array | null; // M×K×H×W, every method (several methods only)
  allPeak: Float32Array | null; // M×K
  methods: string[];
  image: Uint8Array | null; // H×W×3
  height: number;
  width: number;
}

const CSS = `
.nbdebug-gradcam { font: 12px/1.4 var(--jp-ui-font-family, system-ui, sans-serif); color: var(--jp-ui-font-color1, #222); }
.nbdebug-gradcam .nbd-headline { font-weight: 700; margin: 2px 0 6px; overflow-wrap: anywhere; }
.nbdebug-gradcam .nbd-controls { display: flex; flex-wrap: wrap; gap: 10px; align-items: center; margin-bottom: 6px; }
.nbdebug-gradcam select, .nbdebug-gradcam input { font: inherit; }
.nbdebug-gradcam select.nbd-layer, .nbdebug-gradcam select.nbd-class { max-width: 320px; }
.nbdebug-gradcam .nbd-stage { display: flex; gap: 8px; align-items: flex-start; }
.nbdebug-gradcam canvas.nbd-overlay, .nbdebug-gradcam canvas.nbd-thumb { image-rendering: auto; max-width: 100%; border: 1px solid var(--jp-border-color1, #ccc); }
.nbdebug-gradcam .nbd-bar { display: flex; gap: 4px; }
.nbdebug-gradcam .nbd-ticks { display: flex; flex-direction: column; justify-content: space-between; font-size: 10px; }
.nbdebug-gradcam .nbd-info { color: var(--jp-ui-font-color2, #555); margin: 4px 0; }
.nbdebug-gradcam .nbd-notes { margin: 2px 0 6px 18px; padding: 0; color: var(--jp-ui-font-color2, #555); }
.nbdebug-gradcam .nbd-warn { color: #9a5b00; }  /* 5.4:1 on white (#b26a00 was 4.2:1) */
.nbdebug-gradcam table.nbd-rank tr.nbd-failed td { color: #595959; }
.nbdebug-gradcam table.nbd-rank .nbd-fail-tag { font-size: 10px; margin-left: 4px; }
.nbdebug-gradcam table.nbd-rank td.nbd-num { text-align: right; font-variant-numeric: tabular-nums; }
.nbdebug-gradcam .nbd-error { color: #d32f2f; }
.nbdebug-gradcam .nbd-methods { display: flex; flex-wrap: wrap; gap: 6px; margin: 6px 0; }
.nbdebug-gradcam button.nbd-method { display: flex; flex-direction: column; align-items: center; gap: 2px; padding: 3px; font: inherit;
  background: none; border: 2px solid transparent; border-radius: 4px; cursor: pointer; color: inherit; }
.nbdebug-gradcam button.nbd-method.nbd-focus { border-color: var(--jp-brand-color1, #1976d2); }
.nbdebug-gradcam .nbd-flag { color: #9a5b00; font-size: 10px; max-width: 150px; }
.nbdebug-gradcam .nbd-faith, .nbdebug-gradcam .nbd-sanity { margin-top: 8px; }
.nbdebug-gradcam table { border-collapse: collapse; }
.nbdebug-gradcam td, .nbdebug-gradcam th { padding: 1px 6px; text-align: left; }
.nbdebug-gradcam table.nbd-rank tr[data-method] { cursor: pointer; }
.nbdebug-gradcam tr.nbd-focus { background: var(--jp-layout-color2, #eee); }
.nbdebug-gradcam .nbd-swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; }
.nbdebug-gradcam .nbd-charts { display: flex; flex-wrap: wrap; gap: 8px; align-items: flex-end; }
.nbdebug-gradcam figure.nbd-chart { margin: 0; }
.nbdebug-gradcam figcaption, .nbdebug-gradcam .nbd-axis, .nbdebug-gradcam .nbd-caption { font-size: 10px; color: var(--jp-ui-font-color2, #555); }
`;

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const root = h("div", { class: "nbdebug-gradcam" });
  const controls = h("div", { class: "nbd-controls" });
  const canvas = h("canvas", { class: "nbd-overlay", attrs: { width: 1, height: 1 } });
  const bar = h("div", { class: "nbd-barbox" });
  const info = h("div", { class: "nbd-info" });
  const warn = h("div", { class: "nbd-warn" });
  const notes = h("ul", { class: "nbd-notes" });
  const errorBox = h("div", { class: "nbd-error" });
  const faithBox = h("div", { class: "nbd-faith" });
  const sanityBox = h("div", { class: "nbd-sanity-box" });
  const strip = h("div", { class: "nbd-strip" });
  const headline = headlineLine(model);
  root.append(styleElement(CSS + codeCss(".nbdebug-gradcam")), headline.el, controls, errorBox, h("div", { class: "nbd-stage" }, [canvas, bar]), strip, warn, info, faithBox, sanityBox, notes);
  el.appendChild(root);

  let view: View | null = null;
  let alpha = Number(model.get("opacity") ?? 0.5);
  const latest = new Latest();
  let disposed = false;
  let curves: { methods: string[]; data: Float32Array; fractions: Float32Array } | null = null;
  let metrics: string[] = ["deletion", "insertion", "road_morf", "road_lerf"];
  const setTrait = (name: string, value: unknown) => {
    model.set(name, value);
    model.save_changes();
  };
  const classes = (): ClassInfo[] => (model.get("classes") ?? [])[Number(model.get("sample") ?? 0)] ?? [];
  const allMethods = (): string[] => model.get("methods") ?? [String(model.get("method") ?? "gradcam")];
  const sanity = (): SanityRow[] => model.get("sanity") ?? [];
  const faith = (): Faithfulness | null => {
    const f = model.get("faithfulness");
    return f && Array.isArray(f.ranking) && f.ranking.length ? (f as Faithfulness) : null;
  };
  const pick = (m: string) => {
    if (m === String(model.get("method"))) return;
    setTrait("method", m);
    redrawMethod();
  };
  const flags: Record<string, string> = {};
  for (const s of sanity()) if (s.flagged) flags[s.method] = "does not depend on the class decision";
  const strips: Multiples = multiples(allMethods(), flags, pick);
  strip.appendChild(strips.el);

  function buildControls(): void {
    const batch = Number(model.get("batch") ?? 1);
    const sampleSel = sampleSelect(batch, Number(model.get("sample") ?? 0), (v) => {
      setTrait("sample", v);
      buildControls();
      void fetchView();
    });
    const classSel = select(
      classes().map((c, k) => [String(k), `${k + 1}. ${classLabel(c.name, c.index)} (${fmtPct(c.prob)}${classLabel(c.name, c.index) === c.name ? `, #${c.index}` : ""})`]),
      String(model.get("class_rank") ?? 0),
      "nbd-class",
      (v) => {
        setTrait("class_rank", Number(v));
        draw();
      },
    );
    const auto = String(model.get("auto_layer") ?? "");
    const layerSel = select(
      (model.get("layers") ?? []).map((n: string) => [n, n === auto ? `${n} (auto)` : n]),
      String(model.get("layer")),
      "nbd-layer",
      (v) => {
        setTrait("layer", v);
        void fetchView();
      },
    );
    const cmapSel = select(COLORMAPS.map((c) => [c, c]), String(model.get("colormap")), "nbd-colormap", (v) => {
      setTrait("colormap", v);
      draw();
    });
    const slider = h("input", { class: "nbd-opacity", attrs: { type: "range", min: 0, max: 1, step: 0.01 } });
    slider.value = String(alpha);
    const label = h("span", { class: "nbd-opacity-value", text: alpha.toFixed(2) });
    // Local only while moving; the final value goes to Python once, on release.
    slider.addEventListener("input", () => {
      alpha = Number(slider.value);
      label.textContent = alpha.toFixed(2);
      draw();
    });
    slider.addEventListener("change", () => setTrait("opacity", Number(slider.value)));
    const items = [sampleSel, h("label", {}, ["class ", classSel]), h("label", {}, ["layer ", layerSel])];
    const methods = allMethods();
    if (methods.length > 1) {
      items.push(h("label", {}, ["method ", select(methods.map((m) => [m, m]), String(model.get("method")), "nbd-method-select", pick)]));
    }
    replaceChildren(controls, [...items, h("label", {}, ["colormap ", cmapSel]), h("label", {}, ["opacity ", slider, label])]);
    const ns: string[] = model.get("notes") ?? [];
    const image = String(model.get("image_note") ?? "");
    replaceChildren(notes, [...ns, image ? `image: ${image}` : ""].filter(Boolean).map((n) => h("li", { text: n })));
  }

  async function fetchView(): Promise<void> {
    const isLatest = latest.start();
    info.textContent = `computing the CAMs of ${String(model.get("layer"))}…`;
    try {
      const answer = await rpc<ViewInfo>(model, "view", { sample: Number(model.get("sample") ?? 0), layer: String(model.get("layer")),
                                                           method: String(model.get("method")) });
      if (!isLatest()) return;
      const cams = answer.arrays.cams;
      const all = answer.arrays.all_cams;
      view = {
        info: answer.result,
        cams: cams.data as Uint8Array,
        peak: answer.arrays.peak.data as Float32Array,
        all: all ? (all.data as Uint8Array) : null,
        allPeak: answer.arrays.all_peak ? (answer.arrays.all_peak.data as Float32Array) : null,
        methods: answer.result.methods ?? [String(answer.result.method ?? model.get("method"))],
        image: answer.arrays.image ? (answer.arrays.image.data as Uint8Array) : null,
        height: cams.shape[1],
        width: cams.shape[2],
      };
      errorBox.textContent = "";
      draw();
    } catch (err) {
      if (!isLatest()) return;
      const msg = err instanceof Error ? err.message : String(err);
      errorBox.textContent = msg;
      setTrait("js_error", msg);
    } finally {
      if (isLatest()) root.setAttribute("data-ready", "1");
    }
  }

  /** The shown method's CAM of class `k` (K×H×W slice), and its peak. */
  function camOf(v: View, method: string, k: number): [Uint8Array, number] {
    const n = v.height * v.width;
    const K = v.peak.length;
    const mi = v.methods.indexOf(method);
    if (v.all && v.allPeak && mi >= 0) return [v.all.subarray((mi * K + k) * n, (mi * K + k + 1) * n), v.allPeak[mi * K + k]];
    return [v.cams.subarray(k * n, (k + 1) * n), v.peak[k]];
  }

  function draw(): void {
    if (!view) return;
    const v = view;
    const k = Math.min(Number(model.get("class_rank") ?? 0), v.peak.length - 1);
    const method = String(model.get("method") ?? v.methods[0]);
    const cmap = String(model.get("colormap") ?? "inferno");
    const [cam, peak] = camOf(v, method, k);
    paint(canvas, v.image, cam, v.width, v.height, cmap, alpha, 448, 320);
    canvas.setAttribute("data-class-rank", String(k));
    canvas.setAttribute("data-method", method);
    if (v.all) strips.draw(v.image, (mi) => camOf(v, v.methods[mi], k)[0], v.width, v.height, cmap, alpha);
    strips.focus(method);
    const c = classes()[k];
    const auto = model.get("auto_layer") === v.info.layer ? " (auto)" : "";
    info.textContent = `${method} on ${v.info.layer}${auto} · ${v.info.grid} (${v.info.low_hw.join("×")}) · ` +
      (c ? `${classLabel(c.name, c.index) === c.name ? `class ${c.name} #${c.index}` : `class ${c.index}`}: score ${fmt(c.score)}, p ${fmtPct(c.prob)} · ` : "") + `CAM max ${fmt(peak)}`;
    warn.textContent = v.info.zero_grad ? v.info.note : "";
    replaceChildren(bar, [colourBar(cmap, [peak, 0], { width: "12px", height: canvas.style.height || "200px" })]);
  }

  function drawChecks(): void {
    const f = faith();
    const method = String(model.get("method"));
    const ranks: CamRank[] = model.get("ranks") ?? [];
    if (f) faithPanel(faithBox, f, metrics, allMethods(), method, pick, curves, ranks);
    else replaceChildren(faithBox, []);
    const rows = sanity();
    replaceChildren(sanityBox, rows.length ? [sanityTable(rows, Number(model.get("sanity_threshold") ?? 0.9))] : []);
  }

  function redrawMethod(): void {
    const sel = controls.querySelector("select.nbd-method-select") as HTMLSelectElement | null;
    if (sel) sel.value = String(model.get("method"));
    draw();
    drawChecks();
  }

  async function fetchCurves(): Promise<void> {
    if (!faith()) return;
    try {
      const answer = await rpc<{ methods: string[]; metrics: string[] }>(model, "curves", {});
      if (disposed) return;
      metrics = answer.result.metrics;
      curves = { methods: answer.result.methods, data: answer.arrays.curves.data as Float32Array,
                 fractions: answer.arrays.fractions.data as Float32Array };
      drawChecks();
      root.setAttribute("data-curves", "1");
    } catch (err) {
      const msg = err instanceof Error ? err.message : String(err);
      errorBox.textContent = msg;
    }
  }

  const onOpacity = () => {
    const value = Number(model.get("opacity"));
    if (Math.abs(value - alpha) > 1e-9) {
      alpha = value;
      buildControls();
      draw();
    }
  };
  const onClass = () => {
    buildControls();
    draw();
  };
  const onMethod = () => redrawMethod();
  // A layer set from Python (e.g. a linked dashboard): follow it; the dropdown's own change already matches.
  const onLayer = () => {
    const sel = controls.querySelector("select.nbd-layer") as HTMLSelectElement | null;
    if (sel && sel.value === String(model.get("layer"))) return;
    buildControls();
    void fetchView();
  };
  const listeners = new Listeners(); // every model listener, removed by one dispose()
  listeners.model(model, "change:opacity", onOpacity);
  listeners.model(model, "change:class_rank", onClass);
  listeners.model(model, "change:layer", onLayer);
  listeners.model(model, "change:method", onMethod);
  buildControls();
  drawChecks();
  void fetchView();
  void fetchCurves();
  return () => {
    disposed = true;
    latest.dispose();
    headline.dispose();
    listeners.dispose();
  };
}

export default { render };
