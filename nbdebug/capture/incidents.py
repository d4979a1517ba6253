"""The flight recorder: what a capture keeps when something goes wrong in a training loop.

An :class:`Incident` is an event of one step: the first non-finite value (``kind="nonfinite"``:
the module that made it, CPU copies of that call's inputs and output within the byte budget, its
parameters' stats, the row's stats at the previous step, the optimizer state of its parameters)
or a loss spike (``kind="loss_spike"``: the loss above 10× the running median; ``module`` None).
:class:`NonFiniteError` is what ``break_on="nonfinite"`` raises from the capture's forward hook,
so ``%debug`` opens in a frame holding ``inputs``, ``output`` and ``module``.

>>> res.incident.step, res.incident.module, res.incident.inputs[0].shape   # doctest: +SKIP
(6, 'b', torch.Size([3, 2]))
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from .leaves import tensor_leaves

__all__ = ["Incident", "LossSpikes", "NonFiniteError", "copy_within", "describe_nonfinite", "param_stats"]

SPIKE_FACTOR = 10.0  # a loss above this many times the running median is a spike
SPIKE_MIN_STEPS = 5  # steps with a loss before spikes are looked for
SPIKE_WINDOW = 200  # losses the running median is taken over


@dataclass
class Incident:
    """One event of a capture (see the module doc)."""

    kind: str  # "nonfinite" | "loss_spike"
    step: int  # 1-based
    module: str | None  # qualified module name of the origin (None for loss spikes)
    row: str | None  # its row name ("relu#2")
    phase: str | None  # "forward" | "output_grad" | "param_grad"
    message: str
    inputs: list | None = None  # CPU copies of the origin call's tensor inputs (None: dropped / not kept)
    output: Any | None = None  # CPU copy of its output
    params: dict[str, dict[str, float]] = field(default_factory=dict)  # parameter → {mean, std, min, max, norm, nan, inf}
    previous: dict[str, float] | None = None  # the origin row's stats at the previous step
    optimizer: dict[str, dict[str, float]] = field(default_factory=dict)  # parameter → {lr, optimizer state norms}
    value: float | None = None  # loss spikes: the loss
    median: float | None = None  # loss spikes: the running median it is compared with


class NonFiniteError(FloatingPointError):
    """Raised by ``break_on="nonfinite"`` at the first non-finite forward output.

    ``step`` (1-based), ``module`` (qualified name), ``row`` (row name), ``inputs`` (the call's
    positional inputs, the live tensors), ``output`` (its output).
    """

    def __init__(self, message: str, *, step: int, module: str, row: str, inputs: tuple, output: Any) -> None:
        super().__init__(message)
        self.step, self.module, self.row, self.inputs, self.output = step, module, row, inputs, output


def copy_within(obj: Any, budget: int) -> tuple[Any, int]:
    """A detached CPU copy of ``obj``'s tensors (tensor, tuple/list of tensors) and its bytes, or
    ``(None, 0)`` when they do not fit in ``budget`` bytes. Inference tensors are copied too."""
    leaves = [t for _, t in tensor_leaves(obj)]
    nbytes = sum(t.numel() * t.element_size() for t in leaves)
    if nbytes > budget:
        return None, 0

    def cp(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            with torch.inference_mode(False), torch.no_grad():
                return x.detach().to("cpu", copy=True)
        if isinstance(x, (tuple, list)):
            return type(x)(cp(v) for v in x) if not hasattr(x, "_fields") else type(x)(*(cp(v) for v in x))
        if isinstance(x, dict):
            return {k: cp(v) for k, v in x.items()}
        return x

    return cp(obj), nbytes


def _stats(t: torch.Tensor) -> dict[str, float]:
    x = t.detach().float().reshape(-1)
    if not x.numel():
        return {}
    fin = torch.isfinite(x)
    y = x[fin] if not bool(fin.all()) else x
    nan, inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
    if not y.numel():
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan, "norm": math.nan,
                "nan": float(nan), "inf": float(inf)}
    return {"mean": float(y.mean()), "std": float(y.std()) if y.numel() > 1 else math.nan, "min": float(y.min()),
            "max": float(y.max()), "norm": float(x.norm()), "nan": float(nan), "inf": float(inf)}


def param_stats(module: nn.Module) -> dict[str, dict[str, float]]:
    """Parameter name → {mean, std, min, max (over the finite values), norm, nan, inf} of ``module``'s
    own parameters (syncs: for the flight recorder, once per capture)."""
    with torch.no_grad():
        return {n: _stats(p) for n, p in module.named_parameters(recurse=False) if p.device.type != "meta"}


def _input_range(inputs: list | None) -> str:
    if not inputs:
        return ""
    vals = [t.detach().float().reshape(-1) for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
    if not vals:
        return ""
    x = torch.cat(vals)
    fin = x[torch.isfinite(x)]
    if not fin.numel():
        return "; every input value is NaN/Inf"
    return f"; input min {float(fin.min()):.4g}, max {float(fin.max()):.4g}"


def describe_nonfinite(step: int, module: str, row: str, phase: str, what: str, inputs: list | None,
                       inputs_finite: bool | None) -> str:
    """The incident's one-line message ("step 41: `b` produced NaN from finite inputs; input min …");
    ``what`` is "NaN" or "Inf"."""
    if phase == "forward":
        src = "from finite inputs" if inputs_finite else ("from a non-finite input" if inputs_finite is False else "")
        return f"step {step}: `{row}` produced {what} {src}".rstrip() + _input_range(inputs if inputs_finite else None)
    if phase == "output_grad":
        return f"step {step}: the gradient went non-finite in the backward of `{row}` (its output gradient was finite)"
    return f"step {step}: the parameter gradients of `{module}` went non-finite (forward outputs and output gradients were finite)"


class LossSpikes:
    """Running median of the loss; :meth:`check` says when a loss is a spike (> 10× the median, after
    5 steps with a finite loss)."""

    def __init__(self) -> None:
        self._losses: deque[float] = deque(maxlen=SPIKE_WINDOW)

    def check(self, loss: float) -> float | None:
        """The median the (finite) ``loss`` spiked above, or None; then remembers it."""
        if not math.isfinite(loss):
            return None
        out = None
        if len(self._losses) >= SPIKE_MIN_STEPS:
            med = float(np.median(np.fromiter(self._losses, float)))
            if med > 0 and loss > SPIKE_FACTOR * med:
                out = med
        self._losses.append(loss)
        return out
