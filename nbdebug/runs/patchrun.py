"""The recorded runs of the causal workbench: one forward of the model that keeps what every block was
called with and the activations at the points asked for, as nbdebug's own pass (no grad unless a
gradient is asked for, buffers cloned and the RNG forked, the user's hooks set aside, ours removed).

>>> rec = record_run(model, (args, kwargs), blocks, {"attn": [(m, "output") ...]})   # doctest: +SKIP
>>> rec.block_args[3]            # (args, kwargs) block 3 was called with
>>> rec.taps["attn"][3]          # its attention output, detached
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..capture.hooks import HookSet
from ..capture.leaves import first_input, replace_first_input
from .interventions import read_activations
from .own import frozen_params, own_pass
from .points import Point

__all__ = ["Recorded", "frozen_params", "own_pass", "record_run"]


@dataclass
class Recorded:
    """``output``: the model's output; ``block_args``: per block, the ``(args, kwargs)`` of its (first)
    call; ``taps``: per kind, the activation at each point (detached, unless the run kept its graph:
    then they are the graph's own tensors, for ``torch.autograd.grad``)."""

    output: Any
    block_args: list[tuple[tuple[Any, ...], dict[str, Any]]]
    taps: dict[str, list[torch.Tensor]] = field(default_factory=dict)


def record_run(model: nn.Module, call: tuple[tuple[Any, ...], dict[str, Any]], blocks: Sequence[nn.Module],
               taps: dict[str, Sequence[Point]], *, grad: bool = False) -> Recorded:
    """Run ``model(*args, **kwargs)`` once as nbdebug's own pass (:func:`own_pass`), recording each
    block's call and the ``taps``. With ``grad``, the first block's input becomes a leaf that requires
    grad, so every later activation is in one graph (the output too) and ``.grad`` of parameters is
    never touched."""
    args, kwargs = call
    block_args: list[tuple[tuple[Any, ...], dict[str, Any]] | None] = [None] * len(blocks)
    kinds = list(taps)
    points = [p for k in kinds for p in taps[k]]
    with own_pass(model, grad=grad), HookSet() as hooks:
        if grad and blocks:
            def leaf(mod: nn.Module, a: tuple[Any, ...], kw: dict[str, Any]) -> Any:
                x = first_input(a, kw)
                return None if x is None or x.requires_grad else replace_first_input(a, kw, x.detach().requires_grad_(True))

            hooks.forward_pre(blocks[0], leaf, with_kwargs=True)
        for j, block in enumerate(blocks):
            def keep(mod: nn.Module, a: tuple[Any, ...], kw: dict[str, Any], j: int = j) -> None:
                if block_args[j] is None:
                    block_args[j] = (a, dict(kw))

            hooks.forward_pre(block, keep, with_kwargs=True)
        with read_activations(points, detach=not grad) as seen:
            output = model(*args, **kwargs)
    missing = [j for j, a in enumerate(block_args) if a is None]
    if missing:
        raise RuntimeError(f"blocks {missing} were not called by the model's forward")
    out_taps: dict[str, list[torch.Tensor]] = {}
    i = 0
    for k in kinds:
        n = len(taps[k])
        vals = seen[i:i + n]
        if any(not v for v in vals):
            raise RuntimeError(f"{k}: some points were not called by the model's forward")
        out_taps[k] = [v[0] for v in vals]
        i += n
    return Recorded(output, [a for a in block_args if a is not None], out_taps)
