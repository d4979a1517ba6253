"""Closing a step of a :class:`~nbdebug.capture.session.Capture`: the step's device stats → rows and
one :class:`~nbdebug.capture.history.History` entry, in one transfer per step.

:func:`close_step` brings everything a step recorded (stat vectors, gradient stats, dead-unit
masks, input checks, parameter-gradient norms, optimizer numbers, the loss) to the host with
:func:`~nbdebug.capture.stats.packed_to_host` (one ``.cpu()`` per device, whatever the number of
layers), which is also the step's non-finite check; :func:`commit` folds it into the whole-run rows
and the history; :func:`finish` closes the last step at exit (then :mod:`.assemble` builds the result).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .history import FIELD_INDEX, HISTORY_FIELDS
from .incidents import Incident, forward_incident, step_incidents
from .stats import IDX, N_FIELDS, DeviceStats, nonfinite, packed_to_host, raw_from_host, summarize

PENDING_NO_GRAD = 16  # no-grad forwards held back before the first training forward (then: an inference cell)

if TYPE_CHECKING:
    from .calls import _Call
    from .session import Capture

__all__ = ["close_step", "commit", "finish"]

_F = len(HISTORY_FIELDS)
_FI = FIELD_INDEX
_STAT = ("mean", "std", "min", "max", "zero_frac", "norm", "nan", "inf")
_STAT_COLS = [_FI[k] for k in _STAT]
_GRAD_COLS = [_FI["grad_" + k] for k in ("mean", "std", "min", "max", "norm", "nan", "inf")]
_GRAD_KEYS = ("mean", "std", "min", "max", "norm", "nan", "inf")


def _host(items: list[Any], batch: bool) -> list[Any]:
    """``items`` on the host: DeviceStats → raw rows, tensors → numpy, anything else as is; every
    device tensor crosses in one packed transfer per device (``batch``: CPU tensors too)."""
    dev: list[torch.Tensor] = []
    where: list[tuple[int, int]] = []
    out = items
    for i, x in enumerate(items):
        if isinstance(x, DeviceStats):
            where.append((i, len(dev)))
            dev += [x.floats, x.counts]
        elif isinstance(x, torch.Tensor):
            if not batch and x.device.type == "cpu":
                if out is items:
                    out = list(items)
                out[i] = x.detach().numpy()
            else:
                where.append((i, len(dev)))
                dev.append(x)
    if dev:
        if out is items:
            out = list(items)
        host = packed_to_host(dev)
        for i, j in where:
            out[i] = raw_from_host(host[j], host[j + 1]) if isinstance(items[i], DeviceStats) else host[j]
    return out


class _Fetch:
    """Collects what a step needs from the device; :meth:`run` brings it over in one transfer."""

    def __init__(self, batch: bool) -> None:
        self.batch = batch
        self.tensors: list[torch.Tensor | None] = []

    def add(self, x: Any) -> int:
        """Slot of ``x`` (a tensor, a DeviceStats, a number or None)."""
        self.tensors.append(x)  # type: ignore[arg-type]
        return len(self.tensors) - 1

    def run(self) -> list[Any]:
        items = self.tensors
        out: list[Any] = list(items)
        dev: list[torch.Tensor | None] = []
        where: list[tuple[int, int]] = []  # (item, position in dev); DeviceStats take two
        for i, x in enumerate(items):
            if isinstance(x, DeviceStats):
                where.append((i, len(dev)))
                dev += [x.floats, x.counts]
            elif isinstance(x, torch.Tensor):
                if x.device.type == "cpu" and not self.batch:
                    out[i] = x.detach().numpy()
                else:
                    where.append((i, len(dev)))
                    dev.append(x)
        if dev:
            host = packed_to_host(dev)
            for i, j in where:
                out[i] = raw_from_host(host[j], host[j + 1]) if isinstance(items[i], DeviceStats) else host[j]
        return out


@dataclass
class _StepData:
    """One closed step on the host, waiting to be committed (or dropped as an evaluation)."""

    calls: list[Any]
    rows: list[Any]  # _Row of each merged step row
    raw: np.ndarray  # [n, N_FIELDS] merged per row
    grad: np.ndarray  # [n, N_FIELDS] (NaN rows: no gradient)
    values: np.ndarray  # [n, F] float32 for the history
    alive: list[np.ndarray | None]  # per row: units non-zero in some call of the step (None: all / n.a.)
    counts: list[int]  # calls per row
    first_call: list[Any]  # per row: its first call of the step
    checks_bad: dict[int, bool]  # id(call) → an external input was non-finite
    scalars: dict[str, float]
    skipped: bool
    lrs: dict[str, float]
    fwd: tuple[Any, bool, str] | None = None  # (first non-finite call, inputs finite, "NaN"/"Inf")
    fwd_incident: Incident | None = None
    bwd: tuple[Any, Any] | None = None  # (call with the first non-finite output gradient, origin consumer)
    pg: str | None = None  # first module whose parameter gradients were non-finite
    incidents: list[Incident] = field(default_factory=list)


def _f(x: Any) -> float:
    if isinstance(x, float):
        return x
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    return float(a.mean()) if a.size else math.nan


def _group(rows: list[Any], raws: np.ndarray) -> tuple[list[Any], np.ndarray, list[int], list[int]]:
    """Merge raw rows of the same row: (rows in order, merged raws, calls per row, index of each input)."""
    pos: dict[int, int] = {}
    uniq: list[Any] = []
    inv: list[int] = []
    for r in rows:
        j = pos.get(r.id)
        if j is None:
            j = pos[r.id] = len(uniq)
            uniq.append(r)
        inv.append(j)
    if len(uniq) == len(rows):
        return uniq, raws, [1] * len(rows), inv
    n = len(uniq)
    out = np.zeros((n, N_FIELDS))
    inv_a = np.asarray(inv)
    with np.errstate(invalid="ignore", over="ignore"):
        np.add.at(out, inv_a, raws)
    mn, mx = np.full(n, np.inf), np.full(n, -np.inf)
    np.minimum.at(mn, inv_a, raws[:, IDX["min"]])
    np.maximum.at(mx, inv_a, raws[:, IDX["max"]])
    out[:, IDX["min"]], out[:, IDX["max"]] = mn, mx
    return uniq, out, np.bincount(inv_a, minlength=n).tolist(), inv


_V_STAT = [_FI[k] for k in ("mean", "std", "min", "max", "zero_frac", "norm", "nan", "inf")]
_V_GRAD = [_FI["grad_" + k] for k in ("mean", "std", "min", "max")] + [-1] + [_FI["grad_" + k] for k in ("norm", "nan", "inf")]
_V_GRAD_COLS = [c for c in _V_GRAD if c >= 0]
_V_GRAD_SRC = [i for i, c in enumerate(_V_GRAD) if c >= 0]


def _stat_values(raw: np.ndarray, grad: np.ndarray, rows: list[Any]) -> np.ndarray:
    """History values of a step's rows: output stats (and saturation) from ``raw``, gradient stats from
    ``grad`` (NaN rows: none), like :func:`summarize`, with one numpy op per field over all rows."""
    n = len(rows)
    vals = np.full((n, _F), np.nan, np.float32)
    with_grad = not np.isnan(grad[:, 0]).all()
    both = np.concatenate([raw, grad]) if with_grad else raw
    out = np.empty((both.shape[0], 9))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        cnt = both[:, 0]
        safe = np.where(cnt > 0, cnt, np.nan)
        mean = np.divide(both[:, 1], safe, out=out[:, 0])
        var = np.maximum(both[:, 2] / safe - mean * mean, 0.0)
        np.sqrt(np.where(cnt > 1, var * cnt / np.maximum(cnt - 1, 1), np.nan), out=out[:, 1])
        out[:, 2:4] = both[:, 3:5]
        np.subtract(1.0, both[:, 5] / safe, out=out[:, 4])
        np.sqrt(both[:, 2], out=out[:, 5])
        out[:, 6:8] = both[:, 6:8]
        np.divide(both[:, 8], safe, out=out[:, 8])
    vals[:, _V_STAT] = out[:n, :8]
    sat = [i for i, r in enumerate(rows) if r.sat]
    if sat:
        vals[sat, _FI["saturated_frac"]] = out[:n, 8][sat]
    if with_grad:
        vals[:, _V_GRAD_COLS] = out[n:, _V_GRAD_SRC]
    return vals


def _or(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    if a is None or b is None:
        return None
    return a | b if a.shape == b.shape else None


def close_step(cap: Capture) -> None:
    """Bring the open step to the host (one transfer) and commit it (or hold it back: a no-grad step
    before any training forward)."""
    calls: list[_Call] = cap._step_calls
    pg_late = cap._pg_norms is None and bool(cap._pg_fresh)  # norms taken now: after a scaler.step unscaled them
    if pg_late:
        cap._take_param_norms()
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
    opt_keys: list[tuple[str, str]] = []
    opt_vals: list[Any] = []
    if upd is not None:
        for kind in ("update_ratio", "param_norm", "lr"):
            for mod, v in getattr(upd, kind).items():
                opt_keys.append((kind, mod))
                opt_vals.append(v)
    checks = [t for c in calls for t in c.input_checks]
    items: list[Any] = [c.raw for c in calls]
    items += [c.grad_stats for c in calls]
    items += [c.alive for c in calls]
    items += [c.late for c in late]
    items += checks
    items += opt_vals
    items += losses
    items.append(None if pg is None else (np.array(pg[1]) if pg[1] and type(pg[1][0]) is float else torch.stack(pg[1])))
    items.append(upd.scale if upd is not None else None)
    items.append(upd.skipped if upd is not None else False)
    host = _host(items, cap.device_path)  # THE transfer of this step
    h_raw, h_grad, h_alive = host[:n], host[n : 2 * n], host[2 * n : 3 * n]
    pos = 3 * n + len(late)
    _flush_late(cap, late, host[3 * n : pos])
    h_checks = host[pos : pos + len(checks)]
    pos += len(checks)
    h_opt = host[pos : pos + len(opt_vals)]
    pos += len(opt_vals)
    h_loss = host[pos : pos + len(losses)]
    h_pg, h_scale, h_skip = host[-3], host[-2], host[-1]
    if not calls:
        return
    scale = _scale_of(h_scale)
    raws = np.stack(h_raw)
    has_grad = [g is not None for g in h_grad]
    if all(has_grad):
        grads = np.stack(h_grad)
    else:
        grads = np.full((n, N_FIELDS), np.nan)
        if any(has_grad):
            idx = [j for j in range(n) if has_grad[j]]
            grads[idx] = np.stack([h_grad[j] for j in idx])
    if scale is not None:
        _unscale(grads, scale)
    rows, raw, counts, inv = _group([c.row for c in calls], raws)
    grad = grads if len(rows) == n else _group_grads(grads, inv, len(rows))
    nr = len(rows)
    if nr == n:
        alive, first_call = h_alive, calls
    else:
        alive = [None] * nr
        first_call = [None] * nr
        for j, c in enumerate(calls):
            r = inv[j]
            if first_call[r] is None:
                first_call[r], alive[r] = c, h_alive[j]
            else:
                alive[r] = _or(alive[r], h_alive[j])
    values = _stat_values(raw, grad, rows)
    col = _FI["dead_unit_frac"]
    for r, row in enumerate(rows):
        if row.units:
            a = alive[r]
            values[r, col] = 0.0 if a is None else ((a.size - int(np.count_nonzero(a))) / a.size if a.size == row.units else math.nan)
    # parameter-gradient norms (one per module, on its first row) and optimizer numbers
    pg_bad: list[str] = []
    module_norm: dict[str, float] = {}
    if pg is not None:
        sq: dict[str, float] = {}
        owner = cap._param_owner
        pg_host = np.asarray(h_pg, dtype=np.float64).reshape(-1)
        if scale is not None and not pg_late:
            pg_host = pg_host / scale
        for p, v in zip(pg[0], pg_host.tolist()):
            for mod in owner.get(id(p), ()):
                sq[mod] = sq.get(mod, 0.0) + v * v
        module_norm = {m: math.sqrt(v) for m, v in sq.items()}
        pg_bad = [m for m, v in module_norm.items() if not math.isfinite(v)]
    opt: dict[str, dict[str, float]] = {"update_ratio": {}, "param_norm": {}, "lr": {}}
    for (kind, mod), v in zip(opt_keys, h_opt):
        opt[kind][mod] = v if type(v) is float else _f(v)
    skipped = h_skip if type(h_skip) is bool else bool(np.any(h_skip))
    row_pos = {row.id: r for r, row in enumerate(rows)}
    first_row = cap.first_row
    for field_, per_module in (("param_grad_norm", module_norm), ("param_norm", opt["param_norm"]),
                               ("update_ratio", opt["update_ratio"])):
        if per_module:
            c = _FI[field_]
            for mod, v in per_module.items():
                first = first_row.get(mod)
                if first is not None and first.id in row_pos:
                    values[row_pos[first.id], c] = v
    loss = (sum(_f(x) for x in h_loss) / len(h_loss)) if h_loss else math.nan
    lr = opt["lr"].get("", math.nan)
    checks_bad: dict[int, bool] = {}
    if checks:
        k = 0
        for c in calls:
            m = len(c.input_checks)
            if m:
                checks_bad[id(c)] = not all(np.isfinite(x).all() for x in h_checks[k : k + m])
                k += m
    data = _StepData(calls, rows, raw, grad, values, alive, counts, first_call, checks_bad,
                     {"loss": loss, "lr": lr, "skipped": 1.0 if skipped else 0.0}, skipped,
                     {m: v for m, v in opt["lr"].items() if m})
    # the step's non-finite check, in phase order
    bad = np.flatnonzero(raws[:, IDX["nan"]] + raws[:, IDX["inf"]] > 0)
    if bad.size:
        j = int(bad[0])
        c = calls[j]
        what = "NaN" if raws[j, IDX["nan"]] > 0 else "Inf"
        data.fwd = (c, not checks_bad.get(id(c), False), what)
        if cap._hot is not None and cap._hot_call is c:
            data.fwd_incident = cap._hot
        elif c.held is not None:
            data.fwd_incident = forward_incident(cap, c, *c.held)
    if not skipped and np.any(grads[:, IDX["nan"]] + grads[:, IDX["inf"]] > 0):
        data.bwd = _backward_origin(calls, grads)
    if not skipped:
        data.pg = pg_bad[0] if pg_bad else None
        if data.pg is not None:
            data.pg = min(pg_bad, key=lambda m: cap.first_row[m].id if m in cap.first_row else 1 << 30)
    for j, c in enumerate(calls):
        c.closed = True
        c.raw = c.alive = c.held = None
        if c.input_checks:
            c.input_checks = []
        c.ref = None
        c.grad_stats = grads[j] if has_grad[j] else None
    if not cap._open_grad and not cap._seen_training:
        cap._pending.append(data)
        if len(cap._pending) >= PENDING_NO_GRAD:
            cap._commit_pending()
    else:
        commit(cap, data)


def _user_loss(cap: Capture, calls: list[Any]) -> list[Any]:
    """The step's loss from the user's ``loss()``: unknown (no entry, so NaN) when it returns the very
    object of the previous step's close (the variable was not reassigned: a forward that raised, or a
    loop that forgot to), with a note."""
    from .optim import as_float_later

    try:
        v = cap.loss_fn()
    except Exception:  # the user's name may not exist yet
        v = None
    if v is None:
        return []
    prev, cap._loss_prev = cap._loss_prev, _identity(v)
    if prev is not None and (prev() if isinstance(prev, weakref.ref) else prev[0]) is v:
        if calls:
            old = _stale_note(cap.stale_loss)
            cap.stale_loss.append(cap.step + 1)
            new = _stale_note(cap.stale_loss)
            cap.notes[:] = [new if n == old else n for n in cap.notes] if old in cap.notes else [*cap.notes, new]
        return []
    return [as_float_later(v)]


def _stale_note(steps: list[int]) -> str:
    shown = ", ".join(map(str, steps[:5])) + (f" and {len(steps) - 5} more" if len(steps) > 5 else "")
    return (f"loss unknown (NaN) at step{'s' if len(steps) > 1 else ''} {shown}: the loss variable still held "
            "the previous step's loss object (not reassigned, e.g. the forward raised before it)")


def _identity(v: Any) -> Any:
    """A reference to ``v`` for the next step's identity check: weak for tensors (never keeps a graph
    alive), else the object itself in a 1-tuple (floats: tiny)."""
    try:
        return weakref.ref(v)
    except TypeError:
        return (v,)


def _scale_of(x: Any) -> float | None:
    """The GradScaler scale from the step's transfer (None: none, or not a usable divisor)."""
    if x is None:
        return None
    s = _f(x)
    return s if math.isfinite(s) and s > 0 and s != 1.0 else None


