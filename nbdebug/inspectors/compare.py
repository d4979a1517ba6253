"""Runs side by side: the loss and any row's series of two or more captures, aligned by step, and the
first step where each run diverges from the first one (pure numpy: no torch, no Jupyter).

**The first divergence** of a run ``b`` from the reference run ``a`` (the first one given), for one
series (the loss, or one field of one row):

- the two are compared on the steps both kept (the intersection of their ``step_index``; a run
  decimated to fit its byte budget keeps fewer steps, and a note says so);
- their *scale* is the larger of the medians of ``|value|`` of the two over those steps (finite
  values only; at least ``1e-12``): the series' typical magnitude, robust to a few spikes;
- two values are *apart* where ``|a − b| > rtol × scale`` (``rtol`` = 0.1 by default: 10% of that
  magnitude, so a few percent of minibatch wobble is not a divergence), or where exactly one of the two
  is NaN/Inf (one run broke, the other did not); two non-finite values count as equal;
- they *diverge* at the first common step from which they stay apart for ``hold`` (2) common steps in
  a row (or up to the last common step): a one-step blip is not a divergence;
- no common step, or none such: no divergence (``None``).

**A run's outcome** (:func:`outcome`) is read from its own loss: where it ends, its peak, and whether it
*went wrong*: a NaN/Inf loss, or a loss that rose above :data:`SPIKE` (1.5) × its first value (a
healthy run's loss falls from its first value; minibatch noise stays well under 1.5×). The headline
(:func:`compare_headline`) states every run's outcome and how much lower the best one ends; a divergence
is said of the run that went wrong (:func:`divergence_sentence`).

>>> first_divergence(np.array([1, 2, 3, 4]), np.array([2.3, 2.1, 1.9, 1.8]),
...                  np.array([1, 2, 3, 4]), np.array([2.3, 2.2, 2.6, 3.0])).step
3
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FIELDS", "RTOL", "SPIKE", "Divergence", "Outcome", "aligned", "as_result", "compare_headline",
           "divergence_sentence", "first_divergence", "log_scale", "most_different_row", "outcome", "row_names",
           "run_series", "union_steps"]

#: the default relative tolerance of :func:`first_divergence` (of the series' typical magnitude)
RTOL = 0.1
#: common steps in a row two series must stay apart for a divergence
HOLD = 2
#: a run went wrong when its loss rises above this many times its first value
SPIKE = 1.5
#: a chart's values are drawn on a log axis when (positive and) their range exceeds this ratio
LOG_RATIO = 10.0
#: per-row fields a comparison offers (the thermometer's over-time statistics)
FIELDS: tuple[str, ...] = ("mean", "std", "min", "max", "zero_frac", "dead_unit_frac", "grad_norm",
                           "param_grad_norm", "update_ratio", "nan", "inf")


@dataclass(frozen=True)
class Divergence:
    """Where run ``run`` first diverges from the first run: ``step``, the two values there (``a`` the
    first run's, ``b`` this run's), the series' ``scale`` and the tolerance ``rtol`` it was judged with."""

    run: int
    step: int
    a: float
    b: float
    scale: float
    rtol: float

    def as_json(self) -> dict[str, Any]:
        """Plain JSON (NaN/Inf as None, which JSON cannot carry otherwise)."""
        fin = lambda x: x if math.isfinite(x) else None  # noqa: E731
        return {"run": self.run, "step": self.step, "a": fin(self.a), "b": fin(self.b), "scale": self.scale, "rtol": self.rtol}


def as_result(run: Any) -> Any:
    """The capture result behind ``run``: a :class:`~nbdebug.capture.result.CaptureResult` (what
    ``%%nndebug … -o run`` keeps), or anything with one as ``.result`` / ``.capture``."""
    for obj in (run, getattr(run, "result", None), getattr(run, "capture", None)):
        if obj is not None and hasattr(obj, "series") and hasattr(obj, "step_index"):
            return obj
    raise TypeError(f"cannot compare a {type(run).__name__}: pass the CaptureResult of a run "
                    "(%%nndebug model -o run, or nbdebug.debug(...).result)")


def union_steps(step_lists: Sequence[np.ndarray]) -> np.ndarray:
    """Every step any run kept, sorted (the x axis every run's series is aligned on)."""
    if not step_lists:
        return np.zeros(0, np.int64)
    return np.unique(np.concatenate([np.asarray(s, np.int64) for s in step_lists]))


