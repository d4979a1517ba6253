"""Per-step history of every row's stats, bounded by ``max_bytes`` (pure numpy, no torch).

One :class:`History` per capture: the capture appends one step at a time (a ``[rows, fields]``
float32 matrix plus the step's loss / learning rate / skipped flag); views read it back as
``[kept steps, rows, fields]`` arrays. Every step is kept while it fits in ``max_bytes``; after
that adjacent buckets are merged pairwise (each kept slot then stands for a bucket of steps:
``agg="last"`` is the bucket's last step, ``"min"``/``"max"`` its extremes, so spikes survive).
The last step appended is always the last kept slot's last step.

This module holds the storage (the arrays, ``append`` / ``append_many`` / ``update`` / ``extend``,
decimation, memory accounting, ``copy``, ``from_arrays``); the read side (``values``, ``scalar``,
``series``, ``at``, ``changes_since``, ``notes``, ...) is the :class:`~nbdebug.capture.history_read.HistoryReader`
mixin in :mod:`nbdebug.capture.history_read`, which also defines ``HISTORY_FIELDS`` / ``SCALARS`` /
``FIELD_INDEX`` (re-exported here: import them from this module).

>>> h = History(max_bytes=2**20)
>>> r = h.row_id("fc", {"module": "fc", "type": "Linear"})
>>> v = np.full((1, len(HISTORY_FIELDS)), np.nan, np.float32); v[0, FIELD_INDEX["mean"]] = 0.5
>>> h.append(1, np.array([r]), v, {"loss": 2.3})
>>> h.series("fc", "mean").tolist(), h.scalar("loss").tolist(), h.step_index.tolist()
([0.5], [2.299999952316284], [1])
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .history_read import (
    _AGGS,
    _F,
    _F32,
    _NAN_S,
    _S,
    FIELD_INDEX,
    HISTORY_FIELDS,
    SCALAR_INDEX,
    SCALARS,
    HistoryReader,
)

__all__ = ["FIELD_INDEX", "HISTORY_FIELDS", "SCALARS", "History"]

_ALL_SCALARS = frozenset(SCALARS)  # compared with a dict's keys view (a subset test)


class History(HistoryReader):
    """Per-step stats of every row, decimated to stay within ``max_bytes``.

    Storage: three float32 arrays ``[slots, rows, fields]`` (bucket last / min / max), the same for
    the per-step scalars, and int64 bucket bounds. Appending is O(rows × fields) amortised: arrays
    grow by doubling up to the budget's slot count, and a decimation (pairwise merge, O(history))
    happens once per halving of the slots. ``max_bytes`` smaller than one slot still keeps one
    bucket (the last step, and each value's min/max over the run), and :attr:`notes` says so.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self.rows: list[str] = []
        self.row_info: list[dict[str, Any]] = []
        self._row_of: dict[str, int] = {}
        self.steps = 0  # 1-based number of the last step appended (0: none)
        self.appended = 0  # steps appended (fewer than ``steps`` with --every)
        self._k = 0  # kept slots
        self._stride = 1  # steps per full bucket
        self._rcap = 0  # rows allocated
        self._kcap = 0  # slots allocated
        self._version = 0
        self._reorg = 0  # version of the last decimation / row growth
        self._alloc(0, 0)

    # ------------------------------------------------------------------ storage
    def _alloc(self, kcap: int, rcap: int) -> None:
        """(Re)allocate for ``kcap`` slots × ``rcap`` rows, keeping what is stored."""
        k, r_old = self._k, self._rcap
        # Slots past ``k`` are written whole before they are read: no need to fill them.
        new = [np.empty((kcap, rcap, _F), _F32) for _ in _AGGS]
        news = [np.empty((kcap, _S), _F32) for _ in _AGGS]
        if k:
            for dst, src in zip(new, self._v):
                dst[:k, :r_old] = src[:k, :r_old]
                dst[:k, r_old:] = np.nan
            for dst, src in zip(news, self._s):
                dst[:k] = src[:k]
        first, last, count, ver = (np.zeros(kcap, np.int64) for _ in range(4))
        if k:
            first[:k], last[:k], count[:k], ver[:k] = self._first[:k], self._last[:k], self._count[:k], self._ver[:k]
        self._v, self._s = new, news
        self._first, self._last, self._count, self._ver = first, last, count, ver
        self._kcap, self._rcap = kcap, rcap

    @staticmethod
    def slot_bytes(rows: int) -> int:
        """Bytes one kept slot costs for ``rows`` rows (last/min/max of every field and scalar, bounds)."""
        return 3 * 4 * (rows * _F + _S) + 4 * 8

    def max_slots(self, rows: int | None = None) -> int:
        """How many kept slots ``max_bytes`` allows for ``rows`` rows (default: the rows so far); at least 1."""
        rcap = max(self._rcap, len(self.rows)) if rows is None else rows
        return max(1, self.max_bytes // self.slot_bytes(rcap))

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (counted against ``max_bytes``)."""
        return sum(a.nbytes for a in self._v) + sum(a.nbytes for a in self._s) + 4 * self._first.nbytes

    def _ensure_rows(self) -> None:
        n = len(self.rows)
        if n <= self._rcap:
            return
        rcap = n if self._rcap == 0 else max(n, self._rcap + self._rcap // 4 + 1)
        if self._k:
            self._version += 1
            self._reorg = self._version  # earlier slots gained NaN columns: readers start over
        while self._k > self.max_slots(rcap):
            self._decimate()
        self._alloc(min(self._kcap, self.max_slots(rcap)), rcap)

    def _ensure_slot(self) -> None:
        """Room for one more slot (grow by doubling up to the budget)."""
        if self._k < self._kcap:
            return
        self._alloc(min(max(16, 2 * self._kcap), self.max_slots()), self._rcap)

    def _decimate(self) -> None:
        """Merge adjacent slots pairwise (last = the later one's last, min/max combined)."""
        k = self._k
        m = k // 2
        lo, hi = slice(0, 2 * m, 2), slice(1, 2 * m, 2)
        for i, (a, s) in enumerate(zip(self._v, self._s)):
            if i == 0:
                a[:m] = a[hi]
                s[:m] = s[hi]
            else:
                op = np.fmin if i == 1 else np.fmax
                a[:m] = op(a[lo], a[hi])
                s[:m] = op(s[lo], s[hi])
            if k % 2:
                a[m] = a[k - 1]
                s[m] = s[k - 1]
        self._first[:m] = self._first[lo]
        self._last[:m] = self._last[hi]
        self._count[:m] = self._count[lo] + self._count[hi]
        if k % 2:
            self._first[m], self._last[m], self._count[m] = self._first[k - 1], self._last[k - 1], self._count[k - 1]
        self._k = m + k % 2
        self._stride *= 2
        self._version += 1
        self._reorg = self._version
        self._ver[: self._k] = self._version

    def _slot_for(self, count: int) -> tuple[int, bool]:
        """The slot a bucket of ``count`` steps goes to, and whether it folds into the open bucket
        (which has room) rather than opening a new slot (decimating when the budget is full)."""
        while True:
            k = self._k
            if k and self._count[k - 1] + count <= self._stride:
                return k - 1, True
            if k < self.max_slots():
                self._ensure_slot()
                self._k = k + 1
                return k, False
            self._decimate()

    def _push(self, first: int, last: int, count: int, vals: Sequence[np.ndarray], svals: Sequence[np.ndarray]) -> None:
        """Add a bucket: last/min/max ``[R, F]`` matrices (all rows) and ``[S]`` scalars."""
        j, fold = self._slot_for(count)
        v, s = self._v, self._s
        r = vals[0].shape[0]
        if fold:
            v[0][j, :r] = vals[0]
            v[0][j, r:] = np.nan
            np.fmin(v[1][j, :r], vals[1], out=v[1][j, :r])
            np.fmax(v[2][j, :r], vals[2], out=v[2][j, :r])
            s[0][j] = svals[0]
            np.fmin(s[1][j], svals[1], out=s[1][j])
            np.fmax(s[2][j], svals[2], out=s[2][j])
            self._count[j] += count
        else:
            for a, x in zip(v, vals):
                a[j, :r] = x
                a[j, r:] = np.nan
            for a, x in zip(s, svals):
                a[j] = x
            self._first[j], self._count[j] = first, count
        self._last[j] = last
        self._version += 1
        self._ver[j] = self._version

    # ------------------------------------------------------------------ writing
    def row_id(self, name: str, info: Mapping[str, Any] | None = None) -> int:
        """The id of row ``name``, adding it (with ``info``: name, module, type, shape, dtype) if new."""
        i = self._row_of.get(name)
        if i is None:
            i = self._row_of[name] = len(self.rows)
            self.rows.append(name)
            d = {"name": name, "module": name, "type": "", "shape": (), "dtype": ""}
            d.update(info or {})
            d["name"] = name
            self.row_info.append(d)
        return i

    def _full(self, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``values`` of ``rows`` as an all-rows ``[R, F]`` matrix (NaN elsewhere)."""
        values, rows = self._check(rows, values)
        out = np.full((len(self.rows), _F), np.nan, _F32)
        out[rows] = values
        return out

    @staticmethod
    def _check(rows: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        values = np.asarray(values, dtype=_F32)
        rows = np.asarray(rows, dtype=np.intp)
        if values.shape != (len(rows), _F):
            raise ValueError(f"values must be [len(rows), {_F}] (HISTORY_FIELDS), got {values.shape}")
        return values, rows

    def append(self, step: int, rows: np.ndarray, values: np.ndarray, scalars: Mapping[str, float] | None = None) -> None:
        """Add step ``step`` (1-based, increasing; gaps allowed): ``values[i]`` are row ``rows[i]``'s
        :data:`HISTORY_FIELDS` (NaN where unknown); rows not listed are NaN at this step.
        ``scalars`` maps names of :data:`SCALARS` to floats (missing ones are NaN).

        O(rows × fields) amortised: one scatter per stored array, no loop over fields.
        """
        if step <= self.steps:
            raise ValueError(f"history: step {step} appended after step {self.steps} (steps must increase)")
        if len(self.rows) > self._rcap:
            self._ensure_rows()
        values, rows = self._check(rows, values)
        sv = _NAN_S.copy()
        if scalars:
            for key, x in scalars.items():
                i = SCALAR_INDEX.get(key)
                if i is None:
                    raise KeyError(f"history: unknown scalar {key!r}; valid: {SCALARS}")
                sv[i] = np.nan if x is None else x
        j, fold = self._slot_for(1)
        last, lo, hi = self._v
        last[j] = np.nan
        last[j, rows] = values
        if fold:
            lo[j, rows] = np.fmin(lo[j, rows], values)
            hi[j, rows] = np.fmax(hi[j, rows], values)
            s0, s1, s2 = self._s
            s0[j] = sv
            np.fmin(s1[j], sv, out=s1[j])
            np.fmax(s2[j], sv, out=s2[j])
            self._count[j] += 1
        else:
            lo[j] = last[j]
            hi[j] = last[j]
            for a in self._s:
                a[j] = sv
            self._first[j] = step
            self._count[j] = 1
        self._last[j] = step
        self._version += 1
        self._ver[j] = self._version
        self.steps = step
        self.appended += 1

    def append_many(self, steps: Sequence[int], rows: np.ndarray, values: np.ndarray,
                    scalars: Sequence[Mapping[str, float] | None]) -> None:
        """:meth:`append` for several steps of the same ``rows`` (``values``: ``[len(steps), len(rows), F]``):
        one write per stored array while each step still gets a slot of its own (no merging), else
        :meth:`append` step by step. The result is the same either way."""
        k = len(steps)
        if not k:
            return
        if len(self.rows) > self._rcap:
            self._ensure_rows()
        j0 = self._k
        if (self._stride != 1 or j0 + k > self.max_slots() or steps[0] <= self.steps
                or any(b <= a for a, b in itertools.pairwise(steps))):
            for s, v, sc in zip(steps, values, scalars):
                self.append(s, rows, v, sc)
            return
        values = np.asarray(values, dtype=_F32)
        rows = np.asarray(rows, dtype=np.intp)
        if values.shape != (k, len(rows), _F):
            raise ValueError(f"values must be [{k}, len(rows), {_F}] (HISTORY_FIELDS), got {values.shape}")
        for sc in scalars:
            if sc and not sc.keys() <= _ALL_SCALARS:
                bad = next(key for key in sc if key not in _ALL_SCALARS)
                raise KeyError(f"history: unknown scalar {bad!r}; valid: {SCALARS}")
        # one conversion for all the steps; a missing scalar and None are NaN
        sv = np.array([[sc.get(key) if sc else None for key in SCALARS] for sc in scalars], dtype=_F32)
        while self._kcap < j0 + k:
            self._alloc(min(max(16, 2 * self._kcap), self.max_slots()), self._rcap)
        sl = slice(j0, j0 + k)
        last, lo, hi = self._v
        last[sl] = np.nan
        last[sl, rows] = values
        lo[sl] = last[sl]
        hi[sl] = last[sl]
        for a in self._s:
            a[sl] = sv
        st = np.asarray(steps, dtype=np.int64)
        self._first[sl], self._last[sl], self._count[sl] = st, st, 1
        self._ver[sl] = np.arange(self._version + 1, self._version + k + 1)
        self._version += k
        self._k = j0 + k
        self.steps = int(st[-1])
        self.appended += k

    def update(self, step: int, rows: np.ndarray, values: np.ndarray) -> bool:
        """Late data for an appended step (e.g. gradients that arrived after the step was appended):
        non-NaN entries overwrite the step's values; in a decimated bucket they are folded into its
        min/max (and overwrite ``last`` when ``step`` is the bucket's last step). Returns False (and
        changes nothing) when no kept bucket covers ``step``."""
        self._ensure_rows()  # first: room for new rows may merge slots, which moves the step's bucket
        k = self._k
        j = int(np.searchsorted(self._last[:k], step))
        if j >= k or self._first[j] > step:
            return False
        full = self._full(rows, values)
        r = full.shape[0]
        mask = ~np.isnan(full)
        if self._last[j] == step:
            np.copyto(self._v[0][j, :r], full, where=mask)
        if self._count[j] == 1:
            np.copyto(self._v[1][j, :r], full, where=mask)
            np.copyto(self._v[2][j, :r], full, where=mask)
        else:
            np.fmin(self._v[1][j, :r], full, out=self._v[1][j, :r])
            np.fmax(self._v[2][j, :r], full, out=self._v[2][j, :r])
        self._version += 1
        self._ver[j] = self._version
        return True

    def extend(self, other: History) -> None:
        """Append ``other``'s kept buckets after ours (``--continue``), matching rows by name.

        ``other``'s steps follow ours: when its first step is not after our last one (it was
        numbered from 1), its steps are shifted by :attr:`steps`.
        """
        if other._k == 0:
            return
        shift = self.steps if other._first[0] <= self.steps else 0
        ids = np.array([self.row_id(n, other.row_info[i]) for i, n in enumerate(other.rows)], dtype=np.intp)
        self._ensure_rows()
        n = len(self.rows)
        ro = len(other.rows)
        for j in range(other._k):
            mats = []
            for a in other._v:
                m = np.full((n, _F), np.nan, _F32)
                m[ids] = a[j, :ro]
                mats.append(m)
            self._push(int(other._first[j]) + shift, int(other._last[j]) + shift, int(other._count[j]), mats,
                       [s[j].copy() for s in other._s])
        self.steps = int(other.steps) + shift
        self.appended += other.appended

    def copy(self) -> History:
        """An independent copy (e.g. to continue a finished run's history without changing it)."""
        new = History.__new__(History)
        new.__dict__.update(self.__dict__)
        new.rows, new.row_info, new._row_of = list(self.rows), [dict(i) for i in self.row_info], dict(self._row_of)
        new._v, new._s = [a.copy() for a in self._v], [a.copy() for a in self._s]
        new._first, new._last, new._count, new._ver = (a.copy() for a in (self._first, self._last, self._count, self._ver))
        return new

    # ------------------------------------------------------------------ building
    @classmethod
    def from_arrays(cls, steps: Sequence[int] | np.ndarray, rows: Sequence[str], values: np.ndarray,
                    scalars: Mapping[str, Sequence[float] | np.ndarray] | None = None,
                    row_info: Sequence[Mapping[str, Any]] | None = None, max_bytes: int = 2**40) -> History:
        """A History from whole arrays (for tests and hand-built results).

        ``steps``: ``[K]`` increasing 1-based steps; ``rows``: ``R`` row names; ``values``:
        ``[K, R, F]`` in :data:`HISTORY_FIELDS` order, or a mapping field → ``[K, R]`` (other fields
        NaN); ``scalars``: name → ``[K]``; ``row_info``: per row {module, type, shape, dtype}.

        >>> h = History.from_arrays([1, 2], ["a"], {"mean": [[1.0], [2.0]]}, {"loss": [3.0, 2.5]})
        >>> h.series("a", "mean").tolist(), h.scalar("loss").tolist()
        ([1.0, 2.0], [3.0, 2.5])
        """
        steps = np.asarray(steps, dtype=np.int64)
        k, r = len(steps), len(rows)
        if isinstance(values, Mapping):
            arr = np.full((k, r, _F), np.nan, _F32)
            for f, v in values.items():
                if f not in FIELD_INDEX:
                    raise KeyError(f"history: no field {f!r}; valid: {list(HISTORY_FIELDS)}")
                arr[:, :, FIELD_INDEX[f]] = np.asarray(v, dtype=_F32).reshape(k, r)
            values = arr
        values = np.asarray(values, dtype=_F32)
        if values.shape != (k, r, _F):
            raise ValueError(f"values must be [{k}, {r}, {_F}], got {values.shape}")
        h = cls(max_bytes)
        ids = np.array([h.row_id(n, (row_info[i] if row_info else None)) for i, n in enumerate(rows)], dtype=np.intp)
        sc = {name: np.asarray(v, dtype=np.float64) for name, v in (scalars or {}).items()}
        for i, s in enumerate(steps.tolist()):
            h.append(s, ids, values[i], {name: float(v[i]) for name, v in sc.items()})
        return h
