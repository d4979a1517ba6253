"""Model outputs: where the logits are, whatever the model returns.

One helper for every view that reads scores from a model call: Grad-CAM (class scores,
batch×classes) and the logit lens (language-model logits, batch×tokens×vocab).

>>> import torch
>>> logits_of(torch.zeros(2, 5)).shape
torch.Size([2, 5])
>>> logits_of((torch.zeros(1, 4, 9), "cache"), ndim=3).shape
torch.Size([1, 4, 9])
>>> logits_of({"logits": torch.zeros(2, 3)}, ndim=3) is None
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..capture.leaves import first_tensor, tensor_leaves

__all__ = ["class_scores", "logits_of"]


def logits_of(output: Any, *, ndim: int | tuple[int, ...] | None = None) -> torch.Tensor | None:
    """The logits in a model output, or None.

    Looked up in order: a tensor ``.logits`` attribute (HF ``ModelOutput``), a ``"logits"`` key
    (dicts), the output itself when it is a tensor, else the first tensor leaf of a tuple/list/dict
    (``(logits, features)``, ``(logits, past_key_values)``). With ``ndim`` (e.g. ``2`` for
    batch×classes, ``3`` for batch×tokens×vocab, or a tuple of allowed ranks) a tensor of another
    rank gives None, and in a tuple/list/dict the first leaf of that rank is taken (HF's
    ``return_dict=False`` with labels gives ``(loss, logits, …)``).
    """
    ranks = None if ndim is None else ((ndim,) if isinstance(ndim, int) else tuple(ndim))
    logits = getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor) and isinstance(output, Mapping):
        logits = output.get("logits")
    if not isinstance(logits, torch.Tensor):
        if isinstance(output, torch.Tensor):
            logits = output
        elif ranks is None:
            logits = first_tensor(output)
        else:
            logits = next((t for _, t in tensor_leaves(output) if t.dim() in ranks), None)
    if not isinstance(logits, torch.Tensor):
        return None
    if ranks is not None and logits.dim() not in ranks:
        return None
    return logits


def class_scores(output: Any) -> torch.Tensor:
    """Class scores (batch×classes) of a classifier's output; ``ValueError`` saying what was found otherwise."""
    logits = logits_of(output, ndim=2)
    if logits is None:
        found = logits_of(output)
        shape = None if found is None else list(found.shape)
        raise ValueError(f"the model's output is not class scores of shape batch×classes (got {shape})")
    return logits