def aligned(steps: np.ndarray, values: np.ndarray, on: np.ndarray) -> np.ndarray:
    """``values`` (one per kept step ``steps``) placed on the steps ``on``: float32, NaN where the run
    did not keep that step."""
    out = np.full(len(on), np.nan, np.float32)
    idx = np.searchsorted(on, np.asarray(steps, np.int64))
    ok = (idx < len(on)) & (on[np.minimum(idx, len(on) - 1)] == np.asarray(steps, np.int64)) if len(on) else np.zeros(0, bool)
    out[idx[ok]] = np.asarray(values, np.float64)[ok]
    return out


def first_divergence(steps_a: np.ndarray, a: np.ndarray, steps_b: np.ndarray, b: np.ndarray,
                     rtol: float = RTOL, run: int = 1, hold: int = HOLD) -> Divergence | None:
    """The first common step where ``b`` leaves ``a`` (see the module doc), or None."""
    sa, sb = np.asarray(steps_a, np.int64), np.asarray(steps_b, np.int64)
    common, ia, ib = np.intersect1d(sa, sb, assume_unique=True, return_indices=True)
    if not len(common):
        return None
    x, y = np.asarray(a, np.float64)[ia], np.asarray(b, np.float64)[ib]
    fx, fy = np.isfinite(x), np.isfinite(y)
    med = [float(np.median(np.abs(v[f]))) for v, f in ((x, fx), (y, fy)) if f.any()]
    scale = max([*med, 1e-12])
    with np.errstate(invalid="ignore"):
        apart = (fx & fy & (np.abs(x - y) > rtol * scale)) | (fx != fy)
    n, span = len(apart), max(1, int(hold))
    hit = [k for k in np.flatnonzero(apart) if apart[k:min(n, k + span)].all()]
    if not hit:
        return None
    k = int(hit[0])
    return Divergence(run, int(common[k]), float(x[k]), float(y[k]), scale, rtol)


def row_names(results: Sequence[Any]) -> list[str]:
    """The rows of every run's history: the first run's in its order, then rows only others have."""
    out: dict[str, None] = {}
    for r in results:
        hist = getattr(r, "history", None)
        for name in (hist.rows if hist is not None else ()):
            out.setdefault(str(name), None)
    return list(out)


def run_series(result: Any, row: str | None, field: str | None) -> np.ndarray:
    """One run's series: the loss (``row`` None/"") or ``field`` of ``row`` (NaN where the run has
    no such row)."""
    if not row:
        return np.asarray(result.series("loss"), np.float64)
    try:
        return np.asarray(result.series(row, field or "mean"), np.float64)
    except (KeyError, ValueError):
        return np.full(len(result.step_index), np.nan)


def _g(x: float) -> str:
    """3 significant digits, trailing zeros kept (1.10, 0.856, 14.5)."""
    return "NaN" if x != x else f"{x:#.3g}".rstrip(".")


@dataclass(frozen=True)
class Outcome:
    """One run's loss read on its own: ``first``/``last`` finite values (and ``last_step``), the
    ``peak`` after the first step (and ``peak_step``), ``broke`` the first step with a NaN/Inf loss (or
    None). ``wrong``: it broke, or its loss rose above :data:`SPIKE` × its first value."""

    label: str
    first: float
    last: float
    last_step: int
    peak: float
    peak_step: int
    broke: int | None

    @property
    def wrong(self) -> bool:
        return self.broke is not None or self.peak > self.first + (SPIKE - 1) * abs(self.first)

    def sentence(self) -> str:
        """"`lr=3.0` spikes to 14.5 near step 6 and ends at 2.43" / "`lr=0.1` ends at 0.856"."""
        lab = f"`{self.label}`"
        if self.broke is not None:
            return f"{lab} breaks at step {self.broke} (NaN/Inf loss; last finite {_g(self.last)} at step {self.last_step})"
        if not self.wrong:
            return f"{lab} ends at {_g(self.last)}"
        if self.peak_step == self.last_step:
            return f"{lab} rises from {_g(self.first)} to {_g(self.last)}"
        return f"{lab} spikes to {_g(self.peak)} near step {self.peak_step} and ends at {_g(self.last)}"

    def as_json(self) -> dict[str, Any]:
        return {"label": self.label, "first": self.first, "last": self.last, "last_step": self.last_step,
                "peak": self.peak, "peak_step": self.peak_step, "broke": self.broke, "wrong": self.wrong}


