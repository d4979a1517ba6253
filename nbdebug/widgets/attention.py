"""The attention-head viewer: a layers × heads grid of thumbnails and metrics; heads fetched on click.

>>> w = AttentionWidget(result)                  # doctest: +SKIP
>>> w.selected = [[3, 7]]                        # doctest: +SKIP  (opens layer 3, head 7)
>>> head_view(out.attentions, tokens)            # doctest: +SKIP  (BertViz-style, one-line switch)

Synced up front: tokens, names, the finding (which heads are unusual for this model, see
:mod:`nbdebug.inspectors.attention_findings`), the sink summary, uint8 thumbnails ``(L, H, s, s)`` and the metric table
(float32, binary). A head's matrix crosses only when clicked (``head`` request, uint8
sqrt-encoded): the whole ``T × T`` up to ``FULL_SIDE`` tokens, else the requested token range
(``start``/``end``), mean-pooled by ``stride`` so no side exceeds ``max_side``. Heads are
recomputed from the queries/keys the recorder kept; where that needs the model and the model was
deleted, the request answers with the ``ModelGoneError`` message.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import traitlets

from ..inspectors.attention import (
    METRICS,
    AttentionResult,
    from_attentions,
    quantize_head,
)
from ..sessions.ablation_io import AblationAnswer, ablation_request
from ..sessions.protocols import Ablates
from ._base import NBWidget, rpc
from ._snapshot import MAX_SNAPSHOT_BYTES, code_html, colorize, grid, img_tag, upscale
from ._transport import encode_array

__all__ = ["AttentionWidget", "head_view", "model_view"]

#: sequences up to this many tokens send a head's whole matrix at once
FULL_SIDE = 1024


class AttentionWidget(NBWidget):
    """Per-head attention overview and on-demand detail.

    Traits: ``tokens`` (readable labels), ``raw_tokens``, ``layer_names``, ``n_layers``, ``n_heads``,
    ``seq_len``, ``thumbs`` (binary uint8), ``metrics`` (binary float32 ``(M, L, H)``),
    ``metric_names``, ``flags`` (binary uint8 ``(L, H)``), ``summary``, ``path``, ``notes``,
    ``causal``, ``generated`` (per token: 1 if produced by ``generate()``), ``finding`` (the header
    sentence), ``outliers`` (one dict per unusual head: ``layer``, ``head``, ``kind``, ``value``,
    ``typical``, ``z``, ``text``, ``token``), ``outlier_rule``. UI state synced both ways: ``selected``
    (list of ``[layer, head]``), ``metric``, ``token_range`` (``[start, end)`` shown in the detail),
    ``highlight_token`` (a position to mark, -1 none), ``outliers_only`` (the grid shows only the
    unusual heads).
    """

    _view_name_ = "attention"

    tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)
    raw_tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)
    layer_names = traitlets.List(traitlets.Unicode()).tag(sync=True)
    n_layers = traitlets.Int(0).tag(sync=True)
    n_heads = traitlets.Int(0).tag(sync=True)
    seq_len = traitlets.Int(0).tag(sync=True)
    thumbs = traitlets.Dict().tag(sync=True)
    metrics = traitlets.Dict().tag(sync=True)
    metric_names = traitlets.List(traitlets.Unicode()).tag(sync=True)
    flags = traitlets.Dict().tag(sync=True)
    summary = traitlets.Unicode("").tag(sync=True)
    #: the header's first line: which heads stand out for this model
    finding = traitlets.Unicode("").tag(sync=True)
    #: the unusual heads, largest robust z first (HeadOutlier.to_json)
    outliers = traitlets.List(traitlets.Dict()).tag(sync=True)
    #: how "unusual" is decided (shown in the details)
    outlier_rule = traitlets.Unicode("").tag(sync=True)
    path = traitlets.Unicode("").tag(sync=True)
    notes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    causal = traitlets.Bool(False).tag(sync=True)
    #: per token, 1 when generate() produced it (empty: no generation)
    generated = traitlets.List(traitlets.Int()).tag(sync=True)
    #: the widest side a head's matrix is sent at (wider ranges are mean-pooled)
    full_side = traitlets.Int(FULL_SIDE).tag(sync=True)
    #: heads shown in the detail panel, as [layer, head] pairs (the first is the matrix)
    selected = traitlets.List().tag(sync=True)
    #: metric printed under each thumbnail
    metric = traitlets.Unicode("first_mass").tag(sync=True)
    #: [start, end) token range of the detail view ([] = automatic)
    token_range = traitlets.List().tag(sync=True)
    #: token position marked in the detail view (-1 = none); a dashboard sets it from the logit lens
    highlight_token = traitlets.Int(-1).tag(sync=True)
    #: the grid shows only the heads that stand out (the layers without one are left out)
    outliers_only = traitlets.Bool(False).tag(sync=True)
    #: why a head cannot be ablated here (one line), "" when the ``ablate`` request works
    ablate_note = traitlets.Unicode("").tag(sync=True)
    #: the heads of the last ablation the kernel ran, as [layer, head] pairs, and how many it ran (tests)
    ablated = traitlets.List().tag(sync=True)
    ablate_clicks = traitlets.Int(0).tag(sync=True)

    def __init__(self, result: AttentionResult, *, ablation: Ablates | None = None, ablate_note: str = "", **kwargs: Any) -> None:
        self.result = result
        #: an :class:`~nbdebug.sessions.ablation.AblationSession` on the shown prompt (None: no ablation)
        self.ablation = ablation
        if ablation is None and not ablate_note:
            ablate_note = "ablation needs the model: open this view with %%nndebug model --view attention"
        L, H, T = result.shape
        super().__init__(
            tokens=result.display or list(result.tokens),
            raw_tokens=list(result.tokens),
            layer_names=list(result.layer_names),
            n_layers=L,
            n_heads=H,
            seq_len=T,
            thumbs=encode_array(result.thumbs),
            metrics=encode_array(result.metric_array()),
            metric_names=list(METRICS),
            flags=encode_array(result.flags),
            summary=result.summary,
            finding=result.finding,
            headline=result.finding,
            outliers=[o.to_json() for o in result.findings.outliers] if result.findings else [],
            outlier_rule=result.findings.rule if result.findings else "",
            path=result.path,
            notes=list(result.notes),
            causal=result.causal,
            generated=[int(g) for g in result.generated],
            ablate_note=ablate_note,
            **kwargs,
        )

    @traitlets.validate("selected")
    def _check_selected(self, proposal: Any) -> list[list[int]]:
        L, H, _ = self.result.shape
        out = []
        for pair in proposal["value"]:
            layer, head = (int(x) for x in pair)
            if not (0 <= layer < L and 0 <= head < H):
                raise traitlets.TraitError(f"no head [{layer}, {head}] (model has {L} layers × {H} heads)")
            out.append([layer, head])
        return out

    @rpc("head")
    def _head(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        L, H, T = self.result.shape
        layer, head = int(params.get("layer", 0)), int(params.get("head", 0))
        if not (0 <= layer < L and 0 <= head < H):
            raise IndexError(f"no head [{layer}, {head}]")
        start = max(0, min(T - 1, int(params.get("start", 0))))
        end = max(start + 1, min(T, int(params.get("end", T))))
        side = max(1, int(params.get("max_side", self.full_side)))
        res = self.result
        if res.attention is not None:
            p = torch.from_numpy(res.attention[layer, head, start:end, start:end].astype(np.float32))
            stride = 1 if end - start <= side else -(-(end - start) // side)
            if stride > 1:
                p = torch.nn.functional.avg_pool2d(p[None], stride, stride, ceil_mode=True)[0]
            mat = p.numpy()
        elif res.detail is not None:
            mat, stride = res.detail.head(layer, head, start, end, side)
        else:
            raise RuntimeError("head matrices were not kept (over --max-bytes); re-run the cell with a larger --max-bytes")
        m = {name: float(res.metrics[name][layer, head]) for name in METRICS}
        return (
            {"layer": layer, "head": head, "encoding": "sqrt", "metrics": m, "name": res.layer_names[layer],
             "start": start, "end": end, "stride": stride},
            {"attn": quantize_head(mat)},
        )

    @rpc("ablate")
    def _ablate(self, params: dict[str, Any]) -> tuple[AblationAnswer, None]:
        """An ablation request of kind ``heads`` (:mod:`nbdebug.sessions.ablation_io`: per target a layer
        index and its heads) → the ablated run beside the clean one (:meth:`AblationSession.respond`)."""
        if self.ablation is None:
            raise RuntimeError(self.ablate_note)
        request = ablation_request(params, "heads")
        L, H, _ = self.result.shape
        for t in request["targets"]:
            for head in t["units"]:
                if not (0 <= int(t["layer"]) < L and 0 <= head < H):
                    raise IndexError(f"no head [{t['layer']}, {head}] (model has {L} layers × {H} heads)")
        out, _ = self.ablation.respond(request)
        self.ablated = [[t["layer"], h] for t in out["targets"] for h in t["units"]]
        self.ablate_clicks += 1
        return out, None

    def fallback_html(self) -> str:
        """Static snapshot: the layers × heads grid of thumbnails, one PNG per layer row."""
        L, H, T = self.result.shape
        thumbs = np.asarray(self.result.thumbs, dtype=np.uint8)
        s = thumbs.shape[-1] if thumbs.size else 0
        rows: list[str] = []
        tries = [(z, 1) for z in range(max(1, 40 // max(s, 1)), 0, -1)] + [(1, 2), (1, 3), (1, 4), (1, 8)]
        for zoom, step in tries:
            small = thumbs[:, :, ::step, ::step]
            rows = [
                f"<tr><th title='{html.escape(name)}'>{i}</th><td>"
                + img_tag(grid(colorize(upscale(small[i].transpose(1, 2, 0), zoom).transpose(2, 0, 1), "viridis"), H, gap=3),
                          f"layer {i} heads 0–{H - 1}")
                + "</td></tr>"
                for i, name in enumerate(self.result.layer_names[:L])
            ] if s else []
            if sum(map(len, rows)) < MAX_SNAPSHOT_BYTES - 8000 - 40 * min(T, 64):
                break
        outliers = self.result.findings.outliers if self.result.findings else []
        toks = self.tokens[:64]
        gen = list(self.generated) + [0] * T
        words = " ".join(f"<code title='{html.escape(t[:200])}'" + (" style='color:#8a3ffc;font-style:italic'" if gen[i] else "")
                         + f">{html.escape(t[:24])}</code>" for i, t in enumerate(toks)) + (" …" if T > len(toks) else "")
        if any(self.generated):
            words += f" <i>({sum(self.generated)} generated tokens in purple italics)</i>"
        listed = "".join(f"<li><b>{o.label}</b> {html.escape(o.short)}: {html.escape(o.text)}</li>" for o in outliers[:64])
        return (
            f"<div class='nbdebug-attention-static'><p><b>{code_html(self.headline)}</b></p>"
            + (f"<ul>{listed}</ul>" if listed else "")
            + f"<p>nbdebug attention: {L} layers × {H} heads × {T} tokens · "
            f"{html.escape(self.result.summary)} (attention sinks: normal) <i>(path: {html.escape(self.result.path)})</i></p>"
            f"<table><thead><tr><th>layer</th><td>heads 0–{H - 1} (thumbnails, viridis"
            + (f", sampled every {step} pixels" if s and step > 1 else "") + ")</td></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table><p>tokens: {words}</p></div>"
        )

    def export_requests(self, max_bytes: int = 8 * 2**20) -> list[tuple[str, dict[str, Any]]]:
        """Heads to precompute: the selected, the unusual, then the flagged, then the rest, up to ``max_bytes`` of matrices."""
        L, H, T = self.result.shape
        flags = np.asarray(self.result.flags)
        order = [(int(a), int(b)) for a, b in self.selected]
        order += [(o.layer, o.head) for o in (self.result.findings.outliers if self.result.findings else [])]
        order += [(i, j) for i in range(L) for j in range(H) if flags[i, j]]
        order += [(i, j) for i in range(L) for j in range(H)]
        n = min(T, self.full_side)
        heads = list(dict.fromkeys(order))[: max(1, max_bytes // max(n * n, 1))]
        if T <= self.full_side:
            return [("head", {"layer": i, "head": j}) for i, j in heads]
        end = min(T, 128)  # what the view asks first above full_side: the first 128 tokens (LINE_MAX in attention.ts)
        return [("head", {"layer": i, "head": j, "start": 0, "end": end}) for i, j in heads]

    def __repr__(self) -> str:
        L, H, T = self.result.shape
        return f"AttentionWidget({L} layers × {H} heads × {T} tokens; {self.result.finding} {self.result.summary})"


def head_view(
    attention: Sequence[torch.Tensor] | torch.Tensor | np.ndarray,
    tokens: Sequence[str] | None = None,
    *,
    layer: int | None = None,
    heads: Sequence[int] | None = None,
    **_ignored: Any,
) -> AttentionWidget:
    """Drop-in for ``bertviz.head_view(attention, tokens)``: the same arguments, an nbdebug widget.

    ``layer``/``heads`` preselect heads for the detail panel. BertViz options without a meaning
    here (``html_action``, ``include_layers``...) are accepted and ignored.
    """
    w = AttentionWidget(from_attentions(attention, tokens))
    if layer is not None:
        w.selected = [[layer, h] for h in (heads if heads is not None else [0])]
    return w


def model_view(
    attention: Sequence[torch.Tensor] | torch.Tensor | np.ndarray,
    tokens: Sequence[str] | None = None,
    **_ignored: Any,
) -> AttentionWidget:
    """Drop-in for ``bertviz.model_view(attention, tokens)``: the layers × heads overview."""
    return AttentionWidget(from_attentions(attention, tokens))
