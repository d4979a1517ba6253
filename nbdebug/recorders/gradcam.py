"""Recorder of the Grad-CAM view: remembers the cell's model call, then computes CAMs on it.

The cell runs untouched (a :class:`~nbdebug.capture.ModelCall` and a shape-only
:class:`~nbdebug.capture.probe.OutputProbe` watch it). Afterwards nbdebug runs the model once
more on the same input with gradients tracked from the target layer on (also when the cell ran
under ``torch.no_grad`` or ``torch.inference_mode``), on clones of the buffers and with
parameters frozen (:func:`~nbdebug.capture.gradients.layer_pass`), so a graph the user still
holds stays valid. The recorder, the session and the widget hold the model weakly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..adapters.outputs import logits_of
from ..adapters.vision import (
    InputSize,
    SpatialLayer,
    find_image,
    grid_from_config,
    image_for_display,
    image_hw,
    spatial_layers,
)
from ..capture import (
    DEFAULT_MAX_BYTES,
    ModelCall,
    ModelRef,
    format_bytes,
    parse_bytes,
    select_modules,
    split_call_name,
)
from ..capture.gradients import autograd_inputs
from ..capture.probe import OutputProbe
from ..capture.state import user_hook_count
from ..inspectors.gradcam import (
    CamMaps,
    GradCamResult,
    Target,
    class_names_for,
    compute_cams,
    fallback_layers,
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
    """A model call plus the CAMs computed on it so far; computes other layers on demand.

    Holds the model weakly: once it is deleted, a new layer answers with
    :class:`~nbdebug.capture.ModelGoneError` (its message is what the view shows). ``args``/``kwargs``
    are the cell's inputs as :func:`~nbdebug.capture.gradients.autograd_inputs` returns them.
    """

    def __init__(self, model: nn.Module, args: Sequence[Any], kwargs: dict[str, Any], layers: list[SpatialLayer], *, method: str,
                 reshape: Any, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._model = ModelRef(model)
        self.max_bytes = max_bytes
        self.pinned: str | None = None  # the layer the view opens on: always kept
        self.dropped: set[str] = set()  # layers whose CAMs did not fit the budget (recomputed when asked)
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
            self._model.get(), self.args, self.kwargs, layer, targets=targets, topk=topk, classes=self.classes,
            method=self.method, reshape=self.reshape, output_hw=self.output_hw, name_of=name_of,
        )
        if self.classes is None:
            self.classes = classes
        self._cache(layer.name, maps)
        return maps, logits

    def pin(self, name: str, maps: CamMaps) -> None:
        """Keep ``name``'s CAMs whatever the budget (the layer the view shows first)."""
        self.pinned = name
        self._cache(name, maps)

    @staticmethod
    def _size(maps: CamMaps) -> int:
        return int(maps.cams.nbytes + maps.low.nbytes)

    def kept_bytes(self) -> int:
        return sum(self._size(m) for n, m in self.maps.items() if n != self.pinned)

    def _cache(self, name: str, maps: CamMaps) -> None:
        """Cache a layer's CAMs within ``max_bytes`` (the pinned layer aside): oldest layers go first."""
        self.maps.pop(name, None)
        self.maps[name] = maps
        while self.kept_bytes() > self.max_bytes:
            old = next((n for n in self.maps if n != self.pinned), None)
            if old is None:
                break
            del self.maps[old]
            self.dropped.add(old)
        if name in self.maps:
            self.dropped.discard(name)

    def maps_for(self, name: str) -> CamMaps:
        """CAMs of layer ``name`` (a call name) for the same target classes (cached within the budget)."""
        if name not in self.maps:
            layer, _ = pick_layer(self.layers, name)
            if layer.name not in self.maps:
                return self.compute(layer)[0]
            return self.maps[layer.name]
        return self.maps[name]


