// Layer thermometer: one row per captured layer output in execution order, with activation
// statistics on a shared symlog scale, zero fraction, NaN/Inf counts, gradient norms and
// diagnosis flags. Clicking a row selects it (synced `selected`) and fetches its histogram on
// demand. Python side: nbdebug/widgets/thermometer.py (ThermometerWidget); contract in its docstring.
import { fmt, h, replaceChildren, styleElement, type Child } from "./lib/dom";
import type { AnyModel } from "./lib/rpc";
import { DetailPanel } from "./thermometer/histogram";
import { renderRaised, type Raised } from "./thermometer/raised";
import {
  StatTable,
  buildRow,
  chip,
  computeScales,
  flagColor,
  sortedOrder,
  type Diagnosis,
  type Layer,
  type Legend,
  type Scales,
} from "./thermometer/rows";
import { CSS } from "./thermometer/style";

interface HeaderSpec {
  label: string;
  sort: string;
  title: string;
  /** Sort direction on the first click (numbers: largest first). */
  desc?: boolean;
}

const HEADERS: HeaderSpec[] = [
  { label: "#", sort: "", title: "execution order (click to reset the sort)" },
  { label: "layer", sort: "name", title: "layer output (module name, [i] for tuple outputs)" },
  { label: "type", sort: "type", title: "module type" },
  { label: "shape", sort: "shape", title: "output shape", desc: true },
  { label: "activations", sort: "std", title: "mean ± std (box), min … max (line), shared symlog scale", desc: true },
  { label: "zeros", sort: "zero_frac", title: "fraction of exact zeros", desc: true },
  { label: "NaN / Inf", sort: "nonfinite", title: "non-finite values (∇ = in the gradient)", desc: true },
  { label: "‖∇‖", sort: "grad_norm", title: "gradient norm of the output (log scale)", desc: true },
  { label: "flags", sort: "flags", title: "diagnoses for this layer", desc: true },
];

