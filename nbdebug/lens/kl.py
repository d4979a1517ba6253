"""KL(final ‖ lens) for the lens fit, exact over the vocabulary and cheap in memory and time.

``kl_rows`` measures every row's translator on held-apart positions at once (the tuned fit's keep-the-better
check): the target's ``-H(p)``, ``p U`` and ``p·b`` are computed once, since
``KL(p ‖ softmax(z)) = Σ p log p − Σ p z + logsumexp(z)`` and ``Σ_v p_v z_v = x·(p U) + p·b`` for
``z = x U' + b``: the pass over the vocabulary is one matrix product and one log-sum-exp per position
(several rows per product), no log-softmax, no ``(n, V)`` elementwise KL.
``head_kl`` is the training objective (its gradient formed in the forward pass, a few rows at a time).

>>> kl_rows(parts, held, [(A0, c0), (A1, c1)], U, b)   # [(R,), (R,)] mean KL per row  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch

from ..adapters.transformers import ModelParts

__all__ = ["head_kl", "kl_rows", "lens_logits"]


def lens_logits(parts: ModelParts, h: torch.Tensor, U: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """Logits of residuals ``h (…, d)`` through the final norm, ``U`` (and bias, softcap)."""
    z = parts.normed(h).to(U.device).float() @ U.T
    if b is not None:
        z = z + b
    if parts.softcap:
        z = torch.tanh(z / parts.softcap) * parts.softcap
    return z


class _HeadKL(torch.autograd.Function):
    """``sum over rows of mean over positions of KL(p ‖ softmax(x U' [+ b]))`` for normed rows ``x (R, n, d)``
    against the final log-probabilities ``logp (n, V)``, its gradient ``(q − p) U / n`` computed in the
    forward pass a few rows at a time: the ``(R, n, V)`` logits never exist at once and autograd keeps
    nothing of them (two ``n × V × d`` products per row, the least an exact KL over ``V`` tokens needs)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, logp: torch.Tensor, U: torch.Tensor, bias: torch.Tensor | None,
                chunk: int) -> torch.Tensor:
        p = logp.exp()
        neg_h = (p * logp).sum(-1)  # (n,)
        lin = (x * (p @ U)).sum(-1).sum(0)  # Σ_v p_v (x U')_v = x·(p U): no (R, n, V) product with p
        if bias is not None:
            lin = lin + x.shape[0] * (p @ bias)
        n = x.shape[1]
        lse_sum = x.new_zeros(n)
        grad = torch.empty_like(x)
        for r in range(0, x.shape[0], chunk):
            z = x[r:r + chunk] @ U.T
            if bias is not None:
                z += bias
            lse = torch.logsumexp(z, -1, keepdim=True)
            lse_sum += lse[..., 0].sum(0)
            z.sub_(lse).exp_().sub_(p)  # q − p
            grad[r:r + chunk] = (z @ U) / n
        ctx.save_for_backward(grad)
        return (x.shape[0] * neg_h - lin + lse_sum).mean()

    @staticmethod
    def backward(ctx: Any, go: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (grad,) = ctx.saved_tensors
        return grad * go, None, None, None, None


def head_kl(parts: ModelParts, y: torch.Tensor, logp: torch.Tensor, U: torch.Tensor, bias: torch.Tensor | None,
            *, max_elems: int = 4_000_000) -> torch.Tensor:
    """KL(final ‖ lens) summed over rows ``y (R, n, d)`` (means over positions), differentiable in ``y``;
    exact over the vocabulary of ``U``, chunked so that at most ``max_elems`` logits exist at once."""
    if parts.softcap:  # the softcap's tanh sits between the logits and the softmax: plain autograd
        logq = torch.log_softmax(lens_logits(parts, y, U, bias), -1)
        return (logp.exp() * (logp - logq)).sum(-1).mean(-1).sum()
    x = parts.normed(y).float()
    chunk = max(1, max_elems // max(1, y.shape[1] * U.shape[0]))
    return _HeadKL.apply(x, logp, U, bias, chunk)


def kl_row(parts: ModelParts, y: torch.Tensor, logp: torch.Tensor, U: torch.Tensor, bias: torch.Tensor | None) -> float:
    """Mean KL(final ‖ lens) over positions ``y (n, d)`` on the vocabulary of ``U``: the plain formula."""
    logq = torch.log_softmax(lens_logits(parts, y, U, bias), -1)
    return float((logp.exp() * (logp - logq)).sum(-1).mean())


@torch.no_grad()
def kl_rows(parts: ModelParts, held: torch.Tensor, translators: list[tuple[torch.Tensor, torch.Tensor]],
            U: torch.Tensor, bias: torch.Tensor | None, *, max_elems: int = 8_000_000) -> list[torch.Tensor]:
    """For each ``(A, c)`` of ``translators``: ``(R,)`` mean KL(final ‖ row ``r`` read as ``A[r] h + c[r]``)
    over the positions of ``held (R + 1, n, d)`` (the last row is the final residual, the target), on the
    vocabulary of ``U``; at most ``max_elems`` logits at once. Equal to :func:`kl_row` row by row."""
    logp = torch.log_softmax(lens_logits(parts, held[-1], U, bias), -1)
    if parts.softcap:  # tanh between logits and softmax: Σ p z is not linear in x; the plain formula per row
        return [torch.tensor([kl_row(parts, held[r] @ A[r].T + c[r], logp, U, bias) for r in range(A.shape[0])])
                for A, c in translators]
    p = logp.exp()
    neg_h = (p * logp).sum(-1)  # (n,)
    pU = p @ U  # (n, d)
    pb = p @ bias if bias is not None else 0.0
    n, V = held.shape[1], U.shape[0]
    k = max(1, max_elems // max(1, n * V))
    out = []
    for A, c in translators:
        x = parts.normed(torch.baddbmm(c[:, None], held[:-1], A.transpose(1, 2))).float()  # (R, n, d)
        lin = (x * pU).sum(-1) + pb  # (R, n)
        lse = []
        for r in range(0, x.shape[0], k):
            z = x[r:r + k] @ U.T
            if bias is not None:
                z += bias
            lse.append(torch.logsumexp(z, -1))
        out.append((neg_h - lin + torch.cat(lse)).mean(-1))
    return out