_G_DIV1 = [IDX["sum"], IDX["min"], IDX["max"]]


def _unscale(grads: np.ndarray, scale: float) -> None:
    """Raw gradient rows of a GradScaler-scaled backward → the unscaled gradients' (in place): sums,
    min and max divided by the scale, sums of squares by its square; counts (numel, non-zero,
    NaN, Inf) unchanged."""
    with np.errstate(invalid="ignore", over="ignore"):
        grads[:, _G_DIV1] /= scale
        grads[:, IDX["sumsq"]] /= scale * scale


def _group_grads(grads: np.ndarray, inv: list[int], n: int) -> np.ndarray:
    out = np.full((n, N_FIELDS), np.nan)
    for j, r in enumerate(inv):
        g = grads[j]
        if np.isnan(g[0]):
            continue
        if np.isnan(out[r, 0]):
            out[r] = g
        else:
            mn, mx = min(out[r, IDX["min"]], g[IDX["min"]]), max(out[r, IDX["max"]], g[IDX["max"]])
            out[r] += g
            out[r, IDX["min"]], out[r, IDX["max"]] = mn, mx
    return out


def _backward_origin(calls: list[Any], grads: np.ndarray) -> tuple[Any, Any] | None:
    """First non-finite output gradient in backward order, and the consumer whose output gradient was
    still finite (the backward of that consumer made it)."""
    pos = {id(c): j for j, c in enumerate(calls)}
    for _, j in sorted((c.grad_order, j) for j, c in enumerate(calls) if c.grad_order >= 0 and not np.isnan(grads[j, 0])):
        if nonfinite(grads[j]):
            bad = calls[j]
            for c in calls:
                k = pos[id(c)]
                if c is not bad and bad in c.input_calls and not np.isnan(grads[k, 0]) and not nonfinite(grads[k]):
                    return bad, c
            return bad, None
    return None


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
        if c.step:
            by_step.setdefault(c.step, []).append((c, c.grad_stats))
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
            cap.history.update(step, hids, vals)
        if cap.bwd_step is None:
            calls = [c for c, _ in items]
            hit = _backward_origin(calls, np.stack([g for _, g in items]))
            if hit is not None:
                cap.bwd_step, cap.bwd_row = step, hit[0].row.id
                cap.bwd_origin = hit[1].row.id if hit[1] is not None else None


