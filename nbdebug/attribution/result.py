"""The result of :func:`nbdebug.attribute`: one score per input token and how far to trust it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["CONVERGED_FRACTION", "Attribution"]

#: integrated gradients is "converged" when |delta| ≤ this fraction of |m(x) − m(baseline)|
CONVERGED_FRACTION = 0.05


@dataclass
class Attribution:
    """Token attribution of ``metric`` (``m(x)``, labelled ``label``) to each input token.

    ``scores`` ``(T,)`` (positive: the token pushes the answer over the wrong one), ``tokens`` their
    text, ``ids`` their ids, ``method``. For integrated gradients ``metric_baseline`` (``m(baseline)``),
    ``delta`` = Σ scores − (m(x) − m(baseline)) (the completeness gap), ``converged`` (|delta| ≤ 5 % of
    |m(x) − m(baseline)|) and ``steps``. ``faithfulness`` ``{"deletion": AUC, "random": AUC}`` and
    ``curves`` (``"deletion"``, ``"random"``: the normalised metric after ``k`` tokens replaced by the
    baseline, ``k = 0..T``) when computed. ``notes``: what the numbers need to be read with.
    """

    scores: np.ndarray
    tokens: list[str]
    ids: list[int]
    method: str
    metric: float
    label: str
    metric_baseline: float | None = None
    delta: float | None = None
    converged: bool | None = None
    steps: int | None = None
    baseline: str = "zero"
    faithfulness: dict[str, float] = field(default_factory=dict)
    curves: dict[str, np.ndarray] = field(default_factory=dict)
    random_curves: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def relative_delta(self) -> float | None:
        """``|delta| / |m(x) − m(baseline)|`` (None without integrated gradients)."""
        if self.delta is None or self.metric_baseline is None:
            return None
        span = abs(self.metric - self.metric_baseline)
        return abs(self.delta) / span if span > 0 else float("inf")

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` tokens with the largest scores, ``(token, score)``, highest first."""
        order = np.argsort(-self.scores, kind="stable")[:k]
        return [(self.tokens[i], float(self.scores[i])) for i in order]

    def show(self) -> Any:
        """The attribution view of this result (``AttributionWidget``: this method only; the other
        methods need the model, as in ``%%nndebug --view attribution``)."""
        # by import path, as views.py loads recorders: the widget module imports this one
        return importlib.import_module("nbdebug.widgets.attribution").AttributionWidget(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (what the attribution view draws)."""
        return {
            "method": self.method, "label": self.label, "tokens": list(self.tokens), "ids": list(self.ids),
            "scores": [float(s) for s in self.scores], "metric": self.metric,
            "metric_baseline": self.metric_baseline, "delta": self.delta, "converged": self.converged,
            "relative_delta": self.relative_delta, "steps": self.steps, "baseline": self.baseline,
            "faithfulness": dict(self.faithfulness),
            "curves": {k: [float(x) for x in v] for k, v in self.curves.items()}, "notes": list(self.notes),
        }

    def __repr__(self) -> str:
        parts = [f"Attribution({self.method}, {self.label} = {self.metric:.4g}", f"{len(self.tokens)} tokens"]
        if self.delta is not None:
            rel = self.relative_delta
            parts.append(f"delta {self.delta:+.4g} ({rel:.1%} of m(x) − m(baseline)"
                         f"{', converged' if self.converged else ', NOT converged: more steps or fix_first=True'})")
        if self.faithfulness:
            parts.append("deletion AUC {deletion:.3f} vs random {random:.3f}".format(**self.faithfulness))
        top = ", ".join(f"{t!r} {s:+.3g}" for t, s in self.top(3))
        return "; ".join(parts) + f"; top: {top})"
