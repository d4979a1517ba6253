"""``nbdebug.patch``: the activation-patching grid of a clean/corrupt pair, in one call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..runs.progress import ProgressSpec
from .grid import PatchGrid
from .session import Workbench

__all__ = ["patch"]


def patch(model: nn.Module, clean: Any, corrupt: Any, *, answer: Any = None, wrong: Any = None, tokenizer: Any = None,
          sites: str = "resid", method: str = "exact", direction: str = "denoise", positions: Any = None,
          verify: int = 0, metric: Callable[[torch.Tensor], torch.Tensor] | None = None, max_bytes: Any = None,
          progress: ProgressSpec = None) -> PatchGrid:
    """Patch each site of ``model`` from one run into the other and measure how much of the answer
    comes back: a :class:`~nbdebug.workbench.grid.PatchGrid` (rows: sites, columns: positions or heads).

    ``clean``/``corrupt``: one prompt each (strings with ``tokenizer``, or token ids ``(T,)``/``(1, T)``),
    the same number of tokens. Metric: ``logit[answer] - logit[wrong]`` at the last position
    (``answer``/``wrong``: one-token strings with ``tokenizer``, or token ids); without ``wrong`` the
    answer's log-probability; or ``metric(logits (B, T, V)) -> (B,)``. ``effect = (m - m_corrupt) /
    (m_clean - m_corrupt)``.

    ``sites``: ``"resid"`` (each block's input), ``"attn"``, ``"mlp"`` (each block's attention / MLP
    output) or ``"heads"`` (each head's output). ``positions``: ``None`` (heads: all positions
    together, rows × heads; others: each position), ``"each"``, ``"all"`` or a list of positions.
    ``direction``: ``"denoise"`` puts clean activations into the corrupt run; ``"noise"`` the reverse.
    ``method``: ``"exact"`` (batched patched runs from cached state) or ``"attribution"`` (a gradient
    estimate from one forward and one backward; ``verify=k`` re-measures its top ``k`` exactly into
    ``g.verified``). ``max_bytes`` bounds the working memory of a batch (default
    :data:`~nbdebug.capture.budget.DEFAULT_MAX_BYTES`); ``progress``: None (a bar when it takes more than
    ~2 s), False, True or ``callable(done, total)``.

    Leaves no hooks, and parameters, buffers, ``.grad``, modes and the RNG as they were; works inside
    ``no_grad``/``inference_mode``, in bf16 and on accelerate-offloaded models.

    >>> g = nbdebug.patch(model, clean="The Eiffel Tower is in the city of",          # doctest: +SKIP
    ...                   corrupt="The Colosseum is in the city of", answer=" Paris", wrong=" Rome", tokenizer=tok)
    >>> g.effect.shape, g.top(1)
    """
    bench = Workbench(model, clean, corrupt, answer=answer, wrong=wrong, tokenizer=tokenizer, metric=metric)
    return bench.grid(sites, method=method, direction=direction, positions=positions, verify=verify,
                      max_bytes=max_bytes, progress=progress)
