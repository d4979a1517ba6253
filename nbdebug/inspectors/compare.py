"""Runs side by side: the loss and any row's series of two or more captures, aligned by step, and the
first step where each run diverges from the first one (pure numpy: no torch, no Jupyter).

**The first divergence** of a run ``b`` from the reference run ``a`` (the first one given), for one
series (the loss, or one field of one row):

- the two are compared on the steps both kept (the intersection of their ``step_index``; a run
  decimated to fit its byte budget keeps fewer steps, and a note says so);
- their *scale* is the larger of the medians of ``|value|`` of the two over those steps (finite
  values only; at least ``1e-12``): the series' typical magnitude, robust to a few spikes;
- they *diverge* at the first common step where ``|a − b| > rtol × scale`` (``rtol`` = 0.01 by
  default: 1% of that magnitude), or where exactly one of the two is NaN/Inf (one run broke, the
  other did not); two non-finite values count as equal;
- no common step, or none beyond the tolerance: no divergence (``None``).

Two runs from the same initial weights and batches have the same loss at step 1 (no update yet):
lr=3.0 against lr=0.1 diverges at step 2. Different seeds diverge at step 1.

>>> first_divergence(np.array([1, 2, 3]), np.array([2.3, 2.1, 1.9]),
...                  np.array([1, 2, 3]), np.array([2.3, 2.2, 2.6])).step
2
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FIELDS", "RTOL", "Divergence", "aligned", "as_result", "first_divergence", "row_names", "run_series",
           "union_steps"]

#: the default relative tolerance of :func:`first_divergence` (of the series' typical magnitude)
RTOL = 0.01
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
                     rtol: float = RTOL, run: int = 1) -> Divergence | None:
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
    hit = np.flatnonzero(apart)
    if not len(hit):
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
