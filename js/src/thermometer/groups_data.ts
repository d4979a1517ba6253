// The grouped thermometer's data, decoded from the `groups` payload of nbdebug/inspectors/groups.py
// (`groups_payload`): names as a tree (node i = name(parent[i]) + strings[suffix[i]]), rows, groups
// of repeated blocks, one strip value per block and statistic. Same filter semantics as groups.match.
import { decode, type WireArray } from "../lib/ndarray";

export type Item = { kind: "row" | "group"; i: number };

export interface GroupInfo {
  name: string;
  parent: number; // enclosing block, -1 at the top level
  first: number; // first row (display order)
  flags: number;
  blocks: number[];
}

export interface BlockInfo {
  name: string;
  group: number;
  index: number;
  rows: number; // rows inside, nested groups included
  flags: number;
  items: Item[];
}

export interface Residual {
  group: number;
  d: number;
  largest_jump: string | null;
  first_nonfinite: string | null;
  notes: string[];
}

function arr(payload: Record<string, any>, key: string): ArrayLike<number> {
  const w = payload[key] as WireArray | undefined;
  if (!w || !w.view) return new Int32Array(0);
  return decode(w).data;
}

/** What {@link GroupData.retimed} replaces (arrays laid out as in the payload). */
export interface Retimed {
  values: Float32Array; // rows × rowFields
  rowFlags: Uint32Array; // bits over flagCodes
  flagCodes: string[];
  strip: Float32Array; // blocks × stripStats
  blockFlags: Uint32Array;
  groupFlags: Uint32Array;
  step: number | null;
  whole: boolean;
  residual: Residual | null;
  growth: ArrayLike<number>;
}

export class GroupData {
  readonly nodes: string[];
  readonly strings: string[];
  readonly rowFields: string[];
  readonly stripStats: string[];
  readonly flagCodes: string[];
  readonly severity: Record<string, number>;
  readonly residual: Residual | null;
  readonly notes: string[];
  /** The step the rows' values and flags are at (null: merged over the whole run). */
  readonly step: number | null;
  /** Values and flags merged over the whole run (the thermometer's "whole run" choice). */
  readonly whole: boolean = false;
  /** Values from the history at one kept step (the slider's), not the payload's own. */
  readonly timed: boolean = false;
  readonly groups: GroupInfo[] = [];
  readonly blocks: BlockInfo[] = [];
  readonly top: Item[] = [];
  readonly rowCount: number;
  private rowName: ArrayLike<number>;
  private rowModule: ArrayLike<number>;
  private rowType: ArrayLike<number>;
  private rowFlags: ArrayLike<number>;
  private rowsOf: number[][] | null = null;
  readonly owner: ArrayLike<number>;
  private values: ArrayLike<number>;
  private strip: ArrayLike<number>;
  readonly growth: ArrayLike<number>;
  /** Kept steps of the blocks' series (empty without a history) and the statistics they carry. */
  readonly histSteps: ArrayLike<number>;
  readonly histStats: string[];
  private hist: ArrayLike<number>;
  private histCol = new Map<number, number>(); // block → column of hist_strip (top-level groups' blocks)
  private lower: string[] | null = null;

  constructor(payload: Record<string, any>) {
    this.strings = (payload.strings ?? []).map(String);
    this.rowFields = (payload.row_fields ?? []).map(String);
    this.stripStats = (payload.strip_stats ?? []).map(String);
    this.flagCodes = (payload.flag_codes ?? []).map(String);
    this.severity = payload.severity ?? {};
    this.residual = payload.residual ?? null;
    this.notes = (payload.notes ?? []).map(String);
    this.step = typeof payload.step === "number" ? payload.step : null;
    const parent = arr(payload, "name_parent");
    const suffix = arr(payload, "name_suffix");
    this.nodes = new Array(parent.length);
    for (let i = 0; i < parent.length; i++) {
      const p = parent[i];
      this.nodes[i] = (p >= 0 ? this.nodes[p] : "") + (this.strings[suffix[i]] ?? "");
    }
    this.rowName = arr(payload, "row_name");
    this.rowModule = arr(payload, "row_module");
    this.rowType = arr(payload, "row_type");
    this.rowFlags = arr(payload, "row_flags");
    this.owner = arr(payload, "row_owner");
    this.values = arr(payload, "values");
    this.strip = arr(payload, "strip");
    this.growth = arr(payload, "residual_growth");
    this.histSteps = arr(payload, "hist_steps");
    this.histStats = (payload.hist_stats ?? []).map(String);
    this.hist = arr(payload, "hist_strip");
    Array.from(arr(payload, "hist_blocks")).forEach((b, j) => this.histCol.set(b, j));
    this.rowCount = this.rowName.length;
    const gName = arr(payload, "group_name");
    const gParent = arr(payload, "group_parent");
    const gFirst = arr(payload, "group_first");
    const gFlags = arr(payload, "group_flags");
    for (let g = 0; g < gName.length; g++) {
      this.groups.push({ name: this.nodes[gName[g]] ?? "", parent: gParent[g], first: gFirst[g], flags: gFlags[g], blocks: [] });
    }
    const bName = arr(payload, "block_name");
    const bGroup = arr(payload, "block_group");
    const bIndex = arr(payload, "block_index");
    const bRows = arr(payload, "block_rows");
    const bFlags = arr(payload, "block_flags");
    for (let b = 0; b < bName.length; b++) {
      this.blocks.push({ name: this.nodes[bName[b]] ?? "", group: bGroup[b], index: bIndex[b], rows: bRows[b], flags: bFlags[b], items: [] });
      this.groups[bGroup[b]]?.blocks.push(b);
    }
    // items of every owner in execution order: rows by index, groups by their first row
    const listOf = (o: number): Item[] => (o >= 0 ? this.blocks[o]?.items ?? this.top : this.top);
    for (let r = 0; r < this.rowCount; r++) listOf(this.owner[r]).push({ kind: "row", i: r });
    this.groups.forEach((g, i) => listOf(g.parent).push({ kind: "group", i }));
    const key = (it: Item) => (it.kind === "row" ? it.i : this.groups[it.i].first);
    const order = (a: Item, b: Item) => key(a) - key(b) || (a.kind === "group" ? -1 : 1);
    this.top.sort(order);
    for (const b of this.blocks) b.items.sort(order);
  }

