"""The three token-attribution methods on :class:`~nbdebug.attribution.runs.EmbeddingRuns`; each returns
one score per input token (float64 numpy), summed over the embedding dimension.

- ``grad_x_input``: ``Σ_d ∂m/∂e_{t,d} · e_{t,d}`` (one forward and backward);
- ``integrated_gradients``: ``Σ_d (e − b)_{t,d} · Σ_k w_k ∂m/∂e_{t,d}(b + α_k (e − b))``, the steps
  batched; ``α``/``w`` exactly as captum's ``IntegratedGradients`` for the same ``method``
  (``gausslegendre``, ``riemann_left``/``right``/``middle``/``trapezoid``);
- ``occlusion``: ``m(e) − m(e with token t's row replaced by the baseline's)``, the ``T`` runs batched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .runs import EmbeddingRuns

__all__ = ["IG_RULES", "METHODS", "Scores", "grad_x_input", "ig_path", "integrated_gradients", "occlusion"]

METHODS = ("grad_x_input", "integrated_gradients", "occlusion")
IG_RULES = ("gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid")


@dataclass
class Scores:
    """A method's scores ``(T,)``, the clean metric ``m(x)`` and (when the method ran it) the baseline's."""

    scores: np.ndarray
    metric: float
    metric_baseline: float | None = None


def ig_path(steps: int, rule: str = "gausslegendre") -> tuple[np.ndarray, np.ndarray]:
    """``(alphas, weights)`` of the integral's quadrature, as captum computes them (its trapezoid rule
    halves the end weights of ``1/n`` steps, so its weights sum to ``1 − 1/n``: kept for equality)."""
    if rule == "gausslegendre":
        if steps < 1:
            raise ValueError("steps must be ≥ 1")
        x, w = np.polynomial.legendre.leggauss(steps)
        return 0.5 * (1 + x), 0.5 * w
    if rule not in IG_RULES:
        raise ValueError(f"ig_rule={rule!r}: one of {IG_RULES}")
    if steps < 2:
        raise ValueError("a Riemann rule needs steps ≥ 2")
    n = steps
    w = np.full(n, 1.0 / n)
    kind = rule.split("_")[1]
    if kind == "trapezoid":
        w[0] /= 2
        w[-1] /= 2
        a = torch.linspace(0, 1, n)
    elif kind == "left":
        a = torch.linspace(0, 1 - 1 / n, n)
    elif kind == "middle":
        a = torch.linspace(1 / (2 * n), 1 - 1 / (2 * n), n)
    else:
        a = torch.linspace(1 / n, 1, n)
    return a.double().numpy(), w


def grad_x_input(runs: EmbeddingRuns) -> Scores:
    """Gradient × input on the clean embeddings (one forward and backward)."""
    e = runs.clean
    m, g = runs.gradients(e[None])
    return Scores((g[0] * e).sum(-1).double().numpy(), float(m[0]))


def integrated_gradients(runs: EmbeddingRuns, baseline: torch.Tensor, steps: int = 64,
                         rule: str = "gausslegendre") -> Scores:
    """Integrated gradients from ``baseline`` ``(T, d)`` in ``steps`` batched runs, plus one batched run of
    the clean input and the baseline (for the completeness check)."""
    alphas, weights = ig_path(steps, rule)
    e = runs.clean
    diff = e - baseline
    a = torch.as_tensor(alphas, dtype=torch.float32)
    path = baseline[None] + a[:, None, None] * diff[None]
    _, total = runs.gradients(path, weights=torch.as_tensor(weights, dtype=torch.float32))
    ends = runs.metric(torch.stack([e, baseline]))
    return Scores((total * diff).sum(-1).double().numpy(), float(ends[0]), float(ends[1]))


def occluded(clean: torch.Tensor, baseline: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """``(B, T, d)``: the clean embeddings with the rows where ``masks`` ``(B, T)`` is True taken from the baseline.
    The masks are built on the CPU; ``torch.where`` takes no CPU condition beside device tensors."""
    return torch.where(masks.to(clean.device)[:, :, None], baseline[None], clean[None])


def occlusion(runs: EmbeddingRuns, baseline: torch.Tensor) -> Scores:
    """Each token's embedding replaced by the baseline's row, one run per token (batched with the clean run)."""
    T = runs.T
    masks = torch.cat([torch.zeros(1, T, dtype=torch.bool), torch.eye(T, dtype=torch.bool)])
    m = runs.metric(occluded(runs.clean, baseline, masks))
    return Scores((m[0] - m[1:]).double().numpy(), float(m[0]))
