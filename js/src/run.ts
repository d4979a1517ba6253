// The view of a distributed run: a rank selector, the chosen rank's layer thermometer (the
// thermometer's own renderer, on a browser-side model of that rank: js/src/run/local.ts) with a
// per-row spread across ranks, the first NaN/Inf with its rank, step and module, the parameters that
// differ across ranks (buffers that differ by design apart), errors per rank and notes. The focus rank
// arrives in the `rank_state` trait; other ranks are fetched with the `rank` request when chosen.
// Python side: nbdebug/widgets/run.py (RunWidget); contract in its docstring.
import { h, replaceChildren, styleElement } from "./lib/dom";
import { rpc, type AnyModel } from "./lib/rpc";
import thermometer from "./thermometer";
import { withCode } from "./thermometer/cards";
import { CARRIED, LocalModel, restoreArrays } from "./run/local";
import { renderDiverged, renderErrors, renderNonFinite, renderSelector, type RankInfo } from "./run/panels";
import { SpreadColumn, type Spread } from "./run/spread";
import { RUN_CSS } from "./run/style";
import { Listeners } from "./lib/request";

interface Shown {
  rank: number;
  local: LocalModel;
  cleanup: () => void;
}

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const root = h("div", { class: "nbdebug-run" });
  const summary = h("div", { class: "nbd-run-summary" });
  const selector = h("div", { class: "nbd-run-selector" });
  const spreadSel = h("select", { class: "nbd-spread-stat", title: "statistic of the spread column" });
  const status = h("span", { class: "nbd-run-status" });
  const bar = h("div", { class: "nbd-run-bar" }, [selector, h("label", { class: "nbd-spread-choice" }, ["spread across ranks: ", spreadSel]), status]);
  const errorBox = h("div", { class: "nbd-run-error-box" });
  const nonfinite = h("div", { class: "nbd-run-nonfinite" });
  const diverged = h("div", { class: "nbd-run-diverged" });
  const errors = h("div", { class: "nbd-run-errors" });
  const notes = h("ul", { class: "nbd-run-notes" });
  const host = h("div", { class: "nbd-run-rank" });
  root.append(styleElement(RUN_CSS), summary, bar, errorBox, nonfinite, errors, diverged, notes, host);
  el.appendChild(root);

  const cache = new Map<number, LocalModel>();
  let shown: Shown | null = null;
  let loading: number | null = null;
  let wanted = Number(model.get("rank") ?? 0);
  let closed = false;
  const spreadField = () => String(model.get("spread_stat") || "mean");
  const spreadCol = new SpreadColumn(host, () => (model.get("spread") ?? {}) as Spread, spreadField);

  const reportError = (msg: string) => {
    errorBox.textContent = msg;
    try {
      model.set("js_error", msg);
      model.save_changes();
    } catch {
      /* ignore */
    }
  };

  function drawSelector(): void {
    renderSelector(selector, (model.get("ranks") ?? []) as RankInfo[], shown?.rank ?? wanted, loading);
    root.dataset.rank = shown ? String(shown.rank) : "";
  }

  function drawPanels(): void {
    replaceChildren(summary, withCode(String(model.get("summary") ?? "")));
    drawSelector();
    const fields: string[] = (model.get("spread") ?? {}).fields ?? [];
    const stat = spreadField();
    replaceChildren(spreadSel, fields.map((f) => h("option", { text: f, attrs: { value: f, selected: f === stat } })));
    spreadSel.value = stat;
    renderNonFinite(nonfinite, model.get("nonfinite") ?? []);
    renderDiverged(diverged, model.get("diverged") ?? [], model.get("buffers_differ") ?? [], Number(model.get("compared_step") ?? 0), Number(model.get("world_size") ?? 0));
    renderErrors(errors, model.get("errors") ?? []);
    const ns: string[] = model.get("notes") ?? [];
    replaceChildren(notes, ns.map((n) => h("li", {}, withCode(String(n)))));
    notes.style.display = ns.length ? "" : "none";
  }

  /** The rank sent up front (`rank_state`), cached like a fetched one. */
  function seedFromTrait(): void {
    const st = model.get("rank_state");
    if (st && typeof st === "object" && st.traits && !cache.has(Number(st.rank))) {
      cache.set(Number(st.rank), new LocalModel(Number(st.rank), st.traits, model));
    }
  }

  function mount(rank: number, local: LocalModel): void {
    if (shown?.local === local) return;
    const prev = shown;
    spreadCol.detach();
    if (prev) {
      for (const k of CARRIED) local.set(k, prev.local.get(k)); // same rows, same step: easy to compare
      prev.cleanup();
    }
    replaceChildren(host, []);
    const cleanup = thermometer.render({ model: local, el: host });
    shown = { rank, local, cleanup };
    spreadCol.attach();
  }

  /** Show `rank` (fetched on first use), optionally at `step` with row `layer` selected. */
  async function show(rank: number, opts: { step?: number; layer?: string } = {}): Promise<void> {
    wanted = rank;
    let local = cache.get(rank);
    if (!local) {
      loading = rank;
      status.textContent = `loading rank ${rank}…`;
      drawSelector();
      try {
        const ans = await rpc(model, "rank", { rank });
        local = new LocalModel(rank, restoreArrays(ans.result?.traits ?? {}, ans.arrays), model);
        cache.set(rank, local);
      } catch (err) {
        if (loading === rank) loading = null;
        status.textContent = "";
        reportError(`nbdebug run: rank ${rank}: ${err instanceof Error ? err.message : String(err)}`);
        drawSelector();
        return;
      }
      if (loading === rank) loading = null;
      if (closed || wanted !== rank) return; // another rank was chosen meanwhile
    }
    errorBox.textContent = "";
    status.textContent = "";
    mount(rank, local);
    if (opts.step) local.set("step", opts.step);
    if (opts.layer) local.set("selected", opts.layer);
    drawSelector();
  }

  function choose(rank: number, opts: { step?: number; layer?: string } = {}): void {
    void show(rank, opts);
    if (Number(model.get("rank")) !== rank) {
      model.set("rank", rank);
      model.save_changes();
    }
  }

  const onSelector = (ev: Event) => {
    const btn = (ev.target as HTMLElement).closest("[data-rank]") as HTMLButtonElement | null;
    if (!btn || btn.disabled) return;
    choose(Number(btn.getAttribute("data-rank")));
  };
  const onLink = (ev: Event) => {
    const link = (ev.target as HTMLElement).closest(".nbd-rank-link") as HTMLElement | null;
    if (!link) return;
    const step = Number(link.getAttribute("data-step")) || undefined;
    choose(Number(link.getAttribute("data-rank")), { step, layer: link.getAttribute("data-layer") || undefined });
  };
  const onSpread = () => {
    model.set("spread_stat", spreadSel.value);
    model.save_changes();
    spreadCol.decorate(true);
  };
  const onRankTrait = () => {
    const r = Number(model.get("rank") ?? 0);
    if (r !== wanted) void show(r);
  };
  const onSpreadTrait = () => {
    spreadSel.value = spreadField();
    spreadCol.decorate(true);
  };
  const onPanels = () => drawPanels();
  const onRankState = () => {
    seedFromTrait();
    if (!shown && cache.has(wanted)) void show(wanted);
  };
  selector.addEventListener("click", onSelector);
  nonfinite.addEventListener("click", onLink);
  errors.addEventListener("click", onLink);
  spreadSel.addEventListener("change", onSpread);
  const subs: [string, () => void][] = [
    ["change:rank", onRankTrait],
    ["change:spread_stat", onSpreadTrait],
    ["change:spread", onSpreadTrait],
    ["change:rank_state", onRankState],
    ...["ranks", "summary", "nonfinite", "diverged", "buffers_differ", "compared_step", "errors", "notes", "world_size"].map(
      (t) => [`change:${t}`, onPanels] as [string, () => void],
    ),
  ];
  const listeners = new Listeners(); // every model listener, removed by one dispose()
  for (const [ev, cb] of subs) listeners.model(model, ev, cb);

  try {
    drawPanels();
    seedFromTrait();
    const recorded = ((model.get("ranks") ?? []) as RankInfo[]).some((r) => r.recorded);
    if (recorded) void show(wanted);
    else host.textContent = "no rank recorded anything";
  } catch (err) {
    reportError(`nbdebug run: ${err instanceof Error ? err.message : String(err)}`);
  }
  root.dataset.ready = "1";

  return () => {
    closed = true;
    listeners.dispose();
    selector.removeEventListener("click", onSelector);
    nonfinite.removeEventListener("click", onLink);
    errors.removeEventListener("click", onLink);
    spreadSel.removeEventListener("change", onSpread);
    spreadCol.detach();
    shown?.cleanup();
    shown = null;
    root.remove();
  };
}

export default { render };
