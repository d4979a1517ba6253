"""Closing a step of a :class:`~nbdebug.capture.session.Capture`: the step's stats → rows and one
:class:`~nbdebug.capture.history.History` entry, in one transfer per step.

:func:`close_step` brings everything a step recorded (stat vectors, gradient stats, dead-unit
masks, input checks, parameter-gradient norms, optimizer numbers, the loss) to the host with
:func:`~nbdebug.capture.stats.packed_to_host` (one ``.cpu()`` per device, whatever the number of
layers; nothing to bring on the CPU path, where every item is already a host number), which is also
the step's non-finite check; :func:`commit` folds it into the whole-run rows and the history;
:func:`finish` closes the last step at exit (then :mod:`.assemble` builds the result). The array
work per step goes through the step's cached :class:`~nbdebug.capture.fold.Layout` (see
:mod:`.fold`): a few numpy operations over all rows, no Python loop over rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .batch import _f, defer, flush, kept, merge_alive, step_extras
from .fold import (
    Layout,
    _accumulate,
    _backward_origin,
    _ensure_run,
    _Fetch,
    _host,
    _merge2,
    _or,
    _unscale,
    accumulate_step,
    merge_calls,
    merge_grads,
    step_values,
)
from .history import FIELD_INDEX, HISTORY_FIELDS
from .incidents import Incident, forward_incident, step_incidents
from .losses import _user_loss
from .stats import IDX, N_FIELDS, summarize

PENDING_NO_GRAD = 16  # no-grad forwards held back before the first training forward (then: an inference cell)

if TYPE_CHECKING:
    from .calls import _Call
    from .session import Capture

__all__ = ["close_step", "commit", "finish"]

_F = len(HISTORY_FIELDS)
_FI = FIELD_INDEX
_GRAD_COLS = [_FI["grad_" + k] for k in ("mean", "std", "min", "max", "norm", "nan", "inf")]
_GRAD_KEYS = ("mean", "std", "min", "max", "norm", "nan", "inf")
_NAN, _INF = IDX["nan"], IDX["inf"]
#: types every item of a step has on the CPU path (nothing to transfer)
_HOST_TYPES = frozenset({np.ndarray, type(None), float, bool, int})


@dataclass
class _StepData:
    """One closed step on the host, waiting to be committed (or dropped as an evaluation)."""

    calls: list[Any]
    rows: list[Any]  # _Row of each merged step row
    rg: np.ndarray  # [n, 2 × N_FIELDS] merged per row: outputs' raw stats, then gradients' (NaN: no gradient)
    has_grad: bool  # some row has gradient stats
    values: np.ndarray  # [n, F] float32 for the history
    alive: list[np.ndarray | None]  # per row: units non-zero in some call of the step (None: all / n.a.)
    counts: np.ndarray  # calls per row
    first_call: list[Any]  # per row: its first call of the step
    checks_bad: dict[int, bool]  # id(call) → an external input was non-finite
    scalars: dict[str, float]
    skipped: bool
    lrs: dict[str, float]
    layout: Layout | None = None
    fwd: tuple[Any, bool, str] | None = None  # (first non-finite call, inputs finite, "NaN"/"Inf")
    fwd_incident: Incident | None = None
    bwd: tuple[Any, Any] | None = None  # (call with the first non-finite output gradient, origin consumer)
    pg: str | None = None  # first module whose parameter gradients were non-finite
    incidents: list[Incident] = field(default_factory=list)


def _lr_of(opt_keys: list[tuple[str, tuple[str, ...]]], h_opt: list[Any]) -> dict[str, float]:
    """Module → learning rate of the step ("" → the first group's), from the optimizer numbers."""
    i = 0
    for kind, mods in opt_keys:
        if kind == "lr":
            return dict(zip(mods, [v if type(v) is float else _f(v) for v in h_opt[i : i + len(mods)]]))
        i += len(mods)
    return {}


def _loss_of(h_loss: list[Any]) -> float:
    return (sum(_f(x) for x in h_loss) / len(h_loss)) if h_loss else math.nan


def _layout(cap: Capture, calls: list[_Call]) -> Layout:
    """The step's layout: the previous step's when its calls belong to the same rows in the same order."""
    key = [c.row for c in calls]
    lay = cap._layout
    if lay is None or lay.key != key:
        lay = cap._layout = Layout(key, cap.first_row)
    return lay


def close_step(cap: Capture) -> None:
    """Bring the open step to the host (one transfer) and commit it (or hold it back: a no-grad step
    before any training forward)."""
    calls: list[_Call] = cap._step_calls
    cap._pg_fallback()  # no backward of the step reached a recorded output: its gradients now
    pg_late = cap._pg_late  # norms taken after the backward: a scaler.step has unscaled them
    pg, cap._pg_norms = cap._pg_norms, None
    if pg is not None:
        cap.pg_seen = True
    cap._pg_fresh.clear()
    upd = cap.watch.take() if cap.watch is not None else None
    losses = list(cap._losses)
    if cap.loss_fn is not None:
        losses = _user_loss(cap, calls)
    late, cap._late = cap._late, []
    if not calls and not late and upd is None:
        return
    n = len(calls)
    opt_keys: list[tuple[str, tuple[str, ...]]] = []  # (kind, its modules in order)
    opt_vals: list[Any] = []
    if upd is not None:
        for kind in ("update_ratio", "param_norm", "lr"):
            d = getattr(upd, kind)
            if d:
                opt_keys.append((kind, tuple(d)))
                opt_vals += d.values()
    # inputs are checked only by a call whose check raised _maybe_bad (forward.py: _link_inputs)
    checks = [t for c in calls for t in c.input_checks] if cap._maybe_bad else []
    h_raw = [c.raw for c in calls]
    h_grad = [c.grad_stats for c in calls]
    h_alive = [c.alive for c in calls]
    small: list[Any] = [*opt_vals, *losses, None if pg is None else (pg[1] if isinstance(pg[1], np.ndarray) else torch.stack(pg[1])),
                        upd.scale if upd is not None else None, upd.skipped if upd is not None else False]
    # On the CPU path a hook that produced stats it cannot read on the host raised _maybe_bad: else the
    # calls' stats are host arrays already and only their unit masks (a tensor for half precision) and
    # the step's other numbers need a look.
    on_host = (not cap.device_path and not cap._maybe_bad and not late and not checks
               and _HOST_TYPES.issuperset(map(type, small)) and _HOST_TYPES.issuperset(map(type, h_alive)))
    h_late: list[Any] = []
    h_checks: list[Any] = []
    if not on_host:
        items = [*h_raw, *h_grad, *h_alive, *(c.late for c in late), *checks, *small]
        on_host = not cap.device_path and _HOST_TYPES.issuperset(map(type, items))
        if not on_host:
            items = _host(items, cap.device_path)  # THE transfer of this step (none on the CPU path)
        h_raw, h_grad, h_alive = items[:n], items[n : 2 * n], items[2 * n : 3 * n]
        pos = 3 * n + len(late)
        h_late, h_checks = items[3 * n : pos], items[pos : pos + len(checks)]
        small = items[pos + len(checks) :]
    h_opt = small[: len(opt_vals)]
    h_loss = small[len(opt_vals) : len(opt_vals) + len(losses)]
    h_pg, h_scale, h_skip = small[-3], small[-2], small[-1]
    scale = _scale_of(h_scale)
    skipped = h_skip if type(h_skip) is bool else bool(np.any(h_skip))
    lr_of = _lr_of(opt_keys, h_opt)
    scalars = {"loss": _loss_of(h_loss), "lr": lr_of.get("", math.nan), "skipped": 1.0 if skipped else 0.0}
    lrs = {m: v for m, v in lr_of.items() if m}
    hold = not cap._open_grad and not cap._seen_training  # a no-grad step before any training forward: held back
    if (on_host and calls and not late and not checks and not cap._maybe_bad
            and defer(cap, _layout(cap, calls), calls, h_raw, h_grad, h_alive, scale, pg, h_pg, pg_late, opt_keys, h_opt,
                      scalars, lrs, skipped, hold)):
        return  # folded later with other steps (batch.py)
    flush(cap)  # steps waiting in the batch come first
    _flush_late(cap, late, h_late)
    if not calls:
        return
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
        _unscale(grads, scale)
    lay = _layout(cap, calls)
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
                alive[r] = _or(alive[r], h_alive[j])
    values = step_values(rg, lay.sat, n_grad > 0)
    # dead units, parameter-gradient norms (one per module, on its first row), optimizer numbers
    _, pg_bad = step_extras(values[None], lay, [alive], opt_keys, [h_opt],
                            None if pg is None else (cap._pg_modules(pg[0]), [h_pg], [None if pg_late else scale]))
    checks_bad: dict[int, bool] = {}
    if checks:
        k = 0
        for c in calls:
            m = len(c.input_checks)
            if m:
                checks_bad[id(c)] = not all(np.isfinite(x).all() for x in h_checks[k : k + m])
                k += m
    data = _StepData(calls, rows, rg, n_grad > 0, values, alive, lay.counts, first_call, checks_bad, scalars, skipped,
                     lrs, lay)
    # the step's non-finite check, in phase order (counts are never negative: any > 0 ⇔ their sum > 0);
    # on the CPU path the hooks flagged a step with any NaN/Inf count (else nothing to look for)
    suspect = cap.device_path or cap._maybe_bad
    if suspect and (raws[:, _NAN : _INF + 1] > 0).any():
        j = int(np.flatnonzero(raws[:, _NAN] + raws[:, _INF] > 0)[0])
        c = calls[j]
        what = "NaN" if raws[j, _NAN] > 0 else "Inf"
        data.fwd = (c, not checks_bad.get(id(c), False), what)
        if cap._hot is not None and cap._hot_call is c:
            data.fwd_incident = cap._hot
        elif c.held is not None:
            data.fwd_incident = forward_incident(cap, c, *c.held)
    if suspect and not skipped and n_grad and (grads[:, _NAN : _INF + 1] > 0).any():
        data.bwd = _backward_origin(calls, grads)
    if not skipped and pg_bad:
        data.pg = min(pg_bad, key=lambda m: cap.first_row[m].id if m in cap.first_row else 1 << 30)
    for j, c in enumerate(calls):  # (Capture._close_step marks them closed)
        c.raw = c.alive = c.held = c.ref = None
        if c.input_checks:
            c.input_checks = []
        c.grad_stats = grads[j] if h_grad[j] is not None else None
    if hold:
        cap._hold_back(data)
    else:
        commit(cap, data)


def _scale_of(x: Any) -> float | None:
    """The GradScaler scale from the step's transfer (None: none, or not a usable divisor)."""
    if x is None:
        return None
    s = _f(x)
    return s if math.isfinite(s) and s > 0 and s != 1.0 else None


def _flush_late(cap: Capture, late: list[Any], raws: list[Any]) -> None:
    """Gradients of closed steps (a delayed backward): merged rows, History.update, the backward check."""
    if not late:
        return
    by_step: dict[int, list[tuple[Any, np.ndarray]]] = {}
    for c, raw in zip(late, raws):
        c.late = None
        if raw is None:
            continue
        _accumulate(cap.run_grad, np.array([c.row.id]), raw[None])
        c.grad_stats = raw.copy() if c.grad_stats is None else _merge2(c.grad_stats, raw)
        if c.mark.step:
            by_step.setdefault(c.mark.step, []).append((c, c.grad_stats))
    for step, items in sorted(by_step.items()):
        rows, idx = [], {}
        for c, g in items:
            if c.row.id not in idx:
                idx[c.row.id] = len(rows)
                rows.append((c.row, g))
            else:
                k = idx[c.row.id]
                rows[k] = (rows[k][0], _merge2(rows[k][1], g))
        vals = np.full((len(rows), _F), np.nan, np.float32)
        gs = summarize(np.stack([g for _, g in rows]))
        for k, col in zip(_GRAD_KEYS, _GRAD_COLS):
            vals[:, col] = gs[k]
        hids = np.array([r.hid for r, _ in rows])
        if (hids >= 0).all():
            cap._history.update(step, hids, vals)
        if cap.bwd_step is None:
            calls = [c for c, _ in items]
            hit = _backward_origin(calls, np.stack([g for _, g in items]))
            if hit is not None:
                cap.bwd_step, cap.bwd_row = step, hit[0].row.id
                cap.bwd_origin = hit[1].row.id if hit[1] is not None else None


def commit(cap: Capture, data: _StepData) -> None:
    """Fold a closed step into the whole-run rows, the first-non-finite bookkeeping, the incidents and
    the history (``every``), then call ``on_step``."""
    cap.step += 1
    step = cap.step
    hist = cap._history
    if data.calls:  # one mark for all of the step's calls
        data.calls[0].mark.step = step
    lay = data.layout
    assert lay is not None
    rows, ids = data.rows, lay.ids
    at = ids if lay.span is None else lay.span
    _ensure_run(cap)
    calls = cap.run_calls
    old: np.ndarray | None = None  # rows seen in an earlier step (None: all of them)
    if not lay.committed:
        seen = calls[ids]
        for r in np.flatnonzero(seen == 0).tolist():
            row = rows[r]
            row.hid = hist.row_id(row.key, {"module": row.module, "type": row.type, "shape": row.shape, "dtype": row.dtype})
            row.first_step = step
            c0 = data.first_call[r]
            row.inputs = tuple(dict.fromkeys(c.row.id for c in c0.input_calls))
            row.ext_nonfinite = data.checks_bad.get(id(c0), False)
            row.alive = data.alive[r]
        old = seen > 0
        lay.committed = True
    accumulate_step(cap, lay, at, data.rg, data.has_grad)
    calls[at] += data.counts
    merge_alive(lay, cap.run_units, [data.alive], {}, old)
    if data.skipped:
        cap.skipped.append(step)
    if data.lrs:
        cap.lrs.update(data.lrs)
    hids = lay.history_ids()
    first_bad = step_incidents(cap, data, step)
    if kept(cap, step) or first_bad:
        hist.append(step, hids, data.values, data.scalars)
        cap.unappended = None
        if cap.on_step is not None:
            cap.on_step(cap)
    else:
        cap.unappended = (step, hids, data.values, data.scalars)
    cap.prev_values, cap.prev_rows = data.values, hids


def finish(cap: Capture) -> None:
    """At exit: close the open step, commit held-back no-grad steps, late gradients, the last step."""
    if cap._open:
        cap._close_step()
    flush(cap)
    cap._commit_pending()
    flush(cap)  # held-back steps taken into the batch
    if cap._late:
        late, cap._late = cap._late, []
        fetch = _Fetch(cap.device_path)
        slots = [fetch.add(c.late) for c in late]
        host = fetch.run()
        _flush_late(cap, late, [host[i] for i in slots])
    if cap.unappended is not None:
        cap._history.append(*cap.unappended)
        cap.unappended = None
        if cap.on_step is not None:
            cap.on_step(cap)
