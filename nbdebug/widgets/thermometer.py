"""The layer thermometer widget: one row per captured layer, histograms fetched on click, and the
per-step history of a training loop (step slider, sparklines, loss curve, incidents, events).

>>> w = ThermometerWidget.from_capture(cap.result)       # doctest: +SKIP
>>> w.selected = "features.1"                            # doctest: +SKIP  (highlights the row)
>>> w.step = 41                                          # doctest: +SKIP  (the table at step 41; 0: last, -1: whole run)

Synced up front: names, types, shapes, flags and diagnoses (small JSON) and the stats table as one
float32 binary buffer. Histograms cross only when a row is clicked (``histogram`` request).

The per-step history (the ``history`` trait and the live ``history`` messages of
:meth:`ThermometerWidget.push_history`) and the histogram answers are built in
:mod:`nbdebug.widgets.thermometer_data` (their wire layout is in its docstring); this module keeps the
widget, its live feed and its static fallback, and re-exports :data:`WIRE_FIELDS`, :data:`TRAIT_BYTES`,
:data:`LIVE_BYTES` and :func:`histogram_answer` from there.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Sequence
from typing import Any

import numpy as np
import traitlets

from ..capture.history import History
from ..capture.result import CaptureResult
from ..inspectors.groups import groups_live, groups_view
from ..inspectors.thermometer import COLUMNS, LEGEND, ThermometerReport, Thresholds, diagnose
from ._base import NBWidget, rpc
from ._transport import encode_array, pack_arrays
from .thermometer_data import (
    LIVE_BYTES,
    TRAIT_BYTES,
    WIRE_FIELDS,
    group_for,
    histogram_answer,
    history_payload,
    no_histogram_reason,
    report_flags_by_row,
    sent_slot_bytes,
)

__all__ = ["LIVE_BYTES", "TRAIT_BYTES", "WIRE_FIELDS", "ThermometerWidget", "histogram_answer"]


class ThermometerWidget(NBWidget):
    """Per-layer activation and gradient health.

    Traits: ``layers`` (rows: name, module, type, shape, dtype, flags, calls), ``columns`` and
    ``stats`` (binary float32 [rows, columns]), ``diagnoses``, ``legend``, ``summary``, ``notes``,
    ``has_grads``, ``raised`` (the module that raised and what does not fit), ``steps``,
    ``first_nonfinite_step``; UI state synced both ways: ``selected``, ``flagged_only``, ``sort_by``,
    ``sort_desc``, ``step`` (the step the table shows: 0 the last, -1 the whole run) and
    ``spark_stat`` (the statistic of the over-time column). Over time: ``history`` (layout in
    :mod:`~nbdebug.widgets.thermometer_data`), ``incidents``, ``events``, ``running`` (True while the
    cell runs); ``report_step`` (the step ``summary``/``notes``/``diagnoses`` describe) and
    ``run_texts`` (the whole run's): at other slider steps the browser says that step's header and
    flags itself; ``histogram_note`` (why no row has a histogram: a click then asks nothing). ``report`` and ``capture`` keep the Python-side data.
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
    #: the kept step the table shows: 0 follows the last step, -1 is the whole run (merged rows)
    step = traitlets.Int(0).tag(sync=True)
    spark_stat = traitlets.Unicode("mean").tag(sync=True)
    history = traitlets.Dict().tag(sync=True)
    incidents = traitlets.List().tag(sync=True)
    events = traitlets.List().tag(sync=True)
    running = traitlets.Bool(False).tag(sync=True)
    #: rows grouped by the module tree, repeated blocks collapsed (``inspectors.groups.groups_view``;
    #: {} below 100 rows or when nothing repeats; while the cell runs, ``groups_live``: the tree of the
    #: rows so far, values from the history in the browser) and the statistic of its strips ("": its default)
    groups = traitlets.Dict().tag(sync=True)
    group_stat = traitlets.Unicode("").tag(sync=True)
    #: the kept step ``summary``, ``notes`` and ``diagnoses`` describe (0: no history); at other slider
    #: steps the browser decides the header and diagnoses from that step's flags (step_texts.ts)
    report_step = traitlets.Int(0).tag(sync=True)
    #: ``{summary, notes, diagnoses}`` of the whole-run report (the slider's "whole run"; {} without history)
    run_texts = traitlets.Dict().tag(sync=True)
    #: why no row has a histogram ("": rows have one, fetched on click); set, a click sends no request
    histogram_note = traitlets.Unicode("").tag(sync=True)

    def __init__(self, report: ThermometerReport, capture: CaptureResult | None = None,
                 thresholds: Thresholds | None = None, **kwargs: Any) -> None:
        self.report = report
        self.capture = capture
        self.thresholds = thresholds
        self._feed = _Feed()
        super().__init__(**self.state_of(report, capture, thresholds), **kwargs)

    @staticmethod
    def state_of(report: ThermometerReport, capture: CaptureResult | None, thresholds: Thresholds | None) -> dict[str, Any]:
        """The traits showing ``report`` (and ``capture``'s history, downsampled for the traits): what a
        widget of them would hold (the run view sends them for another rank)."""
        run = report
        hist = getattr(capture, "history", None)
        timed = hist is not None and len(hist) >= 2 and report.step is not None
        if timed:  # the table's "whole run" choice: merged rows, decided on merged stats
            run = diagnose(capture, thresholds, step="run")
        state = dict(
            layers=[
                {"name": n, "module": m, "type": t, "shape": list(s), "dtype": d, "flags": f, "calls": c}
                for n, m, t, s, d, f, c in zip(run.names, run.modules, run.types, run.shapes,
                                               run.dtypes, run.flags, run.calls)
            ],
            columns=list(COLUMNS),
            stats=encode_array(run.table.astype(np.float32).reshape(len(run.names), len(COLUMNS))),
            diagnoses=[dataclasses.asdict(d) for d in report.diagnoses],
            legend=LEGEND,
            summary=report.summary,
            notes=list(report.notes),
            has_grads=bool(capture.backward_ran) if capture is not None else bool(np.isfinite(report.column("grad_norm")).any()),
            raised=_raised_trait(report),
            steps=report.steps,
            first_nonfinite_step=report.first_nonfinite_step or 0,
            events=[dataclasses.asdict(e) for e in report.events],
            incidents=[_incident(i) for i in getattr(capture, "incidents", None) or []],
            history={},
            report_step=int(report.step or 0) if timed else 0,
            run_texts={},
            histogram_note=no_histogram_reason(capture),
        )
        grouped = groups_view(report, getattr(capture, "layers", None), history=hist if timed else None)
        state["groups"] = {} if grouped is None else {**grouped[0], **{k: encode_array(v) for k, v in grouped[1].items()}}
        if timed:
            group = group_for(len(hist), len(hist.rows), hist.decimated, TRAIT_BYTES)
            flags = report_flags_by_row(report, hist)
            arrays, meta = history_payload(hist, 0, group, flags=flags, first_nonfinite=report.first_nonfinite_step or 0)
            state["history"] = {**meta, **{k: encode_array(v) for k, v in arrays.items()}}
            extra = [] if group == 1 else [
                f"the widget shows {len(arrays['steps'])} of the {len(hist)} kept steps (each the last of {group} kept "
                f"steps, with their min/max) to keep the notebook under {TRAIT_BYTES / 2**20:.1f} MB; "
                "result.series() and result.at() have every kept step"
            ]
            state["notes"] += extra
            state["run_texts"] = {"summary": run.summary, "notes": [*run.notes, *extra],
                                  "diagnoses": [dataclasses.asdict(d) for d in run.diagnoses]}
        return state

    @classmethod
    def waiting(cls, thresholds: Thresholds | None = None, summary: str = "running: waiting for the first step") -> ThermometerWidget:
        """An empty widget shown when the cell starts; :meth:`push_history` fills it live and
        :meth:`finish` gives it the final state."""
        empty = ThermometerReport(names=[], modules=[], types=[], shapes=[], dtypes=[], calls=[],
                                  table=np.zeros((0, len(COLUMNS))), flags=[], diagnoses=[], summary=summary)
        return cls(empty, None, thresholds, running=True)

    def finish(self, report: ThermometerReport, capture: CaptureResult | None) -> None:
        """The final state: every trait from ``report`` (one sync message), the live flag off."""
        self.report, self.capture = report, capture
        state = self.state_of(report, capture, self.thresholds)
        with self.hold_sync():
            for k, v in {**state, "running": False}.items():
                setattr(self, k, v)

    def push_history(self, history: History, *, incidents: Sequence[Any] = (), thresholds: Thresholds | None = None) -> bool:
        """Send the browser the history slots changed since the last push (a custom message with
        binary buffers); False when nothing changed. Decimation or more than :data:`LIVE_BYTES` in
        the browser: the whole, downsampled to :data:`TRAIT_BYTES`."""
        f = self._feed
        token, first = history.changes_since(f.token)
        k = len(history)
        incidents = [_incident(i) for i in incidents]
        if k == 0 or (f.token and first >= k and len(incidents) == f.incidents):
            return False
        reset = f.token == 0 or first == 0
        banded = history.decimated or f.group > 1
        if not reset and -(-k // f.group) * sent_slot_bytes(len(history.rows), banded) > LIVE_BYTES:
            reset = True
        if reset:
            f.group = group_for(k, len(history.rows), history.decimated, TRAIT_BYTES)
        start = 0 if reset else min(first, k - 1) // f.group
        types = [str(i.get("type", "")) for i in history.row_info]
        arrays, meta = history_payload(history, start, f.group, thresholds=thresholds or self.thresholds, types=types,
                                first_nonfinite=0 if reset else f.nonfinite)
        f.nonfinite = meta["first_nonfinite_step"]
        content = {"type": "history", "from": start, "reset": reset, **meta}
        if not reset:  # rows that appeared since the last push (a branch taken late, relu#k, experts)
            names = content.pop("rows")
            if len(names) > f.rows:
                content["rows"], content["rows_from"] = names[f.rows:], f.rows
        f.rows = len(history.rows)
        if len(incidents) != f.incidents:
            content["incidents"] = incidents
            f.incidents = len(incidents)
        body, buffers = pack_arrays(content, arrays)
        self.send(body, buffers)
        f.token = token
        if len(history.rows) != f.grouped:  # the grouped view's tree of the rows so far (values: the history)
            f.grouped = len(history.rows)
            live = groups_live(history.row_info)
            if live is not None:
                self.groups = {**live[0], **{k: encode_array(v) for k, v in live[1].items()}}
        return True

    @classmethod
    def from_capture(cls, result: CaptureResult, thresholds: Thresholds | None = None) -> ThermometerWidget:
        return cls(diagnose(result, thresholds), result, thresholds)

    @traitlets.validate("selected")
    def _check_selected(self, proposal: Any) -> str:
        value = proposal["value"]
        if value and value not in self.report.names and not self.running:  # live: rows still appear
            raise traitlets.TraitError(f"no row named {value!r}")
        return value

    # -- on-demand data ---------------------------------------------------------------------
    @rpc("histogram")
    def _histogram(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        if self.capture is None and self.running:
            raise ValueError("the cell is still running: histograms are available once it has finished")
        return histogram_answer(self.capture, int(params["row"]))

    @staticmethod
    def histogram_answer(capture: CaptureResult | None, row: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The ``histogram`` request's answer for row ``row`` of ``capture`` (:func:`histogram_answer`)."""
        return histogram_answer(capture, row)
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
        diags += "".join(f"<li>step {e.step}: {html.escape(e.message)}</li>" for e in r.events)
        cards = "".join(f'<p style="border-left:4px solid #b30000;padding-left:6px">step {i["step"]}: {html.escape(i["message"])}</p>'
                        for i in self.incidents)
        return (
            f'<div class="nbdebug-thermometer-static"><p><b>nbdebug thermometer</b>: {html.escape(r.summary)}</p>'
            f"{_error_html(r)}{cards}{_loss_svg(self.capture)}<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
            f"<ul>{diags}</ul></div>"
        )

    def export_requests(self) -> list[tuple[str, dict[str, Any]]]:
        """The histogram of every row (what a click on the row asks for)."""
        return [("histogram", {"row": i}) for i in range(len(self.report.names))]

    def __repr__(self) -> str:
        return f"ThermometerWidget({self.report.summary})"


@dataclasses.dataclass
class _Feed:
    """What the browser holds of a running cell's history."""

    token: int = 0  # History.changes_since token of the last push
    group: int = 1  # kept slots merged into one sent slot
    nonfinite: int = 0  # first step with a NaN/Inf seen in what was sent
    incidents: int = 0
    rows: int = 0  # history rows the browser has the names of
    grouped: int = 0  # history rows the live grouped view's tree was built from


def _incident(inc: Any) -> dict[str, Any]:
    """An incident as JSON for the cards (tensors and parameter stats stay in Python)."""
    if isinstance(inc, dict):
        return inc
    get = lambda k: getattr(inc, k, None)  # noqa: E731
    return {"kind": str(get("kind") or ""), "step": int(get("step") or 0), "module": get("module"), "row": get("row"),
            "phase": get("phase"), "message": str(get("message") or ""),
            "value": None if get("value") is None else float(get("value"))}


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


def _loss_svg(capture: CaptureResult | None, width: int = 480, height: int = 60) -> str:
    """The loss per kept step as an inline SVG polyline (at most ``width`` points; no script)."""
    hist = getattr(capture, "history", None)
    if hist is None or len(hist) < 2:
        return ""
    loss, steps, first = hist.scalar("loss").astype(np.float64), hist.step_index, int(hist.bucket_first[0])
    ok = np.isfinite(loss)
    if ok.sum() < 2:
        return ""
    pick = np.unique(np.linspace(0, len(loss) - 1, min(len(loss), width)).round().astype(int))
    pick = pick[ok[pick]]
    lo, hi = float(loss[ok].min()), float(loss[ok].max())
    x = (pick / max(1, len(loss) - 1)) * (width - 2) + 1
    y = height - 2 - (loss[pick] - lo) / ((hi - lo) or 1.0) * (height - 4)
    pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x, y))
    return (f"<p>loss, steps {first}–{int(steps[-1])} (min {_fmt(lo)}, max {_fmt(hi)}, last {_fmt(float(loss[-1]))})</p>"
            f'<svg width="{width}" height="{height}" style="border-bottom:1px solid #ccc">'
            f'<polyline fill="none" stroke="#1976d2" points="{pts}"/></svg>')


def _fmt(x: float) -> str:
    if x != x:
        return "—"
    if x == 0 or 1e-3 <= abs(x) < 1e4:
        return f"{x:.4g}"
    return f"{x:.3e}"
