// A rank's thermometer model, held in the browser: the traits a ThermometerWidget of that rank would
// have (fetched with the run widget's `rank` request, or the `rank_state` trait for the rank sent up
// front), UI state kept locally, and requests the thermometer sends (histograms) forwarded to the
// kernel as `rank_request {rank, method, params}`. Python side: nbdebug/widgets/run.py.
import type { NdArray, WireArray } from "../lib/ndarray";
import { Emitter } from "../lib/events";
import { rpc, type AnyModel } from "../lib/rpc";


/** The thermometer's UI traits that are not part of a rank's data (defaults of ThermometerWidget). */
export const UI_DEFAULTS: Record<string, unknown> = {
  selected: "",
  flagged_only: false,
  sort_by: "",
  sort_desc: true,
  step: 0,
  spark_stat: "mean",
  running: false,
  js_error: "",
};

/** UI traits carried over when another rank is chosen (same rows, same step: easy to compare). */
export const CARRIED = ["selected", "flagged_only", "sort_by", "sort_desc", "step", "spark_stat"];

/** An NdArray as the wire form synced traits have ({view, dtype, shape}). */
export function toWire(a: NdArray): WireArray {
  const d = a.data;
  return { view: new DataView(d.buffer, d.byteOffset, d.byteLength), dtype: a.dtype, shape: a.shape };
}

/** `traits` with every `{"__array__": name}` placeholder replaced by `arrays[name]` in wire form. */
export function restoreArrays(traits: unknown, arrays: Record<string, NdArray>): any {
  const walk = (x: unknown): unknown => {
    if (Array.isArray(x)) return x.map(walk);
    if (x && typeof x === "object" && !(x instanceof DataView) && !ArrayBuffer.isView(x) && !(x instanceof ArrayBuffer)) {
      const o = x as Record<string, unknown>;
      if (typeof o.__array__ === "string") {
        const a = arrays[o.__array__];
        if (!a) throw new Error(`nbdebug: the answer lacks array ${o.__array__}`);
        return toWire(a);
      }
      return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, walk(v)]));
    }
    return x;
  };
  return walk(traits);
}

/** Rank models with a thermometer mounted on them (it listens to `change:step`): the spread column
 * (run/spread.ts) reads the shown rank's step slider from here. */
const MOUNTED = new Set<LocalModel>();

/** The mounted rank model of the run view whose `spread` trait is `spread` (undefined: none). */
export function mountedFor(spread: unknown): LocalModel | undefined {
  for (const m of MOUNTED) if (m.parentTrait("spread") === spread) return m;
  return undefined;
}

export class LocalModel extends Emitter implements AnyModel {
  private traits = new Map<string, any>();

  on(event: string, cb: (...args: any[]) => void): void {
    super.on(event, cb);
    if (event.split(/\s+/).includes("change:step")) MOUNTED.add(this);
  }

  off(event?: string | null, cb?: ((...args: any[]) => void) | null): void {
    super.off(event, cb);
    if (!(this.handlers.get("change:step") ?? []).length) MOUNTED.delete(this);
  }

  /** A trait of the run widget's model this rank belongs to. */
  parentTrait(name: string): unknown {
    return this.parent.get(name);
  }

  constructor(
    readonly rank: number,
    traits: Record<string, any>,
    private parent: AnyModel,
  ) {
    super();
    for (const [k, v] of Object.entries({ ...UI_DEFAULTS, ...traits })) this.traits.set(k, v);
  }
  get(name: string): any {
    return this.traits.get(name);
  }
  set(name: string, value: any): void {
    const old = this.traits.get(name);
    this.traits.set(name, value);
    if (old !== value) this.emit(`change:${name}`, value);
    if (name === "js_error" && value) {
      // the rank's thermometer reports its errors here: the run widget's trait shows them to Python
      this.parent.set("js_error", `rank ${this.rank}: ${String(value)}`);
      this.parent.save_changes();
    }
  }
  save_changes(): void {
    /* local: nothing to sync */
  }
  /** The thermometer's requests go to the kernel as `rank_request`; the answer comes back as its response. */
  send(content: any): void {
    if (!content || content.type !== "request") return;
    const id = content.id;
    rpc(this.parent, "rank_request", { rank: this.rank, method: content.method, params: content.params ?? {} })
      .then((ans) => {
        const meta: Record<string, unknown> = {};
        const buffers: DataView[] = [];
        for (const [name, a] of Object.entries(ans.arrays)) {
          meta[name] = { dtype: a.dtype, shape: a.shape, buffer: buffers.length };
          buffers.push(toWire(a).view as DataView);
        }
        this.emit("msg:custom", { type: "response", id, ok: true, result: ans.result, arrays: meta }, buffers);
      })
      .catch((err: unknown) => {
        this.emit("msg:custom", { type: "response", id, ok: false, error: err instanceof Error ? err.message : String(err) });
      });
  }
}
