// The grouped view mounted on a widget model: `renderGroups` (a standalone view of a `groups`
// trait: tests, any widget syncing groups_payload) and `GroupsPanel` (the grouped view inside the
// layer thermometer, with a "grouped" switch that hides the flat table; it follows the step slider
// and "whole run" from the history already in the browser: groups_step.ts). Traits read: `groups`
// (nbdebug/inspectors/groups.py groups_payload), `legend` (in the thermometer also `step`,
// `running`, `layers`, `stats`, `columns`); synced back: `selected`, `group_stat`.
import { h } from "../lib/dom";
import type { AnyModel } from "../lib/rpc";
import { GroupData, GroupView } from "./groups";
import { groupPosition, groupsAtSlot, groupsWhole } from "./groups_step";
import type { HistoryStore } from "./history";
import { shared } from "./live";
import { StatTable, type Layer, type Legend } from "./rows";
import { Listeners } from "../lib/request";

function viewFor(model: AnyModel, data: GroupData, legend: Legend): GroupView {
  return new GroupView(data, {
    legend,
    stat: model.get("group_stat") || undefined,
    onSelect: (name) => {
      model.set("selected", name);
      model.save_changes();
    },
    onStat: (stat) => {
      if (model.get("group_stat") === undefined) return;
      model.set("group_stat", stat);
      model.save_changes();
    },
  });
}

/** A standalone view of the model's `groups` trait (root `.nbdebug-groups`, `data-ready` when drawn). */
export function renderGroups({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const root = h("div", { class: "nbdebug-groups" });
  el.appendChild(root);
  let view: GroupView | null = null;
  const draw = () => {
    const data = new GroupData(model.get("groups") ?? {});
    if (view) view.update(data);
    else {
      view = viewFor(model, data, model.get("legend") ?? {});
      root.appendChild(view.el);
    }
  };
  draw();
  const onSel = () => view?.select(String(model.get("selected") ?? ""));
  const listeners = new Listeners(); // every model listener, removed by one dispose()
  listeners.model(model, "change:groups", draw);
  listeners.model(model, "change:selected", onSel);
  root.dataset.ready = "1";
  return () => {
    listeners.dispose();
    view?.destroy();
    root.remove();
  };
}

/**
 * The grouped view inside another view (the layer thermometer): shown when the `groups` trait has
 * groups, with a "grouped by blocks" switch; while it is on, the elements in `flat` are hidden.
 */
export class GroupsPanel {
  readonly el: HTMLElement;
  private body: HTMLElement;
  private toggle: HTMLInputElement;
  private view: GroupView | null = null;
  private trait: unknown = undefined;
  private base: GroupData | null = null; // the payload as sent
  private shownKey = "";
  private merged = { layers: null as unknown, stats: null as unknown, table: new StatTable(null, [], 0), version: 0 };
  private store: HistoryStore;

  /** The grouped view follows the slider of the thermometer on `model` (its shared HistoryStore);
   * `onToggle` runs after the switch changed (the thermometer draws its flat table when shown). */
  constructor(private model: AnyModel, private flat: HTMLElement[], private onToggle: () => void = () => {}) {
    this.store = shared(model).store;
    this.toggle = h("input", { attrs: { type: "checkbox", class: "nbd-grouped-toggle", checked: true } });
    this.body = h("div", { class: "nbd-groups-body" });
    this.el = h("div", { class: "nbd-groups-panel" }, [
      h("label", { class: "nbd-grouped-label", title: "rows grouped by the module tree; repeated blocks as one line" }, [this.toggle, " grouped by blocks"]),
      this.body,
    ]);
    this.toggle.addEventListener("change", this.toggled);
    this.el.style.display = "none";
  }

  /** Redraw when the `groups` trait or the position (step slider, whole run, new history) changed
   * (legend: the thermometer's flag legend). */
  sync(legend: Legend): void {
    const value = this.model.get("groups");
    if (value !== this.trait) {
      this.trait = value;
      const has = !!value && Array.isArray(value.strings) && !!value.group_name;
      this.base = has ? new GroupData(value) : null;
      this.shownKey = "";
    }
    if (!this.base) {
      this.view?.destroy();
      this.view = null;
    } else {
      const [key, data] = this.shown(this.base);
      if (key !== this.shownKey || !this.view) {
        this.shownKey = key;
        if (this.view) this.view.update(data());
        else {
          this.view = viewFor(this.model, data(), legend);
          this.body.appendChild(this.view.el);
        }
      }
    }
    this.apply();
  }

  /** The data at the thermometer's position, with a key that changes when it does. */
  private shown(base: GroupData): [string, () => GroupData] {
    const store = this.store;
    const pos = groupPosition(this.model, store);
    if (pos.kind === "slot") return [`slot ${pos.slot} v${store.version}`, () => groupsAtSlot(base, store, pos.slot)];
    if (pos.kind === "whole") {
      const m = this.merged;
      const layers = this.model.get("layers");
      const stats = this.model.get("stats");
      if (m.layers !== layers || m.stats !== stats) {
        const n = ((layers ?? []) as Layer[]).length;
        Object.assign(m, { layers, stats, table: new StatTable(stats, (this.model.get("columns") ?? []).map(String), n), version: m.version + 1 });
      }
      return [`whole v${m.version}`, () => groupsWhole(base, (m.layers ?? []) as Layer[], m.table)];
    }
    return ["payload", () => base];
  }

  /** Whether the grouped view is what the user sees. */
  get active(): boolean {
    return this.view !== null && this.toggle.checked;
  }

  select(name: string): void {
    if (this.active && name) this.view!.select(name);
  }

  destroy(): void {
    this.toggle.removeEventListener("change", this.toggled);
    this.view?.destroy();
    this.el.remove();
  }

  private toggled = () => {
    this.apply();
    this.onToggle();
  };

  private apply = () => {
    this.el.style.display = this.view ? "" : "none";
    this.body.style.display = this.active ? "" : "none";
    for (const e of this.flat) e.style.display = this.active ? "none" : "";
  };
}
