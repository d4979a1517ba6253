// The per-step history of the thermometer, mirrored in the browser. Python side:
// nbdebug/widgets/thermometer_data.py (`history` trait and `history` custom messages, same layout).
//
// Filled from the `history` trait (final state, saved notebooks) and, while the cell runs, from
// custom messages {type: "history", from, reset, ...} that carry only the new slots: slots from
// `from` on are replaced, everything before is kept. A reset replaces the whole store (after the
// kernel decimated its history, or downsampled what the browser holds). The kernel cannot answer
// while the cell runs, so everything the slider and the sparklines need is here.
import { decode, type DType, type NdArray, type WireArray } from "../lib/ndarray";
import { StatTable, type Layer } from "./rows";

export interface RowInfo {
  name: string;
  module?: string;
  type?: string;
  shape?: number[];
  dtype?: string;
}

export interface Incident {
  kind: string;
  step: number;
  module?: string | null;
  row?: string | null;
  phase?: string | null;
  message: string;
  value?: number | null;
}

/** One finding as the kernel sends it (nbdebug.inspectors.findings.as_json), ranked root cause first. */
export interface Finding {
  code: string;
  severity: string;
  step: number;
  rows: string[];
  text: string;
  short: string;
  detail: string;
  advice: string;
  /** Index of the finding this one follows from (-1: a root cause). */
  cause: number;
}

export interface HistEvent {
  step: number;
  row: string;
  code: string;
  message: string;
  suggestion?: string;
}

/** One kept slot: the bucket's last step, its values (rows × fields) and optional min/max band. */
interface Slot {
  step: number;
  rows: number;
  last: Float32Array;
  lo: Float32Array | null;
  hi: Float32Array | null;
  flags: Uint16Array | null;
  loss: number;
  lossLo: number;
  lossHi: number;
  lr: number;
  skipped: number;
}

interface ArrayMeta {
  dtype: DType;
  shape: number[];
  buffer: number;
}

/** JSON part shared by the trait and the messages (arrays travel as wire arrays or buffers). */
export interface HistoryPayload {
  fields?: string[];
  rows?: RowInfo[];
  rows_from?: number;
  flag_bits?: Record<string, number>;
  total_steps?: number;
  first_nonfinite_step?: number;
  group?: number;
  incidents?: Incident[];
  findings?: Finding[];
  headline?: string;
  from?: number;
  reset?: boolean;
  [k: string]: unknown;
}

const ARRAYS = ["steps", "last", "lo", "hi", "flags", "loss", "loss_lo", "loss_hi", "lr", "skipped"] as const;

export class HistoryStore {
  fields: string[] = [];
  rows: RowInfo[] = [];
  flagBits: Record<string, number> = {};
  totalSteps = 0;
  firstNonfinite = 0;
  /** Kept slots per browser slot (1 unless the kernel downsampled what it sends). */
  group = 1;
  incidents: Incident[] = [];
  /** The findings and header of the steps so far (sent while the cell runs, at most once a second). */
  findings: Finding[] = [];
  headline = "";
  /** Some earlier live updates never reached this browser (shown once the cell ends). */
  gap = false;
  /** Bumped on every change (caches of derived drawings key on it). */
  version = 0;
  private slots: Slot[] = [];
  private fieldIndex = new Map<string, number>();

  get length(): number {
    return this.slots.length;
  }

  /** Replace everything with the `history` trait (wire arrays inline); null/empty clears. */
  applyTrait(h: Record<string, any> | null | undefined): void {
    this.version++;
    this.slots = [];
    this.gap = false;
    if (!h || !h.steps) {
      this.rows = [];
      this.totalSteps = 0;
      this.firstNonfinite = 0;
      this.incidents = [];
      this.findings = [];
      this.headline = "";
      return;
    }
    const arrays: Record<string, NdArray> = {};
    for (const k of ARRAYS) if (h[k] && (h[k] as WireArray).view) arrays[k] = decode(h[k] as WireArray);
    this.apply({ ...h, reset: true, from: 0 }, arrays);
  }

