"""One forward of nbdebug's own with its interventions as arguments: edits and reads at points,
optionally stopped once every read was taken (TransformerLens' ``run_with_hooks(fwd_hooks=...)``).

>>> r = run(model, ids, edits=[((model.h[3], "output"), lambda x: x * 0)], reads=[model.h[5]], stop=True)
>>> r.reads[0]                     # block 5's output with block 3 zeroed; the rest of the model never ran
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .interventions import edit_activations, read_activations
from .own import own_pass
from .points import Stopped

__all__ = ["RunResult", "run"]


@dataclass
class RunResult:
    """``output``: the model's output (None when the run stopped early); ``reads``: per read point its
    activation at the point's (first) call, detached unless the run kept its graph (None: not reached)."""

    output: Any
    reads: list[torch.Tensor | None]


def run(model: nn.Module, *args: Any, edits: Sequence[tuple[Any, Callable[[torch.Tensor], torch.Tensor | None]]] = (),
        reads: Sequence[Any] = (), stop: bool = False, grad: bool = False, **kwargs: Any) -> RunResult:
    """``model(*args, **kwargs)`` as nbdebug's own pass (:func:`~nbdebug.runs.own.own_pass`) with each
    ``(point, fn)`` of ``edits`` replacing that activation by ``fn(activation)`` and each point of
    ``reads`` read as the edits left it; the order of edits and reads does not matter (edits on one
    module apply in the order given). ``stop``: the forward ends once every read was taken."""
    with (own_pass(model, grad=grad), edit_activations(list(edits), root=model),
          read_activations(list(reads), stop=stop and bool(reads), detach=not grad, root=model) as seen):
        try:
            output = model(*args, **kwargs)
        except Stopped:
            output = None
    return RunResult(output, [s[0] if s else None for s in seen])
