"""Steps folded in batches: the CPU path's usual training step costs a few Python operations when it
closes, and its array work (history values, run accumulators, history append) is done for many steps
at once.

A step qualifies (:func:`qualifies`) when nothing about it needs looking at right away: host stats (not
the device path), no hook saw a NaN/Inf count, finite parameter-gradient norms, no late gradients or
input checks, and its calls belong to the same rows in the same order as an already committed step (the
cached :class:`~nbdebug.capture.fold.Layout`); then either every call has gradient stats (and every
row of that layout has had some) or none has (a forward without backward: ``no_grad``,
``inference_mode``, predictions). Steps with and without gradients are never in one batch. Its step
number, skipped flag, learning rates, loss-spike check and ``on_step`` call happen at once
(:meth:`~nbdebug.capture.steps.Steps.take`); its numbers wait in a :class:`Batch` as a :class:`Waiting`.
A no-grad step before any training forward is held back instead (as a :class:`Held`; its layout may be
that of the step held just before it): taken when the held-back steps are committed (an inference
cell), dropped as an evaluation when training begins. :meth:`Batch.fold` folds the waiting steps, in order, with the very element-wise operations
the one-step path uses (so the history is bit for bit the same; tested), and runs before anything that
reads what they change: another step that does not qualify, the end of the capture, late gradients,
and any read of ``Capture.history`` (live views, the distributed spool), or when :data:`BATCH` steps
(:data:`BATCH_CALLS` calls) wait. What the
calls' stats do not give (:func:`step_extras`: dead units, parameter-gradient norms, optimizer numbers)
and the whole-run unit masks (:func:`merge_alive`) are computed here for ``k`` steps, and the one-step
close (:mod:`.closing`) calls the same functions with ``k = 1``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .fold import Layout, RunTotals, or_masks, step_values, unscale
from .history import FIELD_INDEX, History
from .rows import Row
from .stats import IDX, N_FIELDS

__all__ = ["BATCH", "BATCH_CALLS", "Batch", "Held", "Waiting", "as_float", "fold_one_by_one", "merge_alive", "qualifies", "step_extras"]

BATCH = 64  # steps that may wait before they are folded
BATCH_CALLS = 4096  # ... and calls (a few MB: a model with many rows waits fewer steps)
_MN, _MX = IDX["min"], IDX["max"]
_DEAD, _PGN = FIELD_INDEX["dead_unit_frac"], FIELD_INDEX["param_grad_norm"]
_OPT_COLS = {"param_norm": FIELD_INDEX["param_norm"], "update_ratio": FIELD_INDEX["update_ratio"]}


class Waiting:
    """One closed step whose numbers wait for :meth:`Batch.fold`."""

    __slots__ = ("alive", "appended", "calls", "grad", "opt", "pg", "pg_div", "raw", "scalars", "scale", "step")

    def __init__(self, calls: list[Any] | None, step: int, raw: list[Any], grad: list[Any], alive: list[Any], scale: float | None,
                 pg: np.ndarray | None, pg_div: float | None, opt: list[Any], scalars: dict[str, float], appended: bool) -> None:
        self.calls, self.step, self.raw, self.grad, self.alive, self.scale = calls, step, raw, grad, alive, scale
        self.pg, self.pg_div, self.opt, self.scalars, self.appended = pg, pg_div, opt, scalars, appended


class Held:
    """A qualifying no-grad step closed before any training forward: it waits with the held-back steps
    (dropped as an evaluation if training follows) and is taken into the batch when they are committed
    (an inference cell)."""

    __slots__ = ("lrs", "sig", "skipped", "waiting")

    def __init__(self, sig: tuple[Any, ...], waiting: Waiting, lrs: dict[str, float], skipped: bool) -> None:
        self.sig, self.waiting, self.lrs, self.skipped = sig, waiting, lrs, skipped

    @property
    def layout(self) -> Layout:
        """Its step's layout (as a held-back ``StepData``'s ``layout``)."""
        return self.sig[0]


def qualifies(lay: Layout, h_grad: list[Any], scale: float | None, pg_host: Any, has_pg: bool,
              held_layout: Layout | None) -> bool | None:
    """Whether a closed step may wait in a batch: None when it may not (it is folded now), else whether
    it has gradients. ``held_layout``: the layout of the step held back just before it, when this one
    would be held back too (a held step may share it before it is committed)."""
    if not (lay.unique and lay.span is not None):
        return None
    if not lay.committed and held_layout is not lay:
        return None
    if h_grad[0] is None:  # no call may have gradient stats: a step without backward (no_grad, inference)
        if scale is not None or any(g is not None for g in h_grad):
            return None
        has_grad = False
    elif not lay.grad_init or any(g is None for g in h_grad):
        return None
    else:
        has_grad = True
    if has_pg and (type(pg_host) is not np.ndarray or not math.isfinite(sum(pg_host.tolist()))):
        return None  # the step's parameter-gradient check needs it now
    return has_grad


class Batch:
    """Closed steps of one signature (layout, optimizer keys, parameter map, with gradients or not)
    waiting to be folded together: ``waiting`` (in step order), ``sig``."""

    __slots__ = ("sig", "waiting")

    def __init__(self) -> None:
        self.waiting: list[Waiting] = []
        self.sig: Any = None

    def __len__(self) -> int:
        return len(self.waiting)

    def other(self, sig: tuple[Any, ...]) -> bool:
        """Steps of another signature wait (fold them before taking one of ``sig``)."""
        prev = self.sig
        # the layout and the parameter map are cached objects (the same object while nothing changed);
        # never compare them with == (the map holds numpy arrays)
        return bool(self.waiting) and (prev[0] is not sig[0] or prev[2] is not sig[2] or prev[1] != sig[1]
                                       or prev[3] != sig[3])

    def add(self, w: Waiting, sig: tuple[Any, ...]) -> bool:
        """Let ``w`` wait; True when the batch is full (fold it now)."""
        self.sig = sig
        self.waiting.append(w)
        return len(self.waiting) >= BATCH or len(self.waiting) * len(w.raw) >= BATCH_CALLS

    def fold(self, totals: RunTotals, rows: list[Row], history: History) -> tuple[np.ndarray, np.ndarray, Any] | None:
        """Fold the waiting steps, in order: exactly what the one-step path does for each of them (into
        ``totals`` and ``history``). Returns the last step's history values, the rows' history ids and
        the last step when ``every`` left it out of the history (else None); None when nothing waited."""
        batch = self.waiting
        if not batch:
            return None
        lay, opt_keys, pgmap, has_grad = self.sig
        totals.ensure(rows)
        k, n = len(batch), len(lay.rows)
        rg = np.empty((k, n, 2 * N_FIELDS))
        rg[:, :, :N_FIELDS] = [w.raw for w in batch]
        if has_grad:
            rg[:, :, N_FIELDS:] = [w.grad for w in batch]
        else:  # steps without gradients (qualifies: no call has any)
            rg[:, :, N_FIELDS:] = np.nan
        scaled = any(w.scale is not None for w in batch)
        if scaled:  # x / 1.0 is x: steps without a scale are unchanged
            unscale(rg[:, :, N_FIELDS:], np.array([1.0 if w.scale is None else w.scale for w in batch])[:, None, None])
        sat = [j * n + r for j in range(k) for r in lay.sat] if lay.sat else []
        vals = step_values(rg.reshape(k * n, 2 * N_FIELDS), sat, has_grad).reshape(k, n, -1)
        alive = [w.alive for w in batch]
        stacked, _ = step_extras(vals, lay, alive, opt_keys, [w.opt for w in batch],
                                 None if pgmap is None else (pgmap, [w.pg for w in batch], [w.pg_div for w in batch]))
        # Everything above only computed: a KeyboardInterrupt there leaves the batch waiting for the exit.
        self.waiting = []
        at = lay.span
        used = rg if has_grad else rg[:, :, :N_FIELDS]  # the halves RunTotals.add_step folds
        if np.isnan(used[:, :, _MN::N_FIELDS] + used[:, :, _MX::N_FIELDS]).any():
            fold_one_by_one(totals, lay, at, rg, has_grad)  # a NaN min/max (an empty output): the exact rules
        else:
            # what add_step's one-slice update does step after step: sums in the same order (a reduction
            # over the first axis adds the steps one after the other), min/max over all of them
            cur = totals.rg[at] if has_grad else totals.raw[at]
            both = np.concatenate([cur[None], used])
            with np.errstate(invalid="ignore", over="ignore"):
                total = np.add.reduce(both, axis=0)
            total[:, _MN::N_FIELDS] = np.fmin.reduce(both[:, :, _MN::N_FIELDS], axis=0)
            total[:, _MX::N_FIELDS] = np.fmax.reduce(both[:, :, _MX::N_FIELDS], axis=0)
            cur[...] = total
        totals.calls[at] += lay.counts * k
        merge_alive(lay, totals.units, alive, stacked)
        if scaled:  # else each call's gradient stats are already these values (rg was filled from them)
            for j, w in enumerate(batch):
                if w.calls is not None:
                    for c, g in zip(w.calls, rg[j, :, N_FIELDS:]):
                        c.grad_stats = g
        hids = lay.history_ids()
        kept = [j for j, w in enumerate(batch) if w.appended]
        if kept:
            history.append_many([batch[j].step for j in kept], hids, vals[kept], [batch[j].scalars for j in kept])
        last = batch[-1]
        return vals[-1], hids, None if last.appended else (last.step, hids, vals[-1], last.scalars)


def fold_one_by_one(totals: RunTotals, lay: Layout, at: slice, rg: np.ndarray, has_grad: bool) -> None:
    """Fold ``k`` steps' ``[k, rows, 2 × N_FIELDS]`` stats into ``totals`` one step after the other
    (:meth:`~nbdebug.capture.fold.RunTotals.add_step`'s exact rules: a NaN min/max in some step)."""
    for j in range(rg.shape[0]):
        totals.add_step(lay, at, rg[j], has_grad)


def step_extras(vals: np.ndarray, lay: Layout, alive: list[list[Any]], opt_keys: list[tuple[str, tuple[str, ...]]],
                opt: list[list[Any]], pg: tuple[Any, list[Any], list[float | None]] | None
                ) -> tuple[dict[int, np.ndarray], list[str]]:
    """The history values of ``k`` steps of one layout beyond their calls' stats, into ``vals``
    (``[k, rows, F]``; :meth:`Batch.fold` and, for one step, :func:`~nbdebug.capture.closing.close_step`:
    one code, element-wise, so a step's numbers do not depend on ``k``): dead-unit fractions (``alive``: per step, each row's mask of units non-zero in some
    call, None: no zero), optimizer numbers (``opt``: per step, ``opt_keys``' values in order) and
    parameter-gradient norms summed per module (``pg``: :meth:`~nbdebug.capture.paramgrads.ParamGrads.modules_of`' map, per step the
    norms and the scale they still need dividing by) on each module's first row. Returns the full
    masks stacked per unit row (``{row: [k, units]}``, when ``k > 1``; for :func:`merge_alive`) and
    the modules whose norm is not finite."""
    k = len(alive)
    stacked: dict[int, np.ndarray] = {}
    for r, units in lay.unit_rows:
        col = [a[r] for a in alive]
        if all(a is None for a in col):  # no zero in any of these calls (a conv or linear output): no dead unit
            vals[:, r, _DEAD] = 0.0
        elif k > 1 and all(a is not None and a.size == units for a in col):
            st = stacked[r] = np.array(col)
            vals[:, r, _DEAD] = (units - st.sum(axis=1)) / units  # a bool sum: the count of units alive
        else:
            for j, a in enumerate(col):
                vals[j, r, _DEAD] = 0.0 if a is None else ((a.size - int(np.count_nonzero(a))) / a.size if a.size == units else math.nan)
    i, nums = 0, _numbers(opt)
    for kind, mods in opt_keys:
        if kind != "lr":
            pos, which = lay.positions(mods)
            if pos.size:
                vals[:, pos, _OPT_COLS[kind]] = nums[:, i + which]
        i += len(mods)
    if pg is None:
        return stacked, []
    (rep, mod_idx, names), norms, div = pg
    p = np.array(norms, dtype=np.float64).reshape(k, -1)
    if any(d is not None for d in div):  # x / 1.0 is x: steps without a divisor are unchanged
        p = p / np.array([1.0 if d is None else d for d in div])[:, None]
    sq = p * p
    if rep is not None:
        sq = sq[:, rep]
    m = len(names)
    # per step and module, in parameter order (bincount adds one weight after the other: the sums of a Python loop)
    at = mod_idx if k == 1 else (np.arange(0, k * m, m)[:, None] + mod_idx).reshape(-1)
    norm = np.sqrt(np.bincount(at, weights=sq.reshape(-1), minlength=k * m)).reshape(k, m)
    pos, which = lay.positions(names)
    if pos.size:
        vals[:, pos, _PGN] = norm[:, which]
    finite = np.isfinite(norm)
    if finite.all():
        return stacked, []
    return stacked, [names[j] for j in np.flatnonzero(~finite.all(axis=0)).tolist()]


def _numbers(rows: list[list[Any]]) -> np.ndarray:
    """``[k, m]`` float64 of ``k`` lists of ``m`` numbers (:func:`as_float` of each: floats, 0-d arrays, None)."""
    try:
        arr = np.array(rows, dtype=np.float64)
        if arr.ndim == 2:
            return arr
    except (TypeError, ValueError):  # an array of several numbers: its mean
        pass
    return np.array([[v if type(v) is float else as_float(v) for v in r] for r in rows], dtype=np.float64)


def as_float(x: Any) -> float:
    """A number of a step on the host as a float (an array: its mean; empty: NaN)."""
    if isinstance(x, float):
        return x
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    return float(a.mean()) if a.size else math.nan


def merge_alive(lay: Layout, units: np.ndarray, alive: list[list[Any]], stacked: dict[int, np.ndarray],
                old: np.ndarray | None = None) -> None:
    """``row.alive`` (units alive in some step so far; None: every unit, or not known) of each unit row
    ORed with ``k`` steps' masks (:func:`step_extras`' arguments and result; ``old``: rows to merge,
    None: all). A mask that became all-true is dropped (no more merging): OR is monotone, so one OR
    over the steps' stacked masks ends where merging them one by one does."""
    rows = lay.rows
    for r, _ in lay.unit_rows:
        row = rows[r]
        if row.alive is None or not units[row.id] or (old is not None and not old[r]):
            continue
        st = stacked.get(r)
        col: Any = st
        if st is None:
            col = [a[r] for a in alive]
            if len(col) > 1 and all(a is not None and a.shape == row.alive.shape for a in col):
                st = np.array(col)
        if st is not None and st.shape[1:] == row.alive.shape:
            a = row.alive | np.logical_or.reduce(st, axis=0)
            row.alive = None if a.all() else a
            continue
        for a in col:
            m = or_masks(row.alive, a)
            row.alive = None if m is None or m.all() else m
            if row.alive is None:
                break
