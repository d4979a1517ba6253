// The grouped thermometer: rows grouped by the module tree, repeated blocks (`model.layers.0 … 31`)
// collapsed into one line per container with a heat strip across blocks (the chosen statistic,
// shared lib colormaps), expandable to each block's rows; a filter over name/type/flag that finds
// rows inside collapsed groups. Drawn incrementally: only open groups/blocks have DOM, and a filter
// draws at most MAX_DRAWN rows. Model text goes through textContent only (dom.h).
// Python side: nbdebug/inspectors/groups.py (`groups_payload`).
import { cssColor } from "../lib/colormap";
import { fmt, h, replaceChildren, styleElement } from "../lib/dom";
import { MORE_CSS, MoreCue } from "../lib/more";
import { GroupData, type Item } from "./groups_data";
import { groupSeries, LABELS, label, makeScaler, sparkEl, statFor, stripEl, type Scaler } from "./groups_strip";
import { GROUPS_CSS } from "./groups_style";
import { chip, type Legend } from "./rows";

export { GroupData } from "./groups_data";

/** Rows drawn at most while filtering (the count says how many matched). */
export const MAX_DRAWN = 400;
export interface GroupOptions {
  legend?: Legend;
  /** Strip statistic; default: residual when present, else the worst flag if any, else mean std. */
  stat?: string;
  onSelect?: (name: string) => void;
  onStat?: (stat: string) => void;
}

export class GroupView {
  readonly el: HTMLElement;
  private list: HTMLElement;
  private more: MoreCue;
  private filterBox: HTMLInputElement;
  private statSel: HTMLSelectElement;
  private counter: HTMLElement;
  private data: GroupData;
  private opts: GroupOptions;
  private stat: string;
  private query = "";
  private openGroups = new Set<number>();
  private openBlocks = new Set<number>();
  private scalers = new Map<number, Scaler>();
  private drawn = 0;
  private selected = "";
  private hitCount = new Map<number, number>(); // block → matching rows inside it (while filtering)

  constructor(data: GroupData, opts: GroupOptions = {}) {
    this.data = data;
    this.opts = opts;
    this.stat = this.defaultStat(opts.stat);
    this.filterBox = h("input", {
      class: "nbd-group-filter",
      attrs: { type: "search", placeholder: "filter: name, type:Linear, flag:dead", "aria-label": "filter rows" },
    });
    this.statSel = h("select", { class: "nbd-group-stat", title: "statistic of the strips (one cell per block)" });
    this.counter = h("span", { class: "nbd-group-count" });
    this.list = h("div", { class: "nbd-group-list", attrs: { role: "tree" } });
    this.more = new MoreCue(this.list, "[role=treeitem], .nbd-grow", "row"); // never hides rows silently
    this.el = h("div", { class: "nbd-groups" }, [
      styleElement(GROUPS_CSS + MORE_CSS),
      h("div", { class: "nbd-group-controls" }, [this.filterBox, h("label", {}, ["strip: ", this.statSel]), this.counter]),
      this.list,
      this.more.el,
    ]);
    this.filterBox.addEventListener("input", this.onInput);
    this.statSel.addEventListener("change", this.onStatChange);
    this.list.addEventListener("click", this.onClick);
    this.list.addEventListener("keydown", this.onKey);
    this.draw();
  }

  /** New data (keeps open groups/blocks by name, the filter and the statistic when still present). */
  update(data: GroupData): void {
    const groups = new Set([...this.openGroups].map((g) => this.data.groups[g]?.name));
    const blocks = new Set([...this.openBlocks].map((b) => this.data.blocks[b]?.name));
    this.data = data;
    this.openGroups = new Set(data.groups.flatMap((g, i) => (groups.has(g.name) ? [i] : [])));
    this.openBlocks = new Set(data.blocks.flatMap((b, i) => (blocks.has(b.name) ? [i] : [])));
    if (!data.stripStats.includes(this.stat)) this.stat = this.defaultStat();
    this.draw();
  }

  setStat(stat: string): void {
    if (stat === this.stat || !this.data.stripStats.includes(stat)) return;
    this.stat = stat;
    this.draw();
  }

  setFilter(query: string): void {
    this.query = query;
    if (this.filterBox.value !== query) this.filterBox.value = query;
    this.draw();
  }

