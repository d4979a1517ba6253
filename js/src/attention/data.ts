// What the attention view reads from its model once: sizes, token labels, thumbnails, the metric
// table, flags (bit 1: sink on the first token, 2: sink on [SEP]/EOS, 4: near-uniform) and the heads
// that stand out for this model (`outliers`, from nbdebug/inspectors/attention_findings.py).
import { fmt, fmtPct } from "../lib/dom";
import { decode, type NdArray, type WireArray } from "../lib/ndarray";
import type { AnyModel } from "../lib/rpc";

export const LABELS: Record<string, string> = {
  first_mass: "sink: first token",
  sep_mass: "sink: [SEP]/EOS",
  entropy: "entropy (nats)",
  norm_entropy: "entropy / max",
  prev_token: "previous token",
  diagonal: "diagonal (self)",
  max_mass: "most-attended key",
};
const MASS = new Set(["first_mass", "sep_mass", "prev_token", "diagonal", "max_mass", "norm_entropy"]);

/** One head unusual for this model (HeadOutlier.to_json on the Python side). */
export interface Outlier {
  layer: number;
  head: number;
  kind: string;
  value: number;
  typical: number;
  z: number;
  text: string;
  token: number;
  /** the reason in a few characters, printed under the head ("prev 100%"): the headline's statistic */
  short?: string;
}

export interface AttentionData {
  L: number;
  H: number;
  T: number;
  tokens: string[];
  rawTokens: string[];
  generated: number[];
  names: string[];
  thumbs: NdArray | null;
  metrics: NdArray | null;
  flags: NdArray | null;
  /** unusual heads by `layer * H + head` */
  outliers: Map<number, Outlier>;
  fullSide: number;
}

function wire(model: AnyModel, name: string): NdArray | null {
  const w = model.get(name) as WireArray | undefined;
  return w && w.view ? decode(w) : null;
}

export function readData(model: AnyModel): AttentionData {
  const H: number = model.get("n_heads");
  const tokens: string[] = model.get("tokens") || [];
  const outliers = new Map<number, Outlier>();
  for (const o of (model.get("outliers") || []) as Outlier[]) outliers.set(o.layer * H + o.head, o);
  return {
    L: model.get("n_layers"),
    H,
    T: model.get("seq_len"),
    tokens,
    rawTokens: model.get("raw_tokens") || tokens,
    generated: model.get("generated") || [],
    names: model.get("metric_names") || [],
    thumbs: wire(model, "thumbs"),
    metrics: wire(model, "metrics"),
    flags: wire(model, "flags"),
    outliers,
    fullSide: model.get("full_side") || 1024,
  };
}

export function metricAt(d: AttentionData, name: string, l: number, hd: number): number {
  const m = d.names.indexOf(name);
  return d.metrics && m >= 0 ? (d.metrics.data[(m * d.L + l) * d.H + hd] as number) : NaN;
}

export function flagAt(d: AttentionData, l: number, hd: number): number {
  return d.flags ? (d.flags.data[l * d.H + hd] as number) : 0;
}

export const fmtMetric = (name: string, v: number): string => (MASS.has(name) ? fmtPct(v) : fmt(v));

/** Token label of position `t` with its index, e.g. "␣Paris [4]" (model text: textContent only). */
export const tokenAt = (d: AttentionData, t: number): string => `${d.tokens[t] ?? ""} [${t}]`;
