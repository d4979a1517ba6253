"""Array helpers of a step's close (:mod:`.steps`): what crosses to the host, merging a step's calls
per row, the history values of a step, the whole-run accumulators, and :class:`Layout`, the cached
shape of a step.

A training loop runs the same calls in the same order every step, so everything that depends only on
*which rows* the step's calls belong to (merged rows, their ids and history ids, calls per row, the
rows holding each module's parameter and optimizer numbers, the saturating and unit rows) is worked
out once per distinct sequence of rows (:class:`Layout`) and reused: closing a step is then a few
numpy operations over all rows, with no Python loop over rows or calls beyond gathering their stats.
A step whose sequence differs (a new row, a different number of calls) builds a new layout; the
numbers are the same either way (tested against the layout-free path).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .history import FIELD_INDEX, HISTORY_FIELDS
from .rows import Row
from .stats import IDX, N_FIELDS, DeviceStats, nonfinite, packed_to_host, raw_from_host

__all__ = ["Fetch", "Layout", "RunTotals", "accumulate", "backward_origin", "host_items", "merge2", "merge_calls",
           "merge_grads", "or_masks", "stat_values", "step_values", "unscale"]

_F = len(HISTORY_FIELDS)
_FI = FIELD_INDEX
_MN, _MX = IDX["min"], IDX["max"]


def host_items(items: list[Any], batch: bool) -> list[Any]:
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


class Fetch:
    """Collects what a step needs from the device; :meth:`run` brings it over in one transfer."""

    def __init__(self, batch: bool) -> None:
        self.batch = batch
        self.tensors: list[Any] = []

    def add(self, x: Any) -> int:
        """Slot of ``x`` (a tensor, a DeviceStats, a number or None)."""
        self.tensors.append(x)
        return len(self.tensors) - 1

    def run(self) -> list[Any]:
        return list(host_items(self.tensors, self.batch))


class Layout:
    """What a step's sequence of rows (one per recorded call, in call order) determines, computed
    once per distinct sequence: the merged rows in first-call order, ``inv`` (merged position of
    each call), calls per row, each row's first call, the saturating and unit rows, where each
    module's first row sits (parameter-gradient norms, parameter norms and update ratios go there)."""

    __slots__ = ("committed", "counts", "epoch", "first_idx", "grad_init", "hids", "ids", "inv", "inv_a", "key",
                 "mod_pos", "pos_cache", "rows", "sat", "span", "unique", "unit_rows")

    def __init__(self, key: list[Row], first_row: dict[str, Row], epoch: int = 0) -> None:
        self.key, self.epoch = key, epoch  # epoch: the row table's when built (a row learning its units moves it)
        pos: dict[int, int] = {}
        rows: list[Row] = []
        inv: list[int] = []
        first_idx: list[int] = []
        for j, r in enumerate(key):
            p = pos.get(r.id)
            if p is None:
                p = pos[r.id] = len(rows)
                rows.append(r)
                first_idx.append(j)
            inv.append(p)
        self.rows, self.inv, self.first_idx = rows, inv, first_idx
        self.unique = len(rows) == len(key)
        self.inv_a = np.asarray(inv, dtype=np.intp)
        self.counts = np.bincount(self.inv_a, minlength=len(rows)).astype(np.int64)
        self.ids = np.fromiter((r.id for r in rows), np.intp, len(rows))
        lo = int(self.ids[0]) if len(rows) else 0
        # rows lo, lo+1, … in order: the run accumulators are updated through a slice (no fancy indexing)
        self.span = slice(lo, lo + len(rows)) if bool((self.ids == np.arange(lo, lo + len(rows))).all()) else None
        self.sat = [i for i, r in enumerate(rows) if r.sat]
        self.unit_rows = [(i, r.units) for i, r in enumerate(rows) if r.units]
        self.mod_pos = {m: pos[fr.id] for m, fr in first_row.items() if fr.id in pos}
        self.hids: np.ndarray | None = None
        self.committed = False  # every row has been committed once (none is new)
        self.grad_init = False  # every row's gradient accumulator has started (see RunTotals.add_step)
        self.pos_cache: dict[Any, tuple[np.ndarray, np.ndarray]] = {}  # module-name keys → (positions, which keys)

    def history_ids(self) -> np.ndarray:
        """History row ids of the rows (once they are all committed; recomputed before)."""
        if self.hids is not None:
            return self.hids
        hids = np.fromiter((r.hid for r in self.rows), np.intp, len(self.rows))
        if self.committed:
            self.hids = hids
        return hids

    def positions(self, modules: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(row positions, indices into ``modules``) of the modules whose first row is in this step."""
        hit = self.pos_cache.get(modules)
        if hit is None:
            keep = [i for i, m in enumerate(modules) if m in self.mod_pos]
            hit = self.pos_cache[modules] = (np.array([self.mod_pos[modules[i]] for i in keep], dtype=np.intp),
                                            np.array(keep, dtype=np.intp))
        return hit


def merge_calls(lay: Layout, raws: np.ndarray) -> np.ndarray:
    """Raw rows of a step's calls merged per row (sums added, min/max combined), in ``lay.rows`` order."""
    if lay.unique:
        return raws
    n = len(lay.rows)
    out = np.zeros((n, N_FIELDS))
    inv_a = lay.inv_a
    mn, mx = np.full(n, np.inf), np.full(n, -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN min/max (NaN values, empty outputs) propagate quietly
        np.add.at(out, inv_a, raws)
        np.minimum.at(mn, inv_a, raws[:, _MN])
        np.maximum.at(mx, inv_a, raws[:, _MX])
    out[:, _MN], out[:, _MX] = mn, mx
    return out


def merge_grads(lay: Layout, grads: np.ndarray) -> np.ndarray:
    """Gradient raw rows merged per row like :func:`merge_calls`; NaN rows (no gradient) are skipped."""
    if lay.unique:
        return grads
    out = np.full((len(lay.rows), N_FIELDS), np.nan)
    for j, r in enumerate(lay.inv):
        g = grads[j]
        if np.isnan(g[0]):
            continue
        if np.isnan(out[r, 0]):
            out[r] = g
        else:
            mn, mx = min(out[r, _MN], g[_MN]), max(out[r, _MX], g[_MX])
            out[r] += g
            out[r, _MN], out[r, _MX] = mn, mx
    return out


_V_STAT = [_FI[k] for k in ("mean", "std", "min", "max", "zero_frac", "norm", "nan", "inf")]
_V_GRAD = [_FI["grad_" + k] for k in ("mean", "std", "min", "max")] + [-1] + [_FI["grad_" + k] for k in ("norm", "nan", "inf")]
_V_GRAD_COLS = [c for c in _V_GRAD if c >= 0]
_V_GRAD_SRC = [i for i, c in enumerate(_V_GRAD) if c >= 0]
_V_STAT_LO, _V_GRAD_LO = min(_V_STAT), min(_V_GRAD_COLS)
_V_STAT_RUN = _V_STAT == list(range(_V_STAT_LO, _V_STAT_LO + 8))  # contiguous columns: one slice assignment
_V_GRAD_RUN = _V_GRAD_COLS == list(range(_V_GRAD_LO, _V_GRAD_LO + 7)) and _V_GRAD_SRC == [0, 1, 2, 3, 5, 6, 7]
_SAT = _FI["saturated_frac"]


def step_values(rg: np.ndarray, sat: list[int], with_grad: bool) -> np.ndarray:
    """History values of a step's rows from their ``[rows, 2 × N_FIELDS]`` raw stats (outputs', then
    gradients'; NaN: no gradient): output stats and the saturation of the ``sat`` rows, gradient
    stats, like :func:`~nbdebug.capture.stats.summarize`, with one numpy op per field over all rows."""
    n = rg.shape[0]
    vals = np.full((n, _F), np.nan, np.float32)
    both = rg.reshape(2 * n, N_FIELDS) if with_grad else rg[:, :N_FIELDS]  # rows: out 0, grad 0, out 1, …
    out = np.empty((both.shape[0], N_FIELDS))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        cnt = both[:, 0]
        if cnt.min() > 1:  # every row has 2+ values (NaN rows, no gradient, fail this: the general path)
            mean = np.divide(both[:, 1], cnt, out=out[:, 0])
            var = np.maximum(both[:, 2] / cnt - mean * mean, 0.0)
            np.sqrt(var * cnt / (cnt - 1), out=out[:, 1])
            safe = cnt
        else:
            safe = np.where(cnt > 0, cnt, np.nan)
            mean = np.divide(both[:, 1], safe, out=out[:, 0])
            var = np.maximum(both[:, 2] / safe - mean * mean, 0.0)
            np.sqrt(np.where(cnt > 1, var * cnt / np.maximum(cnt - 1, 1), np.nan), out=out[:, 1])
        out[:, 2:4] = both[:, 3:5]
        np.subtract(1.0, both[:, 5] / safe, out=out[:, 4])
        np.sqrt(both[:, 2], out=out[:, 5])
        out[:, 6:8] = both[:, 6:8]
        np.divide(both[:, 8], safe, out=out[:, 8])
    o = out[0::2] if with_grad else out
    if _V_STAT_RUN:
        vals[:, _V_STAT_LO : _V_STAT_LO + 8] = o[:, :8]
    else:
        vals[:, _V_STAT] = o[:, :8]
    if sat:
        vals[sat, _SAT] = o[sat, 8]
    if with_grad:
        g = out[1::2]
        if _V_GRAD_RUN:
            vals[:, _V_GRAD_LO : _V_GRAD_LO + 4] = g[:, :4]
            vals[:, _V_GRAD_LO + 4 : _V_GRAD_LO + 7] = g[:, 5:8]
        else:
            vals[:, _V_GRAD_COLS] = g[:, _V_GRAD_SRC]
    return vals


def stat_values(raw: np.ndarray, grad: np.ndarray, sat: list[int]) -> np.ndarray:
    """:func:`step_values` from separate ``[rows, N_FIELDS]`` output and gradient raw stats."""
    return step_values(np.concatenate([raw, grad], axis=1), sat, not np.isnan(grad[:, 0]).all())


def or_masks(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    """Units alive in either mask (None: every unit; masks of different shapes: unknown, None)."""
    if a is None or b is None:
        return None
    return a | b if a.shape == b.shape else None


_G_DIV1 = [IDX["sum"], IDX["min"], IDX["max"]]
_SQ = slice(IDX["sumsq"], IDX["sumsq"] + 1)


def unscale(grads: np.ndarray, scale: float | np.ndarray) -> None:
    """Raw gradient rows (``[..., N_FIELDS]``) of a GradScaler-scaled backward → the unscaled gradients'
    (in place): sums, min and max divided by the scale, sums of squares by its square; counts (numel,
    non-zero, NaN, Inf) unchanged. ``scale``: a number, or one per step (shape ``[steps, 1, 1]``)."""
    with np.errstate(invalid="ignore", over="ignore"):
        grads[..., _G_DIV1] /= scale
        grads[..., _SQ] /= scale * scale


def backward_origin(calls: list[Any], grads: np.ndarray) -> tuple[Any, Any] | None:
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


class RunTotals:
    """The whole-run accumulators per row id: outputs' and gradients' raw sums/min/max side by side in
    ``rg`` (``raw``/``grad`` are its two halves; a NaN gradient row: none yet), ``calls`` per row,
    ``units`` (which rows have units). Grown by :meth:`ensure`, folded into by :meth:`add_step`."""

    __slots__ = ("calls", "grad", "raw", "rg", "units", "units_known")

    def __init__(self) -> None:
        self.rg = np.zeros((0, 2 * N_FIELDS))
        self.raw, self.grad = self.rg[:, :N_FIELDS], self.rg[:, N_FIELDS:]
        self.calls = np.zeros(0, np.int64)
        self.units = np.zeros(0, bool)
        self.units_known = 0  # rows whose ``units`` are in ``units``

    def ensure(self, rows: list[Row]) -> None:
        """Accumulators sized for every row so far."""
        n = len(rows)
        have = self.raw.shape[0]
        if n > have:
            size = max(n, 2 * have, 16)
            rg = np.zeros((size, 2 * N_FIELDS))
            rg[:, _MN], rg[:, _MX] = np.inf, -np.inf
            rg[:, N_FIELDS:] = np.nan
            rg[:have, :N_FIELDS], rg[:have, N_FIELDS:] = self.raw, self.grad
            calls = np.zeros(size, np.int64)
            calls[:have] = self.calls
            self.rg, self.raw, self.grad, self.calls = rg, rg[:, :N_FIELDS], rg[:, N_FIELDS:], calls
        if self.units.shape[0] != self.raw.shape[0] or self.units_known != n:
            units = np.zeros(self.raw.shape[0], bool)
            units[:n] = [r.units > 0 for r in rows]
            self.units, self.units_known = units, n

    def add_step(self, lay: Layout, at: np.ndarray | slice, rg: np.ndarray, has_grad: bool) -> None:
        """Fold a step's merged ``[rows, 2 × N_FIELDS]`` stats into the accumulators (rows ``at``):
        exactly :func:`accumulate` on each half (gradients only for rows that have some). When every row
        has gradients, they have had some before (no fresh accumulator) and no min is NaN, the two halves
        are one in-place update of a slice."""
        if isinstance(at, slice) and has_grad and lay.grad_init:
            with np.errstate(invalid="ignore", over="ignore"):
                mins, maxs = rg[:, _MN :: N_FIELDS], rg[:, _MX :: N_FIELDS]
                if not np.isnan(mins + maxs).any():  # a NaN min or max (NaN values, an empty tensor): the exact path
                    cur = self.rg[at]
                    mn = np.fmin(cur[:, _MN :: N_FIELDS], mins)
                    mx = np.fmax(cur[:, _MX :: N_FIELDS], maxs)
                    cur += rg
                    cur[:, _MN :: N_FIELDS], cur[:, _MX :: N_FIELDS] = mn, mx
                    return
        accumulate(self.raw, at, rg[:, :N_FIELDS])
        if not has_grad:
            return
        grad = rg[:, N_FIELDS:]
        has_g = ~np.isnan(grad[:, 0])
        if has_g.all():
            accumulate(self.grad, at, grad)
            lay.grad_init = True  # every row's gradient accumulator has started: none is fresh from now on
        elif has_g.any():
            ids = lay.ids if isinstance(at, slice) else at
            accumulate(self.grad, ids[has_g], grad[has_g])


def accumulate(run: np.ndarray, ids: np.ndarray | slice, raw: np.ndarray) -> None:
    """Fold raw rows (unique ``ids``, or a slice of rows) into the run accumulator (a NaN accumulator
    row starts afresh). A NaN min/max in ``raw`` propagates; otherwise a NaN accumulated min/max is
    replaced (``fmin``/``fmax``)."""
    with np.errstate(invalid="ignore", over="ignore"):
        view = isinstance(ids, slice)
        cur = run[ids]  # a view for a slice: updated in place
        fresh = np.isnan(cur[:, 0])
        if fresh.any():
            cur[fresh] = 0.0
            cur[fresh, _MN], cur[fresh, _MX] = np.inf, -np.inf
        cur[:, :_MN] += raw[:, :_MN]
        cur[:, _MX + 1 :] += raw[:, _MX + 1 :]
        mn, mx = raw[:, _MN], raw[:, _MX]
        (np.minimum if np.isnan(mn).any() else np.fmin)(cur[:, _MN], mn, out=cur[:, _MN])
        (np.maximum if np.isnan(mx).any() else np.fmax)(cur[:, _MX], mx, out=cur[:, _MX])
        if not view:
            run[ids] = cur


def merge2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two raw stat rows of one tensor merged (sums added, min/max combined)."""
    with np.errstate(invalid="ignore", over="ignore"):
        out = a + b
    out[_MN], out[_MX] = min(a[_MN], b[_MN]), max(a[_MX], b[_MX])
    return out