  /** "at step 41" / "over the whole run" when the run has kept steps ("" otherwise). */
  get at(): string {
    if (this.whole) return "over the whole run";
    return this.step !== null && (this.timed || this.histSteps.length >= 2) ? `at step ${this.step}` : "";
  }

  /** Index of the shown step among the blocks' kept steps (the sparklines' cursor; undefined: whole run). */
  histCursor(): number | undefined {
    if (this.whole || this.step === null || this.histSteps.length < 2) return undefined;
    const s = this.step;
    for (let k = 0; k < this.histSteps.length; k++) if (this.histSteps[k] >= s) return k;
    return this.histSteps.length - 1;
  }

  /** Every row inside each block, nested groups' rows included (execution order). */
  blockRows(): number[][] {
    if (!this.rowsOf) {
      const out: number[][] = this.blocks.map(() => []);
      for (let r = 0; r < this.rowCount; r++) for (const b of this.blockChain(r)) out[b].push(r);
      this.rowsOf = out;
    }
    return this.rowsOf;
  }

  /** The same tree showing other values (the rows at another step, or the whole run). */
  retimed(p: Retimed): GroupData {
    const d: GroupData = Object.create(GroupData.prototype);
    Object.assign(d, this, {
      values: p.values,
      rowFlags: p.rowFlags,
      flagCodes: p.flagCodes,
      strip: p.strip,
      step: p.step,
      whole: p.whole,
      timed: true,
      residual: p.residual,
      growth: p.growth,
      blocks: this.blocks.map((b, i) => ({ ...b, flags: p.blockFlags[i] })),
      groups: this.groups.map((g, i) => ({ ...g, flags: p.groupFlags[i] })),
    });
    return d;
  }

  name(r: number): string {
    return this.nodes[this.rowName[r]] ?? "";
  }

  module(r: number): string {
    return this.nodes[this.rowModule[r]] ?? "";
  }

  type(r: number): string {
    return this.strings[this.rowType[r]] ?? "";
  }

  flags(r: number): string[] {
    return this.codes(this.rowFlags[r]);
  }

  /** Flag codes of a bitmask (rows, blocks and groups use the same bits). */
  codes(bits: number): string[] {
    const out: string[] = [];
    this.flagCodes.forEach((c, i) => {
      if ((bits >>> i) & 1) out.push(c);
    });
    return out;
  }

  value(r: number, field: string): number {
    const j = this.rowFields.indexOf(field);
    return j < 0 ? NaN : this.values[r * this.rowFields.length + j];
  }

  stripValue(b: number, stat: string): number {
    const j = this.stripStats.indexOf(stat);
    return j < 0 ? NaN : this.strip[b * this.stripStats.length + j];
  }

  /** Block `b`'s `stat` at every kept step (null: no series of `stat`, or a nested group's block). */
  series(b: number, stat: string): Float32Array | null {
    const j = this.histStats.indexOf(stat);
    const col = this.histCol.get(b);
    const K = this.histSteps.length;
    if (j < 0 || K < 2 || col === undefined) return null;
    const B = this.histCol.size;
    const S = this.histStats.length;
    const out = new Float32Array(K);
    for (let k = 0; k < K; k++) out[k] = this.hist[(k * B + col) * S + j];
    return out;
  }

  /** Strip statistics that some block has a value for. */
  availableStats(): string[] {
    return this.stripStats.filter((s) => this.blocks.some((_, b) => Number.isFinite(this.stripValue(b, s))));
  }

  /** The blocks holding row r, innermost first. */
  blockChain(r: number): number[] {
    const out: number[] = [];
    let b = this.owner[r];
    while (b >= 0 && out.length < 64) {
      out.push(b);
      b = this.groups[this.blocks[b].group]?.parent ?? -1;
    }
    return out;
  }

  /**
   * Rows matching every word of `query` (case-insensitive) in the full name, the type or a flag
   * code; `type:Linear`, `flag:dead`, `name:q_proj` look in one place only (as groups.match).
   */
  match(query: string): number[] {
    const words = query.toLowerCase().split(/\s+/).filter(Boolean);
    if (!this.lower) this.lower = Array.from({ length: this.rowCount }, (_, r) => this.name(r).toLowerCase());
    const out: number[] = [];
    for (let r = 0; r < this.rowCount; r++) {
      const hay: Record<string, string> = { name: this.lower[r], type: this.type(r).toLowerCase(), flag: this.flags(r).join(" ").toLowerCase() };
      const ok = words.every((w) => {
        const k = w.indexOf(":");
        const where = k > 0 ? w.slice(0, k) : "";
        if (where in hay) return hay[where].includes(w.slice(k + 1));
        return hay.name.includes(w) || hay.type.includes(w) || hay.flag.includes(w);
      });
      if (ok) out.push(r);
    }
    return out;
  }
}