def _ensure_run(cap: Capture) -> None:
    """Whole-run accumulators sized for every row so far: raw and gradient sums/min/max, calls, units."""
    n = len(cap._rows)
    have = cap.run_raw.shape[0]
    if n > have:
        size = max(n, 2 * have, 16)
        raw = np.zeros((size, N_FIELDS))
        raw[:, IDX["min"]], raw[:, IDX["max"]] = np.inf, -np.inf
        grad = np.full((size, N_FIELDS), np.nan)
        raw[:have], grad[:have] = cap.run_raw, cap.run_grad
        calls = np.zeros(size, np.int64)
        calls[:have] = cap.run_calls
        cap.run_raw, cap.run_grad, cap.run_calls = raw, grad, calls
    if cap.run_units.shape[0] != cap.run_raw.shape[0] or cap.units_known != n:
        units = np.zeros(cap.run_raw.shape[0], bool)
        units[:n] = [r.units > 0 for r in cap._rows]
        cap.run_units, cap.units_known = units, n


_ADD = [i for i in range(N_FIELDS) if i not in (IDX["min"], IDX["max"])]
_MN, _MX = IDX["min"], IDX["max"]


def _accumulate(run: np.ndarray, ids: np.ndarray, raw: np.ndarray) -> None:
    """Fold raw rows (unique ``ids``) into the run accumulator (a NaN accumulator row starts afresh)."""
    with np.errstate(invalid="ignore", over="ignore"):
        cur = run[ids]
        fresh = np.isnan(cur[:, 0])
        if fresh.any():
            cur[fresh] = 0.0
            cur[fresh, _MN], cur[fresh, _MX] = np.inf, -np.inf
        cur[:, _ADD] += raw[:, _ADD]
        cur[:, _MN] = np.fmin(cur[:, _MN], raw[:, _MN]) if not np.isnan(raw[:, _MN]).any() else np.minimum(cur[:, _MN], raw[:, _MN])
        cur[:, _MX] = np.fmax(cur[:, _MX], raw[:, _MX]) if not np.isnan(raw[:, _MX]).any() else np.maximum(cur[:, _MX], raw[:, _MX])
        run[ids] = cur


