// The one ablation request and answer of every view (nbdebug/sessions/ablation_io.py is the same shape
// in Python): the attention view's heads, the feature-map view's channels, the thermometer's rows.
// A request: `{kind, targets: [{layer, units}], mode}` (layer: a block index for heads, else a module
// name; units: heads or channels, `[]` a module's whole output). An answer: what was measured and by
// how much (`metric`), both runs' top lists (`top`, or null), a note, the seconds, and one kind's own
// part (`lens` for heads, `cam` for channels with the arrays `cam`/`cam_clean`, `agreement` for rows
// without a loss). `askAblation` sends a request and rejects an answer that is not this shape.
import type { LensEntry } from "./lenscolumn";
import { rpc, type AnyModel, type RpcAnswer } from "./rpc";

export type AblationKind = "heads" | "channels" | "modules";
export type AblationMode = "zero" | "mean";

export interface AblationTarget {
  layer: number | string;
  units: number[];
}

export interface AblationRequest {
  kind: AblationKind;
  targets: AblationTarget[];
  mode: string;
}

/** A class or a next token (its display text) and its probability. */
export interface Ranked {
  id: number;
  label: string;
  p: number;
}

export interface AblationMetric {
  label: string;
  /** "metric": the view's metric (`label` says which); "p": a probability; "loss"; "output": mean |logits|. */
  kind: "metric" | "p" | "loss" | "output";
  clean: number;
  ablated: number;
  delta: number;
  /** The token or class the metric is about (null: the loss or the output). */
  of: { id: number; label: string } | null;
}

/** The clean and ablated runs' lens columns (THE lens-column format, lib/lenscolumn.ts); p_answer is p(metric.of). */
export interface LensDiff {
  clean: LensEntry[];
  ablated: LensEntry[];
}

export interface AblationAnswer {
  kind: AblationKind;
  targets: AblationTarget[];
  mode: string;
  metric: AblationMetric;
  top: { clean: Ranked[]; ablated: Ranked[] } | null;
  note: string;
  seconds: number;
  lens?: LensDiff;
  cam?: { layer: string; shape: number[] };
  agreement?: number;
}

const KINDS: readonly string[] = ["heads", "channels", "modules"];
const METRIC_KINDS: readonly string[] = ["metric", "p", "loss", "output"];

/** `[[layer, head], ...]` (the attention view's selection) as targets: one per layer, in first-click order. */
export function headTargets(pairs: [number, number][]): AblationTarget[] {
  const byLayer = new Map<number, number[]>();
  for (const [layer, head] of pairs) {
    const units = byLayer.get(layer) ?? [];
    if (!units.includes(head)) units.push(head);
    byLayer.set(layer, units);
  }
  return [...byLayer].map(([layer, units]) => ({ layer, units }));
}

/** The targets as `[layer, unit]` pairs (the heads of an answer: "L1h2 + L2h0"). */
export function targetPairs(targets: AblationTarget[]): [number | string, number][] {
  return targets.flatMap((t) => t.units.map((u) => [t.layer, u] as [number | string, number]));
}

const isNum = (x: unknown): x is number => typeof x === "number";
/** A measured number: a non-finite one (NaN: outputs of another shape) may arrive as null. */
const isValue = (x: unknown): x is number => isNum(x) || x === null;
const isStr = (x: unknown): x is string => typeof x === "string";
const isObj = (x: unknown): x is Record<string, unknown> => typeof x === "object" && x !== null && !Array.isArray(x);
const listOf = <T>(x: unknown, is: (v: unknown) => v is T): x is T[] => Array.isArray(x) && x.every(is);

function isTarget(x: unknown): x is AblationTarget {
  return isObj(x) && (isNum(x.layer) || isStr(x.layer)) && listOf(x.units, isNum);
}

function isRanked(x: unknown): x is Ranked {
  return isObj(x) && isNum(x.id) && isStr(x.label) && isNum(x.p);
}

function isMetric(x: unknown): x is AblationMetric {
  return isObj(x) && isStr(x.label) && isStr(x.kind) && METRIC_KINDS.includes(x.kind) && isValue(x.clean) && isValue(x.ablated)
    && isValue(x.delta) && (x.of === null || (isObj(x.of) && isNum(x.of.id) && isStr(x.of.label)));
}

function isEntry(x: unknown): x is LensEntry {
  return isObj(x) && isStr(x.row) && isNum(x.id) && isStr(x.token) && isNum(x.p) && isNum(x.p_answer);
}

function isLens(x: unknown): x is LensDiff {
  return isObj(x) && listOf(x.clean, isEntry) && listOf(x.ablated, isEntry);
}

/** Whether `x` is an answer of this shape (every required field with its type; the optional parts when present). */
export function isAblationAnswer(x: unknown): x is AblationAnswer {
  if (!isObj(x)) return false;
  const top = x.top;
  return isStr(x.kind) && KINDS.includes(x.kind) && listOf(x.targets, isTarget) && isStr(x.mode) && isMetric(x.metric)
    && (top === null || (isObj(top) && listOf(top.clean, isRanked) && listOf(top.ablated, isRanked)))
    && isStr(x.note) && isNum(x.seconds)
    && (x.lens === undefined || isLens(x.lens))
    && (x.cam === undefined || (isObj(x.cam) && isStr(x.cam.layer) && listOf(x.cam.shape, isNum)))
    && (x.agreement === undefined || isValue(x.agreement));
}

/** Send `request` (the `ablate` rpc) and resolve with the answer; rejects when the kernel fails or the
 *  answer is not of this shape or not of the request's kind. */
export async function askAblation(model: AnyModel, request: AblationRequest): Promise<RpcAnswer<AblationAnswer>> {
  const answer = await rpc<unknown>(model, "ablate", request as unknown as Record<string, unknown>);
  const r = answer.result;
  if (!isAblationAnswer(r) || r.kind !== request.kind) {
    throw new Error(`nbdebug: the kernel's ablation answer is not a ${request.kind} answer (is the extension up to date? re-run the cell)`);
  }
  return { result: r, arrays: answer.arrays };
}
