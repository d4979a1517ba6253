"""Logit lens: every layer's residual stream read through the model's own final norm and unembedding.

The probability tensor ``rows × positions × vocabulary`` is never held: the vocabulary is walked in
chunks with a running top-k and a running log-sum-exp (plus the sums needed for the entropy, the
target token's rank and the KL divergence to the final layer), and positions are processed in
blocks so the working set stays a few tens of MB whatever the sequence length.

>>> lens = LogitLens(residuals, parts, k=10)             # residuals: (rows, T, d)  # doctest: +SKIP
>>> col = lens.columns([T - 1])                          # what the view shows first
>>> table = lens.result()                                # every (row, position)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["LensResult", "LogitLens", "lens_stats"]

FIELDS = ("top_ids", "top_probs", "entropy", "kl", "target_prob", "target_rank")


def lens_stats(
    normed: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    k: int = 10,
    targets: torch.Tensor | None = None,
    softcap: float | None = None,
    chunk: int = 4096,
    budget: int = 6_000_000,
) -> dict[str, torch.Tensor]:
    """Softmax statistics of ``normed (R, P, d) @ weight.T (V, d)`` without materialising ``(R, P, V)``.

    Row ``R - 1`` is the reference for the KL divergence (``KL(p_final ‖ p_row)`` per position).
    ``targets (P,)`` (``-1`` = none) gives each position's target-token probability and rank
    (0 = top-1). Returns float32/int64 tensors shaped ``(R, P[, k])``.
    """
    R, P, d = normed.shape
    V = weight.shape[0]
    k = min(k, V)
    # Rows ordered position-major: (P, R) so each position's final row sits at r = R - 1.
    x = normed.transpose(0, 1).reshape(P * R, d).float().contiguous()
    N = P * R
    C = max(256, min(chunk, budget // max(N, 1)))
    dev = x.device
    m = torch.full((N,), -float("inf"), device=dev)
    s = torch.zeros(N, device=dev)
    t = torch.zeros(N, device=dev)  # Σ e·z
    u = torch.zeros(N, device=dev)  # Σ e_final·z_row (same position)
    top_v = torch.full((N, k), -float("inf"), device=dev)
    top_i = torch.zeros((N, k), dtype=torch.long, device=dev)
    rank = torch.zeros(N, dtype=torch.long, device=dev)
    has_t = targets is not None and bool((targets >= 0).any())
    if has_t:
        assert targets is not None
        tid = targets.to(dev).clamp_min(0).repeat_interleave(R)
        zt = (x * weight.index_select(0, tid).float()).sum(-1)
        if bias is not None:
            zt = zt + bias.float().index_select(0, tid)
        if softcap:
            zt = torch.tanh(zt / softcap) * softcap
    zbuf = torch.empty((N, C), device=dev)
    ebuf = torch.empty((N, C), device=dev)
    for c0 in range(0, V, C):
        c1 = min(V, c0 + C)
        w = weight[c0:c1].float()
        z = zbuf[:, : c1 - c0]
        e = ebuf[:, : c1 - c0]
        torch.mm(x, w.T, out=z)
        if bias is not None:
            z.add_(bias[c0:c1].float())
        if softcap:
            z.div_(softcap).tanh_().mul_(softcap)
        kk = min(k, c1 - c0)
        cv, ci = z.topk(kk, dim=1)
        m_new = torch.maximum(m, cv[:, 0])
        scale = torch.exp(m - m_new)
        torch.sub(z, m_new[:, None], out=e)
        e.exp_()
        s.mul_(scale).add_(e.sum(1))
        t.mul_(scale).add_(torch.linalg.vecdot(e, z))
        ef = e.view(P, R, -1)[:, R - 1 :, :]  # (P, 1, C): final row's weights
        fscale = scale.view(P, R)[:, R - 1 :]
        u.view(P, R).mul_(fscale).add_(torch.bmm(z.view(P, R, -1), ef.transpose(1, 2)).squeeze(-1))
        m = m_new
        allv = torch.cat([top_v, cv], 1)
        alli = torch.cat([top_i, ci + c0], 1)
        top_v, pick = allv.topk(k, dim=1)
        top_i = alli.gather(1, pick)
        if has_t:
            rank += (z > zt[:, None]).sum(1)
            inside = (tid >= c0) & (tid < c1)
            if bool(inside.any()):
                rows = inside.nonzero().squeeze(1)
                zin = z[rows, tid[rows] - c0]
                rank[rows] -= (zin > zt[rows]).long()  # the target itself, if rounding put it above zt
    lse = m + torch.log(s)
    entropy = lse - t / s
    lse_f = lse.view(P, R)[:, R - 1 :]
    s_f = s.view(P, R)[:, R - 1 :]
    t_f = t.view(P, R)[:, R - 1 :]
    kl = (t_f / s_f - lse_f) - u.view(P, R) / s_f + lse.view(P, R)
    out = {
        "top_ids": top_i.view(P, R, k).transpose(0, 1),
        "top_probs": torch.exp(top_v - lse[:, None]).view(P, R, k).transpose(0, 1),
        "entropy": entropy.view(P, R).T,
        "kl": kl.clamp_min(0).T,
    }
    if has_t:
        assert targets is not None
        valid = (targets.to(dev) >= 0).repeat_interleave(R)
        out["target_prob"] = torch.where(valid, torch.exp(zt - lse), torch.nan).view(P, R).T
        out["target_rank"] = torch.where(valid, rank, -1).view(P, R).T
    else:
        out["target_prob"] = torch.full((R, P), float("nan"), device=dev)
        out["target_rank"] = torch.full((R, P), -1, dtype=torch.long, device=dev)
    return {key: v.contiguous() for key, v in out.items()}


@dataclass
class LensResult:
    """The logit-lens table: ``rows`` = embeddings then each block's output, ``T`` positions.

    ``top_ids``/``top_probs`` ``(rows, T, k)``; ``entropy`` (nats), ``kl`` (``KL(final ‖ row)``,
    nats), ``target_prob`` and ``target_rank`` (0 = top-1, -1 = no target) ``(rows, T)``;
    ``targets (T,)`` the token id each position was scored against. ``vocab`` maps every id that
    appears in ``top_ids`` (and the targets) to its token string.
    """

    row_names: list[str]
    tokens: list[str]
    top_ids: np.ndarray
    top_probs: np.ndarray
    entropy: np.ndarray
    kl: np.ndarray
    target_prob: np.ndarray
    target_rank: np.ndarray
    targets: np.ndarray
    target_label: str
    vocab: dict[int, str] = field(default_factory=dict)
    check: str = ""
    notes: list[str] = field(default_factory=list)

    def top_tokens(self, row: int, pos: int) -> list[tuple[str, float]]:
        """``[(token, prob), ...]`` of one cell."""
        return [(self.vocab.get(int(i), f"#{int(i)}"), float(p)) for i, p in zip(self.top_ids[row, pos], self.top_probs[row, pos])]

    def top1(self, row: int = -1) -> list[str]:
        """Top-1 token string of every position in one row (default: the final row)."""
        return [self.vocab.get(int(i), f"#{int(i)}") for i in self.top_ids[row, :, 0]]

    def __repr__(self) -> str:
        R, T, k = self.top_ids.shape
        return f"LensResult({R} rows × {T} positions, top-{k}; final row: {self.top1()[-1]!r} at the last position)"


class LogitLens:
    """Holds the residual streams of one sequence and computes lens columns on demand (cached).

    ``residuals``: ``(rows, T, d)`` — embeddings, then each block's output. ``normed_fn`` applies
    the model's final norm (and any projection before the head); ``weight``/``bias`` are the
    unembedding. Columns are computed in position blocks and remembered, so the first column the
    view shows costs one small GEMM and the rest are filled when asked (or by :meth:`result`).
    """

    def __init__(
        self,
        residuals: torch.Tensor,
        normed_fn: Callable[[torch.Tensor], torch.Tensor],
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        k: int = 10,
        targets: torch.Tensor | None = None,
        softcap: float | None = None,
        row_names: Sequence[str] | None = None,
        tokens: Sequence[str] | None = None,
        decode: Callable[[list[int]], list[str]] | None = None,
        target_label: str = "",
        position_block: int | None = None,
    ) -> None:
        self.residuals = residuals
        self.normed_fn = normed_fn
        self.weight = weight
        self.bias = bias
        self.k = k
        self.softcap = softcap
        R, T, _ = residuals.shape
        self.R, self.T = R, T
        self.targets = targets if targets is not None else torch.full((T,), -1, dtype=torch.long)
        self.row_names = list(row_names) if row_names is not None else ["embed"] + [f"block {i}" for i in range(R - 1)]
        self.tokens = list(tokens) if tokens is not None else [f"#{i}" for i in range(T)]
        self.decode = decode or (lambda ids: [f"#{i}" for i in ids])
        self.target_label = target_label
        self.position_block = position_block or max(1, 2048 // max(R, 1))
        self.done = np.zeros(T, dtype=bool)
        self.table: dict[str, np.ndarray] = {
            "top_ids": np.zeros((R, T, k), np.int64),
            "top_probs": np.zeros((R, T, k), np.float32),
            "entropy": np.full((R, T), np.nan, np.float32),
            "kl": np.full((R, T), np.nan, np.float32),
            "target_prob": np.full((R, T), np.nan, np.float32),
            "target_rank": np.full((R, T), -1, np.int64),
        }
        self.vocab: dict[int, str] = {}

    @torch.no_grad()
    def _compute(self, pos: list[int]) -> None:
        idx = torch.tensor(pos, dtype=torch.long)
        h = self.residuals.index_select(1, idx.to(self.residuals.device))
        normed = self.normed_fn(h)
        st = lens_stats(normed, self.weight, self.bias, k=self.k, targets=self.targets[idx], softcap=self.softcap)
        for key, v in st.items():
            self.table[key][:, pos] = v.cpu().numpy()
        self.done[pos] = True

    def columns(self, positions: Sequence[int]) -> dict[str, np.ndarray]:
        """Lens statistics of ``positions`` (every row), computed now unless already cached."""
        pos = sorted({int(p) % self.T for p in positions})
        todo = [p for p in pos if not self.done[p]]
        for i in range(0, len(todo), self.position_block):
            self._compute(todo[i : i + self.position_block])
        self._learn([int(i) for i in np.unique(self.table["top_ids"][:, pos])])
        return {key: v[:, pos] for key, v in self.table.items()}

    def _learn(self, ids: list[int]) -> dict[int, str]:
        new = [i for i in ids if i not in self.vocab]
        added = dict(zip(new, self.decode(new))) if new else {}
        self.vocab.update(added)
        return added

    def vocab_for(self, positions: Sequence[int]) -> dict[int, str]:
        ids = np.unique(self.table["top_ids"][:, list(positions)])
        return {int(i): self.vocab[int(i)] for i in ids if int(i) in self.vocab}

    @torch.no_grad()
    def cell(self, row: int, pos: int, k: int = 20) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ids and probabilities of one cell (one matrix-vector product)."""
        h = self.residuals[row, pos][None, None]
        z = (self.normed_fn(h)[0, 0].float() @ self.weight.float().T)
        if self.bias is not None:
            z = z + self.bias.float()
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        p = torch.softmax(z, -1)
        v, i = p.topk(min(k, p.numel()))
        self._learn([int(x) for x in i])
        return i.numpy(), v.numpy()

    def result(self) -> LensResult:
        """The whole table (fills every missing column)."""
        self.columns(range(self.T))
        tids = self.targets.cpu().numpy()
        self._learn([int(t) for t in tids if t >= 0])
        return LensResult(
            row_names=self.row_names,
            tokens=self.tokens,
            **{k: v.copy() for k, v in self.table.items()},
            targets=tids,
            target_label=self.target_label,
            vocab=dict(self.vocab),
        )

