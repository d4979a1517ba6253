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

from ..inspectors.featuremaps import SORT_KEYS, FeatureMapsResult, encode_page, page_size
from ._base import NBWidget, rpc

__all__ = ["FeatureMapsWidget"]


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

    def __init__(self, result: FeatureMapsResult, *, sample: int = 0, colormap: str = "viridis", sort: str = "index", norm: str = "channel", **kwargs: Any) -> None:
        layers = [
            {"name": lay.name, "shape": list(lay.shape), "channels": lay.grid.channels, "height": lay.grid.height,
             "width": lay.grid.width, "layout": lay.grid.describe(), "samples": lay.samples}
            for lay in result.layers.values()
        ]
        kept = min((lay.samples for lay in result.layers.values()), default=1)
        super().__init__(
            layers=layers, layer=layers[0]["name"] if layers else "", batch=max(kept, 1),
            sample=min(max(sample, 0), max(kept - 1, 0)), colormap=colormap, sort=sort, norm=norm,
            notes=list(result.notes), **kwargs,
        )
        self._result = result

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
        items = "".join(f"<li>{html.escape(lay['name'])} {lay['shape']}</li>" for lay in self.layers[:20])
        return f"<div class='nbdebug-featuremaps-static'><b>Feature maps</b><ul>{items}</ul><i>Run the notebook to see the grid.</i></div>"

    def __repr__(self) -> str:
        return f"FeatureMapsWidget(layers={len(self.layers)}, layer={self.layer!r}, batch={self.batch})"
