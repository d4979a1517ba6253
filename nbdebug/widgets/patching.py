"""The activation-patching grid: rows = sites (module names), columns = positions (or heads), each
cell the normalised effect of patching that site from the clean run into the corrupt one.

>>> w = PatchingWidget(session)                          # doctest: +SKIP
>>> w.handle_request("grid", {"sites": "heads"})         # what the site selector asks for

Synced up front: the first grid (``effect``/``raw`` float32, ``identical`` uint8 as binary arrays,
``rows``/``columns`` as strings), the metric, both prompts' tokens and top-5 next tokens. On request
(``js/src/patching.ts``): ``grid`` (another site kind, or ``method="attribution"``: the triage
estimate with its top cells verified exactly) and ``cell`` (one patch run exactly: its top-5 next
tokens beside the clean and corrupt runs', and the three runs' logit-lens columns at the last position:
per block the top-1 token and p(answer)). The session holds the model weakly: once it is deleted a
request answers with the ``ModelGoneError`` message.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import traitlets

from ..inspectors.attention import display_token
from ..inspectors.token_headlines import SHOWN, block_labels, patch_headline
from ..sessions.protocols import PatchClicks
from ..workbench import PatchGrid
from ._base import NBWidget, rpc
from ._snapshot import code_html
from ._transport import encode_array
from .logitlens import text_on

__all__ = ["PatchingWidget", "diverging"]

#: the saturated ends of the diverging scale (effect +1 / −1); 0 is white. The same scale colours the
#: attribution view's scores: blue is "toward the answer" in both views, red "against it".
POSITIVE = (33, 102, 172)
NEGATIVE = (178, 24, 43)
SITES = ("resid", "attn", "mlp", "heads")


def diverging(effect: float) -> tuple[int, int, int]:
    """RGB of an effect: white at 0, :data:`POSITIVE` at +1, :data:`NEGATIVE` at −1 (clamped; NaN grey),
    as ``js/src/patching/colour.ts``."""
    if not np.isfinite(effect):
        return (224, 224, 224)
    t = min(1.0, abs(float(effect)))
    end = POSITIVE if effect >= 0 else NEGATIVE
    return tuple(round(255 + (c - 255) * t) for c in end)  # type: ignore[return-value]


def _labels(grid: PatchGrid) -> list[str]:
    """Each row named for what it is (block input, attention/MLP output, head)."""
    s = grid.row_sites
    return block_labels(grid.rows, [x.kind for x in s], [x.layer for x in s], [x.head for x in s])


def _wire(grid: PatchGrid) -> dict[str, Any]:
    """A grid's traits / request answer: JSON parts and the arrays as wire arrays."""
    return {
        "rows": list(grid.rows), "row_labels": _labels(grid), "columns": [display_token(c) for c in grid.columns], "sites": grid.sites,
        "method": grid.method, "verified": [[int(r), int(c), float(v)] for (r, c), v in grid.verified.items()],
        "notes": list(grid.notes), "seconds": float(grid.seconds), "patches": int(grid.patches),
    }


def _arrays(grid: PatchGrid) -> dict[str, np.ndarray]:
    # an identical cell (clean = corrupt there: nothing to patch) is drawn grey with "=", not as a 0 effect
    shown = np.where(grid.identical, np.nan, grid.effect)
    return {"effect": shown.astype(np.float32), "raw": grid.raw.astype(np.float32),
            "identical": grid.identical.astype(np.uint8)}