  /** Take the kernel's live row list (the `live_rows` trait) when it names more rows than this store
   * has: the first live message, which carries them, is lost when it reaches the browser before the
   * view's module loaded. True when the rows changed. */
  adoptRows(rows: unknown): boolean {
    if (!Array.isArray(rows) || rows.length <= this.rows.length) return false;
    this.rows = rows.slice() as RowInfo[];
    this.version++;
    return true;
  }

  /** Apply a custom message (`msg.arrays` names buffers); returns false for other messages. */
  applyMessage(msg: any, buffers: (DataView | ArrayBuffer)[] | undefined): boolean {
    if (!msg || msg.type !== "history") return false;
    const arrays: Record<string, NdArray> = {};
    const meta: Record<string, ArrayMeta> = msg.arrays || {};
    for (const [name, m] of Object.entries(meta)) {
      const buf = buffers?.[m.buffer];
      if (!buf) throw new Error(`nbdebug: history update lacks buffer ${m.buffer}`);
      arrays[name] = decode({ view: buf, dtype: m.dtype, shape: m.shape });
    }
    this.apply(msg as HistoryPayload, arrays);
    return true;
  }

  private apply(p: HistoryPayload, a: Record<string, NdArray>): void {
    this.version++;
    if (p.reset) this.slots = [];
    if (Array.isArray(p.fields)) {
      this.fields = p.fields.map(String);
      this.fieldIndex = new Map(this.fields.map((f, i) => [f, i]));
    }
    if (Array.isArray(p.rows)) {
      const at = p.reset ? 0 : Number(p.rows_from ?? 0);
      this.rows = this.rows.slice(0, at).concat(p.rows);
    }
    if (p.flag_bits && typeof p.flag_bits === "object") this.flagBits = p.flag_bits;
    if (p.total_steps !== undefined) this.totalSteps = Number(p.total_steps);
    if (p.first_nonfinite_step !== undefined) this.firstNonfinite = Number(p.first_nonfinite_step) || 0;
    if (p.group !== undefined) this.group = Number(p.group) || 1;
    if (Array.isArray(p.incidents)) this.incidents = p.incidents;
    if (Array.isArray(p.findings)) this.findings = p.findings;
    if (typeof p.headline === "string") this.headline = p.headline;
    const steps = a.steps?.data;
    if (!steps) return;
    const n = steps.length;
    const nf = this.fields.length;
    const last = a.last;
    const nr = last && last.shape.length === 3 ? last.shape[1] : 0;
    if (last && (last.shape[0] !== n || last.shape[2] !== nf)) {
      throw new Error(`nbdebug: history values of shape [${last.shape}] do not match ${n} steps × ${nf} fields`);
    }
    const per = nr * nf;
    const slice = (arr: NdArray | undefined, i: number, size: number) =>
      arr ? (arr.data.subarray(i * size, (i + 1) * size) as Float32Array) : null;
    const scalar = (arr: NdArray | undefined, i: number, dflt = NaN) => (arr ? Number(arr.data[i]) : dflt);
    const asked = Number(p.from ?? this.slots.length);
    // An update for slots this browser never got (it loaded after the first ones were sent): keep
    // what arrives; the final state (traits) has everything.
    if (!p.reset && asked > this.slots.length) this.gap = true;
    if (p.reset) this.gap = false;
    const from = Math.max(0, Math.min(asked, this.slots.length));
    this.slots.length = from;
    for (let i = 0; i < n; i++) {
      const loss = scalar(a.loss, i);
      this.slots.push({
        step: Number(steps[i]),
        rows: nr,
        last: slice(last, i, per) ?? new Float32Array(0),
        lo: slice(a.lo, i, per),
        hi: slice(a.hi, i, per),
        flags: a.flags ? (a.flags.data.subarray(i * nr, (i + 1) * nr) as Uint16Array) : null,
        loss,
        lossLo: scalar(a.loss_lo, i, loss),
        lossHi: scalar(a.loss_hi, i, loss),
        lr: scalar(a.lr, i),
        skipped: scalar(a.skipped, i, 0),
      });
    }
  }

