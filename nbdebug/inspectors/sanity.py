"""The model-randomisation sanity check of saliency maps (Adebayo et al. 2018, "Sanity Checks for
Saliency Maps"): pure parts.

A map that explains the model's decision must change when the layers that make the decision are
re-initialised. :func:`spearman` compares the map with the map of a copy whose layers after the CAM
layer were re-initialised; :func:`cascade_steps` groups those layers from the output down (one
more each step, at most ``steps`` steps); :class:`SanityReport` holds ρ per method and step, and
flags the methods whose map barely changed (ρ ≥ :data:`THRESHOLD`): their map "does not depend on
the class decision". The re-initialised copy and its passes are :mod:`nbdebug.cams.checks`'.

>>> round(spearman([1, 2, 3, 4], [10, 20, 30, 40]), 3), round(spearman([1, 2, 3, 4], [4, 3, 2, 1]), 3)
(1.0, -1.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["THRESHOLD", "SanityReport", "cascade_steps", "ranks", "spearman"]

#: ρ at or above which a map is flagged: re-initialising the decision layers barely changed it
THRESHOLD = 0.9


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks of ``x`` (flattened), ties sharing their average rank (0-based)."""
    v = np.asarray(x, dtype=np.float64).reshape(-1)
    _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    start = np.cumsum(counts) - counts
    return (start + (counts - 1) / 2.0)[inverse]


def spearman(a: np.ndarray | Sequence[float], b: np.ndarray | Sequence[float]) -> float:
    """Spearman's rank correlation of two maps (flattened; ties get average ranks). NaN when either
    map is constant (no order to compare), 1.0 when both are the same constant."""
    x, y = np.asarray(a, dtype=np.float64).reshape(-1), np.asarray(b, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"maps of different sizes: {x.shape} and {y.shape}")
    rx, ry = ranks(x), ranks(y)
    dx, dy = rx - rx.mean(), ry - ry.mean()
    den = float(np.sqrt((dx * dx).sum() * (dy * dy).sum()))
    if den == 0:
        return 1.0 if np.array_equal(x, y) else float("nan")
    return float((dx * dy).sum() / den)


def cascade_steps(layers_after: Sequence[str], steps: int = 12) -> list[list[str]]:
    """The layers after the CAM layer (in call order) regrouped from the output down: one layer per
    step, or ``steps`` contiguous groups when there are more layers than that."""
    down = list(layers_after)[::-1]
    if len(down) <= steps:
        return [[name] for name in down]
    return [list(part) for part in np.array_split(np.asarray(down, dtype=object), steps) if len(part)]


@dataclass
class SanityReport:
    """``rho[method]``: Spearman ρ with every layer after ``layer`` re-initialised; ``cascade[method]``:
    ``[(deepest layer re-initialised so far, ρ)]`` from the output down; ``layers``: the layers
    re-initialised (call order); ``flagged``: methods with ρ ≥ ``threshold``; ``notes``: why
    something could not be checked."""

    layer: str
    rho: dict[str, float] = field(default_factory=dict)
    cascade: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    layers: list[str] = field(default_factory=list)
    threshold: float = THRESHOLD
    notes: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> list[str]:
        """Methods whose map barely changed: it does not depend on the class decision."""
        return [m for m, r in self.rho.items() if not np.isnan(r) and r >= self.threshold]