/** Text with `code` spans (backticks), as text nodes only. */
function withCode(text: string): Child[] {
  return String(text ?? "")
    .split("`")
    .map((part, i) => (i % 2 === 1 ? h("code", { text: part }) : part))
    .filter((c) => c !== "");
}

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const root = h("div", { class: "nbdebug-thermometer" });
  const summary = h("div", { class: "nbd-summary" });
  const raisedBox = h("div", { class: "nbd-raised" });
  const notes = h("ul", { class: "nbd-notes" });
  const legendBox = h("div", { class: "nbd-legend" });
  const onlyBox = h("input", { attrs: { type: "checkbox", class: "nbd-only" } });
  const counter = h("span", { class: "nbd-count" });
  const controls = h("div", { class: "nbd-controls" }, [counter, h("label", {}, [onlyBox, "flagged only"])]);
  const head = h("div", { class: "nbd-head" });
  const body = h("div", { class: "nbd-body" });
  const nothing = h("div", { class: "nbd-nothing", text: "" });
  const table = h("div", { class: "nbd-table" }, [head, body, nothing]);
  const diagList = h("ul", { class: "nbd-diagnoses" });
  const errorBox = h("div", { class: "nbd-error" });
  const detail = new DetailPanel(model, () => {
    const c = getComputedStyle(root).getPropertyValue("--jp-brand-color1").trim();
    return c || "#1976d2";
  });
  root.append(
    styleElement(CSS),
    summary,
    raisedBox,
    notes,
    h("div", { class: "nbd-bar-row" }, [legendBox, controls]),
    errorBox,
    table,
    detail.el,
    diagList,
  );
  el.appendChild(root);

  let layers: Layer[] = [];
  let columns: string[] = [];
  let stats = new StatTable(null, [], 0);
  let rows: HTMLElement[] = [];
  let byName = new Map<string, number>();
  let current = ""; // the selection currently highlighted and shown
  let scales: Scales | null = null;

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

  function buildHeader(): void {
    const sortBy = String(model.get("sort_by") ?? "");
    const desc = Boolean(model.get("sort_desc"));
    const cells = HEADERS.map((spec) => {
      const active = spec.sort === sortBy;
      const arrow = active && spec.sort !== "" ? (desc ? " ▼" : " ▲") : "";
      const cell = h("div", { class: ["nbd-h", active && "nbd-sorted"], title: spec.title, data: { sort: spec.sort } }, [
        spec.label + arrow,
      ]);
      if (spec.label === "activations" && scales) {
        // Sub-sorts and a tick axis of the shared scale.
        const sub = h("span", { class: "nbd-sub" }, ["(", ...["mean", "min", "max"].map((c) => h("span", { text: c, data: { sort: c }, class: c === sortBy ? "nbd-sorted" : "" })), ")"]);
        cell.appendChild(sub);
        const axis = h("div", { class: "nbd-axis" });
        let last = -Infinity;
        for (const t of scales.act.ticks(6)) {
          const pos = scales.act.clamped(t);
          if (pos - last < 9) continue; // labels would overlap
          last = pos;
          // Labels at the ends are anchored inside the cell instead of centred on the tick.
          const shift = pos < 5 ? "0" : pos > 95 ? "-100%" : "-50%";
          axis.appendChild(h("span", { text: fmt(t), style: { left: `${pos.toFixed(2)}%`, transform: `translateX(${shift})` } }));
        }
        cell.appendChild(axis);
      }
      return cell;
    });
    replaceChildren(head, cells);
  }

  function applySort(): void {
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
      rows[i].style.display = only && !isFlagged ? "none" : "";
    });
    counter.textContent = `${layers.length} layer outputs, ${flagged} flagged`;
    nothing.textContent = layers.length === 0 ? "no layer outputs were captured" : only && flagged === 0 ? "no flagged layers" : "";
    nothing.style.display = nothing.textContent ? "" : "none";
  }

  function select(name: string, opts: { scroll?: boolean; force?: boolean } = {}): void {
    if (name === current && !opts.force) return;
    if (current && byName.has(current)) rows[byName.get(current)!]?.classList.remove("nbd-selected");
    current = name;
    const i = byName.get(name);
    if (!name || i === undefined) {
      detail.clear();
      return;
    }
    const row = rows[i];
    row.classList.add("nbd-selected");
    if (opts.scroll && typeof row.scrollIntoView === "function") row.scrollIntoView({ block: "nearest" });
    void detail.show(i, name, stats, columns);
  }

  function renderTexts(): void {
    replaceChildren(summary, withCode(String(model.get("summary") ?? "")));
    renderRaised(raisedBox, model.get("raised") as Partial<Raised> | undefined);
    const ns: string[] = model.get("notes") ?? [];
    replaceChildren(notes, ns.map((n) => h("li", {}, withCode(String(n)))));
    notes.style.display = ns.length ? "" : "none";
    const legend: Legend = model.get("legend") ?? {};
    const present = new Set(layers.flatMap((l) => l.flags ?? []));
    const diags: Diagnosis[] = model.get("diagnoses") ?? [];
    for (const d of diags) present.add(d.code);
    replaceChildren(
      legendBox,
      Object.entries(legend).map(([code, e]) =>
        h("span", { class: ["nbd-legend-item", !present.has(code) && "nbd-absent"], title: e.description ?? code, data: { code } }, [
          h("span", { class: "nbd-swatch", style: { background: flagColor(legend, code) } }),
          e.label || code,
        ]),
      ),
    );
    replaceChildren(
      diagList,
      diags.map((d) =>
        h("li", { class: `nbd-sev-${d.severity}`, style: { "--nbd-chip": flagColor(legend, d.code) } }, [
          h("div", {}, [
            h("span", { class: "nbd-sev", text: d.severity }),
            chip(legend, d.code),
            d.layer ? h("span", { class: "nbd-link", text: d.layer, data: { layer: d.layer }, title: "show this layer" }) : null,
            d.layer ? " — " : null,
            ...withCode(d.message),
          ]),
          d.suggestion ? h("div", { class: "nbd-suggestion" }, withCode(d.suggestion)) : null,
        ]),
      ),
    );
  }

  function rebuild(): void {
    errorBox.textContent = "";
    try {
      layers = model.get("layers") ?? [];
      columns = model.get("columns") ?? [];
      stats = new StatTable(model.get("stats"), columns, layers.length);
      scales = computeScales(stats);
      const legend: Legend = model.get("legend") ?? {};
      rows = layers.map((l, i) => buildRow(l, i, stats, scales!, legend));
      byName = new Map();
      layers.forEach((l, i) => {
        if (!byName.has(String(l.name))) byName.set(String(l.name), i);
      });
      replaceChildren(body, []);
      applySort();
      applyFilter();
      renderTexts();
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
    applySort();
  };
  const onBodyClick = (ev: Event) => {
    const row = (ev.target as HTMLElement).closest(".nbd-row") as HTMLElement | null;
    if (!row) return;
    const i = Number(row.getAttribute("data-row"));
    const name = String(layers[i]?.name ?? "");
    const again = name === current;
    select(name, { force: again });
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
    if (!byName.has(name)) return;
    select(name, { scroll: true });
    model.set("selected", name);
    model.save_changes();
  };
  const onOnly = () => {
    model.set("flagged_only", onlyBox.checked);
    model.save_changes();
    applyFilter();
  };
  head.addEventListener("click", onHeadClick);
  body.addEventListener("click", onBodyClick);
  body.addEventListener("keydown", onBodyKey);
  diagList.addEventListener("click", onDiagClick);
  onlyBox.addEventListener("change", onOnly);

  const onSelected = () => select(String(model.get("selected") ?? ""), { scroll: true });
  const onSortTrait = () => applySort();
  const subs: [string, () => void][] = [
    ["change:layers", schedule],
    ["change:stats", schedule],
    ["change:columns", schedule],
    ["change:legend", schedule],
    ["change:summary", schedule],
    ["change:notes", schedule],
    ["change:diagnoses", schedule],
    ["change:has_grads", schedule],
    ["change:raised", schedule],
    ["change:flagged_only", applyFilter],
    ["change:sort_by", onSortTrait],
    ["change:sort_desc", onSortTrait],
    ["change:selected", onSelected],
  ];
  for (const [ev, cb] of subs) model.on(ev, cb);

  rebuild();
  root.dataset.ready = "1";

  return () => {
    for (const [ev, cb] of subs) model.off(ev, cb);
    head.removeEventListener("click", onHeadClick);
    body.removeEventListener("click", onBodyClick);
    body.removeEventListener("keydown", onBodyKey);
    diagList.removeEventListener("click", onDiagClick);
    onlyBox.removeEventListener("change", onOnly);
    detail.clear();
    root.remove();
  };
}

export default { render };
