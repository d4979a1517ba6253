"""Channel ablation for the feature-map view: does this channel matter for the class the model picked?

:class:`ChannelAblation` keeps the cell's first model call, cut to its first sample, and a weak
reference to the model. :meth:`ChannelAblation.ablate` re-runs that sample with some channels of one
layer zeroed (or replaced by their spatial mean, ``mode="mean"``: :func:`nbdebug.ablate`) and returns
the change of the clean top-1 class's probability, the ablated run's top-5 classes and its Grad-CAM
map for that class at the layer the Grad-CAM view picks (:func:`~nbdebug.cams.methods.grad_cam`
/ :func:`~nbdebug.cams.methods.compute_cams`: the one CAM code). Every pass is nbdebug's own:
buffers cloned (BatchNorm running statistics untouched), RNG forked, parameters' ``.grad`` untouched,
modes as found, the user's hooks not called, no hook left.

>>> s = ChannelAblation(model, (images,), {})               # doctest: +SKIP
>>> s.ablate("layer4", [3, 7])["delta"]                     # Δ p(clean top-1)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..adapters.vision import SpatialLayer, find_image, image_hw
from ..cams.methods import compute_cams, grad_cam
from ..capture.weak import ModelRef
from ..inspectors.gradcam import class_names_for
from ..runs.gradients import autograd_inputs
from ..workbench import ablate
from ..workbench.interventions import MODES
from .ablation_io import AblationRequest, Answered, ablation_answer, ranked

__all__ = ["ChannelAblation", "first_sample"]


def first_sample(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's inputs cut to their first sample: every tensor whose first axis is the batch (the
    image's, else the first tensor's) keeps row 0; other inputs are passed as they are."""
    img = find_image(tuple(args), dict(kwargs))
    first = img if img is not None else next((a for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)), None)
    if first is None or first.dim() == 0:
        return tuple(args), dict(kwargs)
    b = first.shape[0]

    def cut(x: Any) -> Any:
        return x[:1] if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == b else x

    return tuple(cut(a) for a in args), {k: cut(v) for k, v in kwargs.items()}


def _probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.detach().reshape(logits.shape[0], -1)[0].cpu().double(), -1)  # float64 on the CPU only


class ChannelAblation:
    """The first sample of a model call, ablated on request (see the module docstring).

    ``clean()`` (computed once): ``{cls, label, p, top, cam_layer, cam}``; ``ablate(layer, channels,
    mode)``: ``{layer, channels, mode, cls, label, p_clean, p, delta, top, cam_layer, cam, cam_clean}``
    with ``top`` the top-``k`` classes ``{id, label, p}``, ``cam`` an ``H×W`` float32 array at input
    size (normalised as the Grad-CAM view shows it), ``cam_low`` the map at the layer's size (ReLU'd,
    unscaled). Raises :class:`~nbdebug.capture.ModelGoneError` (its message says: re-run the cell)
    once the model is deleted. At the CAM layer itself an ablated channel counts with its gradient
    (zero through the ablation): the map is the one of the ablated activation for ``mode="zero"``.
    """

    def __init__(self, model: nn.Module, args: Sequence[Any], kwargs: dict[str, Any], *, class_names: Any = None,
                 topk: int = 5) -> None:
        self.model_ref: ModelRef[nn.Module] = ModelRef(model)
        one_args, one_kwargs = first_sample(args, kwargs)
        self.args, self.kwargs = autograd_inputs(one_args, one_kwargs)
        self.class_names = class_names
        self.topk = int(topk)
        img = find_image(self.args, self.kwargs)
        self.output_hw = image_hw(img) if img is not None else None
        self.layer: SpatialLayer | None = None
        self.cls = -1
        self.base: dict[str, Any] | None = None
        self.requests = 0

    def name_of(self) -> Callable[[int], str]:
        """Class index → display name (``class_names``, the config's id2label, else the index)."""
        return class_names_for(self.model_ref.get(), self.class_names, 0)

    def top(self, probs: torch.Tensor) -> list[dict[str, Any]]:
        """The ``topk`` most likely classes ``{id, label, p}``."""
        name = self.name_of()
        v, i = probs.topk(min(self.topk, probs.numel()))
        return [{"id": int(a), "label": name(int(a)), "p": float(b)} for a, b in zip(i, v)]

    def clean(self) -> dict[str, Any]:
        """The clean run: its top-1 class (the one ablations are measured on), top-``k`` and Grad-CAM."""
        if self.base is None:
            model = self.model_ref.get()
            maps, classes, logits, layers, _ = grad_cam(model, self.args, self.kwargs, topk=1)
            self.cls = int(classes[0, 0])
            self.layer = next((lay for lay in layers if lay.name == maps.layer), None)
            if self.layer is None:
                raise RuntimeError(f"the Grad-CAM layer {maps.layer!r} is not among the spatial layers")
            p = _probs(logits)
            self.base = {"cls": self.cls, "label": self.name_of()(self.cls), "p": float(p[self.cls]), "top": self.top(p),
                         "cam_layer": maps.layer, "cam": maps.cams[0, 0].astype(np.float32)}
        return self.base

    def ablate(self, layer: str, channels: Sequence[int], mode: str = "zero") -> dict[str, Any]:
        """The first sample with ``channels`` of ``layer`` ablated (``mode``: zero | mean)."""
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: 'zero' or 'mean'")
        chans = sorted({int(c) for c in channels})
        if not chans:
            raise ValueError("no channel to ablate: click a channel tile first")
        base = self.clean()
        model = self.model_ref.get()
        assert self.layer is not None
        with ablate(model, channels={layer: chans}, mode=mode):  # an intervention: kept by the CAM's own passes
            maps, _, logits = compute_cams(model, self.args, self.kwargs, self.layer, classes=torch.tensor([[self.cls]]),
                                           output_hw=self.output_hw)
        p = _probs(logits)
        self.requests += 1
        return {"layer": layer, "channels": chans, "mode": mode, "cls": self.cls, "label": base["label"],
                "p_clean": base["p"], "p": float(p[self.cls]), "delta": float(p[self.cls]) - base["p"],
                "top": self.top(p), "top_clean": base["top"], "cam_layer": base["cam_layer"],
                "cam": maps.cams[0, 0].astype(np.float32), "cam_low": maps.low[0, 0].astype(np.float32),
                "cam_clean": base["cam"]}

    def respond(self, request: AblationRequest) -> Answered:
        """A view's ablation request (kind ``channels``: one layer and its channels) as :meth:`ablate`
        answers it, in the one answer shape (:mod:`nbdebug.sessions.ablation_io`); the Grad-CAM maps
        before and after (float32, input size) are the arrays ``cam_clean`` and ``cam``."""
        t0 = time.perf_counter()
        (target,) = request["targets"]
        out = self.ablate(str(target["layer"]), target["units"], request["mode"])
        metric = {"label": f"p({out['label']})", "kind": "p", "clean": out["p_clean"], "ablated": out["p"],
                  "delta": out["delta"], "of": {"id": out["cls"], "label": out["label"]}}
        top = {"clean": ranked(out["top_clean"], lambda e: e["label"]), "ablated": ranked(out["top"], lambda e: e["label"])}
        cam = np.ascontiguousarray(out["cam"], np.float32)
        answer = ablation_answer(request, metric, top=top, t0=t0,  # type: ignore[arg-type]
                                 cam={"layer": out["cam_layer"], "shape": list(cam.shape)})
        return answer, {"cam": cam, "cam_clean": np.ascontiguousarray(out["cam_clean"], np.float32)}