  step(slot: number): number {
    return this.slots[slot]?.step ?? NaN;
  }

  steps(): number[] {
    return this.slots.map((s) => s.step);
  }

  /** The slot showing `step` (the first slot whose bucket ends at or after it), else the last. */
  slotOf(step: number): number {
    const i = this.slots.findIndex((s) => s.step >= step);
    return i < 0 ? this.slots.length - 1 : i;
  }

  hasField(field: string): boolean {
    return this.fieldIndex.has(field);
  }

  /** Value of `field` for `row` at `slot` (bucket's last step); NaN when absent. */
  get(slot: number, row: number, field: string, agg: "last" | "lo" | "hi" = "last"): number {
    const s = this.slots[slot];
    const j = this.fieldIndex.get(field);
    if (!s || j === undefined || row < 0 || row >= s.rows) return NaN;
    const arr = agg === "last" ? s.last : (agg === "lo" ? s.lo : s.hi) ?? s.last;
    return arr[row * this.fields.length + j];
  }

  /** Whether any slot carries a min/max band (the kernel merged steps into buckets). */
  banded(): boolean {
    return this.slots.some((s) => s.lo !== null);
  }

  flagsAt(slot: number, row: number): number {
    const s = this.slots[slot];
    return s && s.flags && row < s.rows ? s.flags[row] : 0;
  }

  /** Flag codes set in `bits` (names from the kernel's FLAG_BITS). */
  codes(bits: number): string[] {
    return Object.entries(this.flagBits)
      .filter(([, b]) => (bits & b) !== 0)
      .map(([code]) => code);
  }

  scalar(name: "loss" | "lossLo" | "lossHi" | "lr" | "skipped"): number[] {
    return this.slots.map((s) => s[name]);
  }

  /** The series of one row's field over the kept slots (with its band when decimated). */
  series(row: number, field: string): { y: Float32Array; lo: Float32Array; hi: Float32Array } {
    const n = this.slots.length;
    const y = new Float32Array(n).fill(NaN);
    const lo = new Float32Array(n).fill(NaN);
    const hi = new Float32Array(n).fill(NaN);
    const j = this.fieldIndex.get(field);
    if (j === undefined) return { y, lo, hi };
    const nf = this.fields.length;
    for (let k = 0; k < n; k++) {
      const s = this.slots[k];
      if (row >= s.rows) continue;
      const at = row * nf + j;
      y[k] = s.last[at];
      lo[k] = s.lo ? s.lo[at] : y[k];
      hi[k] = s.hi ? s.hi[at] : y[k];
    }
    return { y, lo, hi };
  }

  /** The table at `slot`, in the thermometer's columns (a field the history lacks stays NaN). */
  tableAt(slot: number, columns: string[]): StatTable {
    const nr = this.rows.length;
    const data = new Float32Array(nr * columns.length).fill(NaN);
    for (let r = 0; r < nr; r++) {
      columns.forEach((c, j) => {
        data[r * columns.length + j] = this.get(slot, r, c);
      });
    }
    return StatTable.fromArray(data, columns, nr);
  }

  /** The rows at `slot` as table layers, their flags from the slot's bitmask. */
  layersAt(slot: number, calls: Map<string, number>): Layer[] {
    return this.rows.map((r, i) => ({
      name: String(r.name),
      module: r.module,
      type: r.type,
      shape: r.shape,
      dtype: r.dtype,
      flags: this.codes(this.flagsAt(slot, i)),
      calls: calls.get(String(r.name)) ?? 1,
    }));
  }
}