def outcome(label: str, steps: np.ndarray, loss: np.ndarray) -> Outcome | None:
    """The outcome of one run's loss (None when it has no finite loss at all)."""
    st, v = np.asarray(steps, np.int64), np.asarray(loss, np.float64)
    ok = np.isfinite(v)
    if not ok.any():
        return None
    fin = np.flatnonzero(ok)
    bad = np.flatnonzero(~ok)
    later = fin[1:] if len(fin) > 1 else fin
    p = int(later[np.argmax(v[later])])
    return Outcome(str(label), float(v[fin[0]]), float(v[fin[-1]]), int(st[fin[-1]]), float(v[p]), int(st[p]),
                   int(st[bad[0]]) if len(bad) else None)


def compare_headline(outcomes: Sequence[Outcome | None], labels: Sequence[str]) -> str:
    """Every run's outcome, in order, the best-ending healthy run with how much lower it ends
    ("`lr=3.0` spikes to 14.5 near step 6 and ends at 2.43; `lr=0.1` ends at 0.856, 2.8× lower")."""
    parts = [o.sentence() if o is not None else f"`{lab}` has no loss" for o, lab in zip(outcomes, labels)]
    ends = [(o.last, i) for i, o in enumerate(outcomes) if o is not None and o.broke is None]
    if len(ends) >= 2:
        (best, i), (second, j) = sorted(ends)[:2]
        worst = max(ends)[0]
        others = [lab for k, lab in enumerate(labels) if k != i]
        if best > 0 and second / best >= 1.1:
            than = "" if len(labels) == 2 else f" than `{labels[j]}`"
            parts[i] += f", {second / best:.2g}× lower{than}"
        elif best > 0 and worst / best < 1.1:
            parts.append("all end within 10% of each other" if len(others) > 1 else "both end within 10% of each other")
    elif len(ends) == 1 and len(outcomes) >= 2:
        parts[ends[0][1]] += " (the only run with a finite loss to the end)"
    return "; ".join(parts)


def divergence_sentence(divs: Sequence[dict[str, Any] | None], labels: Sequence[str], wrong: Sequence[bool],
                        what: str, rtol: float = RTOL) -> str:
    """Where each run and the first part, said of the run that went wrong ("`lr=3.0` leaves `lr=0.1` at
    step 3: 3.1 vs 2.0"); neutral ("… part at step 3") when both or neither went wrong."""
    parts = []
    for i, d in enumerate(divs, start=1):
        a, b = labels[0], labels[i]
        if d is None:
            parts.append(f"`{b}` stays within {rtol:g}× of `{a}`")
            continue
        va, vb = _g(d["a"] if d["a"] is not None else float("nan")), _g(d["b"] if d["b"] is not None else float("nan"))
        if wrong[i] and not wrong[0]:
            parts.append(f"`{b}` leaves `{a}` at step {d['step']}: {vb} vs {va}")
        elif wrong[0] and not wrong[i]:
            parts.append(f"`{a}` leaves `{b}` at step {d['step']}: {va} vs {vb}")
        else:
            parts.append(f"`{a}` and `{b}` part at step {d['step']}: {va} vs {vb}")
    if not parts:
        return ""
    return (f"first divergence in {what}: " + "; ".join(parts)
            + f" (more than {rtol:g}× the typical magnitude apart, {HOLD} kept steps in a row)")


def log_scale(values: np.ndarray) -> bool:
    """Whether ``values`` (any shape) are drawn on a log axis: all finite ones positive and their range
    wider than :data:`LOG_RATIO` (a linear axis from 0.86 to 14.5 flattens the healthy run's descent)."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    return bool(len(v) and v.min() > 0 and v.max() / v.min() > LOG_RATIO)


def most_different_row(results: Sequence[Any], rows: Sequence[str], field: str) -> str:
    """The row whose ``field`` differs most between the runs (largest |a − b| over the common steps of
    any run and the first, relative to the series' typical magnitude); "" when none differs."""
    best, name = 0.0, ""
    base = results[0]
    for row in rows:
        a = run_series(base, row, field)
        for r in results[1:]:
            _, ia, ib = np.intersect1d(np.asarray(base.step_index, np.int64), np.asarray(r.step_index, np.int64),
                                            assume_unique=True, return_indices=True)
            x, y = a[ia], run_series(r, row, field)[ib]
            ok = np.isfinite(x) & np.isfinite(y)
            if not ok.any():
                continue
            scale = max(float(np.median(np.abs(x[ok]))), float(np.median(np.abs(y[ok]))), 1e-12)
            gap = float(np.max(np.abs(x[ok] - y[ok]))) / scale
            if gap > best + 1e-12:
                best, name = gap, row
    return name
