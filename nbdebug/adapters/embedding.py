"""Where a language model embeds its tokens, and how to call it on token ids alone.

>>> emb = input_embedding(model)          # doctest: +SKIP
>>> args, kwargs = lm_call(model, ids)    # model(*args, **kwargs) -> logits of the last position at least

Hugging Face models (``get_input_embeddings()``), TransformerLens ``HookedTransformer`` (``embed``) and
any model with exactly one ``nn.Embedding`` are known. The embedding module's output ``(B, T, d)`` is
what token attribution differentiates (positions, scaling such as Gemma's ``√d`` come after it).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from .transformers import AdapterError

__all__ = ["input_embedding", "lm_call", "takes_logits_to_keep"]


def input_embedding(model: nn.Module) -> nn.Module:
    """The module that maps token ids to their embeddings ``(B, T, d)``."""
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            emb = get()
        except NotImplementedError:
            emb = None
        if isinstance(emb, nn.Module):
            return emb
    emb = getattr(model, "embed", None)
    if isinstance(emb, nn.Module) and hasattr(model, "cfg"):  # TransformerLens
        return emb
    found = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    if len(found) == 1:
        return found[0]
    raise AdapterError(f"could not find the token embedding of {type(model).__name__} "
                       f"({len(found)} nn.Embedding modules): give a model with get_input_embeddings()")


def lm_call(model: nn.Module, ids: torch.Tensor, *, last_only: bool = True) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """THE call of a language model on ids: ``(args, kwargs)`` of a forward of ``ids`` ``(B, T)`` without a
    cache (``input_ids=``, ``use_cache=False`` for a Hugging Face model, else ``model(ids)``); with
    ``last_only`` a Hugging Face causal LM computes only the last position's logits
    (``logits_to_keep=1``) when its forward takes it."""
    if getattr(model, "config", None) is None:
        return (ids,), {}
    kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": False}
    if last_only and takes_logits_to_keep(model):
        kwargs["logits_to_keep"] = 1
    return (), kwargs


def takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (a Hugging Face causal LM)."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
