"""Recorder of the thermometer view: a stats :class:`~nbdebug.capture.session.Capture` around the code."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..capture.budget import parse_bytes
from ..capture.session import Capture, CaptureResult
from ..inspectors.thermometer import Thresholds, diagnose
from ..views import Recorder
from ..widgets.thermometer import ThermometerWidget


class ThermometerRecorder(Recorder):
    """Options read: ``layers``, ``histograms``, ``max_bytes`` (``64MB`` or bytes), ``sample_size``,
    ``dead_threshold``, ``vanishing``, ``exploding``, ``device_path``. Zero values are honoured (only a
    missing option, None, takes the default)."""

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        o = options
        self.capture = Capture(
            model,
            o.get("layers"),
            histograms=bool(o.get("histograms")),
            max_bytes=parse_bytes(o.get("max_bytes")),
            sample_size=4096 if o.get("sample_size") is None else int(o["sample_size"]),
            device_path=o.get("device_path"),
        )
        defaults = Thresholds()
        self.thresholds = Thresholds(
            dead=defaults.dead if o.get("dead_threshold") is None else float(o["dead_threshold"]),
            vanishing=defaults.vanishing if o.get("vanishing") is None else float(o["vanishing"]),
            exploding=defaults.exploding if o.get("exploding") is None else float(o["exploding"]),
        )

    def __enter__(self) -> ThermometerRecorder:
        self.capture.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.capture.__exit__(*exc)

    def result(self) -> CaptureResult:
        assert self.capture.result is not None, "the recorder has not run yet"
        return self.capture.result

    def widget(self) -> ThermometerWidget:
        res = self.result()
        return ThermometerWidget(diagnose(res, self.thresholds), res)