  /** Open or close group `g` (toggles when `open` is undefined). */
  toggleGroup(g: number, open?: boolean): void {
    const now = open ?? !this.openGroups.has(g);
    if (now) this.openGroups.add(g);
    else this.openGroups.delete(g);
    const line = this.list.querySelector<HTMLElement>(`.nbd-grp[data-group="${g}"]`);
    if (!line || this.query) return this.draw();
    line.classList.toggle("nbd-open", now);
    line.setAttribute("aria-expanded", String(now));
    const next = line.nextElementSibling;
    if (next && next.classList.contains("nbd-grp-body")) next.remove();
    if (now) line.after(this.groupBody(g, null, this.depth(line) + 1));
  }

  /** Open or close block `b` (and open its group and the blocks above it). */
  toggleBlock(b: number, open?: boolean): void {
    const now = open ?? !this.openBlocks.has(b);
    if (now) this.openBlocks.add(b);
    else this.openBlocks.delete(b);
    const g = this.data.blocks[b]?.group;
    if (now && g !== undefined && !this.openGroups.has(g)) {
      // open everything above it, then draw once
      let p = this.data.groups[g].parent;
      this.openGroups.add(g);
      while (p >= 0) {
        this.openBlocks.add(p);
        this.openGroups.add(this.data.blocks[p].group);
        p = this.data.groups[this.data.blocks[p].group].parent;
      }
      return this.draw();
    }
    const line = this.list.querySelector<HTMLElement>(`.nbd-blk[data-block="${b}"]`);
    if (!line || this.query) return this.draw();
    line.classList.toggle("nbd-open", now);
    line.setAttribute("aria-expanded", String(now));
    const next = line.nextElementSibling;
    if (next && next.classList.contains("nbd-blk-body")) next.remove();
    if (now) line.after(this.blockBody(b, null, this.depth(line) + 1));
  }

  /** Highlight the row named `name`, opening the blocks that hold it. */
  select(name: string): void {
    this.selected = name;
    const r = Array.from({ length: this.data.rowCount }, (_, i) => i).find((i) => this.data.name(i) === name);
    if (r !== undefined) {
      const chain = this.data.blockChain(r);
      if (chain.some((b) => !this.openBlocks.has(b))) {
        for (const b of chain) {
          this.openBlocks.add(b);
          this.openGroups.add(this.data.blocks[b].group);
        }
        this.draw();
      }
    }
    this.list.querySelectorAll(".nbd-grow.nbd-selected").forEach((e) => e.classList.remove("nbd-selected"));
    const line = r === undefined ? null : this.list.querySelector<HTMLElement>(`.nbd-grow[data-row="${r}"]`);
    line?.classList.add("nbd-selected");
    if (line && typeof line.scrollIntoView === "function") line.scrollIntoView({ block: "nearest" });
  }

  destroy(): void {
    this.more.dispose();
    this.filterBox.removeEventListener("input", this.onInput);
    this.statSel.removeEventListener("change", this.onStatChange);
    this.list.removeEventListener("click", this.onClick);
    this.list.removeEventListener("keydown", this.onKey);
    this.el.remove();
  }

  // -- drawing ------------------------------------------------------------------------------------
  private defaultStat(want?: string): string {
    const avail = this.data.availableStats();
    if (want && this.data.stripStats.includes(want)) return want;
    if (avail.includes("residual")) return "residual";
    if (this.data.flagCodes.length && avail.includes("severity")) return "severity";
    return avail.includes("std") ? "std" : avail[0] ?? "severity";
  }

  private draw(): void {
    this.scalers.clear();
    this.drawn = 0;
    const avail = this.data.availableStats();
    replaceChildren(
      this.statSel,
      (avail.length ? avail : [this.stat]).map((s) => h("option", { text: LABELS[s] ?? s, attrs: { value: s, selected: s === this.stat } })),
    );
    this.statSel.value = this.stat;
    const d = this.data;
    if (!this.query) {
      replaceChildren(this.list, this.items(d.top, null, 0));
      const at = d.at ? ` (values and flags ${d.at})` : "";
      this.counter.textContent = `${d.rowCount} rows, ${d.groups.length} group${d.groups.length === 1 ? "" : "s"} of repeated blocks${at}`;
      return;
    }
    const hits = new Set(d.match(this.query));
    this.hitCount.clear();
    hits.forEach((r) => d.blockChain(r).forEach((b) => this.hitCount.set(b, (this.hitCount.get(b) ?? 0) + 1)));
    replaceChildren(this.list, this.items(d.top, hits, 0));
    const more = hits.size - this.drawn;
    if (more > 0) this.list.appendChild(h("div", { class: "nbd-group-more", text: `… ${more} more matches: refine the filter` }));
    this.counter.textContent = `${hits.size} of ${d.rowCount} rows match`;
    if (!hits.size) this.list.appendChild(h("div", { class: "nbd-group-none", text: "no row matches the filter" }));
  }