def _merge2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        out = a + b
    out[IDX["min"]], out[IDX["max"]] = min(a[IDX["min"]], b[IDX["min"]]), max(a[IDX["max"]], b[IDX["max"]])
    return out


def commit(cap: Capture, data: _StepData) -> None:
    """Fold a closed step into the whole-run rows, the first-non-finite bookkeeping, the incidents and
    the history (``every``), then call ``on_step``."""
    cap.step += 1
    step = cap.step
    hist = cap.history
    for c in data.calls:
        c.step = step
    ids = np.fromiter((row.id for row in data.rows), np.intp, len(data.rows))
    _ensure_run(cap)
    run, calls = cap.run_raw, cap.run_calls
    new = np.flatnonzero(calls[ids] == 0)
    for r in new.tolist():
        row = data.rows[r]
        row.hid = hist.row_id(row.key, {"module": row.module, "type": row.type, "shape": row.shape, "dtype": row.dtype})
        row.first_step = step
        c0 = data.first_call[r]
        row.inputs = tuple(dict.fromkeys(c.row.id for c in c0.input_calls))
        row.ext_nonfinite = data.checks_bad.get(id(c0), False)
        row.alive = data.alive[r]
    old = calls[ids] > 0
    _accumulate(run, ids, data.raw)
    has_g = ~np.isnan(data.grad[:, 0])
    if has_g.any():
        _accumulate(cap.run_grad, ids[has_g], data.grad[has_g])
    calls[ids] += np.asarray(data.counts, dtype=np.int64)
    for r in np.flatnonzero(old & cap.run_units[ids]).tolist():
        row = data.rows[r]
        row.alive = _or(row.alive, data.alive[r])
    if data.skipped:
        cap.skipped.append(step)
    cap.lrs.update(data.lrs)
    hids = np.fromiter((row.hid for row in data.rows), np.intp, len(data.rows))
    first_bad = step_incidents(cap, data, step)
    first = cap.resume.steps + 1 if cap.resume is not None else 1
    if (step - first) % cap.every == 0 or first_bad:
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
    cap._commit_pending()
    if cap._late:
        late, cap._late = cap._late, []
        fetch = _Fetch(cap.device_path)
        slots = [fetch.add(c.late) for c in late]
        host = fetch.run()
        _flush_late(cap, late, [host[i] for i in slots])
    if cap.unappended is not None:
        cap.history.append(*cap.unappended)
        cap.unappended = None
        if cap.on_step is not None:
            cap.on_step(cap)
