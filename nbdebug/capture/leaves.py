"""Naming the tensors inside a module's output.

>>> tensor_leaves(torch.zeros(2), "fc")
[('fc', tensor([0., 0.]))]
>>> [n for n, _ in tensor_leaves((torch.zeros(1), None, {"a": torch.ones(1)}), "block.0")]
['block.0[0]', 'block.0[2].a']

HF ``ModelOutput`` objects are dicts of their non-None fields, so ``attn`` returning
``BaseModelOutput(attentions=...)`` gives ``attn.attentions``.

A module call's *activation* is read and replaced here, one way for every caller: its first input
(:func:`first_input`: the first positional argument, else the first tensor keyword) and its first
output (:func:`first_output`: the first tensor leaf of a tensor, tuple/list, dict or ``ModelOutput``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["first_input", "first_output", "first_tensor", "replace_first_input", "replace_first_output", "tensor_leaves"]


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


def first_input(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """A call's input activation: its first positional argument (None when that is not a tensor),
    else its first tensor keyword argument."""
    if args:
        return args[0] if isinstance(args[0], torch.Tensor) else None
    for value in kwargs.values():
        if isinstance(value, torch.Tensor):
            return value
    return None


def replace_first_input(args: tuple[Any, ...], kwargs: dict[str, Any], new: torch.Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` with the activation (see :func:`first_input`) replaced by ``new``."""
    if args:
        return (new, *args[1:]), kwargs
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            return args, {**kwargs, key: new}
    return args, kwargs


def first_output(output: Any, _depth: int = 0) -> torch.Tensor | None:
    """A call's output activation: the first tensor leaf of ``output`` (a tensor, a tuple/list such as
    a block's ``(hidden, cache)``, a dict or a ``ModelOutput``: its first non-None field), or None."""
    if isinstance(output, torch.Tensor):
        return output
    if _depth > 4:
        return None
    if isinstance(output, (tuple, list)):
        values: Any = output
    elif isinstance(output, Mapping):
        values = output.values()
    else:
        return None
    for v in values:
        t = first_output(v, _depth + 1)
        if t is not None:
            return t
    return None


def replace_first_output(output: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``output`` with its activation (see :func:`first_output`) replaced by ``fn(activation)`` (called
    once); the container is rebuilt as its own type (tuple, list, named tuple, dict, ``ModelOutput``).
    Without a tensor in it, ``output`` itself."""
    return _replace(output, fn, 0)[0]


def _replace(output: Any, fn: Callable[[torch.Tensor], torch.Tensor], depth: int) -> tuple[Any, bool]:
    if isinstance(output, torch.Tensor):
        return fn(output), True
    if depth > 4:
        return output, False
    if isinstance(output, (tuple, list)):
        for i, v in enumerate(output):
            new, done = _replace(v, fn, depth + 1)
            if done:
                items = list(output)
                items[i] = new
                return (type(output)(*items) if hasattr(output, "_fields") else type(output)(items)), True
        return output, False
    if isinstance(output, Mapping):
        for k, v in output.items():
            new, done = _replace(v, fn, depth + 1)
            if done:
                data = dict(output)
                data[k] = new
                return (type(output)(**data) if type(output) is not dict else data), True
    return output, False