  /** Lines for `items` (with `hits`: only rows that match and groups/blocks holding a match). */
  private items(items: Item[], hits: Set<number> | null, depth: number): HTMLElement[] {
    const out: HTMLElement[] = [];
    for (const it of items) {
      if (it.kind === "row") {
        if (hits && !hits.has(it.i)) continue;
        if (hits && this.drawn >= MAX_DRAWN) break;
        this.drawn++;
        out.push(this.rowLine(it.i, depth));
      } else {
        const blocks = hits ? this.data.groups[it.i].blocks.filter((b) => this.blockHits(b, hits) > 0) : null;
        if (blocks && !blocks.length) continue;
        const line = this.groupLine(it.i, depth, blocks ? blocks.reduce((s, b) => s + this.blockHits(b, hits!), 0) : -1);
        out.push(line);
        if (hits || this.openGroups.has(it.i)) {
          line.classList.add("nbd-open");
          line.setAttribute("aria-expanded", "true");
          out.push(this.groupBody(it.i, hits, depth + 1));
        }
      }
    }
    return out;
  }

  private blockHits(b: number, _hits: Set<number>): number {
    return this.hitCount.get(b) ?? 0;
  }

  private indent(depth: number): Record<string, string> {
    return { "padding-left": `${0.3 + depth * 1.1}em` };
  }

  private depth(line: HTMLElement): number {
    return Number(line.getAttribute("data-depth") ?? 0);
  }

  private relative(name: string, depth: number, owner: number): string {
    const base = owner >= 0 ? this.data.blocks[owner].name : "";
    return depth > 0 && base && name.startsWith(base) ? name.slice(base.length).replace(/^\./, "") || "(output)" : name;
  }

  private rowLine(r: number, depth: number): HTMLElement {
    const d = this.data;
    const name = d.name(r);
    const module = d.module(r);
    const flags = d.flags(r);
    const type = d.type(r);
    const v = (f: string) => d.value(r, f);
    const title = `${name}${module && module !== name ? `\nmodule ${module}` : ""}${type ? `\n${type}` : ""}`;
    const line = h("div", {
      class: ["nbd-grow", flags.length > 0 && "nbd-flagged", name === this.selected && "nbd-selected"],
      style: this.indent(depth),
      data: { row: r, depth },
      attrs: { role: "treeitem", tabindex: 0 },
    }, [
      h("span", { class: "nbd-gname", text: this.relative(name, depth, d.owner[r]), title }),
      h("span", { class: "nbd-gtype", text: type, title: type }),
      h("span", { class: "nbd-gstat", text: `${fmt(v("mean"))} ± ${fmt(v("std"))}`, title: `mean ± std\nmin ${fmt(v("min"))} … max ${fmt(v("max"))}` }),
      h("span", { class: "nbd-gstat", text: Number.isNaN(v("grad_norm")) ? "—" : `‖∇‖ ${fmt(v("grad_norm"))}`, title: "gradient norm" }),
      h("span", { class: "nbd-gflags" }, flags.map((f) => chip(this.opts.legend ?? {}, f))),
    ]);
    return line;
  }

  private groupLine(g: number, depth: number, matches: number): HTMLElement {
    const d = this.data;
    const grp = d.groups[g];
    const res = d.residual && d.residual.group === g ? d.residual : null;
    const shown = this.relative(grp.name, depth, grp.parent) || "(model)"; // the model itself holds the blocks
    return h("div", {
      class: "nbd-grp",
      style: this.indent(depth),
      data: { group: g, depth },
      attrs: { role: "treeitem", "aria-expanded": "false", tabindex: 0 },
    }, [
      h("span", { class: "nbd-toggle", text: "▸" }),
      h("span", { class: "nbd-gname", text: shown, title: `${grp.name}: ${grp.blocks.length} blocks` }),
      h("span", { class: "nbd-gcount", text: `×${grp.blocks.length}` }),
      this.strip(g),
      this.spark(this.groupSeries(g), `${grp.name}: largest ${label(this.statFor(g))} over its blocks`, this.statFor(g)),
      matches >= 0 ? h("span", { class: "nbd-gmatch", text: `${matches} match${matches === 1 ? "" : "es"}` }) : null,
      res?.largest_jump ? h("span", { class: "nbd-gnote", text: `largest jump: ${res.largest_jump}`, title: "residual stream: the block whose output grew most relative to the previous block" }) : null,
      res?.first_nonfinite ? h("span", { class: "nbd-gnote nbd-bad", text: `NaN/Inf from ${res.first_nonfinite}` }) : null,
      h("span", { class: "nbd-gflags" }, d.codes(grp.flags).map((f) => chip(this.opts.legend ?? {}, f))),
    ]);
  }

