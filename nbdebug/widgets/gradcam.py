"""Grad-CAM widget: the input image and a CAM blended in the browser.

Synced state is small (layer names, class names and scores, the opacity/colormap the user picks);
the image and the CAMs of all target classes of one sample/layer arrive as uint8 buffers on demand
(``@rpc("view")``), so switching class or moving the opacity slider never asks the kernel.

>>> w = GradCamWidget(result, session)      # doctest: +SKIP
>>> w.opacity                               # the slider's last value, synced back from the browser
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import traitlets

from ..inspectors.gradcam import GradCamResult
from ._base import NBWidget, rpc

__all__ = ["GradCamWidget", "cam_to_u8"]


def cam_to_u8(cams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """K×H×W CAMs (≥ 0) scaled by their own maxima to uint8, and those maxima (float32 K)."""
    peak = cams.reshape(cams.shape[0], -1).max(axis=1).astype(np.float32)
    scale = np.where(peak > 0, 255.0 / np.where(peak > 0, peak, 1.0), 0.0).astype(np.float32)
    u8 = np.clip(np.rint(cams * scale[:, None, None]), 0, 255).astype(np.uint8)
    return u8, peak


class GradCamWidget(NBWidget):
    """Grad-CAM overlay with an opacity slider, colormap, class and layer choice.

    Traits synced back from the browser: ``opacity`` (0–1), ``colormap``, ``class_rank`` (index into
    the sample's target classes), ``layer`` and ``sample``.
    """

    _view_name_ = "gradcam"

    #: Every layer with a spatial output (dropdown); CAMs of other layers are computed on request.
    layers = traitlets.List(traitlets.Unicode()).tag(sync=True)
    #: Layer shown.
    layer = traitlets.Unicode("").tag(sync=True)
    #: Layer chosen automatically (shown as "auto" in the dropdown).
    auto_layer = traitlets.Unicode("").tag(sync=True)
    method = traitlets.Unicode("gradcam").tag(sync=True)
    #: Per sample, its target classes: ``{"index", "name", "score", "prob"}`` (names are plain text).
    classes = traitlets.List().tag(sync=True)
    batch = traitlets.Int(1).tag(sync=True)
    sample = traitlets.Int(0).tag(sync=True)
    #: Which of the sample's target classes is shown (0 = top-1 with ``targets="topk"``).
    class_rank = traitlets.Int(0).tag(sync=True)
    #: Heatmap opacity over the image; the slider changes it in the browser only, then syncs here.
    opacity = traitlets.Float(0.5).tag(sync=True)
    colormap = traitlets.Unicode("inferno").tag(sync=True)
    notes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    image_note = traitlets.Unicode("").tag(sync=True)

    def __init__(self, result: GradCamResult, session: Any, *, sample: int = 0, colormap: str = "inferno", **kwargs: Any) -> None:
        b = int(result.classes.shape[0])
        classes = [
            [
                {"index": int(result.classes[i, k]), "name": result.class_names[i][k],
                 "score": float(result.scores[i, k]), "prob": float(result.probs[i, k])}
                for k in range(result.classes.shape[1])
            ]
            for i in range(b)
        ]
        super().__init__(
            layers=list(result.layers), layer=result.layer, auto_layer=result.layer if result.auto_layer else "",
            method=result.method, classes=classes, batch=b, sample=min(max(sample, 0), b - 1),
            colormap=colormap, notes=list(result.notes), image_note=result.image_note, **kwargs,
        )
        self._result = result
        self._session = session

    @rpc("view")
    def _view(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Image and every target class's CAM of one sample and layer (uint8, one buffer each)."""
        sample = int(params.get("sample", self.sample))
        layer = str(params.get("layer") or self.layer)
        if not 0 <= sample < self.batch:
            raise IndexError(f"sample {sample} out of range (batch of {self.batch})")
        maps = self._result.maps.get(layer) or self._session.maps_for(layer)
        u8, peak = cam_to_u8(maps.cams[sample])
        arrays: dict[str, Any] = {"cams": u8, "peak": peak}
        if self._result.image is not None:
            arrays["image"] = self._result.image[sample]
        info = {"layer": layer, "sample": sample, "zero_grad": maps.zero_grad, "note": maps.note,
                "grid": maps.grid.describe(), "low_hw": list(maps.low.shape[-2:])}
        return info, arrays

    def fallback_html(self) -> str:
        rows = "".join(
            f"<li>{html.escape(c['name'])} ({c['prob']:.1%})</li>" for c in (self.classes[self.sample] if self.classes else [])
        )
        return (f"<div class='nbdebug-gradcam-static'><b>Grad-CAM</b> on {html.escape(self.layer)}"
                f"<ol>{rows}</ol><i>Run the notebook to see the overlay.</i></div>")

    def __repr__(self) -> str:
        return f"GradCamWidget(layer={self.layer!r}, batch={self.batch}, classes={len(self.classes[0]) if self.classes else 0})"
