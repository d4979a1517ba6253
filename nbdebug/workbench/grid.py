"""The result of :func:`nbdebug.patch`: a grid of effects, plain data (numpy and Python values).

``effect[r, c] = (m - m_corrupt) / (m_clean - m_corrupt)``: 1 means the patch fully restores the
clean answer, 0 means it does nothing (TransformerLens' and ROME's normalisation, for both
directions). A cell whose clean and corrupt activations are exactly equal is not run: patching it
changes nothing, so ``raw`` holds the base run's metric there and ``effect`` is exactly 0 denoising
(1 noising: the clean answer is left as it is), as a per-patch loop (TransformerLens, pyvene) gives;
``identical`` is True there (the view marks those cells, ``top`` leaves them out). NaN only where a
cell was not computed at all.

>>> g.effect.shape, g.rows[0], g.columns[:3]            # doctest: +SKIP
((30, 9), 'model.layers.0', ['The', ' Eiff', 'el'])
>>> g.top(3)                                          # [(row, column, effect), ...] by |effect|
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .sites import Site

__all__ = ["GridOnly", "PatchGrid"]


@dataclass
class PatchGrid:
    """A patching grid (see the module docstring).

    ``rows``: site names (module names; ``name:h<k>`` for a head when heads are rows) and
    ``row_sites`` the :class:`~nbdebug.workbench.sites.Site` behind each; ``columns``: token labels
    (``positions[c]`` the positions patched in column ``c``), head labels ``h<k>`` for heads with
    ``positions="all"``, or ``"all"``. ``raw``: the metric of each patched run (an attribution
    estimate for ``method="attribution"``). ``verified``: ``{(row index, column index): exact
    effect}`` of the cells re-measured exactly (``verify=k``). ``estimate`` (attribution): True.
    """

    effect: np.ndarray
    raw: np.ndarray
    metric_clean: float
    metric_corrupt: float
    rows: list[str]
    columns: list[str]
    sites: str
    method: str
    direction: str
    identical: np.ndarray
    row_sites: list[Site]
    positions: list[tuple[int, ...]]
    tokens_clean: list[str]
    tokens_corrupt: list[str]
    metric: str
    verified: dict[tuple[int, int], float] = field(default_factory=dict)
    seconds: float = 0.0
    patches: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.rows), len(self.columns))

    @property
    def estimate(self) -> bool:
        """Whether ``effect`` is a gradient estimate (attribution) rather than measured."""
        return self.method == "attribution"

    @property
    def layers(self) -> list[int]:
        return [s.layer for s in self.row_sites]

    @property
    def heads(self) -> list[int | None]:
        return [s.head for s in self.row_sites]

    def top(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The ``k`` cells of largest ``|effect|`` (identical cells excluded), as ``(row, column, effect)``."""
        return [(self.rows[r], self.columns[c], float(self.effect[r, c])) for r, c in self.top_cells(k)]

    def top_cells(self, k: int = 10) -> list[tuple[int, int]]:
        """Indices ``(row, column)`` of the ``k`` cells of largest ``|effect|`` (finite ones only)."""
        flat = np.abs(np.nan_to_num(self.effect, nan=-1.0)).ravel()
        finite = (np.isfinite(self.effect) & ~np.asarray(self.identical, dtype=bool)).ravel()
        order = [i for i in np.argsort(-flat, kind="stable") if finite[i]][: max(int(k), 0)]
        n = len(self.columns)
        return [(int(i) // n, int(i) % n) for i in order]

    def show(self) -> Any:
        """The patching view of this grid (``PatchingWidget``; its cell clicks need the model: the
        ``%%nndebug --view patching`` magic or a ``PatchSession`` re-runs them)."""
        # by import path, as views.py loads recorders: the widget module imports this one
        widget = importlib.import_module("nbdebug.widgets.patching").PatchingWidget
        return widget(GridOnly(self), sites=self.sites, method=self.method)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a view (numpy arrays as nested lists are avoided: arrays stay arrays)."""
        return {
            "effect": self.effect, "raw": self.raw, "identical": self.identical, "rows": list(self.rows),
            "columns": list(self.columns), "sites": self.sites, "method": self.method, "direction": self.direction,
            "metric_clean": self.metric_clean, "metric_corrupt": self.metric_corrupt, "metric": self.metric,
            "layers": self.layers, "heads": self.heads, "positions": [list(p) for p in self.positions],
            "tokens_clean": list(self.tokens_clean), "tokens_corrupt": list(self.tokens_corrupt),
            "verified": [[r, c, v] for (r, c), v in self.verified.items()], "notes": list(self.notes),
        }

    def __repr__(self) -> str:
        r, c = self.shape
        best = self.top(1)
        top = f", top {best[0][0]} @ {best[0][1]!r} = {best[0][2]:.3f}" if best else ""
        return (f"PatchGrid({self.sites}, {self.method}, {self.direction}: {r} x {c}, "
                f"{self.metric} clean {self.metric_clean:.3f} corrupt {self.metric_corrupt:.3f}{top})")


class GridOnly:
    """What the patching view reads from a session, from one :class:`PatchGrid` alone: that grid, its
    metric and tokens; no top tokens, and no other grid or cell (there is no model to run them)."""

    def __init__(self, grid: PatchGrid) -> None:
        self.only = grid
        self.metric_label, self.metric_clean, self.metric_corrupt = grid.metric, grid.metric_clean, grid.metric_corrupt
        self.tokens_clean, self.tokens_corrupt = list(grid.tokens_clean), list(grid.tokens_corrupt)
        self.top_clean: list[dict[str, Any]] = []
        self.top_corrupt: list[dict[str, Any]] = []

    def grid(self, sites: str, method: str) -> PatchGrid:
        if (sites, method) != (self.only.sites, self.only.method):
            raise ValueError(f"only the {self.only.sites} grid ({self.only.method}) was computed: call nbdebug.patch("
                             f"..., sites={sites!r}, method={method!r}) or use %%nndebug --view patching")
        return self.only

    def cell(self, sites: str, method: str, row: int, col: int) -> dict[str, Any]:
        raise ValueError("a grid shown from nbdebug.patch(...) has no model to re-run a cell: use %%nndebug --view patching")
