"""Naming the tensors inside a module's output.

>>> tensor_leaves(torch.zeros(2), "fc")
[('fc', tensor([0., 0.]))]
>>> [n for n, _ in tensor_leaves((torch.zeros(1), None, {"a": torch.ones(1)}), "block.0")]
['block.0[0]', 'block.0[2].a']

HF ``ModelOutput`` objects are dicts of their non-None fields, so ``attn`` returning
``BaseModelOutput(attentions=...)`` gives ``attn.attentions``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["first_tensor", "tensor_leaves"]


def tensor_leaves(obj: Any, prefix: str = "", _depth: int = 0) -> list[tuple[str, torch.Tensor]]:
    """All tensors in ``obj`` (tensor, tuple/list, dict/ModelOutput, None) with qualified names."""
    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    if _depth > 4 or obj is None:
        return []
    out: list[tuple[str, torch.Tensor]] = []
    if isinstance(obj, Mapping):  # dicts and HF ModelOutput (an OrderedDict of non-None fields)
        for key, value in obj.items():
            out += tensor_leaves(value, f"{prefix}.{key}" if prefix else str(key), _depth + 1)
    elif isinstance(obj, (tuple, list)):
        for i, value in enumerate(obj):
            out += tensor_leaves(value, f"{prefix}[{i}]", _depth + 1)
    return out


def first_tensor(obj: Any) -> torch.Tensor | None:
    """The first tensor leaf of ``obj`` (a module's 'main' output), or None."""
    leaves = tensor_leaves(obj)
    return leaves[0][1] if leaves else None


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2 parameters, their gradients and optimizer state), with no
    communication; any other tensor as is. Norms and stats of parameters go through this: a DTensor
    op that needs other ranks' shards is a collective, which hangs when only one rank runs it."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t
