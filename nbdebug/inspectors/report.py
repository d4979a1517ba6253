"""What the thermometer shows, as plain data: :class:`ThermometerReport` (a stats table, flags and
:class:`Diagnosis` findings per row), its :data:`COLUMNS` and the flags' :data:`LEGEND`.

Built by :func:`~nbdebug.inspectors.thermometer.diagnose` (the whole run) and
:func:`~nbdebug.inspectors.steps.diagnose_at` (one kept step); read by the widgets. Pure data: no
torch, no Jupyter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ErrorReport
from .events import Event

__all__ = ["COLUMNS", "LEGEND", "UPDATE_SPLIT", "Diagnosis", "ThermometerReport", "display_flags"]


@dataclass(frozen=True)
class Diagnosis:
    """A finding at one step (or over the merged run): ``layer`` is a row name, "" for model-wide."""

    code: str
    severity: str  # "error" | "warning" | "info"
    layer: str
    message: str
    suggestion: str


#: the columns of :attr:`ThermometerReport.table`, in order
COLUMNS = (
    "mean", "std", "min", "max", "zero_frac", "near_zero_frac", "nan", "inf", "numel",
    "grad_norm", "grad_mean", "grad_std", "grad_min", "grad_max", "grad_nan", "grad_inf",
    "param_grad_norm", "dead_unit_frac", "update_ratio",
)

#: per flag code: its label, colour and what it means (the widgets' legend)
LEGEND: dict[str, dict[str, str]] = {
    "raised": {"label": "raised", "color": "#7f0000", "description": "the cell raised inside the model (see the card above the table)"},
    "nan_origin_fwd": {"label": "NaN/Inf origin (forward)", "color": "#b30000", "description": "first layer whose output is non-finite while its inputs were finite"},
    "nan_origin_bwd": {"label": "NaN/Inf origin (backward)", "color": "#e6550d", "description": "the gradient first became non-finite in this layer's backward"},
    "nonfinite": {"label": "non-finite", "color": "#fc9272", "description": "output or gradient contains NaN/Inf (inherited)"},
    "dead": {"label": "dead", "color": "#756bb1", "description": "almost all outputs exactly zero"},
    "saturated": {"label": "saturated", "color": "#3182bd", "description": "bounded activation stuck at its bounds"},
    "exploding": {"label": "exploding grad", "color": "#d62728", "description": "gradient norm above the exploding threshold"},
    "vanishing": {"label": "vanishing grad", "color": "#969696", "description": "gradient norm below the vanishing threshold"},
    "dead_units": {"label": "dead units", "color": "#9e9ac8", "description": "many units (channels / features) zero for every sample of the step"},
    "update_ratio": {"label": "update ratio out of range", "color": "#ff7f0e", "description": "update/parameter ratio ‖Δθ‖/‖θ‖ outside [1e-4, 1e-2] (healthy ~1e-3)"},
    # how the views show an "update_ratio" flag: too high or too low, from the row's ratio (two fixes, two chips)
    "update_high": {"label": "update high", "color": "#ff7f0e", "description": "update/parameter ratio ‖Δθ‖/‖θ‖ above 1e-2 (rule of thumb ~1e-3): harmful only with harm after it, which the header names"},
    "update_low": {"label": "update too low", "color": "#8c6d31", "description": "update/parameter ratio ‖Δθ‖/‖θ‖ below 1e-4 (healthy ~1e-3): the layer barely learns"},
}

#: the display code of an "update_ratio" flag at ratio ``x``: above the healthy range's geometric middle (1e-3) too high
UPDATE_SPLIT = 1e-3


def display_flags(flags: list[str], update_ratio: float) -> list[str]:
    """``flags`` as the views show them: "update_ratio" becomes "update_high" or "update_low" from the
    row's ratio (kept when the ratio is unknown)."""
    if "update_ratio" not in flags or not update_ratio == update_ratio:
        return list(flags)
    code = "update_high" if update_ratio > UPDATE_SPLIT else "update_low"
    return [code if f == "update_ratio" else f for f in flags]


@dataclass
class ThermometerReport:
    """Rows in execution order with their stats table, flags and the diagnoses."""

    names: list[str]
    modules: list[str]
    types: list[str]
    shapes: list[tuple[int, ...]]
    dtypes: list[str]
    calls: list[int]
    table: np.ndarray  # float64 [rows, len(COLUMNS)], NaN where missing
    flags: list[list[str]]
    diagnoses: list[Diagnosis]
    summary: str
    notes: list[str] = field(default_factory=list)
    grad_ratio: float | None = None  # first / last layer gradient norm
    steps: int = 1  # calls of the model's forward in the cell
    first_nonfinite_step: int | None = None  # 1-based step where the first NaN/Inf appeared
    error: ErrorReport | None = None  # the cell raised inside the model: where, and what does not fit
    step: int | None = None  # the step the table and flags are at (None: merged over the whole run)
    events: list[Event] = field(default_factory=list)  # rows that changed state over the kept steps
    step_index: np.ndarray | None = None  # int64 [K]: the kept steps (None without a history)
    history_flags: np.ndarray | None = None  # uint16 [K, rows] FLAG_BITS of every row at every kept step
    findings: list[Any] = field(default_factory=list)  # inspectors.findings.Finding, ranked: the root cause first
    headline: str = ""  # the header: the top finding (→ what followed from it); the summary when none

    def column(self, name: str) -> np.ndarray:
        """The table's column ``name`` (one of :data:`COLUMNS`), one value per row."""
        return self.table[:, COLUMNS.index(name)]

    def flagged(self, code: str) -> list[str]:
        """The names of the rows flagged ``code``."""
        return [n for n, f in zip(self.names, self.flags) if code in f]
