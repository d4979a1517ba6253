"""The logit-lens table: rows = layers, columns = positions, each cell the top-1 token.

>>> w = LogitLensWidget(rec.lens())          # doctest: +SKIP
>>> w.metric = "entropy"                     # doctest: +SKIP

Synced up front: row names, token labels and the columns already computed (the last position,
every row) as binary arrays. The browser asks for the other positions with the ``columns``
request (computed then, cached), and for a pinned cell's longer top-k with ``cell``.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import traitlets

from ..inspectors.attention import display_token
from ..inspectors.logitlens import LogitLens
from ._base import NBWidget, rpc
from ._transport import encode_array

__all__ = ["LogitLensWidget"]

METRICS = ("top1_prob", "entropy", "target_prob", "target_rank", "kl")


def _pack(cols: dict[str, np.ndarray]) -> dict[str, Any]:
    """Arrays of some columns in wire form: top ids int32, the rest float32 (rank as int32)."""
    return {
        "top_ids": cols["top_ids"].astype(np.int32),
        "top_probs": cols["top_probs"].astype(np.float32),
        "entropy": cols["entropy"].astype(np.float32),
        "kl": cols["kl"].astype(np.float32),
        "target_prob": cols["target_prob"].astype(np.float32),
        "target_rank": cols["target_rank"].astype(np.int32),
    }


class LogitLensWidget(NBWidget):
    """Logit-lens table with metric switch, hover top-k, pinned cells and a layer-range filter.

    Traits: ``row_names``, ``tokens`` (readable labels), ``raw_tokens``, ``k``, ``n_rows``,
    ``n_pos``, ``initial`` (``{positions, arrays{name: wire array}}`` for the columns computed up
    front), ``vocab`` (``{id: label}`` for ids in ``initial``), ``targets`` (per-position target
    ids), ``target_label``, ``check``, ``notes``. UI state synced both ways: ``metric``,
    ``row_range`` (``[first, last]``), ``pos_range`` (``[start, end)`` of visible positions),
    ``pinned`` (list of ``[row, pos]``).
    """

    _view_name_ = "logitlens"

    row_names = traitlets.List(traitlets.Unicode()).tag(sync=True)
    tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)
    raw_tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)
    k = traitlets.Int(10).tag(sync=True)
    n_rows = traitlets.Int(0).tag(sync=True)
    n_pos = traitlets.Int(0).tag(sync=True)
    initial = traitlets.Dict().tag(sync=True)
    vocab = traitlets.Dict().tag(sync=True)
    targets = traitlets.List(traitlets.Int()).tag(sync=True)
    target_label = traitlets.Unicode("").tag(sync=True)
    check = traitlets.Unicode("").tag(sync=True)
    notes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    metric = traitlets.Enum(METRICS, default_value="top1_prob").tag(sync=True)
    row_range = traitlets.List(traitlets.Int()).tag(sync=True)
    pos_range = traitlets.List(traitlets.Int()).tag(sync=True)
    pinned = traitlets.List().tag(sync=True)

    def __init__(self, lens: LogitLens, *, window: int = 48, **kwargs: Any) -> None:
        self.lens = lens
        done = [int(i) for i in np.flatnonzero(lens.done)] or [lens.T - 1]
        cols = lens.columns(done)
        T = lens.T
        super().__init__(
            row_names=list(lens.row_names),
            tokens=[display_token(t) for t in lens.tokens],
            raw_tokens=list(lens.tokens),
            k=lens.k,
            n_rows=lens.R,
            n_pos=T,
            initial={"positions": done, "arrays": {k: encode_array(v) for k, v in _pack(cols).items()}},
            vocab=self._labels(lens.vocab_for(done)),
            targets=[int(t) for t in lens.targets.tolist()],
            target_label=lens.target_label,
            row_range=[0, lens.R - 1],
            pos_range=[max(0, T - window), T],
            **kwargs,
        )

    @staticmethod
    def _labels(vocab: dict[int, str]) -> dict[str, str]:
        return {str(i): display_token(s) for i, s in vocab.items()}

    @rpc("columns")
    def _columns(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        T = self.lens.T
        start = max(0, int(params.get("start", 0)))
        end = min(T, int(params.get("end", T)))
        pos = list(range(start, end))
        if not pos:
            return {"positions": [], "vocab": {}}, {}
        cols = self.lens.columns(pos)
        return {"positions": pos, "vocab": self._labels(self.lens.vocab_for(pos))}, _pack(cols)

    @rpc("cell")
    def _cell(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        row, pos = int(params.get("row", 0)), int(params.get("pos", 0))
        if not (0 <= row < self.lens.R and 0 <= pos < self.lens.T):
            raise IndexError(f"no cell [{row}, {pos}]")
        k = max(1, min(int(params.get("k", 20)), 100))
        ids, probs = self.lens.cell(row, pos, k)
        labels = self._labels({int(i): self.lens.vocab[int(i)] for i in ids})
        return {"row": row, "pos": pos, "vocab": labels}, {"ids": ids.astype(np.int32), "probs": probs.astype(np.float32)}

    def fallback_html(self) -> str:
        lens = self.lens
        t = lens.T - 1
        col = lens.table["top_ids"][:, t, 0]
        cells = "".join(
            f"<tr><td>{html.escape(n)}</td><td>{html.escape(display_token(lens.vocab.get(int(i), f'#{int(i)}')))}</td></tr>"
            for n, i in zip(lens.row_names, col, strict=True)
        )
        return f"<div><b>nbdebug logit lens</b> (last position)<table>{cells}</table></div>"

    def __repr__(self) -> str:
        return f"LogitLensWidget({self.lens.R} rows × {self.lens.T} positions, top-{self.lens.k})"
