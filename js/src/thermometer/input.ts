// User input of the layer thermometer (js/src/thermometer.ts): clicks on the header (sort), on a row
// (select; the same row again re-shows it), Enter/Space/arrow keys on the rows, diagnosis links
// (select the layer), incident and event links (the slider to that step, the layer selected), the
// "flagged only" checkbox and the over-time statistic select. Each writes the synced traits
// (`sort_by`, `sort_desc`, `selected`, `flagged_only`, `spark_stat`) and calls back into the view.
import type { AnyModel } from "../lib/rpc";
import { HEADERS } from "./header";
import type { HistoryStore } from "./history";
import type { Position } from "./timeline";
import { Listeners } from "../lib/request";

/** The view's elements that take input. */
export interface InputTargets {
  head: HTMLElement;
  body: HTMLElement;
  diagList: HTMLElement;
  onlyBox: HTMLInputElement;
  sparkSel: HTMLSelectElement;
  findingsList: HTMLElement;
  eventsList: HTMLElement;
}

/** What the input asks of the view (its state changes between calls: read it through these). */
export interface InputActions {
  /** The name of the layer drawn as row `i` (its `data-row`); "" for none. */
  rowName(i: number): string;
  /** The selection currently highlighted and shown. */
  current(): string;
  /** Whether the table at the slider's position has a row named `name`. */
  has(name: string): boolean;
  select(name: string, opts?: { scroll?: boolean; force?: boolean }): void;
  applySort(): void;
  applyFilter(): void;
  /** Move the slider (the `step` trait) to `p`. */
  pick(p: Position): void;
}

/** Listen to the view's input; returns the function that removes every listener. */
export function bindInput(model: AnyModel, store: HistoryStore, t: InputTargets, a: InputActions): () => void {
  const onHeadClick = (ev: Event) => {
    const target = (ev.target as HTMLElement).closest("[data-sort]") as HTMLElement | null;
    if (!target) return;
    const col = target.getAttribute("data-sort") ?? "";
    const spec = HEADERS.find((s) => s.sort === col);
    if (!col) {
      model.set("sort_by", "");
      model.set("sort_desc", false);
    } else if (String(model.get("sort_by") ?? "") === col) {
      model.set("sort_desc", !model.get("sort_desc"));
    } else {
      model.set("sort_by", col);
      model.set("sort_desc", spec ? Boolean(spec.desc) : true);
    }
    model.save_changes();
    a.applySort();
  };
  const onBodyClick = (ev: Event) => {
    const row = (ev.target as HTMLElement).closest(".nbd-row") as HTMLElement | null;
    if (!row) return;
    const i = Number(row.getAttribute("data-row"));
    const name = a.rowName(i);
    const again = name === a.current();
    a.select(name, { force: again });
    if (!again) {
      model.set("selected", name);
      model.save_changes();
    }
  };
  // Keyboard: Enter/Space select the focused row, arrows move through the visible rows.
  const onBodyKey = (ev: KeyboardEvent) => {
    const row = (ev.target as HTMLElement).closest(".nbd-row") as HTMLElement | null;
    if (!row) return;
    if (ev.key === "Enter" || ev.key === " ") {
      ev.preventDefault();
      row.click();
    } else if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
      ev.preventDefault();
      let next = (ev.key === "ArrowDown" ? row.nextElementSibling : row.previousElementSibling) as HTMLElement | null;
      while (next && next.style.display === "none") {
        next = (ev.key === "ArrowDown" ? next.nextElementSibling : next.previousElementSibling) as HTMLElement | null;
      }
      if (next) {
        next.focus();
        next.click();
      }
    }
  };
  const onDiagClick = (ev: Event) => {
    const link = (ev.target as HTMLElement).closest("[data-layer]") as HTMLElement | null;
    if (!link) return;
    const name = link.getAttribute("data-layer") ?? "";
    if (!a.has(name)) return;
    a.select(name, { scroll: true });
    model.set("selected", name);
    model.save_changes();
  };
  const onOnly = () => {
    model.set("flagged_only", t.onlyBox.checked);
    model.save_changes();
    a.applyFilter();
  };
  const onSpark = () => {
    model.set("spark_stat", t.sparkSel.value);
    model.save_changes();
  };
  const onJump = (ev: Event) => {
    const link = (ev.target as HTMLElement).closest(".nbd-link") ? ((ev.target as HTMLElement).closest("[data-step]") as HTMLElement | null) : null;
    if (!link) return;
    const step = Number(link.getAttribute("data-step"));
    if (step > 0 && store.length) a.pick({ slot: store.slotOf(step), whole: false });
    const layer = link.getAttribute("data-layer");
    if (layer) {
      model.set("selected", layer);
      model.save_changes();
    }
  };
  // Added and removed through one Listeners, so the two cannot drift apart.
  const listeners = new Listeners();
  const table: Array<[EventTarget, string, EventListener]> = [
    [t.head, "click", onHeadClick],
    [t.body, "click", onBodyClick],
    [t.body, "keydown", onBodyKey as EventListener],
    [t.diagList, "click", onDiagClick],
    [t.onlyBox, "change", onOnly],
    [t.sparkSel, "change", onSpark],
    [t.findingsList, "click", onJump],
    [t.eventsList, "click", onJump],
  ];
  for (const [target, type, handler] of table) listeners.dom(target, type, handler);
  return () => listeners.dispose();
}
