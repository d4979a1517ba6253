"""Closing a step: what the open step recorded (a :class:`ClosedStep`) → the host → one
:class:`~nbdebug.capture.steps.StepData`, committed, held back, or left to wait in the batch.

:func:`close_step` brings everything a step recorded (stat vectors, gradient stats, dead-unit masks,
input checks, parameter-gradient norms, optimizer numbers, the loss) to the host with
:func:`~nbdebug.capture.fold.host_items` (one ``.cpu()`` per device, whatever the number of layers;
nothing to bring on the CPU path, where every item is already a host number), which is also the step's
non-finite check. The usual CPU step then waits in the batch (:meth:`~nbdebug.capture.steps.Steps.defer`);
any other is merged per row through its cached :class:`~nbdebug.capture.fold.Layout` (a few numpy
operations over all rows, no Python loop over rows) and committed (or held back: a no-grad step
before any training forward).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .batch import as_float, step_extras
from .fold import (
    backward_origin,
    host_items,
    merge_calls,
    merge_grads,
    or_masks,
    step_values,
    unscale,
)
from .stats import IDX, N_FIELDS
from .steps import StepData, Steps

__all__ = ["ClosedStep", "close_step"]

_NAN, _INF = IDX["nan"], IDX["inf"]
#: types every item of a step has on the CPU path (nothing to transfer)
_HOST_TYPES = frozenset({np.ndarray, type(None), float, bool, int})


class ClosedStep:
    """What the open step left when it closed: its ``calls``, ``losses``, the calls whose gradient
    came after their own step closed (``late``), ``maybe_bad`` (a hook saw a NaN/Inf count or stats it
    cannot read on the host), the forward incident snapshotted in a hook (``hot`` of ``hot_call``), its
    parameter-gradient norms (``pg``: (parameters, norms) or None; ``pg_late``: taken after a
    ``scaler.step`` unscaled them; ``pgmap``: their per-module map), the optimizer's numbers (``upd``),
    ``hold`` (a no-grad step before any training forward) and ``device_path``. ``loss_sum``: the
    losses are what the step's backward calls ran on (summed, and divided by a GradScaler's scale),
    not losses of its passes (averaged). ``classes``: the batch's class make-up (:mod:`.classes`), or None."""

    __slots__ = ("calls", "classes", "device_path", "hold", "hot", "hot_call", "late", "loss_sum", "losses", "maybe_bad",
                 "pg", "pg_late", "pgmap", "upd")

    def __init__(self, calls: list[Any], losses: list[Any], late: list[Any], maybe_bad: bool, hot: Any, hot_call: Any,
                 pg: Any, pg_late: bool, pgmap: Any, upd: Any, hold: bool, device_path: bool, loss_sum: bool = False,
                 classes: Any = None) -> None:
        self.calls, self.losses, self.late, self.maybe_bad, self.hot, self.hot_call = calls, losses, late, maybe_bad, hot, hot_call
        self.pg, self.pg_late, self.pgmap, self.upd, self.hold, self.device_path = pg, pg_late, pgmap, upd, hold, device_path
        self.loss_sum, self.classes = loss_sum, classes


def _lr_of(opt_keys: list[tuple[str, tuple[str, ...]]], h_opt: list[Any]) -> dict[str, float]:
    """Module → learning rate of the step ("" → the first group's), from the optimizer numbers."""
    i = 0
    for kind, mods in opt_keys:
        if kind == "lr":
            return dict(zip(mods, [v if type(v) is float else as_float(v) for v in h_opt[i : i + len(mods)]]))
        i += len(mods)
    return {}


def _loss_of(h_loss: list[Any], total: bool, scale: float | None) -> float:
    """The step's loss: the mean of its passes' losses, or (``total``: backward calls) their sum
    divided by the GradScaler scale that scaled them; NaN without any."""
    if not h_loss:
        return math.nan
    s = sum(as_float(x) for x in h_loss)
    if not total:
        return s / len(h_loss)
    return s / scale if scale is not None else s


