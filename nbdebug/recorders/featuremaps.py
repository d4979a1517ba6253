"""Recorder of the feature-map view: keeps a copy of every selected layer's spatial output.

Copies (not references) because in-place ops later in the forward pass (``ReLU(inplace=True)``)
would otherwise change what was captured. Only the first top-level model call is kept (module
calls after it returns, e.g. a checkpointed segment recomputed in backward, are not), at most
``max_samples`` samples per layer and ``max_bytes`` in all (``--max-bytes``; what did not fit is
listed in the notes). Nothing model-related is kept: the model is held weakly, and only while the
cell runs is it needed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..adapters.unhookable import refuse_unhookable
from ..adapters.vision import (
    InputSize,
    SpatialLayer,
    deepest,
    grid_from_config,
    infer_grid,
    spatial_layers,
)
from ..capture import ModelCall, format_bytes, parse_bytes, select_modules, split_call_name
from ..capture.probe import OutputProbe
from ..inspectors.featuremaps import SORT_KEYS, FeatureMapLayer, FeatureMapsResult
from ..sessions.channels import ChannelAblation
from ..views import Recorder

__all__ = ["FeatureMapsRecorder"]


class FeatureMapsRecorder(Recorder):
    """Options read: ``layers``, ``sample``, ``colormap``, ``fm_sort``, ``fm_norm``, ``reshape``,
    ``max_bytes`` (``64MB``, an int; 0 keeps nothing), ``max_samples``.

    The view opens on the first layer asked for (``--layers _blocks.1,_blocks.15`` opens on
    ``_blocks.1``: the order the user wrote is the order of the story); without ``--layers`` on the
    deepest spatial layer kept (the one Grad-CAM tries first), not the first one (often a padding or
    stem layer).
    """

    def __init__(self, model: nn.Module, **options: Any) -> None:
        refuse_unhookable(model)  # TorchScript, torch.export: hooks cannot see its layers (one line instead)
        super().__init__(model, **options)
        o = options
        self.names = {n for n, _ in select_modules(model, o.get("layers"))}
        self._chosen = o.get("layers") is not None  # the user narrowed the layers (notes say "selected")
        self._asked = _asked_order(model, o.get("layers"))
        self.sample = 0 if o.get("sample") is None else int(o["sample"])
        self.colormap = str(o.get("colormap") or "viridis")
        self.sort = str(o.get("fm_sort") or "index")
        if self.sort not in SORT_KEYS:
            raise ValueError(f"--sort {self.sort!r}: use one of {', '.join(SORT_KEYS)}")
        self.norm = str(o.get("fm_norm") or "channel")
        if self.norm not in ("channel", "shared"):
            raise ValueError(f"--norm {self.norm!r}: use 'channel' or 'shared'")
        self.reshape = o.get("reshape")
        self.max_bytes = parse_bytes(o.get("max_bytes"))
        self.max_samples = 32 if o.get("max_samples") is None else int(o["max_samples"])
        if self.max_samples < 1:
            raise ValueError(f"max_samples={o['max_samples']!r}: keep at least one sample (use max_bytes=0 to keep no maps)")
        self._size = InputSize()
        self._grid_hw: tuple[tuple[int, int] | None] | None = None
        self.probe = OutputProbe(
            model,
            keep=self._keep,
            max_samples=self.max_samples,
            max_bytes=self.max_bytes,
            on_first_call=self._size,
        )
        self._spatial: list[SpatialLayer] = []
        self._result: FeatureMapsResult | None = None
        self.class_names = _class_names(o.get("class_names"), o.get("user_ns"))
        self.call: ModelCall | None = ModelCall(model, keep_output=False)  # the first call's inputs: channel ablation
        self.ablation: ChannelAblation | None = None

    def _keep(self, name: str, t: torch.Tensor) -> bool:
        """Copy a selected module's output only when it has a spatial grid (the budget is for maps)."""
        if split_call_name(name)[0] not in self.names:
            return False
        if callable(self.reshape):
            return True
        if self._grid_hw is None:  # once per run: the patch grid of HF ViT-style configs
            self._grid_hw = (grid_from_config(self.model, self._size.hw),)
        try:
            grid = infer_grid(t.shape, input_hw=self._size.hw, grid_hw=self._grid_hw[0], reshape=self.reshape)
        except ValueError:
            return False
        return grid is not None

    def __enter__(self) -> FeatureMapsRecorder:
        self.probe.__enter__()
        if self.call is not None:
            self.call.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        call, self.call = self.call, None
        if call is not None:
            call.__exit__(*exc)
            if call.seen and call.args is not None:
                self.ablation = ChannelAblation(self.model, call.args, call.kwargs or {}, class_names=self.class_names)
        self.probe.__exit__(*exc)
        pr, hw = self.probe, self._size.hw
        try:
            grid_hw = grid_from_config(self.model, hw)
        except Exception:  # the model is gone already: token grids are guessed from the image size
            grid_hw = None
        self._spatial = spatial_layers(pr.records, pr.calls, input_hw=hw, grid_hw=grid_hw,
                                       reshape=self.reshape if isinstance(self.reshape, str) else None)

    def applies(self) -> str | None:
        """None when at least one layer was kept, else why not (never called, no spatial output, budget)."""
        if self.result().layers:
            return None
        if not self.probe.records:
            if self.probe.steps and not self.probe.completed:
                return "the model raised before any layer produced an output"
            return "the cell never called the model"
        if self.probe.dropped:
            return f"no layer fits the memory budget (--max-bytes {format_bytes(self.max_bytes)})"
        return "no captured layer has a spatial output"

    def result(self) -> FeatureMapsResult:
        if self._result is not None:
            return self._result
        pr = self.probe
        layers: dict[str, FeatureMapLayer] = {}
        batch = 0
        for sl in self._spatial:
            data = pr.tensors.get(sl.name)
            if data is None or sl.grid.layout == "custom":
                continue
            layers[sl.name] = FeatureMapLayer(sl.name, sl.shape, sl.grid, data)
            batch = max(batch, int(sl.shape[0]))
        notes: list[str] = []
        if not pr.records:
            notes.append("the model raised before any layer produced an output" if pr.steps and not pr.completed
                         else "the cell never called the model")
        if pr.records and not pr.completed:
            notes.append("the model raised during its first call: the layers that ran before it are shown")
        if pr.steps > 1:
            notes.append(f"the cell called the model {pr.steps} times; the first call is shown")
        spatial_modules = {sl.module for sl in self._spatial}
        flat = sorted({r.module for r in pr.records if r.module in self.names and r.module not in spatial_modules})
        if flat:
            shapes = {r.module: r.shape for r in pr.records}
            listed = ", ".join(f"{n} {list(shapes[n])}" for n in flat[:6])
            notes.append(f"{len(flat)} {'selected ' if self._chosen else ''}layer(s) have no spatial output and are not shown: {listed}{' …' if len(flat) > 6 else ''}")
        if pr.dropped:
            names = [n for n, _ in pr.dropped]
            need = sum(b for _, b in pr.dropped)
            notes.append(f"memory budget {format_bytes(self.max_bytes)} reached: {len(names)} layer output(s) not kept "
                         f"({', '.join(names[:4])}{' …' if len(names) > 4 else ''}; {format_bytes(need)} more); "
                         "narrow --layers or raise --max-bytes")
        kept = min((lay.samples for lay in layers.values()), default=0)
        if batch > kept > 0:
            notes.append(f"the first {kept} of {batch} samples are kept")
        spatial = [sl for sl in self._spatial if sl.name in layers]
        first = next((sl for names in self._asked for sl in spatial if sl.module in names), None)
        shown = first or deepest(spatial)
        self._result = FeatureMapsResult(layers, batch, notes, default_layer=shown.name if shown else "")
        return self._result

    def widget(self) -> Any:
        from ..widgets.featuremaps import FeatureMapsWidget

        return FeatureMapsWidget(self.result(), sample=self.sample, colormap=self.colormap, sort=self.sort, norm=self.norm,
                                 ablation=self.ablation)


def _asked_order(model: nn.Module, layers: Any) -> list[set[str]]:
    """Per entry of ``--layers`` in the order written (names or patterns), the modules it selects;
    [] when the layers were not given by name (None, types, a predicate)."""
    if isinstance(layers, str):
        layers = [layers]
    if not isinstance(layers, (list, tuple)) or not all(isinstance(x, str) for x in layers):
        return []
    return [{n for n, _ in select_modules(model, x)} for x in layers]


def _class_names(value: Any, ns: Any) -> Any:
    """``--class-names``: a notebook variable's value, a comma-separated list, or the object given."""
    if isinstance(value, str):
        if isinstance(ns, dict) and value in ns:
            return ns[value]
        return [v.strip() for v in value.split(",")] if "," in value else None
    return value
