"""The storage under a per-step history: kept slots ("buckets") of float32 matrices within a budget.

:class:`Buckets` knows nothing about row names or what the fields mean: it stores, per kept slot,
a ``[rows, fields]`` matrix three times (the bucket's last step, and each value's min and max over
the bucket), the same for a ``[scalars]`` vector, the bucket's first and last step and how many
steps it stands for. Every step is kept in a slot of its own while the slots fit in ``max_bytes``;
after that adjacent slots merge pairwise (a decimation: ``last`` from the later one, ``min``/``max``
combined), so spikes survive. :class:`~nbdebug.capture.history.History` names the rows, the fields
and the scalars on top of it. Pure numpy, no torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["AGGS", "Buckets", "slot_bytes"]

#: the three matrices kept per slot, in storage order
AGGS: tuple[str, ...] = ("last", "min", "max")
_F32 = np.float32


def slot_bytes(rows: int, fields: int, scalars: int) -> int:
    """Bytes one kept slot costs: last/min/max of ``rows × fields`` values and of ``scalars``, plus
    the slot's bounds (first step, last step, count, change token)."""
    return 3 * 4 * (rows * fields + scalars) + 4 * 8


def agg_index(agg: str) -> int:
    """The storage index of ``agg`` ("last" | "min" | "max"); ValueError for anything else."""
    if agg not in AGGS:
        raise ValueError(f"agg must be one of {AGGS}, got {agg!r}")
    return AGGS.index(agg)