def _scale_of(x: Any) -> float | None:
    """The GradScaler scale from the step's transfer (None: none, or not a usable divisor)."""
    if x is None:
        return None
    s = as_float(x)
    return s if math.isfinite(s) and s > 0 and s != 1.0 else None


def close_step(cs: ClosedStep, steps: Steps) -> None:
    """Bring the closed step to the host (one transfer) and hand it to ``steps``: into the batch,
    committed, or held back (a no-grad step before any training forward)."""
    calls, late, upd, pg, maybe_bad = cs.calls, cs.late, cs.upd, cs.pg, cs.maybe_bad
    if not calls and not late and upd is None:
        return
    losses = cs.losses
    n = len(calls)
    opt_keys: list[tuple[str, tuple[str, ...]]] = []  # (kind, its modules in order)
    opt_vals: list[Any] = []
    if upd is not None:
        for kind in ("update_ratio", "param_norm", "lr"):
            d = getattr(upd, kind)
            if d:
                opt_keys.append((kind, tuple(d)))
                opt_vals += d.values()
    # inputs are checked only by a call whose check raised maybe_bad (forward.py: _link_inputs)
    checks = [t for c in calls for t in c.input_checks] if maybe_bad else []
    h_raw = [c.raw for c in calls]
    h_grad = [c.grad_stats for c in calls]
    h_alive = [c.alive for c in calls]
    small: list[Any] = [*opt_vals, *losses, cs.classes,
                        None if pg is None else (pg[1] if isinstance(pg[1], np.ndarray) else torch.stack(pg[1])),
                        upd.scale if upd is not None else None, upd.skipped if upd is not None else False]
    # On the CPU path a hook that produced stats it cannot read on the host raised maybe_bad: else the
    # calls' stats are host arrays already and only their unit masks (a tensor for half precision) and
    # the step's other numbers need a look.
    on_host = (not cs.device_path and not maybe_bad and not late and not checks
               and _HOST_TYPES.issuperset(map(type, small)) and _HOST_TYPES.issuperset(map(type, h_alive)))
    h_late: list[Any] = []
    h_checks: list[Any] = []
    if not on_host:
        items = [*h_raw, *h_grad, *h_alive, *(c.late for c in late), *checks, *small]
        on_host = not cs.device_path and _HOST_TYPES.issuperset(map(type, items))
        if not on_host:
            items = host_items(items, cs.device_path)  # THE transfer of this step (none on the CPU path)
        h_raw, h_grad, h_alive = items[:n], items[n : 2 * n], items[2 * n : 3 * n]
        pos = 3 * n + len(late)
        h_late, h_checks = items[3 * n : pos], items[pos : pos + len(checks)]
        small = items[pos + len(checks) :]
    h_opt = small[: len(opt_vals)]
    h_loss = small[len(opt_vals) : len(opt_vals) + len(losses)]
    h_cls, h_pg, h_scale, h_skip = small[-4], small[-3], small[-2], small[-1]
    scale = _scale_of(h_scale)
    skipped = h_skip if type(h_skip) is bool else bool(np.any(h_skip))
    lr_of = _lr_of(opt_keys, h_opt)
    scalars = {"loss": _loss_of(h_loss, cs.loss_sum, scale), "lr": lr_of.get("", math.nan), "skipped": 1.0 if skipped else 0.0}
    if h_cls is not None:
        scalars["class_share"], scalars["class_top"] = float(h_cls[0]), float(h_cls[1])
    lrs = {m: v for m, v in lr_of.items() if m}
    if (on_host and calls and not late and not checks and not maybe_bad
            and steps.defer(steps.layout(calls), calls, h_raw, h_grad, h_alive, scale, h_pg, cs.pgmap, cs.pg_late,
                            opt_keys, h_opt, scalars, lrs, skipped, cs.hold)):
        return  # folded later with other steps (batch.py)
    steps.flush()  # steps waiting in the batch come first
    steps.late(late, h_late)
    if not calls:
        return
    data = _step_data(cs, steps, h_raw, h_grad, h_alive, h_checks, checks, h_opt, opt_keys, h_pg, scale, scalars,
                      skipped, lrs)
    if cs.hold:
        steps.hold_back(data)
    else:
        steps.commit(data)


