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

import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from .history import HISTORY_FIELDS
from .leaves import local, tensor_leaves

if TYPE_CHECKING:
    from .session import Capture

__all__ = ["Incident", "LossSpikes", "NonFiniteError", "copy_within", "describe_nonfinite", "forward_incident", "loss_spike",
           "param_stats", "step_incidents"]

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
        return {n: _stats(local(p)) for n, p in module.named_parameters(recurse=False) if p.device.type != "meta"}


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


def forward_incident(cap: Capture, call: Any, inputs: Any, output: Any) -> Incident:
    """The flight recorder's snapshot of the call that made the first non-finite forward output
    (step and message are filled when the step is committed)."""
    budget = max(0, cap.max_bytes - cap._bytes)
    leaves = [t for t in (inputs if isinstance(inputs, (tuple, list)) else (inputs,)) if isinstance(t, torch.Tensor)]
    ins, n_in = copy_within(list(leaves), budget)
    out, n_out = copy_within(output, budget - n_in)
    cap._bytes += n_in + n_out
    return Incident("nonfinite", 0, call.module, call.row.key, "forward", "", ins, out,
                    params=_param_stats(cap, call.module), optimizer=_opt_state(cap, call.module))


def _param_stats(cap: Capture, module: str) -> dict[str, dict[str, float]]:
    m = cap.module_of.get(module)
    return param_stats(m) if m is not None else {}


def _opt_state(cap: Capture, module: str) -> dict[str, dict[str, float]]:
    try:
        return cap.watch.state_of(module) if cap.watch is not None else {}
    except Exception:
        return {}


def _previous(cap: Capture, row: Any) -> dict[str, float] | None:
    if cap.prev_values is None or cap.prev_rows is None or row.hid < 0:
        return None
    hit = np.flatnonzero(cap.prev_rows == row.hid)
    if not hit.size:
        return None
    v = cap.prev_values[hit[0]]
    return {f: float(v[i]) for i, f in enumerate(HISTORY_FIELDS)}


class LossSpikes:
    """Running median of the loss; :meth:`check` says when a loss is a spike (> 10× the median, after
    5 steps with a finite loss)."""

    def __init__(self) -> None:
        self._losses: deque[float] = deque(maxlen=SPIKE_WINDOW)
        self._sorted: list[float] = []  # the same losses, sorted (the median without a sort per step)

    def check(self, loss: float) -> float | None:
        """The median the (finite) ``loss`` spiked above, or None; then remembers it."""
        if not math.isfinite(loss):
            return None
        out = None
        n = len(self._sorted)
        if n >= SPIKE_MIN_STEPS:
            s, m = self._sorted, n // 2
            med = s[m] if n % 2 else (s[m - 1] + s[m]) / 2  # what np.median gives
            if med > 0 and loss > SPIKE_FACTOR * med:
                out = med
        if n == SPIKE_WINDOW:
            del self._sorted[bisect.bisect_left(self._sorted, self._losses[0])]
        self._losses.append(loss)
        bisect.insort(self._sorted, loss)
        return out


def step_incidents(cap: Capture, data: Any, step: int) -> bool:
    """The first-non-finite bookkeeping and incidents of committed step ``step`` (one "nonfinite" incident
    per capture: the first by step and phase; loss spikes); True when this step had a first."""
    first_bad = False
    new: list[Incident] = []
    have = any(i.kind == "nonfinite" for i in cap.incidents)
    if cap.fwd_step is None and data.fwd is not None:
        c, finite, what = data.fwd
        cap.fwd_step, cap.fwd_origin, first_bad = step, (c.row.id, finite), True
        inc = data.fwd_incident or Incident("nonfinite", step, c.module, c.row.key, "forward", "",
                                            params=_param_stats(cap, c.module), optimizer=_opt_state(cap, c.module))
        inc.step, inc.previous = step, _previous(cap, c.row)
        inc.message = describe_nonfinite(step, c.module, c.row.key, "forward", what, inc.inputs, finite)
        new.append(inc)
    if cap.bwd_step is None and data.bwd is not None:
        bad, origin = data.bwd
        cap.bwd_step, cap.bwd_row, first_bad = step, bad.row.id, True
        cap.bwd_origin = origin.row.id if origin is not None else None
        if not have and not new:
            src = origin if origin is not None else bad
            new.append(Incident("nonfinite", step, src.module, src.row.key, "output_grad",
                                describe_nonfinite(step, src.module, src.row.key, "output_grad", "", None, None),
                                params=_param_stats(cap, src.module), previous=_previous(cap, src.row),
                                optimizer=_opt_state(cap, src.module)))
    if cap.pg_step is None and data.pg is not None:
        cap.pg_step, first_bad = step, True
        if not have and not new:
            row = cap.first_row.get(data.pg)
            new.append(Incident("nonfinite", step, data.pg, row.key if row else None, "param_grad",
                                describe_nonfinite(step, data.pg, row.key if row else data.pg, "param_grad", "", None, None),
                                params=_param_stats(cap, data.pg), previous=_previous(cap, row) if row else None,
                                optimizer=_opt_state(cap, data.pg)))
    cap.incidents += new
    loss = data.scalars["loss"]
    if not math.isnan(loss):
        loss_spike(cap, step, loss)
    return first_bad


def loss_spike(cap: Capture, step: int, loss: float) -> None:
    """The loss spike incident of step ``step``, if its loss is one (see :class:`LossSpikes`)."""
    med = cap.spikes.check(loss)
    if med is not None:
        cap.incidents.append(Incident("loss_spike", step, None, None, None,
                                      f"step {step}: loss {loss:.4g} is {loss / med:.1f}× the running median {med:.4g}",
                                      value=loss, median=med))
