// Layer thermometer: one row per captured layer output in execution order, with activation
// statistics on a shared symlog scale, zero fraction, NaN/Inf counts, gradient norms and
// diagnosis flags. Clicking a row selects it (synced `selected`) and fetches its histogram on
// demand. Python side: nbdebug/widgets/thermometer.py (ThermometerWidget) and thermometer_data.py
// (the history and histogram payloads; contract in their docstrings). This file builds the view and
// redraws it from the traits and the live history; user input is in thermometer/input.ts.
import { h, replaceChildren, styleElement } from "./lib/dom";
import { MORE_CSS, MoreCue } from "./lib/more";
import type { AnyModel } from "./lib/rpc";
import { renderFindings, renderHeadline, renderTimeline, Said, withCode, type Finding } from "./thermometer/cards";
import { buildHeader as drawHeader } from "./thermometer/header";
import { DetailPanel } from "./thermometer/histogram";
import type { HistEvent, Incident } from "./thermometer/history";
import { initialize, messageHandler, shared, SparkCache, sparkCell, SPARK_STATS, syncRows, syncTrait } from "./thermometer/live";
import { GroupsPanel } from "./thermometer/groups_widget";
import { bindInput } from "./thermometer/input";
import { ABLATE_CSS, AblateRow } from "./thermometer/ablate";
import { renderRaised, type Raised } from "./thermometer/raised";
import {
  StatTable,
  buildRow,
  computeScales,
  sortedOrder,
  type Layer,
  type Legend,
  type Scales,
} from "./thermometer/rows";
import { drawDiagnoses, drawLegend, textsAt, type At, type Texts } from "./thermometer/step_texts";
import { CSS } from "./thermometer/style";
import { timeMarks, Timeline, type Position } from "./thermometer/timeline";
import { Listeners } from "./lib/request";

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const root = h("div", { class: "nbdebug-thermometer" });
  const finding = h("div", { class: "nbd-finding", attrs: { role: "heading", "aria-level": 3 } });
  const findingsList = h("ol", { class: "nbd-findings" });
  const summary = h("div", { class: "nbd-summary" });
  const raisedBox = h("div", { class: "nbd-raised" });
  const notes = h("ul", { class: "nbd-notes" });
  const notesTitle = h("summary", { class: "nbd-notes-title" });
  const notesBox = h("details", { class: "nbd-notes-box" }, [notesTitle, notes]);
  const legendBox = h("div", { class: "nbd-legend" });
  const onlyBox = h("input", { attrs: { type: "checkbox", class: "nbd-only" } });
  const counter = h("span", { class: "nbd-count" });
  const sparkSel = h("select", { class: "nbd-spark-stat", title: "statistic of the over-time column" });
  const sparkLabel = h("label", { class: "nbd-spark-choice" }, ["over time: ", sparkSel]);
  const controls = h("div", { class: "nbd-controls" }, [counter, sparkLabel, h("label", {}, [onlyBox, "flagged only"])]);
  const timeline = new Timeline((pos) => pick(pos));
  const eventsList = h("ul", { class: "nbd-events", attrs: { "aria-label": "timeline of events" } });
  const head = h("div", { class: "nbd-head" });
  const body = h("div", { class: "nbd-body" });
  const nothing = h("div", { class: "nbd-nothing", text: "" });
  const table = h("div", { class: "nbd-table" }, [head, body, nothing]);
  const diagList = h("ul", { class: "nbd-diagnoses" });
  const diagTitle = h("summary", { class: "nbd-diag-title" });
  const diagBox = h("details", { class: "nbd-diag-box" }, [diagTitle, diagList]);
  let diagOpenFor: boolean | null = null; // whether the flags list was opened for "no findings" (then left to the user)
  // the grouped view hides the flat table while on; the table is rebuilt only when shown (1,600+ rows)
  const groups = new GroupsPanel(model, [table], () => {
    if (!groups.active && flatStale) drawFlat();
  });
  const errorBox = h("div", { class: "nbd-error" });
  const detail = new DetailPanel(model, () => {
    const c = getComputedStyle(root).getPropertyValue("--jp-brand-color1").trim();
    return c || "#1976d2";
  });
  const ablateRow = new AblateRow(model); // a selected row → ablate its module's output → Δ loss
  // the event list and the table keep their max-height, never silently: "N more ▾" under each
  const moreEvents = new MoreCue(eventsList, ":scope > li", "event");
  const moreRows = new MoreCue(table, ".nbd-row", "row");
  root.append(
    styleElement(CSS + ABLATE_CSS + MORE_CSS),
    finding,
    findingsList,
    summary,
    raisedBox,
    timeline.el,
    eventsList,
    moreEvents.el,
    notesBox,
    h("div", { class: "nbd-bar-row" }, [legendBox, controls]),
    errorBox,
    groups.el,
    table,
    moreRows.el,
    ablateRow.el,
    detail.el,
    diagBox,
  );
  const live = shared(model);
  const store = live.store;
  const sparks = new SparkCache();
  el.appendChild(root);

  let layers: Layer[] = [];
  let columns: string[] = [];
  let stats = new StatTable(null, [], 0);
  let rows: HTMLElement[] = [];
  let byName = new Map<string, number>();
  let current = ""; // the selection currently highlighted and shown
  let scales: Scales | null = null;
  let pos: Position = { slot: 0, whole: false };
  let timed = false; // the run has a history of 2+ kept steps (or is still running)
  let storeRow = new Map<string, number>(); // row name → history row
  let traitIndex = new Map<string, number>(); // row name → index in the `layers` trait (histogram requests)
  let flatStale = false; // the flat table's rows are not drawn for the current data (the grouped view is shown)
  let at: At | null = null; // the slider's position as the texts name it (null: no history)

  const reportError = (where: string, err: unknown) => {
    const msg = `${where}: ${err instanceof Error ? err.message : String(err)}`;
    errorBox.textContent = msg;
    try {
      model.set("js_error", msg);
      model.save_changes();
    } catch {
      /* ignore */
    }
  };

  const sparkStat = () => (timed ? String(model.get("spark_stat") || "mean") : "");
  function buildHeader(): void {
    drawHeader(head, scales, String(model.get("sort_by") ?? ""), Boolean(model.get("sort_desc")), sparkStat());
  }

  function applySort(): void {
    if (flatStale) return;
    const order = sortedOrder(layers, stats, String(model.get("sort_by") ?? ""), Boolean(model.get("sort_desc")));
    const frag = document.createDocumentFragment();
    for (const i of order) frag.appendChild(rows[i]);
    body.appendChild(frag);
    buildHeader();
  }

  function applyFilter(): void {
    const only = Boolean(model.get("flagged_only"));
    onlyBox.checked = only;
    let flagged = 0;
    layers.forEach((l, i) => {
      const isFlagged = (l.flags ?? []).length > 0;
      if (isFlagged) flagged++;
      if (!flatStale) rows[i].style.display = only && !isFlagged ? "none" : "";
    });
    counter.textContent = `${layers.length} layer outputs, ${flagged} flagged`;
    nothing.textContent = layers.length === 0 ? "no layer outputs were captured" : only && flagged === 0 ? "no flagged layers" : "";
    nothing.style.display = nothing.textContent ? "" : "none";
  }

  function select(name: string, opts: { scroll?: boolean; force?: boolean } = {}): void {
    if (name === current && !opts.force) return;
    groups.select(name);
    if (current && byName.has(current) && !flatStale) rows[byName.get(current)!]?.classList.remove("nbd-selected");
    current = name;
    ablateRow.show(byName.has(name) ? name : "");
    const i = byName.get(name);
    if (!name || i === undefined) {
      detail.clear();
      return;
    }
    if (!flatStale) {
      const row = rows[i];
      row.classList.add("nbd-selected");
      if (opts.scroll && typeof row.scrollIntoView === "function") row.scrollIntoView({ block: "nearest" });
    }
    // histograms are fetched by the row's index in the run's table (the same name at every step)
    void detail.show(traitIndex.get(name) ?? i, name, stats, columns, {
      at: at ? (at.whole ? "whole run" : `step ${at.step}`) : "",
      unavailable: String(model.get("histogram_note") ?? ""),
      statRow: i, // the row in the table at the position (a step's rows are the history's)
    });
  }

  /** The header, notes and diagnoses at the slider's position (step_texts.ts). */
  function texts(): Texts {
    const kernel: Texts = {
      summary: String(model.get("summary") ?? ""),
      notes: (model.get("notes") ?? []).map(String),
      diagnoses: model.get("diagnoses") ?? [],
    };
    const run = model.get("run_texts");
    return textsAt(at, Number(model.get("report_step") ?? 0), kernel, run && typeof run === "object" ? run : null, layers, stats, model.get("legend") ?? {});
  }

  /** The header, the ranked findings, the timeline, the table's line, notes and flags (advice said once). */
  function renderTexts(): void {
    const t = texts();
    const running = Boolean(model.get("running"));
    const findings: Finding[] = running ? store.findings : model.get("findings") ?? [];
    renderHeadline(finding, running ? store.headline : String(model.get("headline") ?? ""));
    const said = new Said();
    renderFindings(findingsList, findings, said);
    const incidents: Incident[] = model.get("incidents") ?? [];
    renderTimeline(eventsList, incidents.length ? incidents : store.incidents, (model.get("events") ?? []) as HistEvent[], said);
    replaceChildren(summary, withCode(t.summary));
    if (running && store.length) {
      const nan = store.firstNonfinite ? `, first NaN/Inf at step ${store.firstNonfinite}` : "";
      const gap = store.gap ? " (earlier steps appear when the cell ends)" : "";
      const where = pos.whole || pos.slot >= store.length - 1 ? "" : `; table at step ${store.step(pos.slot)}`;
      summary.textContent = `running: ${store.totalSteps} step${store.totalSteps === 1 ? "" : "s"} so far${nan}${gap}${where}`;
    }
    renderRaised(raisedBox, model.get("raised") as Partial<Raised> | undefined);
    const ns = t.notes;
    replaceChildren(notes, ns.map((n) => h("li", {}, withCode(String(n)))));
    notesTitle.textContent = `notes (${ns.length})`;
    notesBox.style.display = ns.length ? "" : "none";
    const legend = model.get("legend") ?? {};
    drawLegend(legendBox, legend, layers, t.diagnoses, stats);
    drawDiagnoses(diagList, legend, t.diagnoses, said);
    const where = at ? (at.whole ? "over the whole run" : `at step ${at.step}`) : "";
    diagTitle.textContent = `flags${where ? ` ${where}` : ""}: ${t.diagnoses.length ? t.diagnoses.length : "none"}`;
    diagBox.style.display = t.diagnoses.length ? "" : "none";
    const open = findings.length === 0; // the findings above say it: the per-flag list is a click away
    if (diagOpenFor !== open) diagBox.open = open;
    diagOpenFor = open;
  }

  /** Where the table is, from the `step` trait: 0 follows the last kept step, -1 is the whole run. */
  function position(): Position {
    const n = store.length;
    const step = Number(model.get("step") ?? 0);
    if (step < 0 && (model.get("layers") ?? []).length) return { slot: n - 1, whole: true };
    if (step > 0 && n) return { slot: store.slotOf(step), whole: false };
    return { slot: n - 1, whole: false };
  }

  function pick(p: Position): void {
    const n = store.length;
    const step = p.whole ? -1 : p.slot >= n - 1 ? 0 : store.step(p.slot);
    model.set("step", step);
    model.save_changes();
    schedule();
  }

  function renderSparkChoices(): void {
    const stat = String(model.get("spark_stat") || "mean");
    const choices = SPARK_STATS.filter((c) => store.hasField(c));
    replaceChildren(sparkSel, choices.map((c) => h("option", { text: c, attrs: { value: c, selected: c === stat } })));
    sparkSel.value = stat;
    sparkLabel.style.display = timed ? "" : "none";
  }

  /** Build the flat table's rows for the current data (layers, stats at the position). */
  function drawFlat(): void {
    flatStale = false;
    scales = computeScales(stats);
    const legend: Legend = model.get("legend") ?? {};
    const stat = sparkStat();
    const nan = timeMarks(store).filter((m) => m.cls === "nbd-mark-nan");
    rows = layers.map((l, i) => {
      const row = buildRow(l, i, stats, scales!, legend);
      if (stat) row.appendChild(sparkCell(store, storeRow.get(String(l.name)), stat, pos.whole ? undefined : pos.slot, nan, sparks));
      return row;
    });
    replaceChildren(body, []);
    applySort();
    applyFilter();
    const i = byName.get(current);
    if (current && i !== undefined) rows[i]?.classList.add("nbd-selected");
  }

  function rebuild(): void {
    errorBox.textContent = live.error;
    try {
      syncTrait(model);
      syncRows(model);
      const running = Boolean(model.get("running"));
      const merged: Layer[] = model.get("layers") ?? [];
      detail.reset(model.get("layers"));
      columns = model.get("columns") ?? [];
      traitIndex = new Map();
      merged.forEach((l, i) => traitIndex.has(String(l.name)) || traitIndex.set(String(l.name), i));
      storeRow = new Map(store.rows.map((r, i) => [String(r.name), i]));
      timed = store.length >= 2 || (running && store.length >= 1);
      root.classList.toggle("nbd-timed", timed);
      pos = position();
      let cols = columns;
      if (timed && !pos.whole) {
        // the table at one kept step, from the history already in the browser
        const calls = new Map(merged.map((l) => [String(l.name), Number(l.calls ?? 1)]));
        cols = [...columns, ...store.fields.filter((f) => !columns.includes(f))];
        layers = store.layersAt(pos.slot, calls);
        stats = store.tableAt(pos.slot, cols);
      } else {
        layers = merged;
        stats = new StatTable(model.get("stats"), columns, layers.length);
      }
      const total = store.totalSteps || (store.length ? store.step(store.length - 1) : 0);
      at = timed ? { whole: pos.whole, step: pos.whole ? 0 : store.step(pos.slot), total } : null;
      byName = new Map();
      layers.forEach((l, i) => {
        if (!byName.has(String(l.name))) byName.set(String(l.name), i);
      });
      groups.sync(model.get("legend") ?? {});
      // the flat table is drawn only when shown: with the grouped view on, a slider move at 1,600+
      // rows would otherwise rebuild every hidden row (drawn when the grouped view is switched off)
      flatStale = groups.active;
      if (flatStale) applyFilter(); // the counter (drawFlat applies the filter itself)
      else drawFlat();
      renderTexts();
      const incidents: Incident[] = model.get("incidents") ?? [];
      timeline.update(store, pos, running, merged.length > 0, incidents.length ? incidents : store.incidents, (model.get("events") ?? []) as HistEvent[],
                      running ? store.findings : ((model.get("findings") ?? []) as Finding[]));
      timeline.el.style.display = timed ? "" : "none";
      renderSparkChoices();
      columns = cols;
      current = "";
      select(String(model.get("selected") ?? ""), { scroll: true });
    } catch (err) {
      reportError("nbdebug thermometer", err);
    }
  }

  // Coalesce bursts of trait changes (a sync message sets several traits at once).
  let pending = false;
  const schedule = () => {
    if (pending) return;
    pending = true;
    queueMicrotask(() => {
      pending = false;
      rebuild();
    });
  };

  // clicks, keys, the checkbox and the statistic select (thermometer/input.ts)
  const unbindInput = bindInput(model, store, { head, body, diagList, onlyBox, sparkSel, findingsList, eventsList }, {
    rowName: (i) => String(layers[i]?.name ?? ""),
    current: () => current,
    has: (name) => byName.has(name),
    select,
    applySort,
    applyFilter,
    pick,
  });

  const onSelected = () => select(String(model.get("selected") ?? ""), { scroll: true });
  const onSortTrait = () => applySort();
  const subs: [string, () => void][] = [
    ["change:layers", schedule],
    ["change:stats", schedule],
    ["change:columns", schedule],
    ["change:legend", schedule],
    ["change:summary", renderTexts],
    ["change:notes", renderTexts],
    ["change:diagnoses", renderTexts],
    ["change:run_texts", renderTexts],
    ["change:report_step", renderTexts],
    ["change:headline", renderTexts],
    ["change:findings", renderTexts],
    ["change:has_grads", schedule],
    ["change:raised", schedule],
    ["change:history", schedule],
    ["change:live_rows", schedule],
    ["change:running", schedule],
    ["change:step", schedule],
    ["change:spark_stat", schedule],
    ["change:incidents", schedule],
    ["change:events", schedule],
    ["change:groups", schedule],
    ["change:flagged_only", applyFilter],
    ["change:sort_by", onSortTrait],
    ["change:sort_desc", onSortTrait],
    ["change:selected", onSelected],
    ["change:can_ablate", () => ablateRow.show(current)],
  ];
  const listeners = new Listeners(); // every model listener, removed by one dispose()
  for (const [ev, cb] of subs) listeners.model(model, ev, cb);
  // Live updates: the model-level listener (anywidget's initialize) or, without one, this view's.
  live.views.add(schedule);
  const onMsg = live.modelListener ? null : messageHandler(model);
  if (onMsg) listeners.model(model, "msg:custom", onMsg);

  rebuild();
  root.dataset.ready = "1";

  return () => {
    moreEvents.dispose();
    moreRows.dispose();
    listeners.dispose();
    unbindInput();
    live.views.delete(schedule);
    timeline.destroy();
    groups.destroy();
    detail.clear();
    root.remove();
  };
}

export default { initialize, render };