class Buckets:
    """Kept slots of ``fields`` values per row and ``scalars`` values per step, within ``max_bytes``.

    Arrays grow by doubling up to the budget's slot count; a decimation (pairwise merge, O(slots))
    happens once per halving. A budget smaller than one slot still keeps one slot. Each write moves
    a change token; :meth:`changes_since` tells a reader which slots changed since
    the token it last saw (every slot after a decimation or a growth of the rows).
    """

    def __init__(self, max_bytes: int, fields: int, scalars: int) -> None:
        self.max_bytes = int(max_bytes)
        self.fields, self.scalars = int(fields), int(scalars)
        self._k = 0  # kept slots
        self._stride = 1  # steps per full bucket
        self._rcap = 0  # rows allocated
        self._kcap = 0  # slots allocated
        self._edits = 0  # the change token: moves with every write
        self._reorg = 0  # token of the last decimation / row growth
        self._alloc(0, 0)

    # ------------------------------------------------------------------ size
    def __len__(self) -> int:
        return self._k

    @property
    def stride(self) -> int:
        """Appended steps per full bucket: 1 until the first decimation, doubled by each one."""
        return self._stride

    @property
    def rows_allocated(self) -> int:
        """Rows the arrays have room for (what the budget is counted on)."""
        return self._rcap

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (counted against ``max_bytes``)."""
        return sum(a.nbytes for a in self._v) + sum(a.nbytes for a in self._s) + 4 * self._first.nbytes

    @property
    def decimated(self) -> bool:
        """Some kept slot stands for more than one step."""
        return self._stride > 1 or bool(self._k and self._count[: self._k].max() > 1)

    def max_slots(self, rows: int) -> int:
        """How many kept slots ``max_bytes`` allows for ``rows`` rows; at least 1."""
        return max(1, self.max_bytes // slot_bytes(rows, self.fields, self.scalars))

    # ------------------------------------------------------------------ allocation and merging
    def _alloc(self, kcap: int, rcap: int) -> None:
        """(Re)allocate for ``kcap`` slots × ``rcap`` rows, keeping what is stored."""
        k, r_old = self._k, self._rcap
        # Slots past ``k`` are written whole before they are read: no need to fill them.
        new = [np.empty((kcap, rcap, self.fields), _F32) for _ in AGGS]
        news = [np.empty((kcap, self.scalars), _F32) for _ in AGGS]
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

    def ensure_rows(self, rows: int) -> None:
        """Room for ``rows`` rows (earlier slots read NaN for the new ones); merges slots when the
        wider slots no longer fit the budget."""
        if rows <= self._rcap:
            return
        rcap = rows if self._rcap == 0 else max(rows, self._rcap + self._rcap // 4 + 1)
        if self._k:
            self._edits += 1
            self._reorg = self._edits  # earlier slots gained NaN columns: readers start over
        while self._k > self.max_slots(rcap):
            self._decimate()
        self._alloc(min(self._kcap, self.max_slots(rcap)), rcap)

    def _ensure_slot(self) -> None:
        """Room for one more slot (grow by doubling up to the budget)."""
        if self._k < self._kcap:
            return
        self._alloc(min(max(16, 2 * self._kcap), self.max_slots(self._rcap)), self._rcap)

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
        self._edits += 1
        self._reorg = self._edits
        self._ver[: self._k] = self._edits

    def _slot_for(self, count: int) -> tuple[int, bool]:
        """The slot a bucket of ``count`` steps goes to, and whether it folds into the open bucket
        (which has room) rather than opening a new slot (decimating when the budget is full)."""
        while True:
            k = self._k
            if k and self._count[k - 1] + count <= self._stride:
                return k - 1, True
            if k < self.max_slots(self._rcap):
                self._ensure_slot()
                self._k = k + 1
                return k, False
            self._decimate()

    # ------------------------------------------------------------------ writing
    def append(self, step: int, rows: np.ndarray, values: np.ndarray, scalars: np.ndarray) -> None:
        """One step: ``values [len(rows), fields]`` float32 of the row indices ``rows`` (every other
        row NaN at this step), ``scalars [scalars]`` float32. O(rows × fields) amortised: one
        scatter per stored array. The rows must fit (:meth:`ensure_rows`)."""
        j, fold = self._slot_for(1)
        last, lo, hi = self._v
        last[j] = np.nan
        last[j, rows] = values
        if fold:
            lo[j, rows] = np.fmin(lo[j, rows], values)
            hi[j, rows] = np.fmax(hi[j, rows], values)
            s0, s1, s2 = self._s
            s0[j] = scalars
            np.fmin(s1[j], scalars, out=s1[j])
            np.fmax(s2[j], scalars, out=s2[j])
            self._count[j] += 1
        else:
            lo[j] = last[j]
            hi[j] = last[j]
            for a in self._s:
                a[j] = scalars
            self._first[j] = step
            self._count[j] = 1
        self._last[j] = step
        self._edits += 1
        self._ver[j] = self._edits

    def fits_apart(self, steps: int) -> bool:
        """Whether ``steps`` more steps each get a slot of their own without any merging."""
        return self._stride == 1 and self._k + steps <= self.max_slots(self._rcap)

    def append_apart(self, steps: np.ndarray, rows: np.ndarray, values: np.ndarray, scalars: np.ndarray) -> None:
        """Several steps in slots of their own (:meth:`fits_apart` said so): ``steps`` int64 [k],
        ``values [k, len(rows), fields]``, ``scalars [k, scalars]``; one write per stored array."""
        k = len(steps)
        j0 = self._k
        while self._kcap < j0 + k:
            self._alloc(min(max(16, 2 * self._kcap), self.max_slots(self._rcap)), self._rcap)
        sl = slice(j0, j0 + k)
        last, lo, hi = self._v
        last[sl] = np.nan
        last[sl, rows] = values
        lo[sl] = last[sl]
        hi[sl] = last[sl]
        for a in self._s:
            a[sl] = scalars
        self._first[sl], self._last[sl], self._count[sl] = steps, steps, 1
        self._ver[sl] = np.arange(self._edits + 1, self._edits + k + 1)
        self._edits += k
        self._k = j0 + k

    def update(self, step: int, full: np.ndarray) -> bool:
        """Late values for an appended step: ``full [R, fields]`` (R ≤ the rows allocated; NaN =
        no news). Non-NaN entries overwrite the step's values; in a merged bucket they are folded into
        its min/max (and overwrite ``last`` when ``step`` is the bucket's last step). False (nothing
        changed) when no kept bucket covers ``step``."""
        k = self._k
        j = int(np.searchsorted(self._last[:k], step))
        if j >= k or self._first[j] > step:
            return False
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
        self._edits += 1
        self._ver[j] = self._edits
        return True

    def push(self, first: int, last: int, count: int, mats: Sequence[np.ndarray], svals: Sequence[np.ndarray]) -> None:
        """Add a whole bucket: last/min/max ``[R, fields]`` matrices (R ≤ the rows allocated) and
        last/min/max ``[scalars]`` vectors, standing for ``count`` steps from ``first`` to ``last``."""
        j, fold = self._slot_for(count)
        v, s = self._v, self._s
        r = mats[0].shape[0]
        if fold:
            v[0][j, :r] = mats[0]
            v[0][j, r:] = np.nan
            np.fmin(v[1][j, :r], mats[1], out=v[1][j, :r])
            np.fmax(v[2][j, :r], mats[2], out=v[2][j, :r])
            s[0][j] = svals[0]
            np.fmin(s[1][j], svals[1], out=s[1][j])
            np.fmax(s[2][j], svals[2], out=s[2][j])
            self._count[j] += count
        else:
            for a, x in zip(v, mats):
                a[j, :r] = x
                a[j, r:] = np.nan
            for a, x in zip(s, svals):
                a[j] = x
            self._first[j], self._count[j] = first, count
        self._last[j] = last
        self._edits += 1
        self._ver[j] = self._edits

    # ------------------------------------------------------------------ reading
    def values(self, agg: str, start: int, rows: int) -> np.ndarray:
        """float32 ``[K - start, rows, fields]`` copy of the kept slots from ``start`` on."""
        return self._v[agg_index(agg)][start : self._k, :rows].copy()

    def column(self, agg: str, row: int, field: int) -> np.ndarray:
        """float32 ``[K]`` copy: one row's one field at every kept slot."""
        return self._v[agg_index(agg)][: self._k, row, field].copy()

    def scalar(self, agg: str, index: int, start: int = 0) -> np.ndarray:
        """float32 ``[K - start]`` copy: scalar ``index`` at every kept slot from ``start`` on."""
        return self._s[agg_index(agg)][start : self._k, index].copy()

    def slot(self, j: int, agg: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of slot ``j``'s ``[rows, fields]`` matrix and ``[scalars]`` vector."""
        a = agg_index(agg)
        return self._v[a][j, :rows].copy(), self._s[a][j].copy()

    def bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of the kept slots' first steps, last steps and step counts (int64 ``[K]`` each)."""
        k = self._k
        return self._first[:k].copy(), self._last[:k].copy(), self._count[:k].copy()

    def last_steps(self) -> np.ndarray:
        """int64 ``[K]`` copy: the last step of each kept slot."""
        return self._last[: self._k].copy()

    def slot_of(self, step: int) -> int:
        """The kept slot whose last step is ``step``; KeyError naming the nearest kept steps."""
        idx = self._last[: self._k]
        j = int(np.searchsorted(idx, step))
        if j < self._k and idx[j] == step:
            return j
        near = sorted({int(idx[i]) for i in (j - 1, j) if 0 <= i < self._k})
        raise KeyError(f"step {step} is not a kept step; nearest kept: {near or 'none (empty history)'}")

    def changes_since(self, token: int) -> tuple[int, int]:
        """``(new token, first kept slot changed since token)``; the slot is 0 for token 0 and after a
        decimation or row growth (re-read everything), ``len(self)`` when nothing changed."""
        if token <= 0 or token < self._reorg:
            return self._edits, 0
        changed = np.flatnonzero(self._ver[: self._k] > token)
        return self._edits, int(changed[0]) if changed.size else self._k

    def buckets(self, rows: int) -> Iterator[tuple[int, int, int, list[np.ndarray], list[np.ndarray]]]:
        """Every kept slot as ``(first, last, count, [last, min, max] [rows, fields], [last, min, max]
        [scalars])`` (copies), in order: what :meth:`push` takes."""
        for j in range(self._k):
            yield (int(self._first[j]), int(self._last[j]), int(self._count[j]),
                   [a[j, :rows].copy() for a in self._v], [s[j].copy() for s in self._s])

    def copy(self) -> Buckets:
        """An independent copy."""
        new = Buckets.__new__(Buckets)
        new.__dict__.update(self.__dict__)
        new._v, new._s = [a.copy() for a in self._v], [a.copy() for a in self._s]
        new._first, new._last, new._count, new._ver = (a.copy() for a in (self._first, self._last, self._count, self._ver))
        return new