class GradCamRecorder(Recorder):
    """Options read: ``gradcam_layer``, ``target``, ``cam_topk``, ``cam_method``, ``class_names``,
    ``image_mean``, ``image_std``, ``reshape``, ``sample``, ``colormap``, ``user_ns``.

    Holds the model weakly (``self.model`` raises :class:`~nbdebug.capture.ModelGoneError` once it
    is gone). A cell that calls the model several times is explained on its first call.
    """

    @property  # type: ignore[override]
    def model(self) -> nn.Module:
        return self._model_ref.get()

    @model.setter
    def model(self, value: nn.Module) -> None:
        self._model_ref = ModelRef(value)

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        o = options
        self.layer: str | None = o.get("gradcam_layer") or None
        if self.layer:
            # Unknown names fail before the cell runs (the magic turns this into a UsageError);
            # whether the layer has a spatial output is only known after the run.
            select_modules(model, split_call_name(self.layer)[0])
        self.target = _target(o.get("target"))
        topk = o.get("cam_topk")
        self.topk = 5 if topk is None else int(topk)
        if self.topk < 1:
            raise ValueError(f"--topk {self.topk}: explain at least one class")
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
        self.max_bytes = parse_bytes(o.get("max_bytes"))
        self._call: ModelCall | None = ModelCall(model)
        self._size = InputSize()
        self._probe = OutputProbe(model, on_first_call=self._size)
        self._seen = False
        self._calls = 0
        self._inputs: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})
        self._theirs: torch.Tensor | None = None  # the cell's class scores (detached)
        self._output_shape: list[int] | None = None
        self._layers: list[SpatialLayer] = []
        self._result: GradCamResult | None = None
        self.session: GradCamSession | None = None

    def __enter__(self) -> GradCamRecorder:
        assert self._call is not None, "a GradCamRecorder is entered once"
        self._call.__enter__()
        try:
            self._probe.__enter__()
        except BaseException:
            self._call.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._probe.__exit__(*exc)
        finally:
            call, self._call = self._call, None  # nothing of ours keeps the model (ModelCall holds it)
            if call is not None:
                call.__exit__(*exc)
                self._keep(call)

    def _keep(self, call: ModelCall) -> None:
        """What the view needs from the cell's call, without the model or the user's graph."""
        self._seen, self._calls = call.seen, call.calls
        if not call.seen:
            return
        self._inputs = autograd_inputs(call.args or (), call.kwargs or {})
        scores = logits_of(call.output)
        self._output_shape = None if scores is None else list(scores.shape)
        self._theirs = scores.detach() if scores is not None and scores.dim() == 2 else None
        hw = self._size.hw
        self._layers = spatial_layers(self._probe.records, self._probe.calls, input_hw=hw,
                                      grid_hw=grid_from_config(self.model, hw), reshape=self.reshape)

    def applies(self) -> str | None:
        """None, or why there is nothing to explain: the model never ran, no spatial layer, no class scores."""
        if not self._seen:
            return "the cell never called the model, so there is nothing to explain"
        if not self._probe.completed:
            return "the model raised during its first call, so there are no class scores to explain"
        if not self._layers:
            return "no layer has a spatial output (B×C×H×W, B×H×W×C or a token grid)"
        if self._theirs is None:
            return f"the model's output is not class scores (batch×classes); got shape {self._output_shape}"
        return None

    def result(self) -> GradCamResult:
        if self._result is None:
            self._result = self._compute()
        return self._result

    def _compute(self) -> GradCamResult:
        if not self._seen:
            raise RuntimeError("the cell never called the model, so there is nothing to explain; call it once, e.g. `model(x)`")
        layers = self._layers
        chosen, auto = pick_layer(layers, self.layer, self._probe.describe_all())
        model = self.model
        session = GradCamSession(model, *self._inputs, layers, method=self.method, reshape=self.reshape, max_bytes=self.max_bytes)
        self.session = session
        has_names = self.class_names is not None or getattr(getattr(model, "config", None), "id2label", None)
        name_of = class_names_for(model, self.class_names, 0) if has_names else str
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
        session.pin(chosen.name, maps)
        if session.dropped:
            notes.append(f"--max-bytes budget of {format_bytes(self.max_bytes)}: the CAMs of {len(session.dropped)} other layer(s) "
                         "were not kept (recomputed when you pick them); the shown layer's are")
        elif self.max_bytes < session._size(maps):
            notes.append(f"--max-bytes budget of {format_bytes(self.max_bytes)}: only the shown layer's CAMs "
                         f"({format_bytes(session._size(maps))}) are kept; other layers are recomputed when you pick them")
        if maps.note:
            notes.append(maps.note)
        mode = self._probe.grad_mode
        mode = f" (your cell ran under torch.{mode})" if mode in ("no_grad", "inference_mode") else ""
        notes.append(f"nbdebug ran the model once more on your cell's input, tracking gradients from {chosen.name} on{mode}; "
                     "parameters' .grad, buffers and training mode are left as they were")
        hooks = user_hook_count(model)
        if hooks:
            notes.append(f"nbdebug's re-run did not call your {hooks} hook(s) on the model (your cell's call did, as usual)")
        if model.training:
            notes.append("the model is in training mode: dropout and batch statistics apply to that run as in your cell")
        if self._calls > 1:
            notes.append(f"the cell called the model {self._calls} times; the first call is explained")
        if self._theirs is not None and self._theirs.shape == logits.shape:
            theirs = self._theirs.float()
            diff = float((theirs - logits.float()).abs().max())
            if diff > 1e-3 * (1 + float(theirs.abs().max())):
                notes.append(f"the re-run's scores differ from your cell's by up to {diff:.3g} (dropout or other randomness?)")
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
