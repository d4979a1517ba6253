"""Checklist widget of :func:`nbdebug.doctor`: one row per check with its status, evidence and advice,
and the overfit loss curve.

Synced state is small: the checks as plain JSON (numbers, short strings, lists of at most
:data:`MAX_LIST` items; NaN/Inf as strings, which JSON cannot carry) and the overfit curve as one
float32 buffer. Clicking a row sets ``selected`` (synced back to Python).

>>> w = DoctorWidget(report)          # doctest: +SKIP
>>> w.selected                        # doctest: +SKIP
'overfit_batch'
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import traitlets

from ..inspectors.doctor import DoctorReport, shown_evidence
from ._base import NBWidget

__all__ = ["DoctorWidget"]

#: evidence lists longer than this are cut (the widget says how many were left out)
MAX_LIST = 12


def _plain(v: Any) -> Any:
    """A JSON-safe evidence value: finite numbers, strings, bools, short lists; NaN/Inf as text."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else ("NaN" if math.isnan(f) else ("inf" if f > 0 else "-inf"))
    if isinstance(v, (list, tuple)):
        items = [_plain(x) for x in v[:MAX_LIST]]
        return items + ([f"… {len(v) - MAX_LIST} more"] if len(v) > MAX_LIST else [])
    return str(v)


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


class DoctorWidget(NBWidget):
    """The doctor's checklist.

    Traits: ``checks`` (``[{"name", "status", "advice", "evidence": [[key, value], ...]}]`` in
    checklist order; the browser lists the failed ones first; evidence as shown, without internal
    placeholders: :func:`~nbdebug.inspectors.doctor.shown_evidence`), ``curve`` (float32 bytes: the overfit loss per step), ``curve_target`` (the
    "near zero" line), ``curve_floor`` (the double-softmax floor, NaN when it does not apply),
    ``kind``, ``classes``, ``elapsed_s``, ``notes``, and ``selected`` (the clicked check's name,
    synced back from the browser).
    """

    _view_name_ = "doctor"

    checks = traitlets.List().tag(sync=True)
    curve = traitlets.Bytes(b"").tag(sync=True)
    curve_target = traitlets.Float(math.nan, allow_none=True).tag(sync=True)
    curve_floor = traitlets.Float(math.nan, allow_none=True).tag(sync=True)
    kind = traitlets.Unicode("").tag(sync=True)
    classes = traitlets.Int(0).tag(sync=True)
    elapsed_s = traitlets.Float(0.0).tag(sync=True)
    notes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    #: the check the user clicked ("" for none)
    selected = traitlets.Unicode("").tag(sync=True)

    def __init__(self, report: DoctorReport, **kwargs: Any) -> None:
        checks = []
        for name, c in report.checks.items():
            ev = [[k, _plain(v)] for k, v in shown_evidence(c)]
            checks.append({"name": name, "status": c.status, "advice": c.advice, "evidence": ev})
        over = report.checks.get("overfit_batch")
        curve = np.asarray(over.evidence.get("curve", []) if over else [], dtype=np.float32)
        target = _num(over.evidence.get("target")) if over else math.nan
        floor = _num(over.evidence.get("softmax_floor")) if over else math.nan
        super().__init__(checks=checks, curve=curve.tobytes(), curve_target=None if math.isnan(target) else target,
                         curve_floor=None if math.isnan(floor) else floor, kind=report.kind,
                         classes=report.classes or 0, elapsed_s=float(report.elapsed_s), notes=list(report.notes),
                         headline=report.headline, **kwargs)
        self._report = report

    @property
    def report(self) -> DoctorReport:
        """The report this widget shows."""
        return self._report

    def fallback_html(self) -> str:
        """Static snapshot: the checklist table and the overfit curve as an inline SVG polyline."""
        body = self._report._repr_html_()
        curve = np.frombuffer(self.curve, dtype=np.float32)
        finite = curve[np.isfinite(curve)]
        if finite.size < 2:
            return body
        w, h = 240, 60
        hi = float(finite.max()) or 1.0
        xs = np.linspace(0, w, curve.size)
        pts = " ".join(f"{x:.1f},{h - max(min(v / hi, 1.0), 0.0) * h:.1f}" for x, v in zip(xs, curve, strict=True) if math.isfinite(v))
        svg = (f"<svg width='{w}' height='{h}' viewBox='0 0 {w} {h}' role='img' aria-label='overfit loss curve'>"
               f"<polyline fill='none' stroke='#1976d2' stroke-width='1.5' points='{pts}'/></svg>")
        cut = body.rfind("</div>")
        return body[:cut] + f"<p>overfit_batch loss per step (0–{html.escape(f'{hi:.3g}')}):</p>{svg}" + body[cut:]

    def __repr__(self) -> str:
        failed = [c["name"] for c in self.checks if c["status"] == "fail"]
        return f"DoctorWidget(checks={len(self.checks)}, failed={failed})"