class PatchingWidget(NBWidget):
    """Patching grid with a site selector, a triage toggle (attribution estimate) and click → patched top-5.

    Traits: the shown grid (``effect``, ``raw``, ``identical``: wire arrays; ``rows``, ``columns``,
    ``sites``, ``method``, ``verified`` ``[[row, col, exact effect], ...]``, ``grid_notes``), the metric
    (``metric``, ``metric_clean``, ``metric_corrupt``), ``tokens_clean``/``tokens_corrupt``,
    ``top_clean``/``top_corrupt`` (``{id, token, p}``), ``site_kinds``; ``selected`` ``[row, col]`` (the last
    clicked cell, synced both ways) and ``clicks`` (cells the kernel has run, for tests).
    """

    _view_name_ = "patching"

    effect = traitlets.Dict().tag(sync=True)
    raw = traitlets.Dict().tag(sync=True)
    identical = traitlets.Dict().tag(sync=True)
    rows = traitlets.List(traitlets.Unicode()).tag(sync=True)
    #: what each row is ("block 3 input", "block 3 mlp out", "block 3 head 5"); ``rows`` keeps module names
    row_labels = traitlets.List(traitlets.Unicode()).tag(sync=True)
    columns = traitlets.List(traitlets.Unicode()).tag(sync=True)
    sites = traitlets.Unicode("resid").tag(sync=True)
    method = traitlets.Unicode("exact").tag(sync=True)
    verified = traitlets.List().tag(sync=True)
    grid_notes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    site_kinds = traitlets.List(traitlets.Unicode()).tag(sync=True)
    metric = traitlets.Unicode("").tag(sync=True)
    metric_clean = traitlets.Float(0.0).tag(sync=True)
    metric_corrupt = traitlets.Float(0.0).tag(sync=True)
    tokens_clean = traitlets.List(traitlets.Unicode()).tag(sync=True)
    tokens_corrupt = traitlets.List(traitlets.Unicode()).tag(sync=True)
    top_clean = traitlets.List().tag(sync=True)
    top_corrupt = traitlets.List().tag(sync=True)
    #: the answer token's ``{id, token, p, rank}`` in the clean and corrupt runs (shown under each top-5)
    answer_clean = traitlets.Dict(allow_none=True).tag(sync=True)
    answer_corrupt = traitlets.Dict(allow_none=True).tag(sync=True)
    selected = traitlets.List(traitlets.Int()).tag(sync=True)
    clicks = traitlets.Int(0).tag(sync=True)

    def __init__(self, session: PatchClicks, *, sites: str = "resid", method: str = "exact", **kwargs: Any) -> None:
        self.session = session
        grid = session.grid(sites, method)
        self._answer = display_token(session.answer_clean["token"]) if getattr(session, "answer_clean", None) else "the answer"
        super().__init__(
            answer_clean=self._answer_of(getattr(session, "answer_clean", None)),
            answer_corrupt=self._answer_of(getattr(session, "answer_corrupt", None)),
            metric=session.metric_label, metric_clean=float(session.metric_clean),
            metric_corrupt=float(session.metric_corrupt), site_kinds=list(SITES),
            tokens_clean=[display_token(t) for t in session.tokens_clean],
            tokens_corrupt=[display_token(t) for t in session.tokens_corrupt],
            top_clean=self._tops(session.top_clean), top_corrupt=self._tops(session.top_corrupt),
            **self._grid_traits(grid), **kwargs)

    @staticmethod
    def _tops(tops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**t, "token": display_token(t["token"])} for t in tops]

    @staticmethod
    def _answer_of(entry: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if entry is None else {**entry, "token": display_token(entry["token"])}

    def _headline_of(self, grid: PatchGrid) -> str:
        """The finding: which positions carry the answer in which blocks (:func:`patch_headline`)."""
        answer = f"'{self._answer}'" if self._answer != "the answer" else "the answer"
        return patch_headline(grid.effect, [display_token(c) for c in grid.columns], answer,
                              [x.layer for x in grid.row_sites], grid.sites, estimate=grid.estimate, labels=_labels(grid))

    def _grid_traits(self, grid: PatchGrid) -> dict[str, Any]:
        wire = _wire(grid)
        arrays = {k: encode_array(v) for k, v in _arrays(grid).items()}
        return {**arrays, "rows": wire["rows"], "row_labels": wire["row_labels"], "columns": wire["columns"],
                "sites": grid.sites, "method": grid.method, "verified": wire["verified"], "grid_notes": wire["notes"],
                "headline": self._headline_of(grid)}

    @property
    def grid(self) -> PatchGrid:
        """The grid shown now."""
        return self.session.grid(self.sites, self.method)

    @rpc("grid")
    def _grid(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        grid = self.session.grid(str(params.get("sites", self.sites)), str(params.get("method", self.method)))
        self._show(grid)
        return {**_wire(grid), "headline": self.headline}, _arrays(grid)

    def _show(self, grid: PatchGrid) -> None:
        with self.hold_sync():
            for k, v in self._grid_traits(grid).items():
                setattr(self, k, v)

    @rpc("cell")
    def _cell(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        sites, method = str(params.get("sites", self.sites)), str(params.get("method", self.method))
        row, col = int(params.get("row", 0)), int(params.get("col", 0))
        out = self.session.cell(sites, method, row, col)
        for key in ("patched", "clean", "corrupt"):
            out[key] = self._tops(out[key])
            out["lens"][key] = self._tops(out["lens"][key])
        out["answer"] = {k: self._answer_of(v) for k, v in (out.get("answer") or {}).items()}
        self.selected = [row, col]
        self.clicks += 1
        return out, None

    def fallback_html(self, max_cells: int = 4000) -> str:
        """Static snapshot: the shown grid as an HTML table coloured white (0) to blue (+1) / red (−1)."""
        grid = self.grid
        R, C = grid.shape
        rows = range(min(R, max(1, max_cells // max(C, 1))))
        head = "".join(f"<th>{html.escape(c[:12])}</th>" for c in self.columns)
        body = []
        for r in rows:
            tds = []
            for c in range(C):
                e = float(grid.effect[r, c])
                rgb = diverging(e)
                fg = text_on(rgb)
                txt = "=" if grid.identical[r, c] else (f"{e:.2f}" if abs(e) >= SHOWN else "")
                tds.append(f"<td style='background:rgb{rgb};color:{fg};padding:1px 4px' title='{e:.4g}'>{txt}</td>")
            body.append(f"<tr><th title='{html.escape(grid.rows[r])}'>{html.escape(self.row_labels[r] if r < len(self.row_labels) else grid.rows[r])}</th>{''.join(tds)}</tr>")
        return (f"<div class='nbdebug-patching-static'><p class='nbd-headline'><b>{code_html(self.headline)}</b></p>"
                f"<p>nbdebug patching ({html.escape(grid.sites)}, {grid.method}): "
                f"effect of restoring each site, {html.escape(self.metric)}, clean {self.metric_clean:.3g}, corrupt "
                f"{self.metric_corrupt:.3g} (1 = fully restored; blue restores the answer, red pushes against it; |effect| &lt; {SHOWN:g} not printed)</p><table style='border-collapse:collapse;"
                f"font-family:monospace'><thead><tr><th>site</th>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
                "</table></div>")

    def __repr__(self) -> str:
        return f"PatchingWidget({self.sites}, {self.method}: {len(self.rows)} x {len(self.columns)}, {self.metric})"
