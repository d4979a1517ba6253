// Logit-lens table: rows = embeddings and each block's output (final at the top), columns =
// positions. The header states the finding first (from which block the answer at the last position
// is top-1 and stays, nbdebug/inspectors/lens_finding.py), then a colour bar and the legend of the
// marks. Each cell shows the top-1 token of that layer's residual read through the model's own
// final norm and unembedding, coloured by the chosen metric; hovering shows the top-k (and a column
// header the whole token), clicking pins a cell (its top-20 is fetched with rpc "cell"). The last
// position arrives with the widget; other positions of the visible window are fetched with rpc
// "columns" (computed then in the kernel). Python side: nbdebug/widgets/logitlens.py. Token text is
// untrusted: textContent only.
//
// With `--steer`, the steering panel (logitlens/steer.ts) re-runs the cell's input steered in the
// kernel (rpc "steer") and the table shows the steered run's lens ("show original" switches back).
//
// Parts: logitlens/columns.ts (the columns held, metrics, colour scales), header.ts (finding,
// controls, colour bar, legend, details), table.ts, tip.ts, pins.ts, steer.ts, side.ts (panels beside
// the table acting on pinned cells: add a `LensPanel` to `panelsFor` below).
import { decode, type NdArray, type WireArray } from "./lib/ndarray";
import { append, codeCss, h, replaceChildren, styleElement } from "./lib/dom";
import { MORE_CSS, MoreCue } from "./lib/more";
import { rpc, type AnyModel } from "./lib/rpc";
import { colourScale, Columns } from "./logitlens/columns";
import { LensHeader } from "./logitlens/header";
import { Pins } from "./logitlens/pins";
import { byLayerPanel } from "./logitlens/bylayer";
import { SidePanels, type LensPanel } from "./logitlens/side";
import { SteerPanel } from "./logitlens/steer";
import { CSS } from "./logitlens/style";
import { lensTable, type LensText } from "./logitlens/table";
import { LensTip } from "./logitlens/tip";
import { Listeners } from "./lib/request";

