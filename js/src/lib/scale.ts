// Scales shared by the views: a callable that maps a data domain onto a pixel range, with
// `invert` and `ticks`. Degenerate domains (a === b) map every value to the middle of the range;
// NaN in, NaN out.
//
//   const x = symlog([-1e6, 1e3], [0, 200]);  x(0), x.invert(100), x.ticks(5)

export interface Scale {
  /** Map a domain value to the range (linear extrapolation outside the domain). */
  (x: number): number;
  /** Map to the range and clamp to it (NaN stays NaN). */
  clamped(x: number): number;
  /** Map a range value back to the domain. */
  invert(y: number): number;
  /** About `n` round values inside the domain, in increasing order. */
  ticks(n?: number): number[];
  readonly domain: [number, number];
  readonly range: [number, number];
}

type Transform = { fwd: (x: number) => number; inv: (t: number) => number };

function makeScale(
  domain: [number, number],
  range: [number, number],
  tr: Transform,
  ticks: (lo: number, hi: number, n: number) => number[],
): Scale {
  const [a, b] = domain;
  const [c, d] = range;
  const ta = tr.fwd(a);
  const tb = tr.fwd(b);
  const span = tb - ta;
  const degenerate = !(Math.abs(span) > 0) || !Number.isFinite(span);
  const mid = (c + d) / 2;
  const rlo = Math.min(c, d);
  const rhi = Math.max(c, d);
  const f = ((x: number): number => {
    if (Number.isNaN(x)) return NaN;
    if (degenerate) return Number.isNaN(ta) || Number.isNaN(tb) ? NaN : mid;
    return c + ((tr.fwd(x) - ta) / span) * (d - c);
  }) as Scale;
  f.clamped = (x: number) => {
    const y = f(x);
    return Number.isNaN(y) ? NaN : Math.min(rhi, Math.max(rlo, y));
  };
  f.invert = (y: number): number => {
    if (Number.isNaN(y)) return NaN;
    if (degenerate || d === c) return Number.isNaN(ta) ? NaN : a;
    return tr.inv(ta + ((y - c) / (d - c)) * span);
  };
  f.ticks = (n = 5) => {
    if (!Number.isFinite(a) || !Number.isFinite(b)) return [];
    const lo = Math.min(a, b);
    const hi = Math.max(a, b);
    if (lo === hi) return [lo];
    return ticks(lo, hi, Math.max(1, n));
  };
  Object.defineProperty(f, "domain", { value: [a, b] as [number, number] });
  Object.defineProperty(f, "range", { value: [c, d] as [number, number] });
  return f;
}

/** Round tick values (1, 2, 5 × 10^k steps) covering [lo, hi] with about n ticks. */
export function niceTicks(lo: number, hi: number, n = 5): number[] {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) return [];
  if (lo > hi) [lo, hi] = [hi, lo];
  if (lo === hi) return [lo];
  const raw = (hi - lo) / Math.max(1, n);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const m = raw / p;
  const step = (m >= Math.SQRT2 * 5 ? 10 : m >= Math.sqrt(10) ? 5 : m >= Math.SQRT2 ? 2 : 1) * p;
  const out: number[] = [];
  const start = Math.ceil(lo / step - 1e-9);
  const stop = Math.floor(hi / step + 1e-9);
  for (let i = start; i <= stop; i++) {
    // Multiply from an integer index to avoid accumulating rounding errors; trim float noise.
    out.push(Number((i * step).toPrecision(12)));
  }
  return out;
}

/** Linear scale from `domain` onto `range`. */
export function linear(domain: [number, number], range: [number, number]): Scale {
  return makeScale(domain, range, { fwd: (x) => x, inv: (t) => t }, niceTicks);
}

/** The symlog transform: sign(x) · log10(1 + |x| / linthresh). */
export function symlogTransform(x: number, linthresh = 1): number {
  return Math.sign(x) * Math.log10(1 + Math.abs(x) / linthresh);
}

/** Inverse of `symlogTransform`. */
export function symlogInverse(t: number, linthresh = 1): number {
  return Math.sign(t) * linthresh * (Math.pow(10, Math.abs(t)) - 1);
}

/**
 * Symmetric log scale: values are transformed with sign(x) · log10(1 + |x| / linthresh), then
 * mapped linearly. Linear near zero (|x| ≲ linthresh), logarithmic beyond; handles both signs.
 */
export function symlog(domain: [number, number], range: [number, number], linthresh = 1): Scale {
  const c = linthresh > 0 && Number.isFinite(linthresh) ? linthresh : 1;
  const tr: Transform = { fwd: (x) => symlogTransform(x, c), inv: (t) => symlogInverse(t, c) };
  const ticks = (lo: number, hi: number, n: number): number[] => {
    // Candidates: 0 and ±10^k (10^k ≥ linthresh, where the scale is logarithmic) inside the
    // domain; thinned out to about n below.
    const cand: number[] = [];
    if (lo <= 0 && hi >= 0) cand.push(0);
    const maxAbs = Math.max(Math.abs(lo), Math.abs(hi));
    const k0 = Math.ceil(Math.log10(c) - 1e-9);
    const k1 = Math.floor(Math.log10(maxAbs) + 1e-9);
    for (let k = k0; k <= k1; k++) {
      const v = Number(Math.pow(10, k).toPrecision(12));
      if (v >= lo && v <= hi) cand.push(v);
      if (-v >= lo && -v <= hi) cand.push(-v);
    }
    cand.sort((x, y) => x - y);
    if (cand.length < 2) return niceTicks(lo, hi, n);
    if (cand.length <= n + 1) return cand;
    // Keep zero (if present) and every step-th decade on each side.
    const step = Math.ceil(cand.length / (n + 1));
    const zero = cand.indexOf(0);
    const pivot = zero >= 0 ? zero : 0;
    return cand.filter((_, i) => (i - pivot) % step === 0);
  };
  return makeScale(domain, range, tr, ticks);
}

/** Log10 scale for positive domains; non-positive values map to NaN. */
export function log(domain: [number, number], range: [number, number]): Scale {
  const tr: Transform = { fwd: (x) => (x > 0 ? Math.log10(x) : NaN), inv: (t) => Math.pow(10, t) };
  const ticks = (lo: number, hi: number, n: number): number[] => {
    if (!(lo > 0)) return [];
    const k0 = Math.ceil(Math.log10(lo) - 1e-9);
    const k1 = Math.floor(Math.log10(hi) + 1e-9);
    if (k1 < k0) return niceTicks(lo, hi, n);
    const step = Math.max(1, Math.ceil((k1 - k0 + 1) / n));
    const out: number[] = [];
    for (let k = k0; k <= k1; k += step) out.push(Number(Math.pow(10, k).toPrecision(12)));
    return out;
  };
  return makeScale(domain, range, tr, ticks);
}
