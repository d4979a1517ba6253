"""How faithful token scores are: the metric while tokens are replaced by the baseline, most attributed
first (deletion: a faithful attribution makes it fall fast, lower area is better), against the mean of
random orders. All ``(T − 1) · (1 + orders) + 2`` runs are batched, each distinct input run once: two
orders that replace the same set of tokens after ``k`` steps (often, with ``T`` tokens and 10 orders),
or sets that differ only in tokens whose baseline row is their own embedding (``fix_first``), give the
same input (SmolLM2, "The Eiffel Tower is in the city of", 9 tokens: 90 runs → 73 from zero, 58–59 with the
first token fixed, depending on the score order).

The metric is normalised to ``(m_k − m(baseline)) / (m(x) − m(baseline))``: 1 with nothing replaced,
0 with every token replaced. Random orders can push it far outside ``[0, 1]``; the curves say more
than the areas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .methods import occluded
from .runs import EmbeddingRuns

__all__ = ["Faithfulness", "deletion_curves"]


@dataclass
class Faithfulness:
    """``curves["deletion"]``/``curves["random"]`` ``(T + 1,)`` normalised metric after ``k`` tokens
    replaced; ``auc`` the trapezoid area of each over ``k / T`` in ``[0, 1]``; ``random_orders``
    ``(orders, T + 1)`` each random order's curve."""

    curves: dict[str, np.ndarray]
    auc: dict[str, float]
    random_orders: np.ndarray
    raw_scale: tuple[float, float]  # (m(x), m(baseline)) used to normalise


def _auc(y: np.ndarray) -> float:
    x = np.linspace(0.0, 1.0, len(y))
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2)


def deletion_curves(runs: EmbeddingRuns, baseline: torch.Tensor, scores: np.ndarray, *, orders: int = 10,
                    seed: int = 0) -> Faithfulness:
    """Deletion in ``scores`` order (highest first, ties by position) and the mean of ``orders`` random
    orders drawn from ``numpy.random.default_rng(seed)`` (the user's random state is not used)."""
    T = runs.T
    rng = np.random.default_rng(seed)
    perms = [np.argsort(-np.asarray(scores), kind="stable")] + [rng.permutation(T) for _ in range(orders)]
    masks = torch.zeros(len(perms), T - 1, T, dtype=torch.bool)
    for i, p in enumerate(perms):
        for k in range(1, T):
            masks[i, k - 1, torch.as_tensor(p[:k])] = True
    ends = torch.stack([torch.zeros(T, dtype=torch.bool), torch.ones(T, dtype=torch.bool)])
    differs = (baseline != runs.clean).any(-1).cpu()  # a row equal to its baseline: replacing it changes nothing (one copy per call)
    every = torch.cat([ends, masks.reshape(-1, T)]) & differs
    distinct, which = torch.unique(every, dim=0, return_inverse=True)
    m = runs.metric(occluded(runs.clean, baseline, distinct)).double().numpy()[which.numpy()]
    clean, base = float(m[0]), float(m[1])
    span = clean - base
    mid = m[2:].reshape(len(perms), T - 1)
    raw = np.concatenate([np.full((len(perms), 1), clean), mid, np.full((len(perms), 1), base)], axis=1)
    norm = (raw - base) / span if abs(span) > 1e-12 else raw - base
    curves = {"deletion": norm[0], "random": norm[1:].mean(0)}
    return Faithfulness(curves, {k: _auc(v) for k, v in curves.items()}, norm[1:], (clean, base))
