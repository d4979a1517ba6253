"""The rows of a :class:`~nbdebug.capture.session.Capture`: one :class:`Row` per recorded tensor leaf
name (``relu``, ``relu#2``, ``block.0[1]``), merged over its calls in every step, held in a
:class:`RowTable` (rows in first-seen order, by name, and each module's first row, where its
parameter and optimizer numbers go).

The forward hooks add rows (:meth:`RowTable.new`); the step close folds into them; the result at exit
reads them. A row's ``units`` (dim 1 of its output) is set once, through :meth:`RowTable.set_units`,
which moves the table's ``epoch``: step layouts cached before it list the unit rows without it.
"""

from __future__ import annotations

import numpy as np
import torch

from .stats import SATURATING

__all__ = ["Row", "RowTable"]


class Row:
    """One row of the whole run (merged over its calls in every step)."""

    __slots__ = (
        "alive",
        "calls",
        "dtype",
        "ext_nonfinite",
        "first_step",
        "grad",
        "hid",
        "hist",
        "id",
        "inputs",
        "key",
        "module",
        "raw",
        "sample",
        "sample_tried",
        "sat",
        "shape",
        "type",
        "units",
    )

    def __init__(self, rid: int, key: str, module: str, type_: str, shape: tuple[int, ...], dtype: str) -> None:
        self.id, self.key, self.module, self.type, self.shape, self.dtype = rid, key, module, type_, shape, dtype
        self.calls = 0
        self.raw: np.ndarray | None = None  # merged raw stats (host), filled at exit
        self.grad: np.ndarray | None = None  # merged output-gradient raw stats (host), filled at exit
        self.sample: torch.Tensor | np.ndarray | None = None
        self.sample_tried = False
        self.hist: torch.Tensor | np.ndarray | None = None
        self.inputs: tuple[int, ...] | None = None  # row ids feeding its first folded call
        self.ext_nonfinite = False
        self.first_step = 0
        self.units = 0  # units per call (dim 1), 0 when not applicable
        self.alive: np.ndarray | None = None  # units non-zero in some call of the run (None: all, so far)
        self.sat = type_ in SATURATING
        self.hid = -1  # its History row id (assigned when first committed)


class RowTable:
    """Every row of a capture: ``rows`` (id order), ``by_key``, ``first_of`` (module → its first row)
    and ``epoch`` (moves when a row learns its number of units)."""

    __slots__ = ("by_key", "epoch", "first_of", "rows")

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.by_key: dict[str, Row] = {}
        self.first_of: dict[str, Row] = {}
        self.epoch = 0

    def new(self, key: str, module: str, type_: str, t: torch.Tensor) -> Row:
        """A new row for leaf ``key`` of ``module``'s call, shaped like ``t``."""
        row = Row(len(self.rows), key, module, type_, tuple(t.shape), str(t.dtype).replace("torch.", ""))
        self.rows.append(row)
        self.by_key[key] = row
        self.first_of.setdefault(module, row)
        return row

    def set_units(self, row: Row, units: int) -> None:
        """``row`` has ``units`` units (dim 1 of its output): step layouts built before list it again."""
        row.units = units
        self.epoch += 1

    def clear(self) -> None:
        """Forget every row (the result is then built from nothing: see ``Capture.__exit__``)."""
        self.rows, self.by_key, self.first_of = [], {}, {}
        self.epoch += 1
