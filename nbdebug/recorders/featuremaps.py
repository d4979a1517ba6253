"""Recorder of the feature-map view: keeps a copy of every selected layer's spatial output.

Copies (not references) because in-place ops later in the forward pass (``ReLU(inplace=True)``)
would otherwise change what was captured. Only the first top-level model call is kept, at most
``max_samples`` samples per layer and ``max_bytes`` in all (the rest is listed in the notes).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..adapters.vision import LayerProbe
from ..capture import select_modules
from ..inspectors.featuremaps import SORT_KEYS, FeatureMapLayer, FeatureMapsResult
from ..views import Recorder

__all__ = ["FeatureMapsRecorder"]

DEFAULT_MAX_BYTES = 256 * 2**20


class FeatureMapsRecorder(Recorder):
    """Options read: ``layers``, ``sample``, ``colormap``, ``fm_sort``, ``fm_norm``, ``reshape``,
    ``max_bytes``, ``max_samples``."""

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        o = options
        self.names = {n for n, _ in select_modules(model, o.get("layers"))}
        self.sample = int(o.get("sample") or 0)
        self.colormap = str(o.get("colormap") or "viridis")
        self.sort = str(o.get("fm_sort") or "index")
        if self.sort not in SORT_KEYS:
            raise ValueError(f"--sort {self.sort!r}: use one of {', '.join(SORT_KEYS)}")
        self.norm = str(o.get("fm_norm") or "channel")
        if self.norm not in ("channel", "shared"):
            raise ValueError(f"--norm {self.norm!r}: use 'channel' or 'shared'")
        self.probe = LayerProbe(
            model,
            keep=self.names.__contains__,
            reshape=o.get("reshape"),
            max_samples=int(o.get("max_samples") or 32),
            max_bytes=int(o.get("max_bytes") or DEFAULT_MAX_BYTES),
        )
        self._result: FeatureMapsResult | None = None

    def __enter__(self) -> FeatureMapsRecorder:
        self.probe.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.probe.__exit__(*exc)

    def result(self) -> FeatureMapsResult:
        if self._result is not None:
            return self._result
        pr = self.probe
        layers: dict[str, FeatureMapLayer] = {}
        batch = 0
        for sl in pr.spatial():
            data = pr.tensors.get((sl.module, sl.call))
            if data is None or sl.grid.layout == "custom":
                continue
            layers[sl.name] = FeatureMapLayer(sl.name, sl.shape, sl.grid, data)
            batch = max(batch, int(sl.shape[0]))
        notes: list[str] = []
        if not pr.records:
            notes.append("the cell never called the model")
        flat = sorted({n for n, _c, s, _k in pr.records if n in self.names and n not in {lay.split('#')[0] for lay in layers}})
        if flat:
            shapes = {n: s for n, _c, s, _k in pr.records}
            listed = ", ".join(f"{n} {list(shapes[n])}" for n in flat[:6])
            notes.append(f"{len(flat)} selected layer(s) have no spatial output and are not shown: {listed}{' …' if len(flat) > 6 else ''}")
        if pr.dropped:
            notes.append(f"memory budget reached: {len(pr.dropped)} layer(s) not kept ({', '.join(pr.dropped[:4])}…); "
                         "narrow --layers or raise --max-bytes")
        kept = min((lay.samples for lay in layers.values()), default=0)
        if batch > kept > 0:
            notes.append(f"the first {kept} of {batch} samples are kept")
        self._result = FeatureMapsResult(layers, batch, notes)
        return self._result

    def widget(self) -> Any:
        from ..widgets.featuremaps import FeatureMapsWidget

        return FeatureMapsWidget(self.result(), sample=self.sample, colormap=self.colormap, sort=self.sort, norm=self.norm)
