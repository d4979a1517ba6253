"""Per-step history of every row's stats, bounded by ``max_bytes`` (pure numpy, no torch).

One :class:`History` per capture: the capture appends one step at a time (a ``[rows, fields]``
float32 matrix plus the step's loss / learning rate / skipped flag); views read it back as
``[kept steps, rows, fields]`` arrays. Every step is kept while it fits in ``max_bytes``; after
that adjacent buckets are merged pairwise (each kept slot then stands for a bucket of steps:
``agg="last"`` is the bucket's last step, ``"min"``/``"max"`` its extremes, so spikes survive).
The last step appended is always the last kept slot's last step.

This module names things: the rows (``row_id``, ``rows``, ``row_info``), the fields
(:data:`HISTORY_FIELDS`) and the per-step scalars (:data:`SCALARS`), and checks what is appended.
The slots themselves (arrays, decimation, memory accounting, change tokens) are a
:class:`~nbdebug.capture.history_store.Buckets` each History owns.

>>> h = History(max_bytes=2**20)
>>> r = h.row_id("fc", {"module": "fc", "type": "Linear"})
>>> v = np.full((1, len(HISTORY_FIELDS)), np.nan, np.float32); v[0, FIELD_INDEX["mean"]] = 0.5
>>> h.append(1, np.array([r]), v, {"loss": 2.3})
>>> h.series("fc", "mean").tolist(), h.scalar("loss").tolist(), h.step_index.tolist()
([0.5], [2.299999952316284], [1])
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .budget import format_bytes
from .history_store import Buckets, slot_bytes

__all__ = ["FIELD_INDEX", "HISTORY_FIELDS", "SCALARS", "SCALAR_INDEX", "History"]

HISTORY_FIELDS: tuple[str, ...] = (
    "mean", "std", "min", "max", "zero_frac", "norm", "nan", "inf", "dead_unit_frac", "saturated_frac",
    "grad_mean", "grad_std", "grad_min", "grad_max", "grad_norm", "grad_nan", "grad_inf",
    "param_grad_norm", "param_norm", "update_ratio",
)
#: per-step values (not per row); NaN when unknown. "skipped" is 1.0 on a step whose optimizer
#: step a GradScaler skipped (inf/NaN gradients), else 0.0; "class_share" / "class_top": the share of
#: the batch on its most frequent label and that label, read from the gradient of the model's
#: classifier output (capture/classes.py; NaN without one)
SCALARS: tuple[str, ...] = ("loss", "lr", "skipped", "class_share", "class_top")
FIELD_INDEX: dict[str, int] = {f: i for i, f in enumerate(HISTORY_FIELDS)}
SCALAR_INDEX: dict[str, int] = {s: i for i, s in enumerate(SCALARS)}
_F = len(HISTORY_FIELDS)
_S = len(SCALARS)
_F32 = np.float32
_NAN_S = np.full(_S, np.nan, _F32)
_ALL_SCALARS = frozenset(SCALARS)  # compared with a dict's keys view (a subset test)

#: one kept bucket as :meth:`History.from_buckets` takes it: first step, last step, steps it stands
#: for, last/min/max ``[R_b, F]`` matrices of the first ``R_b`` rows, last/min/max ``[S]`` scalars
Bucket = tuple[int, int, int, Sequence[np.ndarray], Sequence[np.ndarray]]


class History:
    """Per-step stats of every row, decimated to stay within ``max_bytes``.

    Storage (a :class:`~nbdebug.capture.history_store.Buckets`): three float32 arrays ``[slots,
    rows, fields]`` (bucket last / min / max), the same for the per-step scalars, and int64 bucket
    bounds. Appending is O(rows × fields) amortised: arrays grow by doubling up to the budget's slot
    count, and a decimation (pairwise merge, O(history)) happens once per halving of the slots.
    ``max_bytes`` smaller than one slot still keeps one bucket (the last step, and each value's
    min/max over the run), and :attr:`notes` says so.
    """

    def __init__(self, max_bytes: int) -> None:
        self._store = Buckets(max_bytes, _F, _S)
        self.rows: list[str] = []
        self.row_info: list[dict[str, Any]] = []
        self._row_ids: dict[str, int] = {}
        self.steps = 0  # 1-based number of the last step appended (0: none)
        self.appended = 0  # steps appended (fewer than ``steps`` with --every)

    # ------------------------------------------------------------------ size
    @property
    def max_bytes(self) -> int:
        """The budget of the kept slots."""
        return self._store.max_bytes

    @staticmethod
    def slot_bytes(rows: int) -> int:
        """Bytes one kept slot costs for ``rows`` rows (last/min/max of every field and scalar, bounds)."""
        return slot_bytes(rows, _F, _S)

    def max_slots(self, rows: int | None = None) -> int:
        """How many kept slots ``max_bytes`` allows for ``rows`` rows (default: the rows so far); at least 1."""
        return self._store.max_slots(max(self._store.rows_allocated, len(self.rows)) if rows is None else rows)

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (counted against ``max_bytes``)."""
        return self._store.nbytes

    def __len__(self) -> int:
        return len(self._store)

    @property
    def stride(self) -> int:
        """Appended steps per full bucket: 1 until the first decimation, doubled by each one."""
        return self._store.stride

    @property
    def decimated(self) -> bool:
        """Some kept slot stands for more than one step."""
        return self._store.decimated

    # ------------------------------------------------------------------ writing
    def row_id(self, name: str, info: Mapping[str, Any] | None = None) -> int:
        """The id of row ``name``, adding it (with ``info``: name, module, type, shape, dtype) if new."""
        i = self._row_ids.get(name)
        if i is None:
            i = self._row_ids[name] = len(self.rows)
            self.rows.append(name)
            d = {"name": name, "module": name, "type": "", "shape": (), "dtype": ""}
            d.update(info or {})
            d["name"] = name
            self.row_info.append(d)
        return i

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
        store = self._store
        if len(self.rows) > store.rows_allocated:
            store.ensure_rows(len(self.rows))
        values, rows = self._check(rows, values)
        sv = _NAN_S.copy()
        if scalars:
            for key, x in scalars.items():
                i = SCALAR_INDEX.get(key)
                if i is None:
                    raise KeyError(f"history: unknown scalar {key!r}; valid: {SCALARS}")
                sv[i] = np.nan if x is None else x
        store.append(step, rows, values, sv)
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
        store = self._store
        if len(self.rows) > store.rows_allocated:
            store.ensure_rows(len(self.rows))
        if (not store.fits_apart(k) or steps[0] <= self.steps
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
        st = np.asarray(steps, dtype=np.int64)
        store.append_apart(st, rows, values, sv)
        self.steps = int(st[-1])
        self.appended += k

    def update(self, step: int, rows: np.ndarray, values: np.ndarray) -> bool:
        """Late data for an appended step (e.g. gradients that arrived after the step was appended):
        non-NaN entries overwrite the step's values; in a decimated bucket they are folded into its
        min/max (and overwrite ``last`` when ``step`` is the bucket's last step). Returns False (and
        changes nothing) when no kept bucket covers ``step``."""
        self._store.ensure_rows(len(self.rows))  # first: room for new rows may merge slots, which moves the step's bucket
        values, rows = self._check(rows, values)
        full = np.full((len(self.rows), _F), np.nan, _F32)
        full[rows] = values
        return self._store.update(step, full)

    def _matrices(self, ids: np.ndarray, mats: Sequence[np.ndarray]) -> list[np.ndarray]:
        """All-rows ``[R, F]`` copies of ``mats`` whose row ``i`` is our row ``ids[i]`` (NaN elsewhere)."""
        out = []
        for a in mats:
            m = np.full((len(self.rows), _F), np.nan, _F32)
            m[ids] = a[: len(ids)]
            out.append(m)
        return out

    def extend(self, other: History) -> None:
        """Append ``other``'s kept buckets after ours (``--continue``), matching rows by name.

        ``other``'s steps follow ours: when its first step is not after our last one (it was
        numbered from 1), its steps are shifted by :attr:`steps`.
        """
        if not len(other):
            return
        shift = self.steps if other.bucket_first[0] <= self.steps else 0
        ids = np.array([self.row_id(n, other.row_info[i]) for i, n in enumerate(other.rows)], dtype=np.intp)
        self._store.ensure_rows(len(self.rows))
        for first, last, count, mats, svals in other._store.buckets(len(other.rows)):
            self._store.push(first + shift, last + shift, count, self._matrices(ids, mats), svals)
        self.steps = int(other.steps) + shift
        self.appended += other.appended

    def copy(self) -> History:
        """An independent copy (e.g. to continue a finished run's history without changing it)."""
        new = History.__new__(History)
        new.__dict__.update(self.__dict__)
        new.rows, new.row_info, new._row_ids = list(self.rows), [dict(i) for i in self.row_info], dict(self._row_ids)
        new._store = self._store.copy()
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

    @classmethod
    def from_buckets(cls, row_info: Sequence[Mapping[str, Any]], buckets: Iterable[Bucket], *, steps: int,
                     appended: int, max_bytes: int) -> History:
        """A History from kept buckets as another process wrote them (:mod:`nbdebug.capture.spool`):
        ``row_info`` every row's info (with its ``name``) in row order; ``buckets`` in step order (see
        :data:`Bucket`; a bucket's matrices may cover only the rows that existed when it was written).
        The buckets are kept as given (no merging); ``steps``, ``appended`` and ``max_bytes`` are the
        writer's."""
        h = cls(2**40)
        for info in row_info:
            h.row_id(str(info.get("name")), info)
        r = len(h.rows)
        h._store.ensure_rows(r)
        for first, last, count, mats, svals in buckets:
            full = []
            for m in mats:
                x = np.full((r, m.shape[1]), np.nan, _F32)
                x[: m.shape[0]] = m
                full.append(x)
            h._store.push(first, last, count, full, svals)
        h.steps, h.appended = int(steps), int(appended)
        h._store.max_bytes = int(max_bytes)
        return h

    # ------------------------------------------------------------------ reading
    @property
    def step_index(self) -> np.ndarray:
        """int64 ``[K]``: the last step of each kept bucket (1-based)."""
        return self._store.last_steps()

    @property
    def bucket_first(self) -> np.ndarray:
        """int64 ``[K]``: the first step of each kept bucket (equal to :attr:`step_index` until decimation)."""
        return self._store.bounds()[0]

    @property
    def bucket_steps(self) -> np.ndarray:
        """int64 ``[K]``: how many appended steps each kept bucket stands for."""
        return self._store.bounds()[2]

    def row_index(self, row: str) -> int:
        """The id of an existing row (as :meth:`row_id` gave it); KeyError listing some rows."""
        i = self._row_ids.get(row)
        if i is None:
            raise KeyError(f"history: no row {row!r}; rows: {self.rows[:20]}{' …' if len(self.rows) > 20 else ''}")
        return i

    def values(self, agg: str = "last", start: int = 0) -> np.ndarray:
        """float32 ``[K - start, R, F]`` copy of the kept slots from ``start`` on; agg "last" | "min" | "max"."""
        return self._store.values(agg, start, len(self.rows))

    def scalar(self, name: str, agg: str = "last", start: int = 0) -> np.ndarray:
        """float32 ``[K - start]``: the per-step scalar ``name`` (one of :data:`SCALARS`)."""
        if name not in SCALAR_INDEX:
            raise KeyError(f"history: no scalar {name!r}; valid: {list(SCALARS)}")
        return self._store.scalar(agg, SCALAR_INDEX[name], start)

    def series(self, row: str, field: str, agg: str = "last") -> np.ndarray:
        """float32 ``[K]``: ``field`` of ``row`` at each kept slot (NaN before the row appeared)."""
        r = self.row_index(row)
        if field not in FIELD_INDEX:
            raise KeyError(f"history: no field {field!r}; valid: {list(HISTORY_FIELDS)}")
        return self._store.column(agg, r, FIELD_INDEX[field])

    def slot_of(self, step: int) -> int:
        """The kept slot whose last step is ``step``; KeyError naming the nearest kept steps."""
        return self._store.slot_of(step)

    def at(self, step: int, agg: str = "last") -> dict[str, dict[str, float]]:
        """row → {field: value} at a kept step, for the rows with any value at that step."""
        m, _ = self._store.slot(self.slot_of(step), agg, len(self.rows))
        present = ~np.all(np.isnan(m), axis=1)
        return {self.rows[i]: dict(zip(HISTORY_FIELDS, m[i].tolist())) for i in np.flatnonzero(present)}

    def scalars_at(self, step: int, agg: str = "last") -> dict[str, float]:
        """name → value of the per-step scalars at a kept step."""
        return dict(zip(SCALARS, self._store.slot(self.slot_of(step), agg, 0)[1].tolist()))

    def changes_since(self, token: int) -> tuple[int, int]:
        """``(new token, first kept slot changed since token)``; the slot is 0 for token 0 and after a
        decimation or row growth (re-read everything), ``len(self)`` when nothing changed."""
        return self._store.changes_since(token)

    @property
    def notes(self) -> list[str]:
        """What the budget cost (empty while every appended step is kept on its own)."""
        if not self.decimated:
            return []
        if self.max_slots() == 1:
            return [f"history: the budget of {format_bytes(self.max_bytes)} is smaller than one step of "
                    f"{len(self.rows)} rows; kept only the last step (step {self.steps}) and each value's "
                    f"min/max over the {self.appended} steps (raise max_bytes to keep more)"]
        return [f"history: {self.appended:,} steps kept as {len(self)} points of up to {self.stride} steps each to stay "
                f"within {format_bytes(self.max_bytes)}; each point shows its last step, agg='min'/'max' its extremes"]

    def __repr__(self) -> str:
        return (f"History({len(self.rows)} rows, {self.appended} steps in {len(self)} slots, "
                f"{format_bytes(self.nbytes)} of {format_bytes(self.max_bytes)})")
