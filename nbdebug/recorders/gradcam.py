"""Recorder of the Grad-CAM view: remembers the cell's model call, then computes CAMs on it.

The cell runs untouched (a :class:`~nbdebug.capture.ModelCall` and a shape-only
:class:`~nbdebug.adapters.vision.LayerProbe` watch it). Afterwards nbdebug runs the model once
more on the same input with gradients tracked from the target layer on (also when the cell ran
under ``torch.no_grad``), inside ``preserve_buffers`` and ``no_param_grads``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..adapters.vision import LayerProbe, SpatialLayer, find_image, image_for_display, image_hw
from ..capture import ModelCall, select_modules
from ..inspectors.gradcam import (
    CamMaps,
    GradCamResult,
    Target,
    class_names_for,
    compute_cams,
    fallback_layers,
    logits_of,
    pick_layer,
)
from ..views import Recorder

__all__ = ["GradCamRecorder", "GradCamSession"]

METHODS = ("gradcam", "gradcam++")


def _floats(value: Any) -> list[float] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return [float(v) for v in value.replace(" ", "").split(",") if v]
    if isinstance(value, (int, float)):
        return [float(value)]
    return [float(v) for v in value]


def _target(value: Any) -> Target:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "topk", "top", "auto")):
        return "topk"
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        items: list[int | str] = [int(p) if p.lstrip("-").isdigit() else p for p in parts]
        return items[0] if len(items) == 1 else items
    return value


def _names(value: Any, ns: dict[str, Any] | None) -> Any:
    """Class names: an object, a variable name in the notebook, or a comma-separated list."""
    if isinstance(value, str):
        if ns is not None and value in ns:
            return ns[value]
        if "," in value:
            return [v.strip() for v in value.split(",")]
        raise ValueError(f"--class-names: no variable named {value!r} in the notebook")
    return value


class GradCamSession:
    """A model call plus the CAMs computed on it so far; computes other layers on demand."""

    def __init__(self, model: nn.Module, args: Sequence[Any], kwargs: dict[str, Any], layers: list[SpatialLayer], *, method: str, reshape: Any) -> None:
        self.model = model
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.layers = layers
        self.method = method
        self.reshape = reshape
        img = find_image(self.args, self.kwargs)
        self.image = img
        self.output_hw = image_hw(img) if img is not None else None
        self.classes: torch.Tensor | None = None
        self.maps: dict[str, CamMaps] = {}

    def compute(self, layer: SpatialLayer, *, targets: Target = "topk", topk: int = 5, name_of: Any = str) -> tuple[CamMaps, torch.Tensor]:
        maps, classes, logits = compute_cams(
            self.model, self.args, self.kwargs, layer, targets=targets, topk=topk, classes=self.classes,
            method=self.method, reshape=self.reshape, output_hw=self.output_hw, name_of=name_of,
        )
        if self.classes is None:
            self.classes = classes
        self.maps[layer.name] = maps
        return maps, logits

    def maps_for(self, name: str) -> CamMaps:
        """CAMs of layer ``name`` for the same target classes (computed once, then cached)."""
        if name not in self.maps:
            layer, _ = pick_layer(self.layers, name)
            self.compute(layer)
        return self.maps[name]


class GradCamRecorder(Recorder):
    """Options read: ``gradcam_layer``, ``target``, ``cam_topk``, ``cam_method``, ``class_names``,
    ``image_mean``, ``image_std``, ``reshape``, ``sample``, ``colormap``, ``user_ns``."""

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        o = options
        self.layer: str | None = o.get("gradcam_layer") or None
        if self.layer:
            # Unknown names fail before the cell runs (the magic turns this into a UsageError);
            # whether the layer has a spatial output is only known after the run.
            select_modules(model, self.layer.split("#")[0])
        self.target = _target(o.get("target"))
        self.topk = int(o.get("cam_topk") or 5)
        self.method = str(o.get("cam_method") or "gradcam").lower().replace("-", "")
        if self.method == "gradcampp":
            self.method = "gradcam++"
        if self.method not in METHODS:
            raise ValueError(f"unknown Grad-CAM method {o.get('cam_method')!r}; use gradcam or gradcam++")
        self.class_names = _names(o.get("class_names"), o.get("user_ns"))
        self.mean = _floats(o.get("image_mean"))
        self.std = _floats(o.get("image_std"))
        self.reshape = o.get("reshape")
        self.sample = int(o.get("sample") or 0)
        self.colormap = str(o.get("colormap") or "inferno")
        self._call = ModelCall(model)
        self._probe = LayerProbe(model, reshape=self.reshape)
        self._result: GradCamResult | None = None
        self.session: GradCamSession | None = None

    def __enter__(self) -> GradCamRecorder:
        self._call.__enter__()
        try:
            self._probe.__enter__()
        except BaseException:
            self._call.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._probe.__exit__(*exc)
        self._call.__exit__(*exc)

    def result(self) -> GradCamResult:
        if self._result is None:
            self._result = self._compute()
        return self._result

    def _compute(self) -> GradCamResult:
        call = self._call
        if not call.seen:
            raise RuntimeError("the cell never called the model, so there is nothing to explain; call it once, e.g. `model(x)`")
        layers = self._probe.spatial()
        chosen, auto = pick_layer(layers, self.layer, self._probe.describe_all())
        session = GradCamSession(self.model, call.args or (), call.kwargs or {}, layers, method=self.method, reshape=self.reshape)
        self.session = session
        has_names = self.class_names is not None or getattr(getattr(self.model, "config", None), "id2label", None)
        name_of = class_names_for(self.model, self.class_names, 0) if has_names else str
        maps, logits = session.compute(chosen, targets=self.target, topk=self.topk, name_of=name_of)
        notes: list[str] = []
        if auto and maps.zero_grad:
            for cand in fallback_layers(layers, chosen):
                m2, _ = session.compute(cand)
                if not m2.zero_grad:
                    notes.append(f"{chosen.name} (the last layer with a spatial output) has a zero gradient; "
                                 f"{cand.name} is the last one the scores depend on")
                    chosen, maps = cand, m2
                    break
        if maps.note:
            notes.append(maps.note)
        grad_note = " (your cell ran under torch.no_grad)" if not call.grad_enabled else ""
        notes.append(f"nbdebug ran the model once more on your cell's input, tracking gradients from {chosen.name} on{grad_note}; "
                     "parameters' .grad, buffers and training mode are left as they were")
        if self.model.training:
            notes.append("the model is in training mode: dropout and batch statistics apply to that run as in your cell")
        if call.calls > 1:
            notes.append(f"the cell called the model {call.calls} times; the first call is explained")
        try:
            theirs = logits_of(call.output).detach().float()
            diff = float((theirs - logits.float()).abs().max())
            if diff > 1e-3 * (1 + float(theirs.abs().max())):
                notes.append(f"the re-run's scores differ from your cell's by up to {diff:.3g} (dropout or other randomness?)")
        except (ValueError, RuntimeError):
            pass
        classes = session.classes
        assert classes is not None
        probs = torch.softmax(logits.float(), dim=1).gather(1, classes).cpu().numpy()
        scores = logits.float().gather(1, classes).cpu().numpy()
        cls = classes.cpu().numpy().astype(np.int64)
        names = [[name_of(int(c)) for c in row] for row in cls]
        image, image_note = (None, "no image input found")
        if session.image is not None and session.image.dim() == 4:
            image, image_note = image_for_display(session.image, self.mean, self.std)
        return GradCamResult(
            layer=chosen.name, auto_layer=auto, method=self.method, classes=cls, scores=scores, probs=probs,
            class_names=names, layers=[lay.name for lay in layers if lay.module], maps=session.maps, image=image,
            image_note=image_note, notes=notes,
        )

    def widget(self) -> Any:
        from ..widgets.gradcam import GradCamWidget

        res = self.result()
        assert self.session is not None
        return GradCamWidget(res, self.session, sample=self.sample, colormap=self.colormap)
