"""Recorder of the thermometer view: a stats :class:`~nbdebug.capture.session.Capture` around the code,
and the live widget that follows a training loop while the cell runs.

Live protocol (see :class:`~nbdebug.api.Debug`): right after every recorder entered, ``Debug`` calls
:meth:`ThermometerRecorder.live_widget` when the live view is wanted and displays it; the capture's
``on_step`` callback then pushes the new history slots to it, at most :data:`MAX_RATE` times a
second, and once more at exit; :meth:`ThermometerRecorder.widget` returns that same widget with its
final state (nothing is displayed twice).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from torch import nn

from ..adapters.unhookable import refuse_unhookable
from ..capture.budget import parse_bytes
from ..capture.session import Capture, CaptureResult
from ..inspectors.thermometer import ThermometerReport, Thresholds, diagnose
from ..runs.output_probe import probes_after_cell
from ..sessions.thermometer import LastCall, ModuleAblation
from ..views import Recorder, training_options
from ..widgets.thermometer import ThermometerWidget

MAX_RATE = 4.0  # live updates per second, at most


class ThermometerRecorder(Recorder):
    """Options read: ``layers``, ``histograms``, ``max_bytes`` (``64MB`` or bytes), ``sample_size``,
    ``dead_threshold``, ``vanishing``, ``exploding``, ``device_path``, the training options
    (``every``, ``loss_var``, ``break_on``, ``continue_from``, ``step_on``) and ``live`` (show the
    widget while the cell runs). Zero values are honoured (only a missing option, None, takes the
    default)."""

    def __init__(self, model: nn.Module, **options: Any) -> None:
        refuse_unhookable(model)  # TorchScript, torch.export: hooks cannot see its layers (one line instead)
        super().__init__(model, **options)
        o = options
        self.live = bool(o.get("live"))
        self._widget: ThermometerWidget | None = None
        self._last_push = 0.0
        self._pushing = True
        self.last: LastCall | None = None
        self._diagnosed: tuple[CaptureResult, ThermometerReport] | None = None
        self.capture = Capture(
            model,
            _default_layers(model) if o.get("layers") is None else o["layers"],
            histograms=bool(o.get("histograms")),
            max_bytes=parse_bytes(o.get("max_bytes")),
            sample_size=4096 if o.get("sample_size") is None else int(o["sample_size"]),
            device_path=o.get("device_path"),
            **training_options(o),
            on_step=self._on_step,
        )
        defaults = Thresholds()
        self.thresholds = Thresholds(
            dead=defaults.dead if o.get("dead_threshold") is None else float(o["dead_threshold"]),
            vanishing=defaults.vanishing if o.get("vanishing") is None else float(o["vanishing"]),
            exploding=defaults.exploding if o.get("exploding") is None else float(o["exploding"]),
        )

    def __enter__(self) -> ThermometerRecorder:
        self.capture.__enter__()
        self.last = LastCall(self.model)  # the last call's inputs: a row's ablation re-runs them
        self.last.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.last is not None:
                self.last.__exit__(*exc)
            self.capture.__exit__(*exc)
            self._probe_batch(exc[0] is None)
        finally:
            if self._widget is not None:
                self._push()  # always one final update (what the throttle held back)

    def _probe_batch(self, ok: bool) -> None:
        """Once, after a training cell that did not raise: does a sample's output depend on the rest of its
        batch, and what does the model hand the loss? (:func:`~nbdebug.runs.output_probe.probes_after_cell` on the
        last call: one own pass over the whole batch in eval mode serving both, then the half batch)
        → ``result.loop["batch_probe"]`` / ``["output_probe"]``, read by ``batch_mixed`` and the output findings."""
        res = self.capture.result
        inputs = self.last.inputs if self.last is not None else None
        if not ok or res is None or inputs is None or not res.backward_ran:
            return
        # one own pass over the whole batch serves both probes (then the half batch): "batch_probe", "output_probe"
        res.loop.update(probes_after_cell(self.model, inputs))

    # -- live --------------------------------------------------------------------------------
    def live_widget(self) -> ThermometerWidget:
        """The widget shown while the cell runs (created once; :meth:`widget` returns it at the end)."""
        if self._widget is None:
            self._widget = ThermometerWidget.waiting(self.thresholds)
        return self._widget

    def _on_step(self, cap: Any = None) -> None:
        """The capture's per-step callback: push at most :data:`MAX_RATE` times a second."""
        if self._widget is None or time.monotonic() - self._last_push < 1.0 / MAX_RATE:
            return
        self._push()

    def _push(self) -> None:
        w, hist = self._widget, getattr(self.capture, "history", None)
        if w is None or hist is None or not self._pushing:
            return
        try:
            w.push_history(hist, incidents=list(getattr(self.capture, "incidents", None) or []), thresholds=self.thresholds)
        except Exception as exc:  # a live update must never break the user's loop
            self._pushing = False
            sys.stderr.write(f"nbdebug: live updates stopped: {type(exc).__name__}: {exc}\n")
        self._last_push = time.monotonic()

    # -- after the run -----------------------------------------------------------------------
    def result(self) -> CaptureResult:
        """The capture's result, with its ranked ``findings`` and ``headline`` (decided once)."""
        assert self.capture.result is not None, "the recorder has not run yet"
        self._report()
        return self.capture.result

    def _report(self) -> ThermometerReport:
        res = self.capture.result
        assert res is not None, "the recorder has not run yet"
        if self._diagnosed is None or self._diagnosed[0] is not res:
            report = diagnose(res, self.thresholds)
            res.findings, res.headline = list(report.findings), report.headline
            self._diagnosed = (res, report)
        return self._diagnosed[1]

    def widget(self) -> ThermometerWidget:
        res = self.result()
        report = self._report()
        if self._widget is not None:
            self._widget.finish(report, res)
            w = self._widget
        else:
            w = ThermometerWidget(report, res, self.thresholds)
        inputs = self.last.inputs if self.last is not None else None
        if inputs is not None:
            w.ablation = ModuleAblation(self.model, inputs)
            w.can_ablate = True
        return w


def _default_layers(model: nn.Module) -> Any:
    """Every leaf module, and for a transformer also its blocks' own outputs: the residual stream
    after each block (the grouped view's strip) is the first thing people plot when a deep model
    misbehaves. ``None`` (leaves only) for any other model."""
    from ..adapters.transformers import find_parts
    from ..capture.select import select_modules

    try:
        blocks = [name for name, _ in find_parts(model).blocks]
    except Exception:  # not a transformer this adapter knows: leaves only
        return None
    if not blocks:
        return None
    leaves = [name for name, _ in select_modules(model, None)]
    return leaves + [b for b in blocks if b not in leaves]
