"""The batch order as the run shows it (pure numpy: no torch, no Jupyter): ``unshuffled``, from the per-step
class make-up of the batch the capture keeps (the history's ``class_share`` / ``class_top`` scalars: the share of
the batch on its most frequent label and that label, read from the gradient of the model's classifier output,
:mod:`nbdebug.capture.classes`).

``unshuffled``: most batches are nearly one class (:data:`ONE_CLASS` of their samples or more, in at least
:data:`MOST` of the steps), and the class of those batches persists from one such step to the next far more than
chance: in shuffled data the class of each step's batch is drawn afresh, so the class repeats with probability
``Σ q_k²`` (``q_k``: each class's share of those steps); data read class after class repeats it for a whole class's
worth of batches. The finding needs a z-score of the repeats ≥ :data:`Z_MIN` over that binomial, at least two
classes each holding :data:`HELD` such steps in a row, and :data:`MIN_STEPS` steps with the statistic.

What it is calibrated on (the project zoo, ``benchmarks/zoo``; docs/diagnosis.md): shuffled runs — batches of 4 of
10 classes (one class by chance now and then), binary data at 90/10 (batches of the majority class, the same class
each time: ``Σ q²`` ≈ 1, no evidence), a head predicting one class for every batch at init (the statistic reads the
labels, not the predictions) — stay quiet; the digits MLP and CNN read class after class are named at their first
step.

Ranking: with one class per batch, each step pulls every logit toward that batch's class and the next batches undo
it: large update ratios, loss spikes and a loss that ends above its start after that first step follow from the
order (:func:`order_causes`), as the same model at the same learning rate learns on shuffled batches.

>>> [f.code for f in order_findings(result)]                                    # doctest: +SKIP
['unshuffled']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .events import fmt_g
from .run_evidence import Finding

__all__ = ["ADVICE", "HELD", "MIN_STEPS", "MOST", "ONE_CLASS", "Z_MIN", "order_causes", "order_findings", "unshuffled"]

ADVICE = ("Shuffle the training data every epoch: DataLoader(..., shuffle=True), a RandomSampler (or a "
          "WeightedRandomSampler for imbalanced classes), or index the tensors with torch.randperm; data stored class "
          "after class must not be read in order.")

#: a step's batch is "one class" when its most frequent label holds at least this share of its samples
ONE_CLASS = 0.9
#: at least this share of the steps with the statistic hold one class
MOST = 0.5
#: z-score of the repeats of the one-class steps' class over the chance of a repeat (Σ q²) at or above this
Z_MIN = 4.0
#: at least two classes each hold this many one-class steps in a row
HELD = 2
#: fewest steps with the statistic
MIN_STEPS = 10

#: what follows from batches of one class when it comes after the order's first step
_FOLLOWS = ("lr_high", "loss_diverged", "loss_spike", "exploding_run")


def unshuffled(steps: np.ndarray, share: np.ndarray, top: np.ndarray) -> Finding | None:
    """The ``unshuffled`` finding of per-step ``share`` / ``top`` at ``steps`` (NaN: no statistic; 0: no row of
    the batch named its label, e.g. every sample already fitted: no evidence either way), or None."""
    ok = np.isfinite(share) & np.isfinite(top) & (share > 0)
    steps, share, top = np.asarray(steps)[ok], share[ok], top[ok].astype(np.int64)
    m = len(share)
    if m < MIN_STEPS:
        return None
    one = share >= ONE_CLASS
    n = int(one.sum())
    if n < max(MIN_STEPS // 2, math.ceil(MOST * m)):
        return None
    cls, at = top[one], steps[one]
    q = np.bincount(cls) / n
    chance = float((q * q).sum())
    same = int((cls[1:] == cls[:-1]).sum())
    pairs = n - 1
    if chance >= 1.0:
        return None
    z = (same - pairs * chance) / math.sqrt(pairs * chance * (1.0 - chance))
    # runs of one-class steps of the same class (mixed steps between them do not break a run)
    cut = np.flatnonzero(cls[1:] != cls[:-1]) + 1
    starts, ends = np.r_[0, cut], np.r_[cut, n]
    lens = ends - starts
    held = {int(cls[s]) for s, k in zip(starts, lens) if k >= HELD}
    if z < Z_MIN or len(held) < 2:
        return None
    first = int(at[0])
    runs = [(int(cls[s]), int(at[s]), int(at[e - 1])) for s, e in zip(starts, ends)]
    shown = ", ".join(f"class {c} at step {a}" + (f"–{b}" if b != a else "") for c, a, b in runs[:4])
    more = f" and {len(runs) - 4} more runs" if len(runs) > 4 else ""
    changes = len(runs) - 1
    text = (f"data not shuffled: in {n} of {m} steps one class held ≥ {ONE_CLASS:.0%} of the batch, and that class "
            f"changed {changes} times, in runs of {int(lens.min())}–{int(lens.max())} steps ({shown}{more})")
    detail = (f"{text}: batches come class after class (the class repeats from one such step to the next {same} times "
              f"of {pairs}, where shuffled batches would repeat it about {fmt_g(pairs * chance)} times). Each step "
              "pulls the model toward one class and the next ones undo it: large updates, loss swings and a "
              "divergence that follow come from the order, not from the learning rate alone.")
    return Finding("unshuffled", "warning", first, (), text, f"one class per batch from step {first}", detail, ADVICE,
                   key="unshuffled")


def order_findings(result: Any) -> list[Finding]:
    """The batch-order findings of a capture ``result`` whose history keeps the class make-up (else none)."""
    h = getattr(result, "history", None)
    if h is None or len(h) < MIN_STEPS:
        return []
    try:
        share, top = np.asarray(h.scalar("class_share"), np.float64), np.asarray(h.scalar("class_top"), np.float64)
    except KeyError:  # a history from before the statistic (a saved run)
        return []
    f = unshuffled(np.asarray(h.step_index), share, top)
    return [f] if f is not None else []


def order_causes(found: Sequence[Finding]) -> dict[str, str]:
    """key → ``unshuffled`` for the findings that follow from it (see the module doc): the large updates, loss spikes,
    divergence and blown-up gradients seen at or after its first step."""
    order = next((f for f in found if f.code == "unshuffled"), None)
    if order is None:
        return {}
    return {f.key: order.key for f in found if f.key in _FOLLOWS and f.step >= order.step}
