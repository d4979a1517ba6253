// Grad-CAM overlay: the input image and the CAM of one target class blended in the browser.
// The image and the CAMs of every target class of a sample/layer arrive together (one rpc,
// uint8 buffers) from GradCamWidget (nbdebug/widgets/gradcam.py, `@rpc("view")`), so switching
// class, colormap or opacity redraws locally. The opacity slider sends nothing while it moves;
// its final value is synced to the `opacity` trait when released.
import { colourBar } from "./lib/colorbar";
import { COLORMAPS, lut } from "./lib/colormap";
import { fmt, fmtPct, h, replaceChildren, styleElement } from "./lib/dom";
import { rpc, type AnyModel } from "./lib/rpc";
import { sampleSelect, select } from "./lib/select";

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
}

interface View {
  info: ViewInfo;
  cams: Uint8Array; // K×H×W
  peak: Float32Array;
  image: Uint8Array | null; // H×W×3
  height: number;
  width: number;
}

const CSS = `
.nbdebug-gradcam { font: 12px/1.4 var(--jp-ui-font-family, system-ui, sans-serif); color: var(--jp-ui-font-color1, #222); }
.nbdebug-gradcam .nbd-controls { display: flex; flex-wrap: wrap; gap: 10px; align-items: center; margin-bottom: 6px; }
.nbdebug-gradcam select, .nbdebug-gradcam input { font: inherit; }
.nbdebug-gradcam select.nbd-layer, .nbdebug-gradcam select.nbd-class { max-width: 320px; }
.nbdebug-gradcam .nbd-stage { display: flex; gap: 8px; align-items: flex-start; }
.nbdebug-gradcam canvas.nbd-overlay { image-rendering: auto; max-width: 100%; border: 1px solid var(--jp-border-color1, #ccc); }
.nbdebug-gradcam .nbd-bar { display: flex; gap: 4px; }
.nbdebug-gradcam .nbd-ticks { display: flex; flex-direction: column; justify-content: space-between; font-size: 10px; }
.nbdebug-gradcam .nbd-info { color: var(--jp-ui-font-color2, #555); margin: 4px 0; }
.nbdebug-gradcam .nbd-notes { margin: 2px 0 6px 18px; padding: 0; color: var(--jp-ui-font-color2, #555); }
.nbdebug-gradcam .nbd-warn { color: #b26a00; }
.nbdebug-gradcam .nbd-error { color: #d32f2f; }
`;

