// The "spread across ranks" column added to the rank's thermometer rows: min … max of the chosen
// stat over the ranks at each rank's last kept step (the `spread` trait of nbdebug/widgets/run.py:
// {fields, rows, lo, hi} with lo/hi float32 [rows, fields]). The thermometer redraws its rows itself (slider,
// sort, live); a MutationObserver adds the cell to every row it (re)builds.
import { fmt, h } from "../lib/dom";
import { decode, type WireArray } from "../lib/ndarray";

export interface Spread {
  fields?: string[];
  rows?: string[];
  lo?: WireArray;
  hi?: WireArray;
}

interface Index {
  at: Map<string, number>;
  lo: ArrayLike<number>;
  hi: ArrayLike<number>;
  k: number;
}

const INDEX = new WeakMap<object, Index>();

function indexOf(spread: Spread): Index {
  let ix = INDEX.get(spread);
  if (!ix) {
    const rows = Array.isArray(spread.rows) ? spread.rows : [];
    const k = (spread.fields ?? []).length;
    const lo = spread.lo?.view ? decode(spread.lo).data : new Float32Array(0);
    const hi = spread.hi?.view ? decode(spread.hi).data : new Float32Array(0);
    if (lo.length !== rows.length * k || hi.length !== rows.length * k) {
      throw new Error(`nbdebug: spread of ${lo.length} values does not match ${rows.length} rows × ${k} fields`);
    }
    ix = { at: new Map(rows.map((r, i) => [String(r), i])), lo, hi, k };
    INDEX.set(spread, ix);
  }
  return ix;
}

/** `[lo, hi]` of `field` for `row` (NaN when no rank had a finite value). */
export function spreadOf(spread: Spread, row: string, field: string): [number, number] {
  const j = (spread.fields ?? []).indexOf(field);
  const ix = indexOf(spread);
  const i = ix.at.get(row);
  if (j < 0 || i === undefined) return [NaN, NaN];
  return [ix.lo[i * ix.k + j], ix.hi[i * ix.k + j]];
}

/** Whether lo and hi differ beyond float32 rounding. */
export function differs(lo: number, hi: number): boolean {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) return false;
  return Math.abs(hi - lo) > 1e-6 * Math.max(Math.abs(lo), Math.abs(hi), 1e-30);
}

/** The spread cell of one row. */
export function spreadCell(spread: Spread, row: string, field: string): HTMLElement {
  const [lo, hi] = spreadOf(spread, row, field);
  if (Number.isNaN(lo)) return h("div", { class: "nbd-spread-cell nbd-empty", text: "—", title: `no rank has a finite ${field} for this row` });
  const text = lo === hi ? fmt(lo) : `${fmt(lo)} … ${fmt(hi)}`;
  return h("div", {
    class: ["nbd-spread-cell", "nbd-num", differs(lo, hi) && "nbd-spread-differs"],
    text,
    title: `${field} across ranks at each rank's last kept step: min ${fmt(lo)}, max ${fmt(hi)}`,
  });
}

/** A row's name: the first text node of its name cell (a "×N" calls badge may follow). */
export function rowName(row: Element): string {
  const cell = row.querySelector(".nbd-name");
  const first = cell?.firstChild;
  return first && first.nodeType === 3 ? String(first.textContent ?? "") : String(cell?.textContent ?? "");
}

/** Keeps a spread cell on every row and a header cell of a thermometer mounted in `host`. */
export class SpreadColumn {
  private observer: MutationObserver | null = null;

  constructor(
    private host: HTMLElement,
    private spread: () => Spread,
    private field: () => string,
  ) {}

  /** Decorate what is there now and whatever the thermometer redraws later. */
  attach(): void {
    this.detach();
    this.decorate(true);
    const body = this.host.querySelector(".nbd-body");
    const head = this.host.querySelector(".nbd-head");
    if (typeof MutationObserver === "undefined" || !body || !head) return;
    this.observer = new MutationObserver(() => this.decorate(false));
    this.observer.observe(body, { childList: true });
    this.observer.observe(head, { childList: true });
  }

  detach(): void {
    this.observer?.disconnect();
    this.observer = null;
  }

  /** Add missing cells (`all`: redo every cell, e.g. after the stat changed). */
  decorate(all: boolean): void {
    const field = this.field();
    const spread = this.spread();
    const head = this.host.querySelector(".nbd-head");
    if (head) {
      let hc = head.querySelector(":scope > .nbd-h-spread");
      if (hc && all) {
        hc.remove();
        hc = null;
      }
      if (!hc) {
        head.appendChild(h("div", { class: "nbd-h nbd-h-spread", text: `${field} across ranks`, title: "min … max over the ranks, at each rank's last kept step (bold: the ranks differ)" }));
      }
    }
    for (const row of Array.from(this.host.querySelectorAll(".nbd-body > .nbd-row"))) {
      const old = row.querySelector(":scope > .nbd-spread-cell");
      if (old && !all) continue;
      old?.remove();
      row.appendChild(spreadCell(spread, rowName(row), field));
    }
  }
}
