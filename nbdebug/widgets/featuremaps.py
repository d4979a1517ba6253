"""Feature-map grid widget: channels of one layer as tiles, fetched a page at a time.

Synced state: the layer list (names and shapes) and the display choices. Pixels arrive on demand
(``@rpc("page")``): one uint8 buffer per page (all channels when they fit in 1 MB), with each
channel's min/max so the browser can also draw them on a shared scale.

>>> w = FeatureMapsWidget(result)            # doctest: +SKIP
>>> w.handle_request("page", {"layer": "layer1", "sample": 0})   # doctest: +SKIP
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import traitlets

from ..inspectors.featuremaps import (
    SORT_KEYS,
    FeatureMapsResult,
    channel_stats,
    encode_page,
    layer_headline,
    page_size,
    silent_on_all,
)
from ..sessions.ablation_io import AblationAnswer, ablation_request
from ..sessions.protocols import Ablates
from ._base import NBWidget, rpc
from ._snapshot import MAX_SNAPSHOT_BYTES, code_html, colorize, encode_png, grid, img_tag, upscale

__all__ = ["FeatureMapsWidget"]


def _first_layer(result: FeatureMapsResult, layers: list[dict[str, Any]]) -> str:
    """The layer to open on: the result's ``default_layer`` (the first layer asked for, else the deepest
    spatial output), else the first."""
    if result.default_layer in result.layers:
        return result.default_layer
    return str(layers[0]["name"]) if layers else ""


class FeatureMapsWidget(NBWidget):
    """Tiled channels of a captured layer with colormap, normalisation, sorting and paging.

    Traits synced back from the browser: ``layer``, ``sample``, ``colormap``, ``norm``
    (``"channel"``/``"shared"``), ``sort`` (``index``/``mean``/``max``/``sparsity``) and
    ``selected`` (the enlarged channel, -1 for none).
    """

    _view_name_ = "featuremaps"

    #: ``{"name", "shape", "channels", "height", "width", "layout"}`` per captured layer.
    layers = traitlets.List().tag(sync=True)
    layer = traitlets.Unicode("").tag(sync=True)
    sample = traitlets.Int(0).tag(sync=True)
    batch = traitlets.Int(1).tag(sync=True)
    colormap = traitlets.Unicode("viridis").tag(sync=True)
    norm = traitlets.Unicode("channel").tag(sync=True)
    sort = traitlets.Unicode("index").tag(sync=True)
    selected = traitlets.Int(-1).tag(sync=True)
    notes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    #: whether a channel can be ablated (the cell's first call was kept), and the ablations run (for tests)
    can_ablate = traitlets.Bool(False).tag(sync=True)
    ablations = traitlets.Int(0).tag(sync=True)

    def __init__(self, result: FeatureMapsResult, *, sample: int = 0, colormap: str = "viridis", sort: str = "index", norm: str = "channel",
                 ablation: Ablates | None = None, **kwargs: Any) -> None:
        layers = [
            {"name": lay.name, "shape": list(lay.shape), "channels": lay.grid.channels, "height": lay.grid.height,
             "width": lay.grid.width, "layout": lay.grid.describe(), "samples": lay.samples}
            for lay in result.layers.values()
        ]
        kept = min((lay.samples for lay in result.layers.values()), default=1)
        super().__init__(
            layers=layers, layer=_first_layer(result, layers), batch=max(kept, 1),
            sample=min(max(sample, 0), max(kept - 1, 0)), colormap=colormap, sort=sort, norm=norm,
            notes=list(result.notes), can_ablate=ablation is not None, **kwargs,
        )
        self._result = result
        self.ablation = ablation  # a ChannelAblation (nbdebug.sessions.channels) or None
        self._silent_all: dict[str, Any] = {}
        self._set_headline()
        self.observe(self._set_headline, names=["layer", "sample"])

    def _set_headline(self, _change: Any = None) -> None:
        """``headline``: the shown layer's silent channels on the shown sample
        (:func:`~nbdebug.inspectors.featuremaps.layer_headline`)."""
        layer = self._result.layers.get(self.layer)
        if layer is None:
            self.headline = "No layer with a spatial output was captured." if not self._result.layers else ""
            return
        sample = min(max(int(self.sample), 0), layer.samples - 1)
        if layer.samples > 1 and self.layer not in self._silent_all:
            self._silent_all[self.layer] = silent_on_all(layer)
        self.headline = layer_headline(self.layer, channel_stats(layer.maps(sample)), sample=sample, samples=layer.samples,
                                       silent_all=self._silent_all.get(self.layer))

    @rpc("ablate")
    def _ablate(self, params: dict[str, Any]) -> tuple[AblationAnswer, dict[str, Any]]:
        """An ablation request of kind ``channels`` (:mod:`nbdebug.sessions.ablation_io`: one layer, its
        channels): Δ p of the clean top-1 class, the new top-5, and the Grad-CAM maps (clean and
        ablated) as the float32 arrays ``cam_clean`` and ``cam``."""
        if self.ablation is None:
            raise RuntimeError("channel ablation needs the cell's model call (none was kept)")
        out, arrays = self.ablation.respond(ablation_request(params, "channels"))
        self.ablations += 1
        return out, arrays

    @rpc("page")
    def _page(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Channels ``start:start+count`` of a layer/sample in a sort order, as uint8 + stats."""
        name = str(params.get("layer") or self.layer)
        if name not in self._result.layers:
            raise KeyError(f"no captured layer {name!r}; captured: {', '.join(list(self._result.layers)[:10])}")
        sort = str(params.get("sort") or "index")
        if sort not in SORT_KEYS:
            raise ValueError(f"unknown sort {sort!r}")
        layer = self._result.layers[name]
        maps = layer.maps(int(params.get("sample", 0)))
        c, h, w = maps.shape
        count = params.get("count")
        count = page_size(c, h, w) if count is None else max(1, int(count))
        page = encode_page(maps, order=sort, descending=bool(params.get("descending", True)), start=int(params.get("start", 0)), count=count)
        st, ch = page.stats, page.channels
        info = {
            "layer": name, "start": page.start, "total": page.total, "height": h, "width": w,
            "page_size": count, "dead": int(st.dead.sum()), "lo": float(st.lo.min()) if c else 0.0,
            "hi": float(st.hi.max()) if c else 0.0, "sort": sort,
        }
        arrays = {
            "pixels": page.pixels, "channels": ch, "lo": st.lo[ch], "hi": st.hi[ch], "mean": st.mean[ch],
            "sparsity": st.sparsity[ch], "dead": st.dead[ch].astype(np.uint8),
        }
        return info, arrays

    def fallback_html(self) -> str:
        """Static snapshot: the first page of the shown layer as one PNG grid in the chosen colormap."""
        head = "<b>nbdebug feature maps</b>"
        if not self.layer:
            return f"<div class='nbdebug-featuremaps-static'>{head}: no layer with a spatial output was captured</div>"
        lead = f"<p><b>{code_html(self.headline)}</b></p>" if self.headline else ""
        info, arrays = self._page({"layer": self.layer, "sample": self.sample, "sort": self.sort, "start": 0})
        pix = np.asarray(arrays["pixels"])
        if self.norm == "shared" and pix.size:
            lo, hi = arrays["lo"].astype(np.float64), arrays["hi"].astype(np.float64)
            vals = lo[:, None, None] + pix / 255.0 * (hi - lo)[:, None, None]
            span = max(info["hi"] - info["lo"], 1e-12)
            pix = np.clip(np.rint((vals - info["lo"]) / span * 255), 0, 255).astype(np.uint8)
        n, h, w = pix.shape
        img, step = self._snapshot_grid(pix)
        shown = f"channels {info['start']}–{info['start'] + n - 1} of {info['total']}" + (f", sampled every {step} pixels" if step > 1 else "")
        caption = (f"{head}: <code>{html.escape(self.layer)}</code> · sample {self.sample} · {shown} · {h}×{w} · "
                   f"{html.escape(self.colormap)}, {html.escape(self.norm)} scale · {info['dead']} silent on this input")
        notes = "".join(f"<li>{html.escape(n_)}</li>" for n_ in self.notes)
        return (f"<div class='nbdebug-featuremaps-static'>{lead}<p>{caption}</p>"
                f"{img_tag(img, f'feature maps of {self.layer}')}"
                + (f"<ul>{notes}</ul>" if notes else "") + "</div>")

    def _snapshot_grid(self, pix: np.ndarray) -> tuple[np.ndarray, int]:
        """Tiles coloured and laid out, every ``step``th pixel so the PNG fits the snapshot budget."""
        n, h, w = pix.shape
        cols = max(1, int(np.ceil(np.sqrt(n * w / max(h, 1) * 1.0))))
        for step in (1, 2, 3, 4, 6, 8, 12, 16):
            tiles = pix[:, ::step, ::step]
            zoom = max(1, 48 // max(tiles.shape[1], tiles.shape[2], 1))
            img = grid(colorize(upscale(tiles.transpose(1, 2, 0), zoom).transpose(2, 0, 1), self.colormap), cols, gap=2)
            if len(encode_png(img)) * 4 // 3 < MAX_SNAPSHOT_BYTES - 4000:
                break
        return img, step

    def export_requests(self) -> list[tuple[str, dict[str, Any]]]:
        """The first page of every layer for the current sample and sort (what a layer switch asks)."""
        return [("page", {"layer": lay["name"], "sample": self.sample, "sort": self.sort, "start": 0}) for lay in self.layers]

    def __repr__(self) -> str:
        return f"FeatureMapsWidget(layers={len(self.layers)}, layer={self.layer!r}, batch={self.batch})"
