// Feature-map grid: the headline first (the shown layer's silent channels, computed in Python:
// nbdebug/inspectors/featuremaps.py layer_headline), then every channel of one captured layer as a
// canvas tile (colormap, per-channel or shared normalisation, sort by mean/max/sparsity, channels
// silent on this input marked — one sample cannot call a channel dead —, hover stats, click to
// enlarge with a colour bar). The grid fits its content: no scroll box hides tiles. Pixels are fetched on demand, one uint8 page per request, from
// FeatureMapsWidget (nbdebug/widgets/featuremaps.py, `@rpc("page")`).
import { colourBar } from "./lib/colorbar";
import { COLORMAPS, paintU8 } from "./lib/colormap";
import { codeCss, fmt, fmtPct, h, replaceChildren, styleElement, withCode } from "./lib/dom";
import type { NdArray } from "./lib/ndarray";
import { rpc, type AnyModel } from "./lib/rpc";
import { Latest, Listeners } from "./lib/request";
import { sampleSelect, select } from "./lib/select";
import { ABLATE_CSS, ablatePanel } from "./featuremaps/ablate";

interface LayerInfo {
  name: string;
  shape: number[];
  channels: number;
  height: number;
  width: number;
  layout: string;
  samples: number;
}

interface PageInfo {
  layer: string;
  start: number;
  total: number;
  height: number;
  width: number;
  page_size: number;
  dead: number;
  lo: number;
  hi: number;
  sort: string;
}

interface Page {
  info: PageInfo;
  pixels: Uint8Array;
  channels: Int32Array;
  lo: Float32Array;
  hi: Float32Array;
  mean: Float32Array;
  sparsity: Float32Array;
  dead: Uint8Array;
}

const CSS = `
.nbdebug-featuremaps { font: 12px/1.4 var(--jp-ui-font-family, system-ui, sans-serif); color: var(--jp-ui-font-color1, #222); }
.nbdebug-featuremaps .nbd-controls { display: flex; flex-wrap: wrap; gap: 10px; align-items: center; margin-bottom: 6px; }
.nbdebug-featuremaps select, .nbdebug-featuremaps button { font: inherit; }
.nbdebug-featuremaps select.nbd-layer { max-width: 360px; }
.nbdebug-featuremaps .nbd-info { color: var(--jp-ui-font-color2, #555); margin: 2px 0 6px; min-height: 1.4em; }
.nbdebug-featuremaps .nbd-headline { font-weight: 700; margin: 2px 0 6px; overflow-wrap: anywhere; }
.nbdebug-featuremaps .nbd-grid { display: flex; flex-wrap: wrap; gap: 3px; }
.nbdebug-featuremaps .nbd-tile { position: relative; cursor: pointer; border: 2px solid transparent; line-height: 0; }
.nbdebug-featuremaps .nbd-tile:hover { border-color: var(--jp-brand-color1, #1976d2); }
.nbdebug-featuremaps .nbd-tile.nbd-dead { border-color: #d32f2f; }
.nbdebug-featuremaps .nbd-tile.nbd-dead canvas { opacity: 0.45; }
.nbdebug-featuremaps .nbd-tile.nbd-selected { border-color: #ff9800; }
.nbdebug-featuremaps .nbd-tile canvas, .nbdebug-featuremaps .nbd-big canvas.nbd-map { image-rendering: pixelated; display: block; }
.nbdebug-featuremaps .nbd-tile .nbd-idx { position: absolute; left: 1px; top: 1px; font-size: 9px; line-height: 1.2; padding: 0 2px; color: #fff; background: rgba(0, 0, 0, 0.62); }
.nbdebug-featuremaps .nbd-flag { font-weight: 700; color: #b71c1c; }
.nbdebug-featuremaps .nbd-tile.nbd-dead::after { content: "silent"; position: absolute; right: 1px; bottom: 1px; font-weight: 700; font-size: 9px; color: #fff; background: #d32f2f; line-height: 1.2; padding: 0 2px; }
.nbdebug-featuremaps .nbd-hover { min-height: 1.4em; margin-top: 4px; font-variant-numeric: tabular-nums; }
.nbdebug-featuremaps .nbd-big { display: none; gap: 10px; align-items: flex-start; margin: 6px 0; padding: 6px; border: 1px solid var(--jp-border-color1, #ccc); }
.nbdebug-featuremaps .nbd-big.nbd-open { display: flex; }
.nbdebug-featuremaps .nbd-bar { display: flex; gap: 4px; align-items: stretch; }
.nbdebug-featuremaps .nbd-ticks { display: flex; flex-direction: column; justify-content: space-between; font-size: 10px; }
.nbdebug-featuremaps .nbd-error { color: #d32f2f; }
.nbdebug-featuremaps .nbd-notes { margin: 2px 0 6px 18px; padding: 0; color: var(--jp-ui-font-color2, #555); }
`;

