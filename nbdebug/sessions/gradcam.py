"""The Grad-CAM view's clicks: a model call plus the CAMs computed on it so far, other layers computed
on demand (:func:`~nbdebug.cams.methods.compute_cams`) within the ``--max-bytes`` budget, the model
held weakly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..adapters.vision import SpatialLayer, find_image, image_hw
from ..cams.methods import compute_cams
from ..capture import DEFAULT_MAX_BYTES, ModelRef
from ..inspectors.cams import parse_methods
from ..inspectors.gradcam import CamMaps, Target, pick_layer
from ..runs.progress import Reporter

__all__ = ["GradCamSession"]


class GradCamSession:
    """A model call plus the CAMs computed on it so far; computes other layers on demand.

    Holds the model weakly: once it is deleted, a new layer answers with
    :class:`~nbdebug.capture.ModelGoneError` (its message is what the view shows). ``args``/``kwargs``
    are the cell's inputs as :func:`~nbdebug.runs.gradients.autograd_inputs` returns them;
    ``methods`` every method computed for each layer (``method``: the first); ``order`` the modules
    of the first call in the order their calls ended (the sanity check's "layers after");
    ``item_bytes`` one perturbed forward's memory estimate.
    """

    def __init__(self, model: nn.Module, args: Sequence[Any], kwargs: dict[str, Any], layers: list[SpatialLayer], *,
                 method: str = "gradcam", methods: Sequence[str] | str | None = None, reshape: Any = None,
                 max_bytes: int = DEFAULT_MAX_BYTES, item_bytes: int | None = None, order: Sequence[str] = (),
                 progress: Reporter | None = None) -> None:
        self._model = ModelRef(model)
        self.max_bytes = max_bytes
        self.pinned: str | None = None  # the layer the view opens on: always kept
        self.dropped: set[str] = set()  # layers whose CAMs did not fit the budget (recomputed when asked)
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.layers = layers
        self.methods = parse_methods(methods if methods is not None else method)
        self.method = self.methods[0]
        self.reshape = reshape
        self.item_bytes = item_bytes
        self.order = list(order)
        self.progress = progress
        img = find_image(self.args, self.kwargs)
        self.image = img
        self.output_hw = image_hw(img) if img is not None else None
        self.classes: torch.Tensor | None = None
        self.maps: dict[str, CamMaps] = {}

    @property
    def model(self) -> nn.Module:
        """The model (``ModelGoneError`` once it has been deleted)."""
        return self._model.get()

    def compute(self, layer: SpatialLayer, *, targets: Target = "topk", topk: int = 5, name_of: Any = str,
                auto: bool = False) -> tuple[CamMaps, torch.Tensor]:
        """``(maps, logits)`` of ``layer`` (:func:`compute_cams`, every method); the first call fixes the
        target classes for every later layer; the maps are cached within the budget."""
        maps, classes, logits = compute_cams(
            self.model, self.args, self.kwargs, layer, targets=targets, topk=topk, classes=self.classes,
            methods=self.methods, reshape=self.reshape, output_hw=self.output_hw, name_of=name_of, max_bytes=self.max_bytes,
            item_bytes=self.item_bytes, progress=self.progress, auto=auto,
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
    def cam_bytes(maps: CamMaps) -> int:
        """Bytes one layer's CAMs take, every method's (what the budget counts)."""
        return maps.nbytes

    def kept_bytes(self) -> int:
        """Bytes of the cached CAMs, the pinned layer's aside."""
        return sum(self.cam_bytes(m) for n, m in self.maps.items() if n != self.pinned)

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
