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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from .budget import Budget
from .history import HISTORY_FIELDS
from .leaves import local, tensor_leaves
from .rows import Row

__all__ = ["Incident", "IncidentLog", "LossSpikes", "NonFiniteError", "copy_within", "describe_nonfinite", "param_stats"]

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


class IncidentLog:
    """The first non-finite value of a run (step, phase, origin) and its incidents (see the module doc).

    Built with what its snapshots read: ``budget`` (copies of the origin call's tensors fit in what is
    left), ``modules`` (name → the selected module, for its parameters' stats; emptied by
    :meth:`release`), ``optimizer_state(module)`` (the optimizer state of its parameters), ``resume``
    (an earlier result whose first steps and incidents carry over). Fed by the step folding
    (:meth:`commit`, :meth:`loss_spike`, :meth:`remember`, :meth:`late_backward`); read by the result.
    """

    def __init__(self, budget: Budget, modules: dict[str, nn.Module],
                 optimizer_state: Callable[[str], dict[str, dict[str, float]]] | None, resume: Any = None) -> None:
        self.budget, self.modules, self.optimizer_state = budget, modules, optimizer_state
        self.fwd_origin: tuple[int, bool] | None = None  # (row id, its inputs were finite)
        self.fwd_step: int | None = resume.forward_nonfinite_step if resume is not None else None
        self.bwd_row: int | None = None
        self.bwd_origin: int | None = None
        self.bwd_step: int | None = resume.backward_nonfinite_step if resume is not None else None
        self.pg_step: int | None = resume.param_grad_nonfinite_step if resume is not None else None
        self.incidents: list[Incident] = list(resume.incidents) if resume is not None else []
        self.spikes = LossSpikes()
        self.prev_values: np.ndarray | None = None  # the last committed step's history values (rows × fields)
        self.prev_rows: np.ndarray | None = None  # ... and their history row ids

    def release(self) -> None:
        """At exit: hold no module of the model, no optimizer."""
        self.modules, self.optimizer_state = {}, None

    def forward_incident(self, call: Any, inputs: Any, output: Any) -> Incident:
        """The flight recorder's snapshot of the call that made the first non-finite forward output
        (step and message are filled when the step is committed)."""
        budget = self.budget.left
        leaves = [t for t in (inputs if isinstance(inputs, (tuple, list)) else (inputs,)) if isinstance(t, torch.Tensor)]
        ins, n_in = copy_within(list(leaves), budget)
        out, n_out = copy_within(output, budget - n_in)
        self.budget.add(n_in + n_out)
        return Incident("nonfinite", 0, call.module, call.row.key, "forward", "", ins, out,
                        params=self._param_stats(call.module), optimizer=self._opt_state(call.module))

    def _param_stats(self, module: str) -> dict[str, dict[str, float]]:
        m = self.modules.get(module)
        return param_stats(m) if m is not None else {}

    def _opt_state(self, module: str) -> dict[str, dict[str, float]]:
        try:
            return self.optimizer_state(module) if self.optimizer_state is not None else {}
        except Exception:
            return {}

    def remember(self, values: np.ndarray, hids: np.ndarray) -> None:
        """The last committed step's history values and their row ids (an incident's ``previous``)."""
        self.prev_values, self.prev_rows = values, hids

    def _previous(self, row: Row) -> dict[str, float] | None:
        if self.prev_values is None or self.prev_rows is None or row.hid < 0:
            return None
        hit = np.flatnonzero(self.prev_rows == row.hid)
        if not hit.size:
            return None
        v = self.prev_values[hit[0]]
        return {f: float(v[i]) for i, f in enumerate(HISTORY_FIELDS)}

    def commit(self, data: Any, step: int, pg_row: Row | None) -> bool:
        """The first-non-finite bookkeeping and incidents of committed step ``step`` (one "nonfinite"
        incident per capture: the first by step and phase; loss spikes); True when this step had a
        first. ``data``: the step's :class:`~nbdebug.capture.steps.StepData`; ``pg_row``: the first row of
        the module whose parameter gradients went non-finite (``data.pg``), if it has one."""
        first_bad = False
        new: list[Incident] = []
        have = any(i.kind == "nonfinite" for i in self.incidents)
        if self.fwd_step is None and data.fwd is not None:
            c, finite, what = data.fwd
            self.fwd_step, self.fwd_origin, first_bad = step, (c.row.id, finite), True
            inc = data.fwd_incident or Incident("nonfinite", step, c.module, c.row.key, "forward", "",
                                                params=self._param_stats(c.module), optimizer=self._opt_state(c.module))
            inc.step, inc.previous = step, self._previous(c.row)
            inc.message = describe_nonfinite(step, c.module, c.row.key, "forward", what, inc.inputs, finite)
            new.append(inc)
        if self.bwd_step is None and data.bwd is not None:
            bad, origin = data.bwd
            self.bwd_step, self.bwd_row, first_bad = step, bad.row.id, True
            self.bwd_origin = origin.row.id if origin is not None else None
            if not have and not new:
                src = origin if origin is not None else bad
                new.append(Incident("nonfinite", step, src.module, src.row.key, "output_grad",
                                    describe_nonfinite(step, src.module, src.row.key, "output_grad", "", None, None),
                                    params=self._param_stats(src.module), previous=self._previous(src.row),
                                    optimizer=self._opt_state(src.module)))
        if self.pg_step is None and data.pg is not None:
            self.pg_step, first_bad = step, True
            if not have and not new:
                row = pg_row
                new.append(Incident("nonfinite", step, data.pg, row.key if row else None, "param_grad",
                                    describe_nonfinite(step, data.pg, row.key if row else data.pg, "param_grad", "", None, None),
                                    params=self._param_stats(data.pg), previous=self._previous(row) if row else None,
                                    optimizer=self._opt_state(data.pg)))
        self.incidents += new
        loss = data.scalars["loss"]
        if not math.isnan(loss):
            self.loss_spike(step, loss)
        return first_bad

    def late_backward(self, step: int, bad: Any, origin: Any) -> None:
        """A delayed backward's first non-finite output gradient (in step ``step``), when none was found before."""
        if self.bwd_step is None:
            self.bwd_step, self.bwd_row = step, bad.row.id
            self.bwd_origin = origin.row.id if origin is not None else None

    def loss_spike(self, step: int, loss: float) -> None:
        """The loss spike incident of step ``step``, if its loss is one (see :class:`LossSpikes`)."""
        med = self.spikes.check(loss)
        if med is not None:
            self.incidents.append(Incident("loss_spike", step, None, None, None,
                                           f"step {step}: loss {loss:.4g} is {loss / med:.1f}× the running median {med:.4g}",
                                           value=loss, median=med))
