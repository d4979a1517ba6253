"""Findings about the schedule and the harm a statistic did (pure numpy: no torch, no Jupyter), from what
the history already keeps (the per-step ``lr`` and ``loss`` scalars: no new capture cost):

* ``lr_decayed``: the learning rate the optimizer used fell to ≤ :data:`DECAYED` × its peak within the run
  and stayed there for the whole last half, while the loss of that half did not fall: a scheduler meant per
  epoch stepped per batch (``StepLR``/``ExponentialLR`` ``.step()`` inside the batch loop) — training stops
  long before the run ends. Healthy schedules (cosine to 0, OneCycle, warmup, StepLR per epoch) reach such a
  fraction only in their last steps, if at all.
* :func:`recovered`: the loss ended (median of its last fifth) at ≤ :data:`RECOVERED` × its first value (a loss that
  went negative: half of its scale below its start, :meth:`~nbdebug.inspectors.run_evidence.Evidence.scale`): a
  rise on the way (a cosine classifier's first steps at scale 30) was no lasting harm, so large update ratios
  before it stay a note.
* :func:`batch_statistics`: the batch probe's change comes from statistics over the batch only (feeding every
  sample twice over changes the outputs by ≤ :data:`STATS_ONLY` × the half-batch change, and no seq-first
  attention/RNN layer is in the model): a normalisation over the batch written by hand, as BatchNorm does in train
  mode — a note (at eval a sample's prediction depends on its batch), not samples mixed by a reshape.
* :func:`harmless_dead_units`: the model learnt (a classifier that started at chance: its loss ended at ≤ half of ln C;
  any other loss: it fell, :meth:`~nbdebug.inspectors.run_evidence.Evidence.falls`): half of a ReLU layer's units
  silent in a model that learns is usual, so ``dead_units`` is then a note.

>>> [f.code for f in data_findings(result)]                                     # doctest: +SKIP
['lr_decayed']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .events import fmt_g
from .run_evidence import Evidence, Finding

__all__ = ["ADVICE", "DECAYED", "RECOVERED", "STATS_ONLY", "batch_statistics", "data_causes", "data_findings",
           "harmless_dead_units", "recovered"]

ADVICE = {
    "lr_decayed": "Step an epoch-based scheduler (StepLR, ExponentialLR, MultiStepLR) once per epoch, after the "
                  "batch loop, or size it in batches (step_size / T_max counted in optimizer steps).",
}

#: the lr at or below this fraction of its peak over the whole last half of the run: training has stopped.
#: The zoo's healthy schedules (StepLR per epoch ×0.5–0.7, OneCycle, cosine, warmup, ReduceLROnPlateau) keep
#: ≥ 0.25 of their peak at the run's middle; StepLR(step_size=1, gamma=0.7) per batch is at 1e-8 of it there
DECAYED = 1e-2
#: a loss rise is no lasting harm when the run ends at or below this fraction of its first loss (the zoo's
#: healthy runs end at 0.013–0.71 of it; a run that rose and came back down ends far below where it began)
RECOVERED = 0.5


def recovered(ev: Evidence) -> bool:
    """The run's end (median loss of its last fifth, ≥ 5 kept steps, every loss finite) is below its first loss by
    ≥ (1 − :data:`RECOVERED`) × the loss's scale (:meth:`Evidence.scale`): ≤ :data:`RECOVERED` × its first loss for a
    loss ≥ 0; for a loss that went negative, half of its range below the start."""
    ok = np.isfinite(ev.loss)
    v = ev.loss[ok]
    sc = ev.scale()
    if len(v) < 5 or not sc > 0 or not np.isfinite(ev.loss).all():
        return False
    return float(np.median(v[-max(2, len(v) // 5):])) <= float(v[0]) - (1 - RECOVERED) * sc


def harmless_dead_units(f: Finding, ev: Evidence) -> Finding:
    """``f`` as a note when it is ``dead_units`` and the model learnt, else ``f``. Units silent for every sample (some of
    a layer's, not all) are no harm seen in a model that learns: half-silent ReLU layers are usual in healthy deep
    Kaiming nets, VAEs and UNets. Learnt: a classifier that started at chance (:attr:`Evidence.chance`, ln C) ended at
    ≤ half of it (:meth:`Evidence.learnt`: its floor is 0, so that is half-way — a 10–20% fall with 89% of a layer
    dead is harm, review 26 R5); any other loss fell (:meth:`Evidence.falls`, 10%): its floor is unknown to the run (a
    VAE's summed BCE + KL sits at the pixels' entropy: the zoo's ``vae_digits`` falls 38.3 → 27.3 with 88% of its
    encoder's units silent, as VAEs' inactive units are). A loss that does not fall, a whole layer dead (``dead``) or
    units that died during the run (``became_dead``) stay warnings; and a partly dead layer does not explain a loss at
    chance (it still passes signal)."""
    if f.code != "dead_units" or not (ev.learnt() if math.isfinite(ev.chance) else ev.falls()):
        return f
    return replace(f, severity="note", advice="", detail=f.detail.rstrip(".") + ", while the loss fell: no harm seen.")


#: finding code → the code of the finding it follows from, when both were found (tied by what they mean)
_FOLLOWS = {"grad_fell": "weight_decay_dominates",  # weights decayed toward 0 pass ever smaller gradients
            "lr_low": "lr_decayed"}  # the same cause: the schedule made every update tiny


def data_causes(found: Sequence[Finding]) -> dict[str, str]:
    """key → cause key for the ranking (:func:`~nbdebug.inspectors.findings.rank`) among ``found`` and the run's own."""
    codes = {f.code for f in found}
    return {k: c for k, c in _FOLLOWS.items() if c in codes}


def data_findings(result: Any) -> list[Finding]:
    """The schedule findings of a capture ``result`` with a history (else none)."""
    h = getattr(result, "history", None)
    if h is None or len(h) < 10:
        return []
    f = _lr_decayed(h, Evidence.of(h))
    return [f] if f is not None else []


def _lr_decayed(h: Any, ev: Evidence) -> Finding | None:
    lr = np.asarray(h.scalar("lr"), np.float64)
    steps = np.asarray(h.step_index)
    ok = np.isfinite(lr)
    if ok.sum() < 10 or not np.all(lr[ok] >= 0):
        return None
    lr, steps, loss = lr[ok], steps[ok], ev.loss[ok]
    peak = float(lr.max())
    if not peak > 0:
        return None
    half = len(lr) // 2
    if float(lr[half:].max()) > DECAYED * peak:
        return None
    tail = loss[half:]
    tail = tail[np.isfinite(tail)]
    if len(tail) < 5 or Evidence(np.arange(len(tail)), tail, np.ones(len(tail))).falls():
        return None
    j = int(np.flatnonzero(lr <= DECAYED * peak)[0])
    s = int(steps[j])
    text = (f"the learning rate fell to {fmt_g(float(lr[-1]))} by step {int(steps[-1])} ({fmt_g(float(lr[-1]) / peak)}× its "
            f"peak {fmt_g(peak)}; below 1/{round(1 / DECAYED)} of it from step {s}), and the loss stopped falling")
    detail = (f"{text}: a scheduler meant per epoch stepped per batch? From step {s} on the updates are too small to "
              f"train (the loss over the last half: {fmt_g(float(tail[0]))} → {fmt_g(float(np.median(tail[-max(2, len(tail) // 5):])))}).")
    return Finding("lr_decayed", "warning", s, (), text, f"lr {fmt_g(float(lr[-1]) / peak)}× its peak from step {s}", detail,
                   ADVICE["lr_decayed"], key="lr_decayed")


#: the duplicated-batch change at or below this fraction of the half-batch change: the outputs depend on the batch
#: through statistics over it only (a mean/std over dim 0: duplicating every sample leaves the mean and the biased
#: std as they were, the unbiased std within 1/(2B)); a reshape that interleaves samples, a sum or a norm over the
#: batch (×√2 when duplicated) change about as much either way
STATS_ONLY = 0.1


def batch_statistics(probe: dict[str, Any], step: int) -> Finding | None:
    """A note for a batch probe whose change is statistics over the batch only (see the module doc), else None."""
    dup, change = probe.get("duplicated"), float(probe.get("change", 0.0))
    if dup is None or probe.get("seq_first") or not float(dup) <= STATS_ONLY * change:
        return None
    text = (f"the outputs depend on statistics over the batch: the first {probe['half']} samples of the last batch changed "
            f"by {change:.0%} without its other {int(probe['batch']) - int(probe['half'])}, and by {float(dup):.1%} with every "
            "sample fed twice (eval mode)")
    detail = (text + ": a normalisation over the batch (as BatchNorm in train mode) — fine for training; at eval a "
              "sample's prediction then depends on the batch it comes in (keep running statistics for eval, as BatchNorm does).")
    return Finding("batch_stats", "note", step, (), text, "statistics over the batch", detail, "", key="batch_stats")
