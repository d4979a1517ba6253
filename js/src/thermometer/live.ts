// One HistoryStore per widget model, shared by its views and filled by the `history` trait and by
// the kernel's `history` custom messages while the cell runs. anywidget calls `initialize` when the
// model is created, before any view exists, so no live update is missed while the first view loads
// (one that reaches the browser before this module has loaded is lost: the rows it carried come from
// the `live_rows` trait, which the model keeps, and the slots it carried with the final state);
// without it (tests, HTML export), each view listens itself while it is mounted.
import { h } from "../lib/dom";
import type { AnyModel } from "../lib/rpc";
import { slotX, sparkline, type Mark } from "../lib/sparkline";
import { HistoryStore } from "./history";
import { Listeners } from "../lib/request";

interface Shared {
  store: HistoryStore;
  /** The trait value last applied (a live store is never wiped by an unchanged empty trait). */
  trait: unknown;
  modelListener: boolean;
  views: Set<() => void>;
  error: string;
}

const SHARED = new WeakMap<AnyModel, Shared>();

export function shared(model: AnyModel): Shared {
  let s = SHARED.get(model);
  if (!s) {
    s = { store: new HistoryStore(), trait: undefined, modelListener: false, views: new Set(), error: "" };
    SHARED.set(model, s);
  }
  return s;
}

/** Apply the `history` trait if it changed since it was last applied; true when it did. */
export function syncTrait(model: AnyModel): boolean {
  const s = shared(model);
  const value = model.get("history");
  if (value === s.trait) return false;
  s.trait = value;
  s.store.applyTrait(value);
  return true;
}

/** Take the `live_rows` trait when it names more rows than the store has (HistoryStore.adoptRows). */
export function syncRows(model: AnyModel): boolean {
  return shared(model).store.adoptRows(model.get("live_rows"));
}

/** The custom-message handler that feeds the store and tells every view to redraw. */
export function messageHandler(model: AnyModel): (msg: any, buffers?: (DataView | ArrayBuffer)[]) => void {
  return (msg, buffers) => {
    const s = shared(model);
    try {
      if (!s.store.applyMessage(msg, buffers)) return;
      syncRows(model);
      s.error = "";
    } catch (err) {
      s.error = `nbdebug thermometer: history update: ${err instanceof Error ? err.message : String(err)}`;
    }
    s.views.forEach((redraw) => redraw());
  };
}

/** anywidget's per-model hook: listen for live updates for the model's whole life. */
export function initialize({ model }: { model: AnyModel }): () => void {
  const s = shared(model);
  syncTrait(model);
  syncRows(model);
  const onMsg = messageHandler(model);
  s.modelListener = true;
  const listeners = new Listeners(); // every model listener, removed by one dispose()
  listeners.model(model, "msg:custom", onMsg);
  return () => {
    listeners.dispose();
    s.modelListener = false;
  };
}

/** Stats drawn on a log scale in the sparklines (norms and ratios span decades). */
export const LOG_STATS = new Set(["grad_norm", "param_grad_norm", "update_ratio", "norm", "grad_std"]);

/** Choices of the "over time" column, kept to those the history carries. */
export const SPARK_STATS = ["mean", "std", "max", "min", "zero_frac", "dead_unit_frac", "grad_norm", "param_grad_norm", "update_ratio", "nan"];

const SPARK_W = 110;
const SPARK_H = 18;
const SVG_NS = "http://www.w3.org/2000/svg";

/** Sparklines of one store version and stat, reused across redraws (a slider move only moves the cursor). */
export class SparkCache {
  private key = "";
  private svgs = new Map<number, SVGSVGElement>();

  get(store: HistoryStore, r: number, stat: string, marks: Mark[]): SVGSVGElement {
    const key = `${store.version}|${stat}`;
    if (key !== this.key) {
      this.key = key;
      this.svgs.clear();
    }
    let svg = this.svgs.get(r);
    if (!svg) {
      const { y, lo, hi } = store.series(r, stat);
      const name = store.rows[r]?.name ?? "";
      svg = sparkline(y, { width: SPARK_W, height: SPARK_H, lo, hi, log: LOG_STATS.has(stat), marks, title: `${name}: ${stat} over ${y.length} kept steps` });
      this.svgs.set(r, svg);
    }
    return svg;
  }
}

/** Put the cursor line of `svg` at `slot` of `n` (remove it for undefined). */
function setCursor(svg: SVGSVGElement, slot: number | undefined, n: number): void {
  let line = svg.querySelector("line.nbd-spark-cursor");
  if (slot === undefined || !(slot >= 0 && slot < n)) {
    line?.remove();
    return;
  }
  if (!line) {
    line = document.createElementNS(SVG_NS, "line");
    line.setAttribute("class", "nbd-spark-cursor");
    line.setAttribute("y1", "0");
    line.setAttribute("y2", String(SPARK_H));
    svg.appendChild(line);
  }
  const x = slotX(slot, n, SPARK_W).toFixed(1);
  line.setAttribute("x1", x);
  line.setAttribute("x2", x);
}

/** The "over time" cell of history row `r` (an empty cell when the row has no history). */
export function sparkCell(store: HistoryStore, r: number | undefined, stat: string, cursor: number | undefined, marks: Mark[], cache: SparkCache): HTMLElement {
  const cell = h("div", { class: "nbd-spark-cell" });
  if (r === undefined || !store.hasField(stat)) return cell;
  const svg = cache.get(store, r, stat, marks);
  setCursor(svg, cursor, store.length);
  cell.appendChild(svg);
  return cell;
}
