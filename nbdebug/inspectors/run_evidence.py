"""What a run's own numbers say about harm: the loss curve and the gradient norms over the kept steps
(pure numpy: no torch, no Jupyter), and the :class:`Finding` type the ranked findings are made of.

A warning needs evidence of harm or of a fault (docs/diagnosis.md): an update ratio above the
1e-2 rule of thumb is harm only when the loss then rose (:func:`loss_rise`), units died, gradients
blew up or a NaN followed. The rules here are relative to the run itself, never to a fixed line
for every model:

* :func:`loss_rise`: the loss after step ``s`` rose above the run's first loss by ≥ (:data:`RISE` − 1) × the
  loss's own scale (:meth:`Evidence.scale`): its first value while it has stayed ≥ 0 (≥ 2× the first loss),
  else the distance it fell below its start (a loss negative by design has no floor at 0: a factor over a first
  value near 0 would call its noise a rise).
* :func:`diverged`: the loss of the run's last fifth (median) is ≥ :data:`RISE` × its first tenth's
  (mean), over at least :data:`MIN_STEPS` kept steps with a loss: a wrecked run, whatever its scale
  (the SmolLM2 fine-tune at lr 3e-3 ends at 2.1× its start; healthy runs' losses fall).
* :func:`grad_blowup`: the model's total parameter-gradient norm reached ≥ :data:`BLOWUP` × its
  median over the first steps.

>>> ev = Evidence.of(history)                                           # doctest: +SKIP
>>> ev.loss_rise(1)                                                     # doctest: +SKIP
Rise(step=6, value=14.5, factor=6.3, start=2.3)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..capture.history import FIELD_INDEX

__all__ = ["BLOWUP", "MIN_STEPS", "RISE", "Evidence", "Finding", "Rise", "names"]

#: the loss at or above this many times the run's first loss: harm (a rise), or a wrecked run (its end)
RISE = 2.0
#: fewest kept steps with a finite loss before the run's end is compared with its start
MIN_STEPS = 5
#: the total parameter-gradient norm at or above this many times its early median: gradients blew up
BLOWUP = 100.0


@dataclass(frozen=True)
class Finding:
    """One finding over the run: ``code`` (docs/diagnosis.md lists them), ``severity`` ("error" |
    "warning" | "note"), ``step`` (its first step; 0 without a history), ``rows`` (the module rows or
    parameters it names), ``text`` (the sentence, module names in backticks: what the header says
    when it is the root), ``short`` (the clause the header gives it as a consequence), ``detail`` (the
    full sentence of the ranked list), ``advice`` ("" when a cause's advice covers it) and ``cause``
    (the index in the ranked list of the finding it follows from; -1 for a root cause)."""

    code: str
    severity: str
    step: int
    rows: tuple[str, ...]
    text: str
    short: str
    detail: str
    advice: str = ""
    cause: int = -1
    key: str = field(default="", compare=False)  # identity while ranking (the code, or code:row for diagnoses)

    def __str__(self) -> str:
        return f"[{self.severity}] {self.code} (step {self.step}): {self.text}" + (f" — {self.advice}" if self.advice else "")


def names(rows: Sequence[str], n: int = 3) -> str:
    """`` `0`, `1` and `2` `` (module names as names, never bare numbers)."""
    xs = [f"`{r}`" for r in rows[:n]]
    more = len(rows) - n
    if more > 0:
        return ", ".join(xs) + f" and {more} more"
    if not xs:
        return ""
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + f" and {xs[-1]}"


class Rise(NamedTuple):
    """The loss at ``step`` (``value``) is ``factor`` × the run's first loss ``start`` — with a ``scale`` other than
    ``start`` (a loss that went negative), ``value`` = ``start`` + (``factor`` − 1) × ``scale``."""

    step: int
    value: float
    factor: float
    start: float
    scale: float = math.nan


@dataclass(frozen=True)
class Evidence:
    """The run's loss and total parameter-gradient norm per kept step (NaN where unknown)."""

    steps: np.ndarray
    loss: np.ndarray
    gnorm: np.ndarray
    move: float = math.nan  # the largest per-row median update ratio over the run (NaN: none known)
    chance: float = math.nan  # ln C when the last row is N×C (C ≥ 2) and the first loss is within 10% of ln C (else NaN)

    @classmethod
    def of(cls, history: Any) -> Evidence:
        """From a :class:`~nbdebug.capture.history.History` (empty without one)."""
        if history is None or not len(history):
            return cls(np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
        steps = np.asarray(history.step_index)
        loss = np.asarray(history.scalar("loss"), np.float64)
        v = history.values("last")
        pg = np.asarray(v[:, :, FIELD_INDEX["param_grad_norm"]], np.float64)
        ur = np.asarray(v[:, :, FIELD_INDEX["update_ratio"]], np.float64)
        with np.errstate(invalid="ignore"):
            have = np.isfinite(pg).any(axis=1)
            g = np.sqrt(np.nansum(np.where(np.isfinite(pg), pg, 0.0) ** 2, axis=1))
            cols = np.isfinite(ur).any(axis=0)
            move = float(np.max(np.nanmedian(ur[:, cols], axis=0))) if cols.any() else math.nan
        return cls(steps, loss, np.where(have, g, np.nan), move, _chance(history, loss))

    def learnt(self) -> bool:
        """A classifier that started at chance (:attr:`chance`) ends (median of its last fifth, ≥ :data:`MIN_STEPS`
        kept steps) at ≤ half of it: half-way from chance to 0."""
        _, v = self._finite()
        n = len(v)
        return n >= MIN_STEPS and math.isfinite(self.chance) and float(np.median(v[-max(2, n // 5):])) <= 0.5 * self.chance

    def _finite(self) -> tuple[np.ndarray, np.ndarray]:
        ok = np.isfinite(self.loss)
        return self.steps[ok], self.loss[ok]

    def scale(self) -> float:
        """The loss's own scale, against which a rise or a recovery is measured: its first value while every finite
        loss is ≥ 0 (cross-entropy, MSE: a floor at 0, so a factor over the start is offset-free), else
        max(|first|, first − lowest) — a loss that went negative (−cosine, a Gaussian NLL, a policy gradient) has no
        floor at 0, and the distance it fell below its start is its range. NaN without a loss."""
        _, v = self._finite()
        if not len(v):
            return math.nan
        first, low = float(v[0]), float(v.min())
        return first if low >= 0 else max(abs(first), first - low)

    def loss_rise(self, after: int) -> Rise | None:
        """The largest loss after step ``after`` when it is above the run's first loss by ≥ (:data:`RISE` − 1) ×
        :meth:`scale` (a positive scale; for a loss ≥ 0: ≥ :data:`RISE` × its first value); a loss that went
        NaN/Inf after it counts as a rise to ∞."""
        s, v = self._finite()
        sc = self.scale()
        if not len(v) or not sc > 0:
            return None
        start = float(v[0])
        bad = np.flatnonzero(~np.isfinite(self.loss) & ~np.isnan(self.loss) & (self.steps > after))
        if len(bad):
            return Rise(int(self.steps[bad[0]]), math.inf, math.inf, start, sc)
        later = s > after
        if not later.any():
            return None
        j = int(np.argmax(np.where(later, v, -np.inf)))
        f = 1.0 + (float(v[j]) - start) / sc  # = v / start for a loss ≥ 0
        return Rise(int(s[j]), float(v[j]), f, start, sc) if f >= RISE else None

    def diverged(self) -> Rise | None:
        """The run's end (median loss of its last fifth, at its last step) vs its start (mean of its
        first tenth) when the end is ≥ :data:`RISE` × the start."""
        s, v = self._finite()
        n = len(v)
        if n < MIN_STEPS:
            return None
        start = float(np.mean(v[: max(1, n // 10)]))
        end = float(np.median(v[-max(2, n // 5):]))
        if start <= 0 or end < RISE * start:
            return None
        return Rise(int(s[-1]), end, end / start, start)

    def grad_blowup(self) -> tuple[int, float, float] | None:
        """(step, norm, early median) of the first kept step whose total parameter-gradient norm is ≥
        :data:`BLOWUP` × the median of the first five kept steps with one."""
        ok = np.flatnonzero(np.isfinite(self.gnorm) & (self.gnorm > 0))
        if len(ok) < 3:
            return None
        g0 = float(np.median(self.gnorm[ok[:5]]))
        big = ok[self.gnorm[ok] >= BLOWUP * g0]
        if not len(big):
            return None
        j = int(big[0])
        return int(self.steps[j]), float(self.gnorm[j]), g0

    def falls(self) -> bool:
        """The loss fell: its last fifth's median is below 0.9 × its first tenth's mean."""
        _, v = self._finite()
        n = len(v)
        if n < MIN_STEPS:
            return False
        return float(np.median(v[-max(2, n // 5):])) < 0.9 * float(np.mean(v[: max(1, n // 10)]))


def _chance(history: Any, loss: np.ndarray) -> float:
    """ln C of a classifier whose first loss sits at chance: the history's last row of shape N×C (C ≥ 2) and the first
    finite loss within 10% of ln C; NaN otherwise (a regression, a reconstruction, an LM's N×T×V)."""
    info = list(getattr(history, "row_info", None) or [])
    shape = tuple(info[-1].get("shape") or ()) if info else ()
    v = loss[np.isfinite(loss)]
    if len(shape) != 2 or not shape[1] >= 2 or not len(v):
        return math.nan
    c = math.log(int(shape[1]))
    return c if abs(float(v[0]) / c - 1) <= 0.1 else math.nan
