"""Hooks that change activations (the causal workbench's patches, ablations and steering) or read them
for it, registered through :class:`~nbdebug.capture.hooks.HookSet` and removed on every exit path.

The callers (``nbdebug.workbench``, ``nbdebug.attribution``, the views' click sessions) decide *what*
changes; this module only owns the hooks:

- :func:`patch_points`: a replacement per point, set by the caller before each call
  (``plan[i] = Replacement(...)``; ``None`` leaves the activation alone);
- :func:`edit_activations`: ``fn(activation) -> activation`` at points while the block runs (ablation,
  steering), with an optional pre-hook on the model's own call;
- :func:`read_activations`: the activations at points during one forward, optionally stopping it
  once the last one is read (:class:`~nbdebug.runs.points.Stopped`).

Every hook set here is an *intervention* (:func:`~nbdebug.capture.state.intervening`): nbdebug's own
passes keep it, so ``with own_pass(m), ablate(m, ...), steer(m, ...), read_activations(...)`` computes
the same numbers in any order of its items. A point is a :class:`~nbdebug.runs.points.Point` or a
``(module, "input"|"output")`` pair; the activation is a module's first input or its first output
(:mod:`nbdebug.capture.leaves`: a tensor, a tuple's first element, a ``ModelOutput``'s first field).

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

from ..capture.eager import eager
from ..capture.hooks import HookSet
from ..capture.leaves import first_input, first_output, replace_first_input, replace_first_output
from ..capture.state import intervening
from .points import CallCounter, Point, Stopped

__all__ = ["Replacement", "Stopped", "edit_activations", "patch_points", "read_activations"]

PointLike = Any  # a Point, (module, where) or (module, where, call)

#: handle ids of the read hooks in force: on a module they run after every edit (see :func:`_reads_last`)
_READ_IDS: set[int] = set()


def _reads_last(module: nn.Module) -> None:
    """Move the module's read hooks behind its other hooks, so that a read sees the activation as
    every intervention on that module left it, whichever was registered first."""
    for attr in ("_forward_hooks", "_forward_pre_hooks"):
        table = module.__dict__.get(attr)
        if table:
            for k in [k for k in table if k in _READ_IDS]:
                table.move_to_end(k)


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


def _register(hooks: HookSet, point: PointLike, fn: Callable[[torch.Tensor], torch.Tensor | None],
              calls: CallCounter | None = None, slot: int = 0, *, read: bool = False) -> None:
    """``fn(activation)`` at the point's module input or output; a returned tensor replaces the
    activation. With a ``calls`` counter (reset at each forward of the model), only the point's call.
    A ``read`` hook runs after the module's edits (registered before or after it)."""
    module, where, call = Point.of(point)
    before = hooks.handle_ids()

    def wanted() -> bool:
        return calls is None or call is None or calls.this_one(slot, call)

    if where == "input":
        def pre(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if not wanted():
                return None
            x = first_input(args, kwargs)
            new = fn(x) if x is not None else None
            return None if new is None else replace_first_input(args, kwargs, new)

        hooks.forward_pre(module, pre, with_kwargs=True)
    else:
        def post(mod: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
            if not wanted():
                return None
            x = first_output(out)
            new = fn(x) if x is not None else None
            return None if new is None else replace_first_output(out, lambda _t: new)

        hooks.forward(module, post)
    if read:
        _READ_IDS.update(hooks.handle_ids() - before)
    else:
        _reads_last(module)


@contextmanager
def _interventions(root: nn.Module | None, points: Sequence[PointLike],
                   on_call: Callable[[tuple[Any, ...], dict[str, Any]], None] | None = None,
                   ) -> Iterator[tuple[HookSet, CallCounter | None]]:
    """A hook set marked as an intervention, with a call counter reset at each call of ``root`` when
    a point names a call (or ``on_call`` is given)."""
    counted = root is not None and any(Point.of(p).call is not None for p in points)
    calls = CallCounter(len(points)) if counted else None
    with HookSet() as hooks, intervening(hooks):
        if root is not None and (calls is not None or on_call is not None):
            def pre(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                if calls is not None:
                    calls.reset()
                if on_call is not None:
                    on_call(args, kwargs)

            # eagerly, never traced by TorchDynamo in a compiled caller (as the capture's hooks, capture/forward.py)
            hooks.forward_pre(root, eager(pre), with_kwargs=True)
        yield hooks, calls


@contextmanager
def patch_points(points: Sequence[Point]) -> Iterator[list[Replacement | None]]:
    """Yield a plan, one slot per point; while a slot holds a :class:`Replacement`, every call of its
    module has that activation replaced. Hooks are removed on exit (exceptions and interrupts too)."""
    plan: list[Replacement | None] = [None] * len(points)
    with _interventions(None, points) as (hooks, _):
        for i, point in enumerate(points):
            def fn(x: torch.Tensor, i: int = i) -> torch.Tensor | None:
                rep = plan[i]
                return None if rep is None else rep.apply(x)

            _register(hooks, point, fn)
        yield plan


@contextmanager
def edit_activations(edits: Sequence[tuple[Any, ...]], root: nn.Module | None = None,
                     on_call: Callable[[tuple[Any, ...], dict[str, Any]], None] | None = None) -> Iterator[None]:
    """While the block runs, each ``(point, fn)`` (or ``(module, "input"|"output", fn)``) replaces that
    activation by ``fn(activation)`` (a None return leaves it); ``on_call(args, kwargs)`` (optional)
    sees every call of ``root`` first. A point's ``call`` needs ``root`` (where its count restarts)."""
    pairs = [(e[0], e[1]) if len(e) == 2 else ((e[0], e[1]), e[2]) for e in edits]
    points = [p for p, _ in pairs]
    with _interventions(root, points, on_call) as (hooks, calls):
        for i, (point, fn) in enumerate(pairs):
            _register(hooks, point, fn, calls, i)
        yield


@contextmanager
def read_activations(points: Sequence[PointLike], *, stop: bool = False, detach: bool = True,
                     every_call: bool = False, root: nn.Module | None = None) -> Iterator[list[list[torch.Tensor]]]:
    """Yield one list per point, filled with its activation at each call during the block (only the
    first call unless ``every_call``; a point's ``call`` with ``root``: that call). Reads see the
    activation as edited by every intervention registered before them. With ``stop``, the forward
    raises :class:`~nbdebug.runs.points.Stopped` as soon as every point was read once (catch it around
    the forward: the rest of the model does not run; :func:`nbdebug.runs.run.run` does)."""
    seen: list[list[torch.Tensor]] = [[] for _ in points]
    with _interventions(root, points) as (hooks, calls):
        for i, point in enumerate(points):
            def fn(x: torch.Tensor, i: int = i) -> None:
                if every_call or not seen[i]:
                    seen[i].append(x.detach() if detach else x)
                if stop and all(seen):
                    raise Stopped

            _register(hooks, point, fn, calls, i, read=True)
        try:
            yield seen
        finally:
            _READ_IDS.difference_update(hooks.handle_ids())
