"""Attention heads: per-head metrics, downsampled thumbnails, and the full matrices kept in the kernel.

Pure computation on tensors/arrays; the recorder feeds it one layer at a time while the model runs
(:class:`AttentionAccumulator`), and BertViz users can call :func:`from_attentions` with the tuple
``model(..., output_attentions=True).attentions`` and a token list.

>>> res = from_attentions(out.attentions, tokens)          # doctest: +SKIP
>>> res.finding                                            # heads unusual for this model
'4 of 72 heads stand out: L0H2 attends to the previous token (100%; typical head here: 5%); ...'
>>> res.summary                                            # the sinks: normal, stated neutrally
'26 of 72 heads put > 50% on [CLS]; 0 on [SEP]; 0 near-uniform'
>>> res.metrics["prev_token"][3, 7]                         # layer 3, head 7
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .attention_findings import HeadFindings, head_findings

__all__ = [
    "METRICS",
    "AttentionAccumulator",
    "AttentionResult",
    "display_token",
    "from_attentions",
    "head_stats",
    "quantize_head",
]

#: Per-head metrics, in the order of ``AttentionResult.metric_array()``.
METRICS = ("entropy", "norm_entropy", "first_mass", "sep_mass", "prev_token", "diagonal", "max_mass")
SINK_THRESHOLD = 0.5
UNIFORM_THRESHOLD = 0.95
THUMB = 64

_SEP = {"[SEP]", "</s>", "<|endoftext|>", "<eos>", "<|im_end|>", "<|eot_id|>"}
_BOS = {"[CLS]", "<s>", "<|endoftext|>", "<bos>", "<|begin_of_text|>", "<|im_start|>", "<|startoftext|>"}
_MARKERS = str.maketrans({"Ġ": "␣", "▁": "␣", "Ċ": "↵", "\n": "↵", "ĉ": "⇥", "\t": "⇥", "\r": "␍", "č": "␍"})


def display_token(tok: str) -> str:
    """A readable label for a raw token: byte-level/sentencepiece space markers and newlines made visible.

    ``"ĠParis"`` and ``" Paris"`` → ``"␣Paris"``, ``"▁the"`` → ``"␣the"``, ``"Ċ"`` → ``"↵"``,
    ``"<0x0A>"`` → ``"↵"``; spaces inside a token are kept as they are.
    The result is still untrusted text (shown with ``textContent`` only).
    """
    if len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
        try:
            ch = chr(int(tok[3:5], 16))
        except ValueError:
            ch = ""
        if ch:
            tok = ch
    core = tok.strip(" ")
    if core != tok:  # decoded text (" Paris"): make leading/trailing spaces visible, keep inner ones
        lead = len(tok) - len(tok.lstrip(" "))
        tail = len(tok) - len(tok.rstrip(" ")) if core else 0
        tok = "␣" * lead + core + "␣" * tail
    out = tok.translate(_MARKERS)
    out = "".join(c if c.isprintable() or c in "␣↵⇥␍" else f"\\x{ord(c):02x}" for c in out)
    return out if out else "∅"


def head_stats(p: torch.Tensor, causal: bool | None = None, thumb: int = THUMB) -> dict[str, torch.Tensor]:
    """Metrics and a thumbnail for the heads of one layer, ``p`` of shape ``(H, T, T)`` (rows sum to 1).

    Returns tensors: ``entropy``/``norm_entropy``/``prev_token``/``diagonal``/``max_mass`` ``(H,)``,
    ``col_mass`` ``(H, T)`` (mean attention each key receives, over the query rows that count),
    ``thumb`` ``(H, s, s)`` uint8 (mean-pooled, scaled by the head's max, sqrt-encoded), ``thumb_max``
    ``(H,)``, and ``causal``. For causal heads the first query row (which can only see token 0) is
    left out of the means, so sinks are not inflated by it.
    """
    p = p.float()
    H, T, _ = p.shape
    if causal is None:  # the first query of a causal head sees only token 0 (cheap: no T×T pass)
        causal = bool(T > 1 and p[:, 0, 1:].abs().amax() == 0 and p[:, :-1, -1].abs().amax() == 0)
    rows = slice(1, T) if (causal and T > 1) else slice(0, T)
    q = p[:, rows]
    nq = q.shape[1]
    ent_rows = -torch.special.xlogy(q, q).sum(-1)  # (H, nq)
    if causal:
        keys = torch.arange(2 if T > 1 else 1, T + 1, dtype=torch.float32, device=p.device)[:nq]
    else:
        keys = torch.full((nq,), float(T), device=p.device)
    norm = torch.log(keys).clamp_min(1e-12)
    out: dict[str, Any] = {
        "entropy": ent_rows.mean(-1),
        "norm_entropy": torch.where(norm > 1e-9, ent_rows / norm, torch.zeros_like(ent_rows)).mean(-1),
        "col_mass": q.mean(1),  # (H, T)
        "diagonal": torch.diagonal(p, dim1=-2, dim2=-1)[:, rows].mean(-1),
        "prev_token": torch.diagonal(p, offset=-1, dim1=-2, dim2=-1).mean(-1)
        if T > 1
        else torch.zeros(H, device=p.device),
        "causal": causal,
    }
    out["max_mass"] = out["col_mass"].amax(-1)
    s = min(T, thumb)
    pooled = F.adaptive_avg_pool2d(p.unsqueeze(0), (s, s))[0] if s < T else p
    mx = pooled.flatten(1).amax(-1).clamp_min(1e-12)
    out["thumb"] = (torch.sqrt(pooled / mx[:, None, None]) * 255 + 0.5).clamp(0, 255).to(torch.uint8)
    out["thumb_max"] = mx
    return out


def quantize_head(p: np.ndarray | torch.Tensor) -> np.ndarray:
    """A head's ``(T, T)`` probabilities as uint8, sqrt-encoded: ``v = round(255·sqrt(p))``.

    Decoding (``(v/255)²``) is exact to ±0.004·sqrt(p): small weights stay visible instead of
    rounding to 0 as with a linear code.
    """
    t = torch.as_tensor(p).float().clamp(0, 1)
    return (torch.sqrt(t) * 255 + 0.5).to(torch.uint8).numpy()


def _special_positions(tokens: Sequence[str]) -> tuple[list[int], list[int]]:
    first = [0] if tokens else []
    sep = [i for i, t in enumerate(tokens) if t in _SEP and i != 0]
    return first, sep


@dataclass
class AttentionResult:
    """Everything the attention view shows, as plain data.

    ``attention`` is ``(L, H, T, T)`` float16 (probabilities of batch item ``batch_index``) when it
    was kept (given tensors, or small enough for ``max_bytes``); otherwise ``detail`` recomputes one
    head at a time from the kept queries/keys (:meth:`head`). ``metrics[name]`` is ``(L, H)`` float32 for every name in :data:`METRICS`; ``flags`` is ``(L, H)``
    uint8 (bit 1: sink on the first token, bit 2: sink on [SEP]/EOS, bit 4: near-uniform);
    ``thumbs`` ``(L, H, s, s)`` uint8. ``path`` says how probabilities were obtained.
    ``generated[t]`` is True for tokens produced by ``generate()`` (empty: none were).
    """

    attention: np.ndarray | None
    tokens: list[str]
    layer_names: list[str]
    metrics: dict[str, np.ndarray]
    thumbs: np.ndarray
    flags: np.ndarray
    causal: bool
    path: str
    summary: str
    col_mass: np.ndarray  # (L, H, T)
    display: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    detail: Any = None  # AttentionDetail (queries/keys kept per layer) when ``attention`` is None
    generated: list[bool] = field(default_factory=list)
    findings: HeadFindings | None = None  # heads unusual for this model (attention_findings.py)

    @property
    def finding(self) -> str:
        """The view's first line: which heads stand out for this model (or that none does)."""
        return self.findings.sentence if self.findings is not None else ""

    @property
    def shape(self) -> tuple[int, int, int]:
        L, H = self.thumbs.shape[:2]
        return int(L), int(H), len(self.tokens)

    def head(self, layer: int, head: int) -> np.ndarray:
        """Float32 ``(T, T)`` probabilities of one head (recomputed from queries/keys when not kept)."""
        if self.attention is not None:
            return self.attention[layer, head].astype(np.float32)
        if self.detail is None:
            raise RuntimeError("head matrices were not kept (over the byte budget); re-run with a larger --max-bytes")
        return self.detail.head(layer, head)[0]

    def metric_array(self) -> np.ndarray:
        """All metrics stacked: ``(len(METRICS), L, H)`` float32."""
        return np.stack([self.metrics[m] for m in METRICS]).astype(np.float32)

    def sink_heads(self, threshold: float = SINK_THRESHOLD) -> list[tuple[int, int]]:
        """(layer, head) pairs putting more than ``threshold`` of their mass on the first token."""
        return [tuple(map(int, x)) for x in np.argwhere(self.metrics["first_mass"] > threshold)]  # type: ignore[misc]

    def __repr__(self) -> str:
        L, H, T = self.shape
        return f"AttentionResult({L} layers × {H} heads × {T} tokens, path={self.path!r}: {self.summary})"


class AttentionAccumulator:
    """Receives one layer's ``(B, H, T, T)`` probabilities at a time; builds an :class:`AttentionResult`.

    Keeps only batch item ``batch_index`` (restricted to ``positions`` when padding is trimmed), as
    float16 when the ``(L, H, T, T)`` array fits in ``max_bytes`` (``None``: always), plus each
    layer's metrics and thumbnails computed while the float32 tensor exists.
    """

    def __init__(
        self, n_layers: int, batch_index: int = 0, positions: torch.Tensor | None = None, thumb: int = THUMB,
        max_bytes: int | None = None,
    ) -> None:
        self.n_layers = n_layers
        self.batch_index = batch_index
        self.positions = positions
        self.thumb = thumb
        self.max_bytes = max_bytes
        self.dropped = ""
        self.layers: list[dict[str, Any]] = []
        self.full: np.ndarray | None = None  # (L, H, T, T) float16, filled layer by layer

    def add(self, attn: torch.Tensor) -> None:
        with torch.no_grad():
            p = attn.detach()
            if p.dim() == 4:
                p = p[min(self.batch_index, p.shape[0] - 1)]
            if self.positions is not None:
                idx = self.positions.to(p.device)
                p = p.index_select(1, idx).index_select(2, idx)
                p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
            stats = head_stats(p, thumb=self.thumb)
            i = len(self.layers)
            if i >= self.n_layers:
                return
            self.layers.append({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in stats.items()})
            need = self.n_layers * p.numel() * 2
            if self.max_bytes is not None and need > self.max_bytes:
                self.dropped = f"head matrices not kept ({need / 2**20:.1f} MB > the {self.max_bytes / 2**20:.1f} MB budget)"
                return
            if self.full is None:  # one buffer for every layer: no stacking copy at the end
                self.full = np.empty((self.n_layers, *p.shape), np.float16)
            torch.from_numpy(self.full[i]).copy_(p)

    def result(self, tokens: Sequence[str], layer_names: Sequence[str], path: str) -> AttentionResult:
        if not self.layers:
            raise RuntimeError("no attention probabilities were captured (did the cell run the model?)")
        if len(self.layers) != self.n_layers:
            raise RuntimeError(f"attention captured for {len(self.layers)} of {self.n_layers} layers")
        attention, self.full = (None if self.dropped else self.full), None
        res = build_result(self.layers, list(tokens), list(layer_names), path, attention=attention)
        if self.dropped:
            res.notes.append(self.dropped)
        return res


def build_result(
    layers: list[dict[str, Any]], tokens: list[str], layer_names: list[str], path: str,
    attention: np.ndarray | None = None, detail: Any = None,
) -> AttentionResult:
    """An :class:`AttentionResult` from per-layer summaries (``head_stats`` / ``summarize_qk`` dicts)."""
    L = len(layers)
    H, T = layers[0]["col_mass"].shape
    if len(tokens) != T:
        tokens = [f"#{i}" for i in range(T)] if not tokens else (tokens + [f"#{i}" for i in range(len(tokens), T)])[:T]
    metrics = {m: torch.stack([lay[m] for lay in layers]).float().numpy() for m in ("entropy", "norm_entropy", "prev_token", "diagonal", "max_mass")}
    col_mass = torch.stack([lay["col_mass"] for lay in layers]).float().numpy()  # (L, H, T)
    first, sep = _special_positions(tokens)
    metrics["first_mass"] = col_mass[:, :, first].sum(-1) if first else np.zeros((L, H), np.float32)
    metrics["sep_mass"] = col_mass[:, :, sep].sum(-1) if sep else np.zeros((L, H), np.float32)
    causal = all(bool(lay["causal"]) for lay in layers)
    flags = np.zeros((L, H), np.uint8)
    flags |= (metrics["first_mass"] > SINK_THRESHOLD).astype(np.uint8) * 1
    flags |= (metrics["sep_mass"] > SINK_THRESHOLD).astype(np.uint8) * 2
    if T > 4:
        flags |= (metrics["norm_entropy"] > UNIFORM_THRESHOLD).astype(np.uint8) * 4
    thumbs = torch.stack([lay["thumb"] for lay in layers]).numpy()
    n = L * H
    first_label = tokens[0] if tokens and tokens[0] in _BOS else "the first token"
    parts = [f"{int((flags & 1).astype(bool).sum())} of {n} heads put > 50% on {first_label}"]
    if sep:
        parts.append(f"{int((flags & 2).astype(bool).sum())} on {tokens[sep[-1]]}")
    if T > 4:
        parts.append(f"{int((flags & 4).astype(bool).sum())} near-uniform")
    display = [display_token(t) for t in tokens]
    sink_label = first_label + (f" or {tokens[sep[-1]]}" if sep else "")
    findings = head_findings(metrics, col_mass, display, sink_positions=first + sep, sink_label=sink_label)
    return AttentionResult(
        attention=attention,
        tokens=tokens,
        layer_names=layer_names,
        metrics={k: v.astype(np.float32) for k, v in metrics.items()},
        thumbs=thumbs,
        flags=flags,
        causal=causal,
        path=path,
        summary="; ".join(parts),
        col_mass=col_mass.astype(np.float32),
        display=display,
        detail=detail,
        findings=findings,
    )


def from_attentions(
    attentions: Sequence[torch.Tensor] | torch.Tensor | np.ndarray,
    tokens: Sequence[str] | None = None,
    *,
    batch_index: int = 0,
    layer_names: Sequence[str] | None = None,
) -> AttentionResult:
    """BertViz-style entry point: ``attentions`` is the per-layer tuple of ``(B, H, T, T)`` tensors
    (``output_attentions=True``) or one ``(L, [B,] H, T, T)`` array; ``tokens`` the token strings."""
    if isinstance(attentions, np.ndarray):
        attentions = torch.from_numpy(attentions)
    if isinstance(attentions, torch.Tensor):
        layers_in = list(attentions) if attentions.dim() in (4, 5) else [attentions]
    else:
        layers_in = list(attentions)
    acc = AttentionAccumulator(len(layers_in), batch_index=batch_index)
    for a in layers_in:
        if a is None:
            raise ValueError("an attention entry is None: the model ran with SDPA; load it with attn_implementation='eager'")
        acc.add(torch.as_tensor(a))
    names = list(layer_names) if layer_names is not None else [f"layer {i}" for i in range(len(layers_in))]
    return acc.result(list(tokens or []), names, "given attention tensors")


