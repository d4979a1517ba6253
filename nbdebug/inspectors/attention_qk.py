"""Attention summaries and head matrices computed from queries and keys, a few rows at a time.

The attention view keeps, per layer, one sequence's queries ``(H, T, dh)`` and keys
``(Hkv, T, dh)`` (within ``--max-bytes``) instead of ``L × H × T × T`` probabilities. Everything
the view shows is recomputed from them in chunks of heads and query rows whose working set is
bounded by ``chunk_bytes``: per-head summaries (identical to :func:`~nbdebug.inspectors.attention.head_stats`
on the full matrix), thumbnails, and one head's matrix on demand (downsampled when the requested
token range is wider than ``max_side``). Pure computation: no hooks, no model.

>>> ranges = KeyRanges.causal(T)                                  # doctest: +SKIP
>>> st = summarize_qk(q, k, ranges, scaling=dh ** -0.5)           # like head_stats(softmax(q k^T))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["AttentionDetail", "KeyRanges", "LayerQK", "head_probs", "key_ranges", "summarize_qk"]

#: working memory of one chunk of probabilities (float32), unless the caller gives a budget
CHUNK_BYTES = 16 * 2**20


@dataclass
class KeyRanges:
    """Which keys each query row may attend to: ``lo[i] ≤ j ≤ hi[i]`` (causal, sliding window,
    bidirectional), or a ``dense (T, T)`` bool mask when the pattern is not an interval per row.

    ``lo``/``hi`` live on the CPU; what the chunked computations need from them (Python bounds, device
    copies) is derived once per object and cached, so summarising many layers that share one mask
    does not read or copy anything per layer."""

    lo: torch.Tensor
    hi: torch.Tensor
    dense: torch.Tensor | None = None
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def causal(cls, T: int) -> KeyRanges:
        return cls(torch.zeros(T, dtype=torch.long), torch.arange(T))

    @classmethod
    def full(cls, T: int) -> KeyRanges:
        return cls(torch.zeros(T, dtype=torch.long), torch.full((T,), T - 1, dtype=torch.long))

    @property
    def T(self) -> int:
        return int(self.lo.shape[0])

    def _bounds(self) -> tuple[list[int], list[int]]:
        if "bounds" not in self._cache:
            self._cache["bounds"] = (self.lo.tolist(), self.hi.tolist())
        return self._cache["bounds"]

    @property
    def is_causal(self) -> bool:
        return self.dense is None and self.T > 1 and self._bounds()[1] == list(range(self.T))

    @property
    def sees_last_key(self) -> bool:
        """Every row may attend to the last key (not banded)."""
        return all(h == self.T - 1 for h in self._bounds()[1])

    def on(self, device: torch.device | str | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(lo, hi, dense)`` on ``device`` (copied once per device)."""
        key = ("on", str(device))
        if key not in self._cache:
            self._cache[key] = (self.lo.to(device), self.hi.to(device), None if self.dense is None else self.dense.to(device))
        return self._cache[key]

    def keys(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Number of visible keys per row (on ``device``)."""
        lo, hi, dense = self.on(device) if device is not None else (self.lo, self.hi, self.dense)
        return dense.sum(-1) if dense is not None else hi - lo + 1

    def allowed(self, r0: int, r1: int, device: torch.device | None = None, k0: int = 0, k1: int | None = None) -> torch.Tensor:
        """``(r1-r0, k1-k0)`` bool: which keys ``k0:k1`` query rows ``r0:r1`` may attend to."""
        k1 = self.T if k1 is None else k1
        lo, hi, dense = self.on(device)
        if dense is not None:
            return dense[r0:r1, k0:k1]
        j = torch.arange(k0, k1, device=device)
        return (j >= lo[r0:r1, None]) & (j <= hi[r0:r1, None])

    def key_span(self, r0: int, r1: int) -> tuple[int, int]:
        """Keys ``[k0, k1)`` that rows ``r0:r1`` can see at all (causal rows never see later keys)."""
        if self.dense is not None:
            return 0, self.T
        lo, hi = self._bounds()
        return min(lo[r0:r1]), max(hi[r0:r1]) + 1

    @property
    def nbytes(self) -> int:
        return 16 * self.T + (self.dense.numel() if self.dense is not None else 0)


def key_ranges(mask: torch.Tensor | None, is_causal: bool, T: int, item: int = 0,
               positions: torch.Tensor | None = None) -> KeyRanges | str:
    """:class:`KeyRanges` of batch item ``item`` from the mask an attention function received
    (``None`` = causal when ``is_causal``; bool ``True`` = attend; additive float ``0``/``-inf``),
    restricted to ``positions`` (padding removed). A string says why it cannot be used."""
    if mask is None:
        return KeyRanges.causal(T) if (is_causal and T > 1) else KeyRanges.full(T)
    if mask.dim() != 4:
        return f"attention mask of shape {tuple(mask.shape)}"
    m = mask[min(item, mask.shape[0] - 1), 0]
    if positions is not None:
        idx = positions.to(m.device)
        m = m.index_select(0, idx).index_select(1, idx)
    if m.shape != (T, T):
        return f"attention mask of shape {tuple(mask.shape)} for {T} tokens"
    if m.dtype == torch.bool:
        allowed = m
    else:
        allowed = m > torch.finfo(m.dtype).min / 2
        if bool((m[allowed] != 0).any()):
            return "the attention mask carries a position bias (ALiBi-like)"
    allowed = allowed.cpu()
    count = allowed.sum(-1)
    if bool((count == 0).any()):
        return "a query row sees no key"
    lo = allowed.to(torch.uint8).argmax(-1)
    hi = T - 1 - allowed.flip(-1).to(torch.uint8).argmax(-1)
    if bool((count == hi - lo + 1).all()):
        return KeyRanges(lo.long(), hi.long())
    return KeyRanges(lo.long(), hi.long(), dense=allowed.clone())


@dataclass
class LayerQK:
    """One layer's queries ``(H, T, dh)`` and keys ``(Hkv, T, dh)`` of one sequence, and how they combine.

    ``scale`` (a 0-d float32 tensor on the queries' device, or None) multiplies every ``q·k``: float16
    copies of float32 queries/keys are stored divided by a power of two so that they cannot overflow.
    """

    q: torch.Tensor
    k: torch.Tensor
    ranges: KeyRanges
    scaling: float
    softcap: float | None = None
    scale: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return self.q.numel() * self.q.element_size() + self.k.numel() * self.k.element_size() + self.ranges.nbytes


def _bias(x: LayerQK, r0: int, r1: int, k0: int = 0, k1: int | None = None) -> torch.Tensor:
    """Additive mask ``(r1-r0, k1-k0)``: 0 where a query row may attend, -inf elsewhere."""
    allowed = x.ranges.allowed(r0, r1, x.q.device, k0, k1)
    return torch.zeros(allowed.shape, device=x.q.device).masked_fill_(~allowed, -math.inf)


def _probs(x: LayerQK, h0: int, h1: int, r0: int, r1: int, bias: torch.Tensor | None = None,
           k0: int = 0, k1: int | None = None) -> torch.Tensor:
    """Float32 probabilities ``(h1-h0, r1-r0, k1-k0)`` of heads ``h0:h1``, query rows ``r0:r1``, over
    keys ``k0:k1`` (which must include every key those rows can see)."""
    H, Hkv = x.q.shape[0], x.k.shape[0]
    rep = max(1, H // Hkv)
    k1 = x.k.shape[1] if k1 is None else k1
    qc = x.q[h0:h1, r0:r1].float()
    if x.scale is not None:
        qc = qc * x.scale
    if rep == 1:
        kc = x.k[h0:h1, k0:k1].float().transpose(1, 2)
    else:
        kc = x.k[:, k0:k1].index_select(0, torch.arange(h0, h1, device=x.k.device) // rep).float().transpose(1, 2)
    bias = _bias(x, r0, r1, k0, k1) if bias is None else bias
    if x.softcap:
        s = torch.bmm(qc, kc).mul_(x.scaling / x.softcap).tanh_().mul_(x.softcap).add_(bias)
    else:  # one fused pass: bias + scaling · q kᵀ
        s = torch.baddbmm(bias.expand(h1 - h0, -1, -1), qc, kc, alpha=x.scaling)
    return s.softmax(-1)


def _plan(x: LayerQK, chunk_bytes: int, s: int) -> tuple[int, int]:
    """Heads and rows per chunk so that three float32 chunk-sized tensors fit in ``chunk_bytes``.

    Banded (causal) layers get 8+ row blocks (a block never computes keys none of its rows sees);
    rows come in multiples of the thumbnail bin height when the bins are even, so blocks pool
    without padding.
    """
    H, T = x.q.shape[0], x.q.shape[1]
    elems = max(T, chunk_bytes // 12)
    rc = T
    if x.ranges.dense is None and T >= 256 and not x.ranges.sees_last_key:
        rc = -(-T // 8)
    rc = max(1, min(rc, elems // T))
    w = T // s if T % s == 0 else 0
    if w and rc >= w:
        rc = rc // w * w
    hc = max(1, min(H, elems // (rc * T)))
    return hc, rc


@torch.no_grad()
def summarize_qk(x: LayerQK, thumb: int = 64, chunk_bytes: int = CHUNK_BYTES) -> dict[str, Any]:
    """Per-head summaries of one layer, the same keys and values as ``head_stats(P)`` of the full
    probabilities ``P``, computed chunk by chunk (never more than ``chunk_bytes`` of probabilities)."""
    H, T = x.q.shape[0], x.q.shape[1]
    dev = x.q.device
    causal = x.ranges.is_causal
    first = 1 if (causal and T > 1) else 0
    n = T - first
    keys = x.ranges.keys(dev).float()
    norm = torch.log(keys).clamp_min(1e-12)
    s = min(T, thumb)
    bins = torch.arange(s, device=dev)
    b_lo, b_hi = (bins * T) // s, ((bins + 1) * T + s - 1) // s  # adaptive pooling bins
    height = (b_hi - b_lo).float().view(1, s, 1)
    ent, nent, diag, prev = (torch.zeros(H, device=dev) for _ in range(4))
    col = torch.zeros(H, T, device=dev)
    pooled = torch.zeros(H, s, s, device=dev)
    hc, rc = _plan(x, chunk_bytes, s)
    w = T // s if T % s == 0 else 0  # even bins: pool by reshaping
    for r0 in range(0, T, rc):
        r1 = min(T, r0 + rc)
        k0, k1 = x.ranges.key_span(r0, r1)
        bias = _bias(x, r0, r1, k0, k1)  # shared by every head of this row chunk
        rows = torch.arange(r0, r1, device=dev)
        c0 = max(first, r0) - r0  # counted rows of this chunk start here
        nrm = norm[r0:r1]
        di, dok = (rows - k0).clamp(0, k1 - k0 - 1), (rows >= k0) & (rows < k1)  # the diagonal, if visible
        pi, pok = (rows - 1 - k0).clamp(0, k1 - k0 - 1), (rows - 1 >= k0) & (rows - 1 < k1) & (rows >= 1)
        for h0 in range(0, H, hc):
            h1 = min(H, h0 + hc)
            p = _probs(x, h0, h1, r0, r1, bias, k0, k1)  # (hc, rc, k1-k0)
            e = -torch.special.xlogy(p, p).sum(-1)  # (hc, rc)
            ent[h0:h1] += e[:, c0:].sum(-1)
            nent[h0:h1] += torch.where(nrm > 1e-9, e / nrm, torch.zeros_like(e))[:, c0:].sum(-1)
            col[h0:h1, k0:k1] += p[:, c0:].sum(1)
            d = p.gather(2, di.view(1, -1, 1).expand(h1 - h0, -1, 1)).squeeze(2) * dok
            diag[h0:h1] += d[:, c0:].sum(-1)
            if T > 1:
                prev[h0:h1] += (p.gather(2, pi.view(1, -1, 1).expand(h1 - h0, -1, 1)).squeeze(2) * pok).sum(-1)
            if r1 - r0 == T and k1 - k0 == T:  # whole rows at once: the same pooling as head_stats
                pooled[h0:h1] = (F.adaptive_avg_pool2d(p, (s, s)) if s < T else p) * height
            elif w and r0 % w == 0 and r1 % w == 0 and k0 % w == 0 and k1 % w == 0:  # aligned block: reshape-pool
                pooled[h0:h1, r0 // w : r1 // w, k0 // w : k1 // w] += F.avg_pool2d(p, w) * w  # (× bin height: see below)
            else:  # rows in chunks: column-pool (full width), then add each row to its bins
                if k1 - k0 < T:
                    p = F.pad(p, (k0, T - k1))
                cp = F.adaptive_avg_pool1d(p, s) if s < T else p  # (hc, rc, s)
                member = ((rows[None, :] >= b_lo[:, None]) & (rows[None, :] < b_hi[:, None])).float()
                pooled[h0:h1] += torch.matmul(member, cp)
                del cp
            del p
    pooled /= height
    mx = pooled.flatten(1).amax(-1).clamp_min(1e-12)
    out: dict[str, Any] = {
        "entropy": ent / max(n, 1),
        "norm_entropy": nent / max(n, 1),
        "col_mass": col / max(n, 1),
        "diagonal": diag / max(n, 1),
        "prev_token": prev / (T - 1) if T > 1 else torch.zeros(H, device=dev),
        "causal": causal,
        "thumb": (torch.sqrt(pooled / mx[:, None, None]) * 255 + 0.5).clamp(0, 255).to(torch.uint8),
        "thumb_max": mx,
    }
    out["max_mass"] = out["col_mass"].amax(-1)
    return out


@torch.no_grad()
def head_probs(x: LayerQK, head: int, start: int = 0, end: int | None = None, max_side: int | None = None,
               chunk_bytes: int = CHUNK_BYTES) -> tuple[np.ndarray, int]:
    """One head's probabilities over queries and keys ``start:end`` as float32 ``(n, n)``, or mean-pooled
    by ``stride`` so that no side exceeds ``max_side``. Returns ``(matrix, stride)``; rows are
    computed in chunks, so a long sequence never holds its ``T × T`` matrix."""
    T = x.q.shape[1]
    end = T if end is None else min(T, end)
    start = max(0, min(start, end - 1))
    n = end - start
    stride = 1 if (max_side is None or n <= max_side) else math.ceil(n / max_side)
    rows_per = max(stride, (max(T, chunk_bytes // 12) // T) // stride * stride)
    out = []
    for r0 in range(start, end, rows_per):
        r1 = min(end, r0 + rows_per)
        k0, k1 = x.ranges.key_span(r0, r1)  # only the keys these rows can see; zero elsewhere
        p = F.pad(_probs(x, head, head + 1, r0, r1, None, k0, k1), (k0, T - k1))[:, :, start:end]  # (1, rc, n)
        if stride > 1:
            p = F.avg_pool2d(p, stride, stride, ceil_mode=True)
        out.append(p[0])
    return torch.cat(out).cpu().numpy(), stride


class AttentionDetail:
    """Serves one head's matrix on demand from the kept queries/keys of each layer.

    ``layers[i]`` is a :class:`LayerQK` or None (not kept: over the byte budget); ``rerun(i)``, when
    given, recomputes a missing layer's queries/keys (e.g. by running the model again; it may raise
    :class:`~nbdebug.capture.weak.ModelGoneError`). Holds no reference to the model itself.
    """

    def __init__(self, layers: list[LayerQK | None], rerun: Callable[[int], LayerQK] | None = None,
                 chunk_bytes: int = CHUNK_BYTES, why_missing: str = "") -> None:
        self.layers = layers
        self.rerun = rerun
        self.chunk_bytes = chunk_bytes
        self.why_missing = why_missing

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes for x in self.layers if x is not None)

    def layer(self, i: int) -> LayerQK:
        x = self.layers[i]
        if x is not None:
            return x
        if self.rerun is None:
            raise RuntimeError(f"layer {i}: queries/keys not kept ({self.why_missing or 'over the byte budget'})")
        return self.rerun(i)

    def head(self, layer: int, head: int, start: int = 0, end: int | None = None,
             max_side: int | None = None) -> tuple[np.ndarray, int]:
        """``(matrix float32, stride)`` of one head over tokens ``start:end`` (see :func:`head_probs`)."""
        return head_probs(self.layer(layer), head, start, end, max_side, self.chunk_bytes)
