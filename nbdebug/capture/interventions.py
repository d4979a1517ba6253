"""Hooks that change activations (the causal workbench's patches, ablations and steering) or read them
for it, registered through :class:`~nbdebug.capture.hooks.HookSet` and removed on every exit path.

The callers (``nbdebug.workbench``) decide *what* changes; this module only owns the hooks:

- :func:`patch_points`: a replacement per point, set by the caller before each call
  (``plan[i] = Replacement(...)``; ``None`` leaves the activation alone);
- :func:`edit_activations`: ``fn(activation) -> activation`` at modules' inputs or outputs while the
  block runs (ablation, steering), with an optional pre-hook on the model's own call;
- :func:`read_activations`: the activations at points during one forward, optionally stopping it
  once the last one is read.

An activation is a module's first input (positional, else its first tensor keyword) or its output
(the first element of a tuple/list output).

>>> with patch_points([(model.h[3].attn, "output")]) as plan:     # doctest: +SKIP
...     plan[0] = Replacement(start=0, mask=m, values=v)
...     out = model.h[3](x)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .hooks import HookSet

__all__ = ["Replacement", "Stopped", "edit_activations", "first_input", "patch_points", "read_activations",
           "replace_first_input", "replace_output"]

Point = tuple[nn.Module, str]  # (module, "input" | "output")


@dataclass
class Replacement:
    """Rows ``start:`` of the batch take ``values`` where ``mask`` is True (both shaped like those
    rows of the activation, or broadcastable to them); other rows are left alone."""

    start: int
    mask: torch.Tensor
    values: torch.Tensor

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        tail = x[self.start:]
        new = torch.where(self.mask, self.values.to(x.dtype), tail)
        return torch.cat([x[: self.start], new]) if self.start else new


def first_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """A call's activation: its first positional argument, else its first tensor keyword argument."""
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


def _first_output(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def replace_output(out: Any, new: torch.Tensor) -> Any:
    """A module output with its activation (the tensor, or a tuple/list's first element) replaced."""
    if isinstance(out, torch.Tensor):
        return new
    return type(out)((new, *out[1:])) if isinstance(out, tuple) else [new, *out[1:]]


def _register(hooks: HookSet, module: nn.Module, where: str, fn: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
    """``fn(activation)`` at ``module``'s input or output; a returned tensor replaces the activation."""
    if where == "input":
        def pre(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            x = first_input(args, kwargs)
            new = fn(x) if x is not None else None
            return None if new is None else replace_first_input(args, kwargs, new)

        hooks.forward_pre(module, pre, with_kwargs=True)
    elif where == "output":
        def post(mod: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
            x = _first_output(out)
            new = fn(x) if x is not None else None
            return None if new is None else replace_output(out, new)

        hooks.forward(module, post)
    else:
        raise ValueError(f"where={where!r}: 'input' or 'output'")


@contextmanager
def patch_points(points: Sequence[Point]) -> Iterator[list[Replacement | None]]:
    """Yield a plan, one slot per point; while a slot holds a :class:`Replacement`, every call of its
    module has that activation replaced. Hooks are removed on exit (exceptions and interrupts too)."""
    plan: list[Replacement | None] = [None] * len(points)
    with HookSet() as hooks:
        for i, (module, where) in enumerate(points):
            def fn(x: torch.Tensor, i: int = i) -> torch.Tensor | None:
                rep = plan[i]
                return None if rep is None else rep.apply(x)

            _register(hooks, module, where, fn)
        yield plan


@contextmanager
def edit_activations(edits: Sequence[tuple[nn.Module, str, Callable[[torch.Tensor], torch.Tensor]]],
                     root: nn.Module | None = None,
                     on_call: Callable[[tuple[Any, ...], dict[str, Any]], None] | None = None) -> Iterator[None]:
    """While the block runs, each ``(module, "input"|"output", fn)`` replaces that activation by
    ``fn(activation)``; ``on_call(args, kwargs)`` (optional) sees every call of ``root`` first."""
    with HookSet() as hooks:
        if on_call is not None and root is not None:
            def pre(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                on_call(args, kwargs)

            hooks.forward_pre(root, pre, with_kwargs=True)
        for module, where, fn in edits:
            _register(hooks, module, where, fn)
        yield


class Stopped(Exception):
    """Raised inside a forward by :func:`read_activations` once everything asked for was read."""


@contextmanager
def read_activations(points: Sequence[Point], *, stop: bool = False, detach: bool = True,
                     every_call: bool = False) -> Iterator[list[list[torch.Tensor]]]:
    """Yield one list per point, filled with its activation at each call during the block (only the
    first call unless ``every_call``). With ``stop``, the forward raises :class:`Stopped` as soon as
    every point was read once (catch it around the forward: the rest of the model does not run)."""
    seen: list[list[torch.Tensor]] = [[] for _ in points]
    with HookSet() as hooks:
        for i, (module, where) in enumerate(points):
            def fn(x: torch.Tensor, i: int = i) -> None:
                if every_call or not seen[i]:
                    seen[i].append(x.detach() if detach else x)
                if stop and all(seen):
                    raise Stopped

            _register(hooks, module, where, fn)
        yield seen
