"""How far each row of a lens is from the model's own output: KL(final ‖ lens) in nats per row, on
held-out text, for the lens and for the plain logit lens on the same positions (the whole vocabulary,
chunked: :func:`~nbdebug.inspectors.logitlens.lens_stats`).

>>> q = heldout_quality(lens, model, parts, seqs)   # {"lens": [...], "logit": [...], "tokens": n}  # doctest: +SKIP
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from ..adapters.transformers import ModelParts
from ..capture.state import loaded_weights
from ..inspectors.logitlens import lens_stats
from .collect import as_list, residual_batches
from .lens import FittedLens

__all__ = ["heldout_quality", "row_kl"]


@torch.no_grad()
def row_kl(lens: FittedLens | None, parts: ModelParts, rows: torch.Tensor) -> torch.Tensor:
    """``(L + 1, n)`` KL(final ‖ row) of residual rows ``(L + 1, n, d)`` read through ``lens``
    (``None``: the logit lens); the last row is the final one (0)."""
    L = rows.shape[0] - 1
    if lens is not None:
        rows = torch.stack([lens.translate(r - 1, rows[r]) for r in range(L)] + [rows[L]])
    normed = parts.normed(rows)
    mod = parts.unembed_module
    with loaded_weights(mod) if mod is not None else nullcontext():
        w = mod.weight if mod is not None else parts.unembed_weight
        b = getattr(mod, "bias", None) if mod is not None else parts.unembed_bias
        assert w is not None
        st = lens_stats(normed.float(), w.detach(), None if b is None else b.detach(), k=1, softcap=parts.softcap)
    return st["kl"].cpu()


def heldout_quality(lens: FittedLens, model: nn.Module, parts: ModelParts, seqs: torch.Tensor) -> dict[str, Any]:
    """Mean KL(final ‖ row) per row over the held-out sequences, for ``lens`` and the logit lens."""
    ours: list[torch.Tensor] = []
    logit: list[torch.Tensor] = []
    for rows in residual_batches(model, parts, seqs):
        ours.append(row_kl(lens, parts, rows))
        logit.append(row_kl(None, parts, rows))
    a, b = torch.cat(ours, 1), torch.cat(logit, 1)
    return {"lens": as_list(a.mean(1)), "logit": as_list(b.mean(1)), "tokens": int(a.shape[1])}