/** Panels beside the table: the by-layer strip (p(answer), rank, KL, the compared lens's top-1). */
function panelsFor(model: AnyModel, rowLabel: (r: number) => string): LensPanel[] {
  const strip = byLayerPanel(model, rowLabel);
  return strip ? [strip] : [];
}

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const R: number = model.get("n_rows");
  const T: number = model.get("n_pos");
  const k: number = model.get("k");
  const tokens: string[] = model.get("tokens") || [];
  const vocab = new Map<number, string>();
  const x: LensText = {
    tokens,
    raw: model.get("raw_tokens") || tokens,
    rows: model.get("row_names") || [],
    targets: model.get("targets") || [],
    generated: model.get("generated") || [],
    label: (id: number) => vocab.get(id) ?? `#${id}`,
    // Short row labels (full module names in the tooltip): "embed", "L0", "L1", ...
    rowLabel: (r: number) => (r === 0 ? "embed" : `L${r - 1}`),
  };
  const orig = new Columns(R, k); // the cell's run
  let steeredCols: Columns | null = null; // the last steered run received
  const cols = new Columns(R, k); // what the table and the tip show: one of the two
  cols.adopt(orig);
  const pending = new Set<number>();
  const found = (model.get("finding_cell") || {}) as Record<string, number>;
  const onsetRow = found.from_row >= 0 ? found.from_row : found.predicted_from_row ?? -1;
  const onset: [number, number] = [onsetRow, Number.isInteger(found.position) ? found.position : -1];
  let disposed = false;
  let cmap = "viridis";
  const learn = (v: Record<string, string>) => {
    for (const [id, s] of Object.entries(v || {})) vocab.set(Number(id), s);
  };
  const initial = model.get("initial") || {};
  learn(model.get("vocab"));
  if (initial.positions && initial.arrays) {
    const arrays: Record<string, NdArray> = {};
    for (const [name, w] of Object.entries(initial.arrays as Record<string, WireArray>)) arrays[name] = decode(w);
    orig.store(initial.positions, arrays);
  }

  const root = h("div", { class: "nbdebug-logitlens" });
  const head = new LensHeader(model, R, T, k);
  const c = head.controls;
  const wrap = h("div", { class: "nbl-wrap" });
  const more = new MoreCue(wrap, "tbody tr", "row"); // the grid keeps its max-height, never silently
  const side = new SidePanels(panelsFor(model, x.rowLabel));
  const tip = new LensTip(root, x, cols);
  const pins = new Pins(model, x, learn);
  const status = h("div", { class: "nbl-note nbl-status" });
  const showingSteered = () => steeredCols !== null && !steer.original.checked;
  const steer = new SteerPanel(model, {
    window: () => clampRange("pos_range", 0, T, 1),
    steered: (ans, arrays) => {
      learn(ans.vocab);
      const fresh = new Columns(R, k);
      fresh.store(ans.positions, arrays);
      steeredCols = fresh;
      if (!steer.original.checked) cols.adopt(fresh);
      root.setAttribute("data-steer", `${ans.layer}:${ans.alpha}`);
      drawTable();
    },
    showOriginal: (original) => {
      cols.adopt(original || !steeredCols ? orig : steeredCols);
      drawTable();
    },
  });
  append(root, [styleElement(CSS + MORE_CSS + codeCss(".nbdebug-logitlens")), ...head.elements, steer.el, h("div", { class: "nbl-main" }, [h("div", { class: "nbl-wrapcol" }, [wrap, more.el]), side.el]), status, pins.el, tip.el]);
  el.appendChild(root);

  const clampRange = (name: string, lo: number, hi: number, minLen: number): [number, number] => {
    const r = (model.get(name) || []) as number[];
    const a = Math.max(lo, Math.min(hi - minLen, Number.isFinite(r[0]) ? r[0] : lo));
    const b = Math.max(a + minLen, Math.min(hi, Number.isFinite(r[1]) ? r[1] : hi));
    return [a, b];
  };

  function drawTable(): void {
    const [r0, r1] = clampRange("row_range", 0, R - 1, 0);
    const [p0, p1] = clampRange("pos_range", 0, T, 1);
    c.rowFrom.value = String(r0);
    c.rowTo.value = String(r1);
    c.posFrom.value = String(p0);
    c.posTo.value = String(p1 - 1); // both ranges inclusive on screen: last position shown
    const positions = Array.from({ length: p1 - p0 }, (_, i) => p0 + i);
    const metric = c.metricSel.value;
    // the embeddings row echoes the input: muted, and left out of the colour scale
    const scale = colourScale(metric, cols, positions, r0 === 0 && r1 > 0 ? 1 : r0, r1);
    head.colourBar(metric, cmap, scale.ticks);
    const pinned = new Set(pins.pinned().map(([r, p]) => `${r},${p}`));
    replaceChildren(wrap, [lensTable(x, { cols, positions, r0, r1, metric, cmap, scale, pinned, onset })]);
    const missing = positions.filter((p) => !cols.has(p));
    root.setAttribute("data-showing", showingSteered() ? "steered" : "original");
    if (missing.length) {
      root.removeAttribute("data-complete");
      if (showingSteered()) void steer.send(); // the steered run's columns of the new window
      else void fetchColumns(missing);
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
      orig.store(ans.result.positions, ans.arrays);
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

  wrap.addEventListener("mousemove", (ev: MouseEvent) => tip.show(ev));
  wrap.addEventListener("mouseleave", () => tip.hide());
  wrap.addEventListener("click", (ev: MouseEvent) => {
    const td = (ev.target as HTMLElement).closest?.("td");
    if (td && td.hasAttribute("data-row")) pins.toggle([Number(td.getAttribute("data-row")), Number(td.getAttribute("data-pos"))]);
  });
  const setRange = (name: string, a: HTMLInputElement, b: HTMLInputElement) => () => {
    model.set(name, [Number(a.value), Number(b.value)]);
    model.save_changes();
  };
  [c.rowFrom, c.rowTo].forEach((i) => i.addEventListener("change", setRange("row_range", c.rowFrom, c.rowTo)));
  [c.posFrom, c.posTo].forEach((i) =>
    i.addEventListener("change", () => {
      model.set("pos_range", [Number(c.posFrom.value), Number(c.posTo.value) + 1]); // inclusive on screen
      model.save_changes();
    }),
  );
  c.metricSel.addEventListener("change", () => {
    model.set("metric", c.metricSel.value);
    model.save_changes();
  });
  c.cmapSel.addEventListener("change", () => {
    cmap = c.cmapSel.value;
    drawTable();
  });
  const onMetric = () => {
    c.metricSel.value = model.get("metric");
    drawTable();
  };
  const onPinned = () => {
    drawTable();
    side.update(pins.pinned());
    void pins.draw();
  };
  const listeners = new Listeners(); // every model listener, removed by one dispose()
  listeners.model(model, "change:metric", onMetric);
  listeners.model(model, "change:row_range", drawTable);
  listeners.model(model, "change:pos_range", drawTable);
  listeners.model(model, "change:pinned", onPinned);

  drawTable();
  side.update(pins.pinned());
  if (pins.pinned().length) void pins.draw();
  root.setAttribute("data-ready", "1");
  return () => {
    disposed = true;
    more.dispose();
    pins.latest.dispose();
    steer.disposed = true;
    listeners.dispose();
  };
}

export default { render };
