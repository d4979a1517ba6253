"""The read side of :class:`~nbdebug.capture.history.History`, and the history's field schema.

:class:`HistoryReader` is the mixin ``History`` inherits from: every query that only reads the
stored arrays (``values``, ``scalar``, ``series``, ``at``, ``scalars_at``, ``slot_of``,
``changes_since``, the bucket properties, ``notes``, ``repr``). The storage itself (the arrays,
``append`` / ``append_many`` / ``update`` / ``extend``, decimation, memory accounting, ``copy``,
``from_arrays``) lives in :mod:`nbdebug.capture.history`, which also re-exports the constants
defined here (``HISTORY_FIELDS``, ``SCALARS``, ``FIELD_INDEX``, ``SCALAR_INDEX``): import them
from there. Pure numpy, no torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .budget import format_bytes

__all__ = ["FIELD_INDEX", "HISTORY_FIELDS", "SCALARS", "SCALAR_INDEX", "HistoryReader"]

HISTORY_FIELDS: tuple[str, ...] = (
    "mean", "std", "min", "max", "zero_frac", "norm", "nan", "inf", "dead_unit_frac", "saturated_frac",
    "grad_mean", "grad_std", "grad_min", "grad_max", "grad_norm", "grad_nan", "grad_inf",
    "param_grad_norm", "param_norm", "update_ratio",
)
#: per-step values (not per row); NaN when unknown. "skipped" is 1.0 on a step whose optimizer
#: step a GradScaler skipped (inf/NaN gradients), else 0.0
SCALARS: tuple[str, ...] = ("loss", "lr", "skipped")
FIELD_INDEX: dict[str, int] = {f: i for i, f in enumerate(HISTORY_FIELDS)}
SCALAR_INDEX: dict[str, int] = {s: i for i, s in enumerate(SCALARS)}
_F = len(HISTORY_FIELDS)
_S = len(SCALARS)
_AGGS = ("last", "min", "max")
_F32 = np.float32
_NAN_S = np.full(_S, np.nan, _F32)


class HistoryReader:
    """Read-only queries over a :class:`~nbdebug.capture.history.History`'s stored arrays.

    A mixin: it holds no state of its own (no ``__init__``, no attributes set), so pickling,
    ``copy.deepcopy`` and :meth:`History.copy` see only ``History``'s own ``__dict__``.
    """

    # Set by History.__init__ / its storage methods (annotations only: no class attributes).
    max_bytes: int
    rows: list[str]
    _row_of: dict[str, int]
    steps: int
    appended: int
    _k: int
    _stride: int
    _version: int
    _reorg: int
    _v: list[np.ndarray]
    _s: list[np.ndarray]
    _first: np.ndarray
    _last: np.ndarray
    _count: np.ndarray
    _ver: np.ndarray

    def max_slots(self, rows: int | None = None) -> int:  # pragma: no cover - History overrides
        raise NotImplementedError

    nbytes: Any  # History's property

    def __len__(self) -> int:
        return self._k

    @property
    def step_index(self) -> np.ndarray:
        """int64 ``[K]``: the last step of each kept bucket (1-based)."""
        return self._last[: self._k].copy()

    @property
    def bucket_first(self) -> np.ndarray:
        """int64 ``[K]``: the first step of each kept bucket (equal to :attr:`step_index` until decimation)."""
        return self._first[: self._k].copy()

    @property
    def bucket_steps(self) -> np.ndarray:
        """int64 ``[K]``: how many appended steps each kept bucket stands for."""
        return self._count[: self._k].copy()

    @property
    def stride(self) -> int:
        """Appended steps per full bucket: 1 until the first decimation, doubled by each one."""
        return self._stride


    @property
    def decimated(self) -> bool:
        """Some kept slot stands for more than one step."""
        return self._stride > 1 or bool(self._k and self._count[: self._k].max() > 1)

    def _agg(self, agg: str) -> int:
        if agg not in _AGGS:
            raise ValueError(f"agg must be one of {_AGGS}, got {agg!r}")
        return _AGGS.index(agg)

    def values(self, agg: str = "last", start: int = 0) -> np.ndarray:
        """float32 ``[K - start, R, F]`` copy of the kept slots from ``start`` on; agg "last" | "min" | "max"."""
        return self._v[self._agg(agg)][start : self._k, : len(self.rows)].copy()

    def scalar(self, name: str, agg: str = "last", start: int = 0) -> np.ndarray:
        """float32 ``[K - start]``: the per-step scalar ``name`` (one of :data:`SCALARS`)."""
        if name not in SCALAR_INDEX:
            raise KeyError(f"history: no scalar {name!r}; valid: {list(SCALARS)}")
        return self._s[self._agg(agg)][start : self._k, SCALAR_INDEX[name]].copy()

    def series(self, row: str, field: str, agg: str = "last") -> np.ndarray:
        """float32 ``[K]``: ``field`` of ``row`` at each kept slot (NaN before the row appeared)."""
        if row not in self._row_of:
            raise KeyError(f"history: no row {row!r}; rows: {self.rows[:20]}{' …' if len(self.rows) > 20 else ''}")
        if field not in FIELD_INDEX:
            raise KeyError(f"history: no field {field!r}; valid: {list(HISTORY_FIELDS)}")
        return self._v[self._agg(agg)][: self._k, self._row_of[row], FIELD_INDEX[field]].copy()

    def slot_of(self, step: int) -> int:
        """The kept slot whose last step is ``step``; KeyError naming the nearest kept steps."""
        idx = self._last[: self._k]
        j = int(np.searchsorted(idx, step))
        if j < self._k and idx[j] == step:
            return j
        near = sorted({int(idx[i]) for i in (j - 1, j) if 0 <= i < self._k})
        raise KeyError(f"step {step} is not a kept step; nearest kept: {near or 'none (empty history)'}")

    def at(self, step: int, agg: str = "last") -> dict[str, dict[str, float]]:
        """row → {field: value} at a kept step, for the rows with any value at that step."""
        j = self.slot_of(step)
        m = self._v[self._agg(agg)][j, : len(self.rows)]
        present = ~np.all(np.isnan(m), axis=1)
        return {self.rows[i]: dict(zip(HISTORY_FIELDS, m[i].tolist())) for i in np.flatnonzero(present)}

    def scalars_at(self, step: int, agg: str = "last") -> dict[str, float]:
        """name → value of the per-step scalars at a kept step."""
        return dict(zip(SCALARS, self._s[self._agg(agg)][self.slot_of(step)].tolist()))

    def changes_since(self, token: int) -> tuple[int, int]:
        """``(new token, first kept slot changed since token)``; the slot is 0 for token 0 and after a
        decimation or row growth (re-read everything), ``len(self)`` when nothing changed."""
        if token <= 0 or token < self._reorg:
            return self._version, 0
        changed = np.flatnonzero(self._ver[: self._k] > token)
        return self._version, int(changed[0]) if changed.size else self._k

    @property
    def notes(self) -> list[str]:
        """What the budget cost (empty while every appended step is kept on its own)."""
        if not self.decimated:
            return []
        if self.max_slots() == 1:
            return [f"history: the budget of {format_bytes(self.max_bytes)} is smaller than one step of "
                    f"{len(self.rows)} rows; kept only the last step (step {self.steps}) and each value's "
                    f"min/max over the {self.appended} steps (raise max_bytes to keep more)"]
        return [f"history: {self.appended:,} steps kept as {self._k} points of up to {self._stride} steps each to stay "
                f"within {format_bytes(self.max_bytes)}; each point shows its last step, agg='min'/'max' its extremes"]

    def __repr__(self) -> str:
        return (f"History({len(self.rows)} rows, {self.appended} steps in {self._k} slots, "
                f"{format_bytes(self.nbytes)} of {format_bytes(self.max_bytes)})")
