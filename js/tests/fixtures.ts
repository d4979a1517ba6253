// Hand-built fixtures shared by the over-time view tests (groups_step, run_step, thermometer_step,
// thermometer_live): wire arrays inline in a trait, the `history` trait of a run of kept steps, the
// thermometer's UI traits at their Python defaults, and moving the step slider.
import { tick } from "./mount";

/** A layer name that would run script if it were ever written as HTML. */
export const HOSTILE = "<img src=x onerror=alert(1)>";

export type WireDtype = "int32" | "uint32" | "uint16" | "float32";

/** A wire array inline in a trait: `values` as `dtype`, shaped `shape` (default: flat). */
export const wire = (dtype: WireDtype, values: number[], shape = [values.length]) => {
  const C = { int32: Int32Array, uint32: Uint32Array, uint16: Uint16Array, float32: Float32Array }[dtype];
  return { view: new DataView(C.from(values).buffer), dtype, shape };
};

/** What a `history` trait is built from: rows `names` (module = name), kept `steps`, field values. */
export interface HistorySpec {
  names: string[];
  fields: string[];
  steps: number[];
  /** Field `field` (the `k`-th of `fields`) of row `r` at step `s`. */
  value: (s: number, r: number, field: string, k: number) => number;
  /** Each row's module type: one for all, or one per row (default "Linear"). */
  types?: string | string[];
  /** Every row's shape (default [2, 4]). */
  shape?: number[];
  flagBits: Record<string, number>;
  /** Row `r`'s flag bits at step `s` (default none). */
  flagAt?: (s: number, r: number) => number;
  /** Default: the last kept step. */
  totalSteps?: number;
  firstNonfiniteStep?: number;
  /** The loss per kept step; left out of the trait when not given. */
  loss?: number[];
}

/** The `history` trait (wire arrays inline) as the kernel lays it out. */
export function historyTrait(h: HistorySpec): Record<string, any> {
  const { names, fields, steps } = h;
  const types = h.types ?? "Linear";
  const flagAt = h.flagAt ?? (() => 0);
  const trait: Record<string, any> = {
    fields,
    rows: names.map((name, r) => ({ name, module: name, type: typeof types === "string" ? types : types[r], shape: h.shape ?? [2, 4], dtype: "float32" })),
    flag_bits: h.flagBits,
    total_steps: h.totalSteps ?? steps[steps.length - 1],
    first_nonfinite_step: h.firstNonfiniteStep ?? 0,
    group: 1,
    steps: wire("int32", steps),
    last: wire("float32", steps.flatMap((s) => names.flatMap((_, r) => fields.map((f, k) => h.value(s, r, f, k)))), [steps.length, names.length, fields.length]),
    flags: wire("uint16", steps.flatMap((s) => names.map((_, r) => flagAt(s, r))), [steps.length, names.length]),
  };
  if (h.loss) trait.loss = wire("float32", h.loss);
  return trait;
}

/** The thermometer's UI traits at the Python defaults: nothing selected, execution order, slider at
 * the last step, no incidents or events, not running (override with a spread after it). */
export function thermometerUiTraits(): Record<string, any> {
  return {
    selected: "",
    flagged_only: false,
    sort_by: "",
    sort_desc: true,
    js_error: "",
    step: 0,
    spark_stat: "mean",
    incidents: [],
    events: [],
    running: false,
  };
}

/** Move the step slider to `slot` as the user would, and let the redraw run. */
export async function slide(el: HTMLElement, slot: number): Promise<void> {
  const slider = el.querySelector(".nbd-slider") as HTMLInputElement;
  slider.value = String(slot);
  slider.dispatchEvent(new Event("input"));
  await tick();
}
