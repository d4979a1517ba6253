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
from ._snapshot import MAX_SNAPSHOT_BYTES, colorize, encode_png, img_tag, upscale

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
        """Image and every target class's CAM of one sample and layer (uint8, one buffer each).

        ``layer`` is a call name (``act``, ``act#2``); a layer not computed yet is computed on demand
        (a deleted model answers with the ModelGoneError message as the error)."""
        sample = int(params.get("sample", self.sample))
        layer = str(params.get("layer") or self.layer)
        if not 0 <= sample < self.batch:
            raise IndexError(f"sample {sample} out of range (batch of {self.batch})")
        maps = self._result.maps.get(layer) or self._session.maps_for(layer)
        u8, peak = cam_to_u8(maps.cams[sample])
        arrays: dict[str, Any] = {"cams": u8, "peak": peak}
        if self._result.image is not None:
            arrays["image"] = self._result.image[sample]
        info = {"layer": maps.layer, "sample": sample, "zero_grad": maps.zero_grad, "note": maps.note,
                "grid": maps.grid.describe(), "low_hw": list(maps.low.shape[-2:])}
        return info, arrays

    def fallback_html(self) -> str:
        """Static snapshot: the shown class's CAM over the (de-normalised) image, as one PNG."""
        info, arrays = self._view({"sample": self.sample, "layer": self.layer})
        classes = self.classes[self.sample] if self.classes else []
        k = min(max(self.class_rank, 0), max(len(classes) - 1, 0))
        cam = np.asarray(arrays["cams"][k])
        heat = colorize(cam, self.colormap).astype(np.float32)
        a = min(1.0, max(0.0, float(self.opacity)))
        image = arrays.get("image")
        base = np.asarray(image, dtype=np.float32) if image is not None and image.shape[:2] == cam.shape else np.zeros_like(heat)
        over = np.clip(np.rint((1 - a) * base + a * heat), 0, 255).astype(np.uint8)
        zoom = max(1, 224 // max(cam.shape))
        while zoom > 1 and len(encode_png(upscale(over, zoom))) * 4 // 3 > MAX_SNAPSHOT_BYTES - 8000:
            zoom -= 1
        pic = upscale(over, zoom)
        while len(encode_png(pic)) * 4 // 3 > MAX_SNAPSHOT_BYTES - 8000:
            pic = pic[::2, ::2]
        shown = classes[k] if classes else {"name": "?", "prob": float("nan")}
        rows = "".join(
            f"<li>{'<b>' if i == k else ''}{html.escape(c['name'])} ({c['prob']:.1%}){'</b>' if i == k else ''}</li>"
            for i, c in enumerate(classes)
        )
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in [*self.notes, self.image_note, info.get("note") or ""] if n)
        return (
            f"<div class='nbdebug-gradcam-static'><p><b>nbdebug {html.escape(self.method)}</b> on "
            f"<code>{html.escape(info['layer'])}</code> · sample {self.sample} · class {html.escape(shown['name'])} · "
            f"opacity {a:.2f} · {html.escape(self.colormap)}</p>"
            f"{img_tag(pic, 'Grad-CAM of ' + str(shown['name']))}<ol>{rows}</ol>"
            + (f"<ul>{notes}</ul>" if notes else "") + "</div>"
        )

    def export_requests(self) -> list[tuple[str, dict[str, Any]]]:
        """Every sample × every layer whose CAMs are already computed (all classes come with each)."""
        layers = [n for n in self.layers if n in self._result.maps] or [self.layer]
        if self.layer not in layers:
            layers.insert(0, self.layer)
        return [("view", {"sample": s, "layer": n}) for s in range(self.batch) for n in layers]

    def __repr__(self) -> str:
        return f"GradCamWidget(layer={self.layer!r}, batch={self.batch}, classes={len(self.classes[0]) if self.classes else 0})"
