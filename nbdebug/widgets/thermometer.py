"""The layer thermometer widget: one row per captured layer, histograms fetched on click.

>>> w = ThermometerWidget.from_capture(cap.result)       # doctest: +SKIP
>>> w.selected = "features.1"                            # doctest: +SKIP  (highlights the row)

Synced up front: names, types, shapes, flags and diagnoses (small JSON) and the stats table as one
float32 binary buffer. Histograms cross only when a row is clicked (``histogram`` request).
"""

from __future__ import annotations

import dataclasses
import html
import math
from typing import Any

import numpy as np
import traitlets

from ..capture.session import CaptureResult
from ..inspectors.thermometer import COLUMNS, LEGEND, ThermometerReport, Thresholds, diagnose
from ._base import NBWidget, rpc
from ._transport import encode_array

__all__ = ["ThermometerWidget"]


class ThermometerWidget(NBWidget):
    """Per-layer activation and gradient health.

    Traits: ``layers`` (rows: name, module, type, shape, dtype, flags, calls), ``columns`` and
    ``stats`` (binary float32 [rows, columns]), ``diagnoses``, ``legend``, ``summary``, ``notes``,
    ``has_grads``, ``raised`` (the module that raised and what does not fit), ``steps``,
    ``first_nonfinite_step``; UI state synced both ways: ``selected``, ``flagged_only``, ``sort_by``,
    ``sort_desc``. ``report`` and ``capture`` keep the Python-side data.
    """

    _view_name_ = "thermometer"

    layers = traitlets.List().tag(sync=True)
    columns = traitlets.List(traitlets.Unicode()).tag(sync=True)
    stats = traitlets.Dict().tag(sync=True)
    diagnoses = traitlets.List().tag(sync=True)
    legend = traitlets.Dict().tag(sync=True)
    summary = traitlets.Unicode("").tag(sync=True)
    notes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    has_grads = traitlets.Bool(False).tag(sync=True)
    #: the cell raised inside the model: ``{module, type, error, problems, inputs, params}`` (else {})
    raised = traitlets.Dict().tag(sync=True)
    #: calls of the model's forward in the cell, and the 1-based step of the first NaN/Inf (0: none)
    steps = traitlets.Int(1).tag(sync=True)
    first_nonfinite_step = traitlets.Int(0).tag(sync=True)
    #: name of the selected row ("" for none); set from Python to highlight a row
    selected = traitlets.Unicode("").tag(sync=True)
    flagged_only = traitlets.Bool(False).tag(sync=True)
    sort_by = traitlets.Unicode("").tag(sync=True)
    sort_desc = traitlets.Bool(True).tag(sync=True)

    def __init__(self, report: ThermometerReport, capture: CaptureResult | None = None, **kwargs: Any) -> None:
        self.report = report
        self.capture = capture
        super().__init__(
            layers=[
                {"name": n, "module": m, "type": t, "shape": list(s), "dtype": d, "flags": f, "calls": c}
                for n, m, t, s, d, f, c in zip(report.names, report.modules, report.types, report.shapes,
                                               report.dtypes, report.flags, report.calls)
            ],
            columns=list(COLUMNS),
            stats=encode_array(report.table.astype(np.float32).reshape(len(report.names), len(COLUMNS))),
            diagnoses=[dataclasses.asdict(d) for d in report.diagnoses],
            legend=LEGEND,
            summary=report.summary,
            notes=report.notes,
            has_grads=bool(capture.backward_ran) if capture is not None else bool(np.isfinite(report.column("grad_norm")).any()),
            raised=_raised_trait(report),
            steps=report.steps,
            first_nonfinite_step=report.first_nonfinite_step or 0,
            **kwargs,
        )

    @classmethod
    def from_capture(cls, result: CaptureResult, thresholds: Thresholds | None = None) -> ThermometerWidget:
        return cls(diagnose(result, thresholds), result)

    @traitlets.validate("selected")
    def _check_selected(self, proposal: Any) -> str:
        value = proposal["value"]
        if value and value not in self.report.names:
            raise traitlets.TraitError(f"no row named {value!r}")
        return value

    # -- on-demand data ---------------------------------------------------------------------
    @rpc("histogram")
    def _histogram(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        row = int(params["row"])
        if self.capture is None or not 0 <= row < len(self.capture.layers):
            raise IndexError(f"row {row} out of range")
        rec = self.capture.layers[row]
        bins = 32
        if rec.histogram is not None:
            counts, edges = rec.histogram
            return self._hist_answer(rec, counts, edges, exact=True, sampled=int(rec.stats["numel"]))
        if rec.sample is None:
            raise ValueError(
                f"no values kept for `{rec.name}` (byte budget reached): re-run with a larger max_bytes"
            )
        fin = rec.sample[np.isfinite(rec.sample)].astype(np.float64)
        lo, hi = rec.stats["min"], rec.stats["max"]
        if not (math.isfinite(lo) and math.isfinite(hi)):
            lo, hi = (float(fin.min()), float(fin.max())) if fin.size else (0.0, 1.0)
        if hi <= lo:
            hi = lo + 1.0
        counts, edges = np.histogram(fin, bins=bins, range=(lo, hi))
        exact = rec.sample.size >= rec.stats["numel"]
        return self._hist_answer(rec, counts, edges, exact=exact, sampled=int(rec.sample.size))

    @staticmethod
    def _hist_answer(rec: Any, counts: np.ndarray, edges: np.ndarray, *, exact: bool, sampled: int) -> tuple[dict[str, Any], dict[str, Any]]:
        result = {
            "name": rec.name,
            "min": float(edges[0]),
            "max": float(edges[-1]),
            "total": int(rec.stats["numel"]),
            "sampled": sampled,
            "exact": bool(exact),
        }
        return result, {"counts": np.asarray(counts, dtype=np.float32), "edges": np.asarray(edges, dtype=np.float32)}

    # -- static fallback and repr -------------------------------------------------------------
    def fallback_html(self) -> str:
        """A plain table (no scripts) shown where widgets cannot render (nbviewer, GitHub, HTML export)."""
        r = self.report
        cols = ["mean", "std", "min", "max", "zero_frac", "nan", "inf", "grad_norm"]
        idx = [COLUMNS.index(c) for c in cols]
        head = "".join(f"<th>{c}</th>" for c in ["#", "layer", "type", "shape", *cols, "flags"])
        body = []
        for i, name in enumerate(r.names):
            shape = "×".join(map(str, r.shapes[i]))
            if not r.dtypes[i].startswith(("float", "bfloat", "complex")):  # masks, indices: counts
                shape += f" {r.dtypes[i]}"
            cells = [str(i), html.escape(name), html.escape(r.types[i]), html.escape(shape)]
            cells += [_fmt(r.table[i, j]) for j in idx]
            cells.append(html.escape(", ".join(r.flags[i])))
            style = ' style="background:#fdecea"' if r.flags[i] else ""
            body.append(f"<tr{style}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        diags = "".join(
            f"<li><b>{html.escape(d.code)}</b>: {html.escape(d.message)} <i>{html.escape(d.suggestion)}</i></li>"
            for d in r.diagnoses
        )
        return (
            f'<div class="nbdebug-thermometer-static"><p><b>nbdebug thermometer</b>: {html.escape(r.summary)}</p>'
            f"{_error_html(r)}<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
            f"<ul>{diags}</ul></div>"
        )

    def export_requests(self) -> list[tuple[str, dict[str, Any]]]:
        """The histogram of every row (what a click on the row asks for)."""
        return [("histogram", {"row": i}) for i in range(len(self.report.names))]

    def __repr__(self) -> str:
        return f"ThermometerWidget({self.report.summary})"


def _raised_trait(report: ThermometerReport) -> dict[str, Any]:
    e = report.error
    if e is None:
        return {}
    return {"module": e.module, "type": e.type, "error": e.error, "problems": list(e.problems),
            "inputs": list(e.inputs), "params": list(e.params), "suggestion": e.suggestion}


def _error_html(report: ThermometerReport) -> str:
    """The card naming the module that raised (escaped text only)."""
    e = report.error
    if e is None:
        return ""
    esc = html.escape
    items = "".join(f"<li>{esc(p)}</li>" for p in e.problems)
    return (
        '<div class="nbd-raised" style="border:1px solid #b30000;padding:4px 8px;margin:4px 0">'
        f"<p><b>raised in <code>{esc(e.module)}</code> ({esc(e.type)})</b>: {esc(e.error)}</p>"
        f"<ul>{items}</ul>"
        f"<p>inputs: {esc('; '.join(e.inputs) or 'none')}<br>parameters: {esc('; '.join(e.params) or 'none')}</p></div>"
    )


def _fmt(x: float) -> str:
    if x != x:
        return "—"
    if x == 0 or 1e-3 <= abs(x) < 1e4:
        return f"{x:.4g}"
    return f"{x:.3e}"
