"""The run's steps: closed steps → the whole-run rows, the history and the incident log.

A :class:`Steps` owns the step count, the :class:`~nbdebug.capture.history.History`, the whole-run
accumulators (:class:`~nbdebug.capture.fold.RunTotals`), the batch of steps waiting to be folded
(:class:`~nbdebug.capture.batch.Batch`), the no-grad steps held back before any training forward,
skipped steps and learning rates. A closed step reaches it from :func:`~nbdebug.capture.closing.close_step`
either as a :class:`StepData` (folded now: :meth:`Steps.commit`) or as a batch entry
(:meth:`Steps.take`: its number, skipped flag, learning rates, loss-spike check and ``on_step`` now, its
array work later in :meth:`Steps.flush`). Gradients that arrive after their step closed (a delayed
backward) are folded by :meth:`Steps.late`; :meth:`Steps.finish` commits what still waits at exit.

Data flows down only: a :class:`Steps` is built with the row table, the history, the incident log and
an ``on_step()`` callback (the capture's live-view hook), and knows nothing of hooks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .batch import Batch, Held, Waiting, merge_alive, qualifies
from .fold import Fetch, Layout, RunTotals, accumulate, backward_origin, merge2
from .history import FIELD_INDEX, HISTORY_FIELDS, History
from .incidents import Incident, IncidentLog
from .rows import RowTable
from .stats import summarize

__all__ = ["PENDING_NO_GRAD", "StepData", "Steps"]

PENDING_NO_GRAD = 16  # no-grad forwards held back before the first training forward (then: an inference cell)

_F = len(HISTORY_FIELDS)
_GRAD_KEYS = ("mean", "std", "min", "max", "norm", "nan", "inf")
_GRAD_COLS = [FIELD_INDEX["grad_" + k] for k in _GRAD_KEYS]


@dataclass
class StepData:
    """One closed step on the host, waiting to be committed (or dropped as an evaluation)."""

    calls: list[Any]
    rows: list[Any]  # Row of each merged step row
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


class Steps:
    """The run's committed steps (see the module doc).

    ``every``: the history keeps steps ``first``, ``first + every``, … (and the last, and the first
    non-finite one); ``first``: the number of the capture's first step (a resumed run continues);
    ``on_step()``: called after each step appended to the history; ``batching``: usual steps wait in a
    batch and rows in order are accumulated through one slice (False: every step is folded alone, row
    by row: the reference the fast paths are tested against).
    ``count`` (the last committed step), ``skipped``, ``lrs``, ``batched`` (steps that waited in a
    batch) are read by the capture and its result."""

    def __init__(self, rows: RowTable, history: History, log: IncidentLog, *, every: int = 1, first: int = 1,
                 on_step: Callable[[], None] | None = None, batching: bool = True) -> None:
        self.rows, self.history, self.log = rows, history, log
        self.every, self.first, self.on_step, self.batching = every, first, on_step, batching
        self.count = first - 1  # the last committed step
        self.totals = RunTotals()
        self.batch = Batch()
        self.pending: list[Any] = []  # closed no-grad steps not yet known to be steps or evaluation
        self.skipped: list[int] = []
        self.lrs: dict[str, float] = {}
        self.unappended: Any = None  # the last committed step when ``every`` left it out
        self.batched = 0
        self._layout: Layout | None = None  # the last step's layout (rows of its calls, in order)

    # -- what a closing step asks -------------------------------------------------------------
    def layout(self, calls: list[Any]) -> Layout:
        """The step's layout: the previous step's when its calls belong to the same rows in the same
        order (and no row learnt its units since)."""
        key = [c.row for c in calls]
        lay = self._layout
        rows = self.rows
        if lay is None or lay.epoch != rows.epoch or lay.key != key:
            lay = self._layout = Layout(key, rows.first_of, rows.epoch)
        return lay

    def next_number(self) -> int:
        """The number the open step will have (held-back steps come before it)."""
        return self.count + len(self.pending) + 1

    def held_layout(self) -> Layout | None:
        """The layout of the last held-back step (a step held after it may share it)."""
        return self.pending[-1].layout if self.pending else None

    def kept(self, step: int) -> bool:
        """Whether ``every`` keeps ``step`` in the history (counted from the capture's first step)."""
        return (step - self.first) % self.every == 0

    # -- batched steps ----------------------------------------------------------------------------
    def defer(self, lay: Layout, calls: list[Any], h_raw: list[Any], h_grad: list[Any], h_alive: list[Any],
              scale: float | None, pg_host: Any, pgmap: Any, pg_late: bool, opt_keys: list[tuple[str, tuple[str, ...]]],
              h_opt: list[Any], scalars: dict[str, float], lrs: dict[str, float], skipped: bool, hold: bool) -> bool:
        """Let a closed step wait in the batch when it qualifies (:func:`~nbdebug.capture.batch.qualifies`);
        False when it does not (the caller folds it now, after :meth:`flush`). With ``hold`` (a no-grad
        step before any training forward) a qualifying step is held back instead. ``pgmap``: the
        parameter-gradient map of the step's norms (None: no norms)."""
        if not self.batching:
            return False
        has_grad = qualifies(lay, h_grad, scale, pg_host, pgmap is not None, self.held_layout() if hold else None)
        if has_grad is None:
            return False
        w = Waiting(calls, 0, h_raw, h_grad, h_alive, scale, pg_host if pgmap is not None else None,
                    None if pg_late else scale, h_opt, scalars, False)
        sig = (lay, tuple(opt_keys), pgmap, has_grad)
        self.batched += 1
        if hold:
            self.hold_back(Held(sig, w, lrs, skipped))
        else:
            self.take(sig, w, lrs, skipped)
        return True

    def take(self, sig: tuple[Any, ...], w: Waiting, lrs: dict[str, float], skipped: bool) -> None:
        """The immediate part of a batched step (its number, skipped flag, learning rates, loss-spike
        check, ``on_step``); its numbers wait in the batch."""
        if self.batch.other(sig):
            self.flush()
        self.count += 1
        step = w.step = self.count
        w.calls[0].mark.step = step  # the step's calls' one mark (marked closed when the step closed)
        if w.scale is None:  # only a scaled step's calls are needed later (the fold gives them their unscaled
            w.calls = None  # gradient stats); the others may go with their graph (fewer long-lived objects)
        if skipped:
            self.skipped.append(step)
        if lrs:
            self.lrs.update(lrs)
        loss = w.scalars["loss"]
        if not math.isnan(loss):
            self.log.loss_spike(step, loss)
        w.appended = self.kept(step)
        if self.batch.add(w, sig):
            self.flush()
        if w.appended and self.on_step is not None:
            self.on_step()  # reading the capture's history folds the waiting steps first

    def flush(self) -> None:
        """Fold the waiting steps, in order: exactly what the one-step path does for each of them."""
        out = self.batch.fold(self.totals, self.rows.rows, self.history)
        if out is not None:
            values, hids, self.unappended = out
            self.log.remember(values, hids)

    # -- held-back no-grad steps ---------------------------------------------------------------------
    def hold_back(self, step: StepData | Held) -> None:
        """Hold back a no-grad step closed before any training forward; after :data:`PENDING_NO_GRAD`
        of them the cell is an inference cell."""
        self.pending.append(step)
        if len(self.pending) >= PENDING_NO_GRAD:
            self.commit_pending()

    def commit_pending(self) -> None:
        """The held-back no-grad steps are an inference cell's: fold them, in order (those that
        qualified for the batch are taken into it, after the steps already there)."""
        pending, self.pending = self.pending, []
        for data in pending:
            if type(data) is Held:
                self.take(data.sig, data.waiting, data.lrs, data.skipped)
            else:
                self.flush()
                self.commit(data)

    def drop_pending(self) -> int:
        """Training began: the held-back steps were evaluations. How many."""
        n = len(self.pending)
        self.pending.clear()
        return n

    # -- one step -------------------------------------------------------------------------------------
    def commit(self, data: StepData) -> None:
        """Fold a closed step into the whole-run rows, the first-non-finite bookkeeping, the incidents
        and the history (``every``), then call ``on_step``."""
        self.count += 1
        step = self.count
        hist = self.history
        if data.calls:  # one mark for all of the step's calls
            data.calls[0].mark.step = step
        lay = data.layout
        assert lay is not None
        rows, ids = data.rows, lay.ids
        at = ids if lay.span is None or not self.batching else lay.span  # (a slice: one in-place update)
        totals = self.totals
        totals.ensure(self.rows.rows)
        calls = totals.calls
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
        totals.add_step(lay, at, data.rg, data.has_grad)
        calls[at] += data.counts
        merge_alive(lay, totals.units, [data.alive], {}, old)
        if data.skipped:
            self.skipped.append(step)
        if data.lrs:
            self.lrs.update(data.lrs)
        hids = lay.history_ids()
        first_bad = self.log.commit(data, step, self.rows.first_of.get(data.pg) if data.pg is not None else None)
        if self.kept(step) or first_bad:
            hist.append(step, hids, data.values, data.scalars)
            self.unappended = None
            if self.on_step is not None:
                self.on_step()
        else:
            self.unappended = (step, hids, data.values, data.scalars)
        self.log.remember(data.values, hids)

    def late(self, late: list[Any], raws: list[Any]) -> None:
        """Gradients of closed steps (a delayed backward): merged rows, History.update, the backward check."""
        if not late:
            return
        by_step: dict[int, list[tuple[Any, np.ndarray]]] = {}
        for c, raw in zip(late, raws):
            c.late = None
            if raw is None:
                continue
            accumulate(self.totals.grad, np.array([c.row.id]), raw[None])
            c.grad_stats = raw.copy() if c.grad_stats is None else merge2(c.grad_stats, raw)
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
                    rows[k] = (rows[k][0], merge2(rows[k][1], g))
            vals = np.full((len(rows), _F), np.nan, np.float32)
            gs = summarize(np.stack([g for _, g in rows]))
            for k, col in zip(_GRAD_KEYS, _GRAD_COLS):
                vals[:, col] = gs[k]
            hids = np.array([r.hid for r, _ in rows])
            if (hids >= 0).all():
                self.history.update(step, hids, vals)
            if self.log.bwd_step is None:
                hit = backward_origin([c for c, _ in items], np.stack([g for _, g in items]))
                if hit is not None:
                    self.log.late_backward(step, hit[0], hit[1])

    def finish(self, late: list[Any], device_path: bool) -> None:
        """At exit (the open step closed already): the batch, held-back no-grad steps, gradients that
        came after their step closed, the last step when ``every`` left it out."""
        self.flush()
        self.commit_pending()
        self.flush()  # held-back steps taken into the batch
        if late:
            fetch = Fetch(device_path)
            slots = [fetch.add(c.late) for c in late]
            host = fetch.run()
            self.late(late, [host[i] for i in slots])
        if self.unappended is not None:
            self.history.append(*self.unappended)
            self.unappended = None
            if self.on_step is not None:
                self.on_step()