/** Blend an RGB image (H×W×3) with a colormapped uint8 CAM (H×W) into RGBA `out`. */
export function blend(image: Uint8Array | null, cam: Uint8Array, cmap: string, alpha: number, out: Uint8ClampedArray): void {
  const table = lut(cmap);
  const a = Math.min(1, Math.max(0, alpha));
  const b = 1 - a;
  for (let i = 0, j = 0, k = 0; i < cam.length; i++, j += 4, k += 3) {
    const t = cam[i] * 4;
    const r = image ? image[k] : 0;
    const g = image ? image[k + 1] : 0;
    const bl = image ? image[k + 2] : 0;
    out[j] = b * r + a * table[t];
    out[j + 1] = b * g + a * table[t + 1];
    out[j + 2] = b * bl + a * table[t + 2];
    out[j + 3] = 255;
  }
}

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const root = h("div", { class: "nbdebug-gradcam" });
  const controls = h("div", { class: "nbd-controls" });
  const canvas = h("canvas", { class: "nbd-overlay", attrs: { width: 1, height: 1 } });
  const bar = h("div", { class: "nbd-barbox" });
  const info = h("div", { class: "nbd-info" });
  const warn = h("div", { class: "nbd-warn" });
  const notes = h("ul", { class: "nbd-notes" });
  const errorBox = h("div", { class: "nbd-error" });
  root.append(styleElement(CSS), controls, errorBox, h("div", { class: "nbd-stage" }, [canvas, bar]), warn, info, notes);
  el.appendChild(root);

  let view: View | null = null;
  let alpha = Number(model.get("opacity") ?? 0.5);
  let request = 0;
  let disposed = false;
  const setTrait = (name: string, value: unknown) => {
    model.set(name, value);
    model.save_changes();
  };
  const classes = (): ClassInfo[] => (model.get("classes") ?? [])[Number(model.get("sample") ?? 0)] ?? [];

  function buildControls(): void {
    const batch = Number(model.get("batch") ?? 1);
    const sampleSel = sampleSelect(batch, Number(model.get("sample") ?? 0), (v) => {
      setTrait("sample", v);
      buildControls();
      void fetchView();
    });
    const classSel = select(
      classes().map((c, k) => [String(k), `${k + 1}. ${c.name} (${fmtPct(c.prob)}, #${c.index})`]),
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
    replaceChildren(controls, [
      sampleSel,
      h("label", {}, ["class ", classSel]),
      h("label", {}, ["layer ", layerSel]),
      h("label", {}, ["colormap ", cmapSel]),
      h("label", {}, ["opacity ", slider, label]),
    ]);
    const ns: string[] = model.get("notes") ?? [];
    const image = String(model.get("image_note") ?? "");
    replaceChildren(notes, [...ns, image ? `image: ${image}` : ""].filter(Boolean).map((n) => h("li", { text: n })));
  }

  async function fetchView(): Promise<void> {
    const id = ++request;
    info.textContent = `computing Grad-CAM for ${String(model.get("layer"))}…`;
    try {
      const answer = await rpc<ViewInfo>(model, "view", { sample: Number(model.get("sample") ?? 0), layer: String(model.get("layer")) });
      if (id !== request || disposed) return;
      const cams = answer.arrays.cams;
      view = {
        info: answer.result,
        cams: cams.data as Uint8Array,
        peak: answer.arrays.peak.data as Float32Array,
        image: answer.arrays.image ? (answer.arrays.image.data as Uint8Array) : null,
        height: cams.shape[1],
        width: cams.shape[2],
      };
      errorBox.textContent = "";
      draw();
    } catch (err) {
      if (id !== request) return;
      const msg = err instanceof Error ? err.message : String(err);
      errorBox.textContent = msg;
      setTrait("js_error", msg);
    } finally {
      if (id === request) root.setAttribute("data-ready", "1");
    }
  }

  function draw(): void {
    if (!view) return;
    const v = view;
    const k = Math.min(Number(model.get("class_rank") ?? 0), v.peak.length - 1);
    const n = v.height * v.width;
    if (canvas.width !== v.width || canvas.height !== v.height) {
      canvas.width = v.width;
      canvas.height = v.height;
      // Small inputs are scaled up, large ones down: at most 448 px wide and 320 px tall.
      const s = Math.min(448 / v.width, 320 / v.height);
      canvas.style.width = `${Math.round(v.width * s)}px`;
      canvas.style.height = `${Math.round(v.height * s)}px`;
    }
    const ctx = canvas.getContext("2d");
    const cmap = String(model.get("colormap") ?? "inferno");
    if (ctx) {
      const img = ctx.createImageData(v.width, v.height);
      blend(v.image, v.cams.subarray(k * n, (k + 1) * n), cmap, alpha, img.data);
      ctx.putImageData(img, 0, 0);
    }
    canvas.setAttribute("data-class-rank", String(k));
    const c = classes()[k];
    const auto = model.get("auto_layer") === v.info.layer ? " (auto)" : "";
    info.textContent = `${String(model.get("method"))} on ${v.info.layer}${auto} · ${v.info.grid} (${v.info.low_hw.join("×")}) · ` +
      (c ? `class ${c.name} #${c.index}: score ${fmt(c.score)}, p ${fmtPct(c.prob)} · ` : "") + `CAM max ${fmt(v.peak[k])}`;
    warn.textContent = v.info.zero_grad ? v.info.note : "";
    replaceChildren(bar, [colourBar(cmap, [v.peak[k], 0], { width: "12px", height: canvas.style.height || "200px" })]);
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
  // A layer set from Python (e.g. a linked dashboard): follow it; the dropdown's own change already matches.
  const onLayer = () => {
    const sel = controls.querySelector("select.nbd-layer") as HTMLSelectElement | null;
    if (sel && sel.value === String(model.get("layer"))) return;
    buildControls();
    void fetchView();
  };
  model.on("change:opacity", onOpacity);
  model.on("change:class_rank", onClass);
  model.on("change:layer", onLayer);
  buildControls();
  void fetchView();
  return () => {
    disposed = true;
    model.off("change:opacity", onOpacity);
    model.off("change:class_rank", onClass);
    model.off("change:layer", onLayer);
  };
}

export default { render };