  private groupBody(g: number, hits: Set<number> | null, depth: number): HTMLElement {
    const body = h("div", { class: "nbd-grp-body", data: { group: g } });
    const scale = this.scaler(g);
    const stat = this.statFor(g);
    for (const b of this.data.groups[g].blocks) {
      if (hits && !this.blockHits(b, hits)) continue;
      const blk = this.data.blocks[b];
      const v = this.data.stripValue(b, stat);
      const t = scale(v);
      const open = hits !== null || this.openBlocks.has(b);
      const line = h("div", {
        class: ["nbd-blk", open && "nbd-open"],
        style: this.indent(depth),
        data: { block: b, depth },
        attrs: { role: "treeitem", "aria-expanded": String(open), tabindex: 0 },
      }, [
        h("span", { class: "nbd-toggle", text: "▸" }),
        h("span", { class: "nbd-gname", text: blk.name.slice(this.data.groups[g].name.length).replace(/^\./, "") || blk.name, title: blk.name }),
        h("span", { class: "nbd-swatch", style: { background: t === null ? "transparent" : cssColor("magma", t) } }),
        h("span", { class: "nbd-gstat", text: `${label(stat)} ${fmt(v)}` }),
        this.spark(this.data.series(b, stat), `${blk.name}: ${label(stat)}`, stat),
        h("span", { class: "nbd-gcount", text: `${blk.rows} rows` }),
        h("span", { class: "nbd-gflags" }, this.data.codes(blk.flags).map((f) => chip(this.opts.legend ?? {}, f))),
      ]);
      body.appendChild(line);
      if (open) body.appendChild(this.blockBody(b, hits, depth + 1));
    }
    return body;
  }

  private blockBody(b: number, hits: Set<number> | null, depth: number): HTMLElement {
    return h("div", { class: "nbd-blk-body", data: { block: b } }, this.items(this.data.blocks[b].items, hits, depth));
  }

  private groupSeries(g: number): Float32Array | null {
    return groupSeries(this.data, g, this.statFor(g));
  }

  private spark(y: Float32Array | null, what: string, stat: string): Element | null {
    return sparkEl(this.data, y, what, stat);
  }

  private statFor(g: number): string {
    return statFor(this.data, g, this.stat);
  }

  private scaler(g: number): Scaler {
    let s = this.scalers.get(g);
    if (!s) this.scalers.set(g, (s = makeScaler(this.data, g, this.statFor(g))));
    return s;
  }

  private strip(g: number): HTMLElement {
    return stripEl(this.data, g, this.statFor(g), this.scaler(g));
  }

  // -- events -------------------------------------------------------------------------------------
  private onInput = () => this.setFilter(this.filterBox.value);

  private onStatChange = () => {
    this.setStat(this.statSel.value);
    this.opts.onStat?.(this.stat);
  };

  /** Enter/Space open/close or select the focused line (focus stays on it after a redraw). */
  private onKey = (ev: KeyboardEvent) => {
    if (ev.key !== "Enter" && ev.key !== " ") return;
    const line = (ev.target as HTMLElement).closest(".nbd-grp, .nbd-blk, .nbd-grow") as HTMLElement | null;
    if (!line) return;
    ev.preventDefault();
    const sel = ["group", "block", "row"].map((k) => (line.hasAttribute(`data-${k}`) ? `[data-${k}="${line.getAttribute(`data-${k}`)}"]` : "")).join("");
    line.click();
    this.list.querySelector<HTMLElement>(`.${line.classList[0]}${sel}`)?.focus();
  };

  private onClick = (ev: Event) => {
    const t = ev.target as HTMLElement;
    const cell = t.closest(".nbd-cell") as HTMLElement | null;
    if (cell) return this.toggleBlock(Number(cell.getAttribute("data-block")), true);
    const grp = t.closest(".nbd-grp") as HTMLElement | null;
    if (grp) return this.toggleGroup(Number(grp.getAttribute("data-group")));
    const blk = t.closest(".nbd-blk") as HTMLElement | null;
    if (blk) return this.toggleBlock(Number(blk.getAttribute("data-block")));
    const row = t.closest(".nbd-grow") as HTMLElement | null;
    if (row) {
      const name = this.data.name(Number(row.getAttribute("data-row")));
      this.select(name);
      this.opts.onSelect?.(name);
    }
  };
}