def _step_data(cs: ClosedStep, steps: Steps, h_raw: list[Any], h_grad: list[Any], h_alive: list[Any],
               h_checks: list[Any], checks: list[Any], h_opt: list[Any], opt_keys: list[tuple[str, tuple[str, ...]]],
               h_pg: Any, scale: float | None, scalars: dict[str, float], skipped: bool,
               lrs: dict[str, float]) -> StepData:
    """A step folded alone: its calls merged per row, its history values, its non-finite check."""
    calls, pg = cs.calls, cs.pg
    n = len(calls)
    # outputs' and gradients' raw stats side by side: [calls, 2 × N_FIELDS] (one array for the whole fold)
    both = np.empty((n, 2 * N_FIELDS))
    both[:, :N_FIELDS] = h_raw
    n_grad = n - sum(1 for g in h_grad if g is None)
    if n_grad == n:
        both[:, N_FIELDS:] = h_grad
    else:
        both[:, N_FIELDS:] = np.nan
        if n_grad:
            for j, g in enumerate(h_grad):
                if g is not None:
                    both[j, N_FIELDS:] = g
    raws, grads = both[:, :N_FIELDS], both[:, N_FIELDS:]
    if scale is not None:
        unscale(grads, scale)
    lay = steps.layout(calls)
    rows = lay.rows
    if lay.unique:
        rg = both
        alive, first_call = h_alive, calls
    else:
        rg = np.concatenate([merge_calls(lay, raws), merge_grads(lay, grads)], axis=1)
        nr = len(rows)
        alive = [None] * nr
        first_call = [calls[j] for j in lay.first_idx]
        seen = [False] * nr
        for j, r in enumerate(lay.inv):
            if not seen[r]:
                seen[r], alive[r] = True, h_alive[j]
            else:
                alive[r] = or_masks(alive[r], h_alive[j])
    values = step_values(rg, lay.sat, n_grad > 0)
    # dead units, parameter-gradient norms (one per module, on its first row), optimizer numbers
    _, pg_bad = step_extras(values[None], lay, [alive], opt_keys, [h_opt],
                            None if pg is None else (cs.pgmap, [h_pg], [None if cs.pg_late else scale]))
    checks_bad: dict[int, bool] = {}
    if checks:
        k = 0
        for c in calls:
            m = len(c.input_checks)
            if m:
                checks_bad[id(c)] = not all(np.isfinite(x).all() for x in h_checks[k : k + m])
                k += m
    data = StepData(calls, rows, rg, n_grad > 0, values, alive, lay.counts, first_call, checks_bad, scalars, skipped,
                    lrs, lay)
    # the step's non-finite check, in phase order (counts are never negative: any > 0 ⇔ their sum > 0);
    # on the CPU path the hooks flagged a step with any NaN/Inf count (else nothing to look for)
    suspect = cs.device_path or cs.maybe_bad
    if suspect and (raws[:, _NAN : _INF + 1] > 0).any():
        j = int(np.flatnonzero(raws[:, _NAN] + raws[:, _INF] > 0)[0])
        c = calls[j]
        what = "NaN" if raws[j, _NAN] > 0 else "Inf"
        data.fwd = (c, not checks_bad.get(id(c), False), what)
        if cs.hot is not None and cs.hot_call is c:
            data.fwd_incident = cs.hot
        elif c.held is not None:
            data.fwd_incident = steps.log.forward_incident(c, *c.held)
    if suspect and not skipped and n_grad and (grads[:, _NAN : _INF + 1] > 0).any():
        data.bwd = backward_origin(calls, grads)
    if not skipped and pg_bad:
        first = steps.rows.first_of
        data.pg = min(pg_bad, key=lambda m: first[m].id if m in first else 1 << 30)
    for j, c in enumerate(calls):  # (the open step's reset marks them closed)
        c.raw = c.alive = c.held = c.ref = None
        if c.input_checks:
            c.input_checks = []
        c.grad_stats = grads[j] if h_grad[j] is not None else None
    return data
