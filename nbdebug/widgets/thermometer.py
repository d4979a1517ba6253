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
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import traitlets

from ..capture.history import History
from ..capture.result import CaptureResult
from ..inspectors.findings import as_json, headline, live_findings
from ..inspectors.groups import groups_live, groups_view
from ..inspectors.history import step_flags
from ..inspectors.thermometer import COLUMNS, LEGEND, ThermometerReport, Thresholds, diagnose
from ..sessions.ablation_io import AblationAnswer, ablation_request
from ..sessions.protocols import Ablates
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
from .thermometer_html import fallback_html, finite_or_none

__all__ = ["FINDINGS_EVERY", "FINDINGS_SHARE", "LIVE_BYTES", "TRAIT_BYTES", "WIRE_FIELDS", "ThermometerWidget", "histogram_answer"]

#: while the cell runs, the findings are worked out again at most once every this many seconds…
FINDINGS_EVERY = 1.0
#: …and at most this share of the loop's time (a slow one waits longer: 20× what it took)
FINDINGS_SHARE = 0.05


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
    flags itself; ``histogram_note`` (why no row has a histogram: a click then asks nothing);
    ``headline`` (the header: the top finding, ranked root cause first) and ``findings`` (the ranked
    findings, :func:`~nbdebug.inspectors.findings.as_json`), both also sent live while the cell runs.
    ``report`` and ``capture`` keep the Python-side data.
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
    #: the header (the top finding → what followed from it) and the ranked findings (root cause first)
    headline = traitlets.Unicode("").tag(sync=True)
    findings = traitlets.List().tag(sync=True)
    #: while the cell runs, the history's rows (as a ``history`` message's ``rows``), set before the push that
    #: first carries them: a browser whose view module loaded after the first push (lost: custom messages
    #: are not kept) still names its rows; [] once the cell has finished (the ``history`` trait has them)
    live_rows = traitlets.List().tag(sync=True)
    #: a row's module can be ablated (the last model call was kept), and the ablations run (for tests)
    can_ablate = traitlets.Bool(False).tag(sync=True)
    ablations = traitlets.Int(0).tag(sync=True)
    #: a ModuleAblation (nbdebug.sessions.thermometer) once the cell ran, else None
    ablation: Ablates | None = None

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
                # calls per step (forward pass): "×2" is a module called twice per pass, never the run's step count
                {"name": n, "module": m, "type": t, "shape": list(s), "dtype": d, "flags": f,
                 "calls": max(1, round(c / max(1, int(getattr(capture, "steps", 1) or 1))))}
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
            events=[_event(e) for e in report.events],
            headline=report.headline,
            findings=as_json(report.findings),
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
            for k, v in {**state, "running": False, "live_rows": []}.items():
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
        if len(history.rows) != f.rows:  # before the send: the trait reaches a browser that misses the message
            self.live_rows = meta["rows"]
        f.rows = len(history.rows)
        if len(incidents) != f.incidents:
            content["incidents"] = incidents
            f.incidents = len(incidents)
        content.update(self._live_findings(history, incidents, thresholds or self.thresholds))
        body, buffers = pack_arrays(content, arrays)
        self.send(body, buffers)
        f.token = token
        if len(history.rows) != f.grouped:  # the grouped view's tree of the rows so far (values: the history)
            f.grouped = len(history.rows)
            live = groups_live(history.row_info)
            if live is not None:
                self.groups = {**live[0], **{k: encode_array(v) for k, v in live[1].items()}}
        return True

    def _live_findings(self, history: History, incidents: list[dict[str, Any]], thresholds: Thresholds | None) -> dict[str, Any]:
        """``{findings, headline}`` of the history so far, when due (see :data:`FINDINGS_EVERY`); {} otherwise."""
        f = self._feed
        now = time.monotonic()
        if f.findings_at and now - f.findings_at < max(FINDINGS_EVERY, f.findings_cost / FINDINGS_SHARE):
            return {}
        info = history.row_info
        bits = step_flags(history.values("last"), [str(i.get("type", "")) for i in info], thresholds,
                          dtypes=[str(i.get("dtype", "")) for i in info], skipped=history.scalar("skipped") == 1,
                          shapes=[tuple(i.get("shape") or ()) or None for i in info])
        found = live_findings(history, thresholds, flags=bits, incidents=incidents)
        f.findings_at, f.findings_cost = time.monotonic(), time.monotonic() - now
        return {"findings": as_json(found), "headline": headline(found, "no problems found so far")}

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

    @rpc("ablate")
    def _ablate(self, params: dict[str, Any]) -> tuple[AblationAnswer, None]:
        """An ablation request of kind ``modules`` (:mod:`nbdebug.sessions.ablation_io`: one row's module):
        the last step's forward re-run with its output ablated, Δ loss, or Δ of the output when the
        loss cannot be recomputed (``note`` says so)."""
        request = ablation_request(params, "modules")
        if self.ablation is None:
            raise ValueError("nothing to re-run: the model's last call was not kept (or the cell is still running)")
        out, _ = self.ablation.respond(request)
        self.ablations += 1
        return out, None

    @staticmethod
    def histogram_answer(capture: CaptureResult | None, row: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The ``histogram`` request's answer for row ``row`` of ``capture`` (:func:`histogram_answer`)."""
        return histogram_answer(capture, row)
    # -- static fallback and repr -------------------------------------------------------------
    def fallback_html(self) -> str:
        """A plain page (no scripts) shown where widgets cannot render (nbviewer, GitHub, HTML export)."""
        return fallback_html(self.report, self.capture, self.incidents)

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
    findings_at: float = 0.0  # time.monotonic() of the last live findings (0: none yet)
    findings_cost: float = 0.0  # seconds they took


def _event(e: Any) -> dict[str, Any]:
    """An event as JSON (NaN, which JSON cannot carry, as None)."""
    d = dataclasses.asdict(e)
    d["value"] = finite_or_none(d.get("value"))
    d["related"] = list(d.get("related") or ())
    return d


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
