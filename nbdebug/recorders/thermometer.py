"""Recorder of the thermometer view: a stats :class:`~nbdebug.capture.session.Capture` around the code."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..capture.session import DEFAULT_MAX_BYTES, Capture, CaptureResult
from ..inspectors.thermometer import Thresholds, diagnose
from ..views import Recorder
from ..widgets.thermometer import ThermometerWidget


class ThermometerRecorder(Recorder):
    """Options read: ``layers``, ``histograms``, ``max_bytes``, ``sample_size``, ``dead_threshold``,
    ``vanishing``, ``exploding``."""

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        o = options
        self.capture = Capture(
            model,
            o.get("layers"),
            histograms=bool(o.get("histograms")),
            max_bytes=int(o.get("max_bytes") or DEFAULT_MAX_BYTES),
            sample_size=int(o.get("sample_size") or 4096),
        )
        defaults = Thresholds()
        self.thresholds = Thresholds(
            dead=o.get("dead_threshold") or defaults.dead,
            vanishing=o.get("vanishing") or defaults.vanishing,
            exploding=o.get("exploding") or defaults.exploding,
        )

    def __enter__(self) -> ThermometerRecorder:
        self.capture.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.capture.__exit__(*exc)

    def result(self) -> CaptureResult:
        assert self.capture.result is not None, "the recorder has not run yet"
        return self.capture.result

    def widget(self) -> ThermometerWidget:
        res = self.result()
        return ThermometerWidget(diagnose(res, self.thresholds), res)
