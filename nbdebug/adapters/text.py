"""Token bookkeeping shared by the language views: input ids of a recorded call, token strings.

Options such as ``--tokens VAR`` / ``--tokenizer VAR`` name variables of the user's namespace
(the magic passes it as ``user_ns``); from Python the objects themselves are passed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["input_ids_of", "resolve_option", "token_option", "token_strings", "valid_positions"]


def token_option(value: Any, tokenizer: Any) -> Any:
    """``--answer``/``--wrong`` as :func:`nbdebug.patch`, :func:`nbdebug.attribute` and the clicks take
    them: ``#12`` or (no tokenizer) ``12`` is an id, an int stays an id, other text stays text, ``""`` is None."""
    if isinstance(value, str):
        if value.startswith("#") and value[1:].isdigit():
            return int(value[1:])
        if tokenizer is None and value.strip().isdigit():
            return int(value)
    if value is None or value == "":
        return None
    return value


def resolve_option(value: Any, user_ns: dict[str, Any] | None, what: str) -> Any:
    """``value`` itself, or the user variable it names when it is a string naming one."""
    if isinstance(value, str) and user_ns is not None:
        if value in user_ns:
            return user_ns[value]
        raise ValueError(f"--{what} {value}: no variable named {value!r} in the notebook")
    return value


def input_ids_of(args: tuple[Any, ...] | None, kwargs: dict[str, Any] | None) -> torch.Tensor | None:
    """The integer ``(B, T)`` token ids a model was called with (``input_ids=`` or first positional)."""
    kwargs = kwargs or {}
    cands = [kwargs.get("input_ids"), kwargs.get("input"), kwargs.get("tokens"), *(args or ())[:1]]
    for c in cands:
        if isinstance(c, dict) and "input_ids" in c:  # model(**enc) is kwargs; model(enc) passes a BatchEncoding
            c = c["input_ids"]
        if isinstance(c, torch.Tensor) and not c.is_floating_point() and c.dim() in (1, 2):
            return c if c.dim() == 2 else c[None]
    return None


def valid_positions(kwargs: dict[str, Any] | None, batch_index: int, length: int) -> torch.Tensor | None:
    """Positions kept for batch item ``batch_index`` when an ``attention_mask`` marks padding."""
    mask = (kwargs or {}).get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.shape[1] != length:
        return None
    row = mask[min(batch_index, mask.shape[0] - 1)]
    if bool((row != 0).all()):
        return None
    return (row != 0).nonzero().squeeze(1).cpu()


def token_strings(
    ids: torch.Tensor | None,
    *,
    tokens: Sequence[str] | None = None,
    tokenizer: Any = None,
    model: Any = None,
    length: int | None = None,
) -> list[str]:
    """Raw token strings for one sequence: given ``tokens``, else the tokenizer's, else ``#id``."""
    if tokens is not None:
        return [str(t) for t in tokens]
    if ids is None:
        return [f"#{i}" for i in range(length or 0)]
    id_list = [int(i) for i in ids.reshape(-1).tolist()]
    if tokenizer is None:
        tokenizer = getattr(model, "tokenizer", None)  # TransformerLens keeps one on the model
    if tokenizer is not None:
        conv = getattr(tokenizer, "convert_ids_to_tokens", None)
        if conv is not None:
            return [str(t) for t in conv(id_list)]
        return [tokenizer.decode([i]) for i in id_list]
    return [f"#{i}" for i in id_list]


def decoder_for(tokenizer: Any, model: Any = None) -> Any:
    """A function ``list[int] -> list[str]`` giving the readable text of vocabulary ids."""
    if tokenizer is None:
        tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        def dec(ids: list[int]) -> list[str]:
            try:
                return [tokenizer.decode([i]) for i in ids]
            except Exception:
                return [str(t) for t in tokenizer.convert_ids_to_tokens(ids)]
        return dec
    return lambda ids: [f"#{i}" for i in ids]