function toPage(result: PageInfo, arrays: Record<string, NdArray>): Page {
  return {
    info: result,
    pixels: arrays.pixels.data as Uint8Array,
    channels: arrays.channels.data as Int32Array,
    lo: arrays.lo.data as Float32Array,
    hi: arrays.hi.data as Float32Array,
    mean: arrays.mean.data as Float32Array,
    sparsity: arrays.sparsity.data as Float32Array,
    dead: arrays.dead.data as Uint8Array,
  };
}

/** uint8 pixels of channel `i` of a page, re-mapped to the shared [lo, hi] scale when asked. */
export function channelPixels(page: Page, i: number, shared: boolean): Uint8Array {
  const n = page.info.height * page.info.width;
  const src = page.pixels.subarray(i * n, (i + 1) * n);
  if (!shared) return src;
  const glo = page.info.lo;
  const span = page.info.hi - glo;
  const lo = page.lo[i];
  const step = (page.hi[i] - lo) / 255;
  const map = new Uint8Array(256);
  for (let v = 0; v < 256; v++) map[v] = span > 0 ? Math.round(((lo + v * step - glo) / span) * 255) : 0;
  const out = new Uint8Array(n);
  for (let j = 0; j < n; j++) out[j] = map[src[j]];
  return out;
}

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const root = h("div", { class: "nbdebug-featuremaps" });
  const headline = h("div", { class: "nbd-headline" }, withCode(String(model.get("headline") ?? "")));
  const controls = h("div", { class: "nbd-controls" });
  const notes = h("ul", { class: "nbd-notes" });
  const info = h("div", { class: "nbd-info" });
  const errorBox = h("div", { class: "nbd-error" });
  const big = h("div", { class: "nbd-big" });
  const grid = h("div", { class: "nbd-grid" });
  const hover = h("div", { class: "nbd-hover" });
  root.append(styleElement(CSS + ABLATE_CSS + codeCss(".nbdebug-featuremaps")), headline, controls, notes, info, errorBox, big, grid, hover);
  el.appendChild(root);

  let page: Page | null = null;
  let start = 0;
  const latest = new Latest();
  let disposed = false;

  const layers = (): LayerInfo[] => model.get("layers") ?? [];
  const current = (): LayerInfo | undefined => layers().find((l) => l.name === model.get("layer"));
  const setTrait = (name: string, value: unknown) => {
    model.set(name, value);
    model.save_changes();
  };
  const reportError = (err: unknown) => {
    const msg = err instanceof Error ? err.message : String(err);
    errorBox.textContent = msg;
    setTrait("js_error", msg);
  };

  // channel ablation (shown when the kernel kept the cell's model call): click picks, shift-click adds
  const ablation = ablatePanel(model, () => String(model.get("layer") ?? ""), reportError);
  if (model.get("can_ablate")) root.insertBefore(ablation.el, big);

  function statsText(p: Page, i: number): string {
    const ch = p.channels[i];
    return `channel ${ch}: min ${fmt(p.lo[i])}, max ${fmt(p.hi[i])}, mean ${fmt(p.mean[i])}, zeros ${fmtPct(p.sparsity[i])}${p.dead[i] ? " (silent on this input: all zero)" : ""}`;
  }
  // the same text, the flagged part ("(silent on this input: all zero)") in bold
  function statsNodes(p: Page, i: number): (string | HTMLElement)[] {
    const text = statsText(p, i);
    const cut = text.indexOf(" (silent");
    return cut < 0 ? [text] : [text.slice(0, cut + 1), h("span", { class: "nbd-flag", text: text.slice(cut + 1) })];
  }

  function buildControls(): void {
    const ls = layers();
    const layerSel = select(ls.map((l) => [l.name, `${l.name} [${l.shape.join("×")}]`]), String(model.get("layer")), "nbd-layer", (v) => {
      start = 0;
      ablation.reset();
      setTrait("layer", v);
      setTrait("selected", -1);
      void fetchPage();
    });
    const batch = Number(model.get("batch") ?? 1);
    const sampleSel = sampleSelect(batch, Number(model.get("sample") ?? 0), (v) => {
      setTrait("sample", v);
      void fetchPage();
    });
    const cmapSel = select(COLORMAPS.map((c) => [c, c]), String(model.get("colormap")), "nbd-colormap", (v) => {
      setTrait("colormap", v);
      draw();
    });
    const normSel = select([["channel", "per-channel contrast"], ["shared", "shared scale"]], String(model.get("norm")), "nbd-norm", (v) => {
      setTrait("norm", v);
      draw();
    });
    const sortSel = select([["index", "channel order"], ["mean", "by mean ▼"], ["max", "by max ▼"], ["sparsity", "by sparsity ▼"]], String(model.get("sort")), "nbd-sort", (v) => {
      start = 0;
      setTrait("sort", v);
      void fetchPage();
    });
    const prev = h("button", { class: "nbd-prev", text: "◀", title: "previous page", on: { click: () => turn(-1) } });
    const next = h("button", { class: "nbd-next", text: "▶", title: "next page", on: { click: () => turn(1) } });
    const pageLabel = h("span", { class: "nbd-page" });
    replaceChildren(controls, [
      h("label", {}, ["layer ", layerSel]),
      h("label", {}, [sampleSel]),
      h("label", {}, ["colormap ", cmapSel]),
      normSel,
      sortSel,
      h("span", {}, [prev, pageLabel, next]),
    ]);
    const ns: string[] = model.get("notes") ?? [];
    replaceChildren(notes, ns.map((n) => h("li", { text: n })));
    notes.style.display = ns.length ? "" : "none";
  }

  function turn(dir: number): void {
    if (!page) return;
    const size = page.info.page_size;
    const next = start + dir * size;
    if (next < 0 || next >= page.info.total) return;
    start = next;
    void fetchPage();
  }

  async function fetchPage(): Promise<void> {
    const layer = current();
    if (!layer) {
      grid.textContent = "no layer with a spatial output was captured";
      root.setAttribute("data-ready", "1");
      return;
    }
    const isLatest = latest.start();
    info.textContent = `loading ${layer.name}…`;
    try {
      const answer = await rpc<PageInfo>(model, "page", { layer: layer.name, sample: Number(model.get("sample") ?? 0), sort: String(model.get("sort") ?? "index"), start });
      if (!isLatest()) return;
      page = toPage(answer.result, answer.arrays);
      errorBox.textContent = "";
      draw();
    } catch (err) {
      if (isLatest()) reportError(err);
    } finally {
      if (isLatest()) root.setAttribute("data-ready", "1");
    }
  }

  function tileSize(hgt: number, wid: number, n: number): number {
    const target = n <= 16 ? 112 : n <= 64 ? 80 : 56;
    return Math.max(target, Math.min(hgt, wid)) / Math.max(hgt, wid);
  }

  function draw(): void {
    if (!page) return;
    const p = page;
    const { height: hh, width: ww, total, dead } = p.info;
    const n = p.channels.length;
    const layer = current();
    replaceChildren(info, [
      `${p.info.layer}: ${layer ? layer.layout : ""} · channels ${p.info.start}–${p.info.start + n - 1} of ${total} · `,
      dead ? h("span", { class: "nbd-flag", text: `${dead} silent on this input` }) : `${dead} silent on this input`,
      ` · values ${fmt(p.info.lo)} … ${fmt(p.info.hi)}`,
    ]);
    const pageLabel = controls.querySelector(".nbd-page");
    if (pageLabel) pageLabel.textContent = ` page ${Math.floor(p.info.start / p.info.page_size) + 1}/${Math.ceil(total / p.info.page_size)} `;
    const cmap = String(model.get("colormap") ?? "viridis");
    const shared = model.get("norm") === "shared";
    const scale = tileSize(hh, ww, n);
    const selected = Number(model.get("selected") ?? -1);
    const frag = document.createDocumentFragment();
    for (let i = 0; i < n; i++) {
      const ch = p.channels[i];
      const canvas = h("canvas", { attrs: { width: ww, height: hh }, style: { width: `${Math.round(ww * scale)}px`, height: `${Math.round(hh * scale)}px` } });
      const ctx = canvas.getContext("2d");
      if (ctx) paintU8(channelPixels(p, i, shared), ww, hh, cmap, ctx);
      const tile = h("div", {
        class: ["nbd-tile", p.dead[i] ? "nbd-dead" : false, ch === selected && "nbd-selected"],
        data: { channel: ch },
        title: statsText(p, i),
        on: {
          mouseenter: () => replaceChildren(hover, statsNodes(p, i)),
          click: (ev: Event) => {
            const add = (ev as MouseEvent).shiftKey;
            ablation.pick(ch, add);
            if (!add) enlarge(i);
          },
        },
      }, [canvas, h("span", { class: "nbd-idx", text: ch })]);
      frag.appendChild(tile);
    }
    replaceChildren(grid, [frag]);
    const idx = Array.from(p.channels).indexOf(selected);
    if (idx >= 0) enlarge(idx, false);
    else big.classList.remove("nbd-open");
  }

  function enlarge(i: number, sync = true): void {
    if (!page) return;
    const p = page;
    const { height: hh, width: ww } = p.info;
    const ch = p.channels[i];
    const shared = model.get("norm") === "shared";
    const cmap = String(model.get("colormap") ?? "viridis");
    const canvas = h("canvas", { class: "nbd-map", attrs: { width: ww, height: hh } });
    const s = 256 / Math.max(hh, ww);
    canvas.style.width = `${Math.round(ww * s)}px`;
    canvas.style.height = `${Math.round(hh * s)}px`;
    const ctx = canvas.getContext("2d");
    if (ctx) paintU8(channelPixels(p, i, shared), ww, hh, cmap, ctx);
    const lo = shared ? p.info.lo : p.lo[i];
    const hi = shared ? p.info.hi : p.hi[i];
    const close = h("button", { class: "nbd-close", text: "×", title: "close", on: { click: () => { big.classList.remove("nbd-open"); setTrait("selected", -1); draw(); } } });
    replaceChildren(big, [canvas, colourBar(cmap, [hi, (lo + hi) / 2, lo], { width: "14px", height: "256px" }), h("div", {}, [h("div", {}, statsNodes(p, i)), close])]);
    big.setAttribute("data-channel", String(ch));
    big.classList.add("nbd-open");
    for (const t of Array.from(grid.children)) t.classList.toggle("nbd-selected", (t as HTMLElement).dataset.channel === String(ch));
    if (sync) setTrait("selected", ch);
  }

  const onLayers = () => {
    ablation.reset();
    buildControls();
    start = 0;
    void fetchPage();
  };
  // A layer set from Python (e.g. a linked dashboard): follow it; the dropdown's own change already matches.
  const onLayer = () => {
    const sel = controls.querySelector("select.nbd-layer") as HTMLSelectElement | null;
    ablation.reset();
    if (sel && sel.value === String(model.get("layer"))) return;
    buildControls();
    start = 0;
    void fetchPage();
  };
  const onHeadline = () => {
    replaceChildren(headline, withCode(String(model.get("headline") ?? "")));
  };
  const listeners = new Listeners(); // every model listener, removed by one dispose()
  listeners.model(model, "change:layers", onLayers);
  listeners.model(model, "change:layer", onLayer);
  listeners.model(model, "change:headline", onHeadline);
  buildControls();
  void fetchPage();
  return () => {
    disposed = true;
    latest.dispose();
    listeners.dispose();
  };
}

export default { render };
