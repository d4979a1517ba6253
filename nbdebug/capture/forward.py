"""The forward hooks of a :class:`~nbdebug.capture.session.Capture`: one recorded call per tensor
leaf of a selected module's output, its stats and dead-unit mask (one
:func:`~nbdebug.capture.stats.stats_and_units` call), its inputs linked to the calls that produced
them, its output-gradient hook, and the forward part of the flight recorder.

A module called outside the model's forward (a rootless pass) or during a backward (checkpoint
recomputation) is routed to the pass rules (:mod:`.passes`) or :meth:`ForwardHooks._on_recompute`.
The common call (one plain tensor out) takes a short path: same records, same order of effects as
the general one (tuple, dict and ``ModelOutput`` outputs, complex leaves), only fewer Python steps.

An output that aliases an already-recorded tensor of the step (Identity, Flatten, eval Dropout, a
view: same start, size and dtype) reuses its stats when the version counter has not moved. Writes
that bypass the counter (through ``.data`` or a ``.numpy()`` view) are not seen: such an alias shows
the stats from before the write.

A :class:`ForwardHooks` is built with what it fills and reads: the row table, the open step's records,
the pass rules, the memory budget, and (for the flight recorder) the incident log and a callback
giving the number the open step will have.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from .budget import Budget
from .calls import Call, OpenStep, StepMark, in_backward
from .classes import batch_classes, classifier_output
from .eager import eager
from .hooks import tensor_hook
from .incidents import IncidentLog, NonFiniteError
from .leaves import tensor_leaves
from .losses import as_float_later, loss_of_output
from .names import call_name
from .passes import Passes
from .rows import Row, RowTable
from .stats import IDX, SATURATING, Raw, device_histogram, stats_and_units, unit_alive

__all__ = ["MAX_CALLS", "ForwardHooks"]

_NAN, _INF, _NZ, _N, _MIN, _MAX = IDX["nan"], IDX["inf"], IDX["nonzero"], IDX["numel"], IDX["min"], IDX["max"]
MAX_CALLS = 200_000  # per-call records kept per step


def _units_of(t: torch.Tensor, raw: Raw, on_device: bool) -> Any:
    """The dead-unit mask of ``t`` whose stats are ``raw`` (computed elsewhere: an aliased output),
    decided like :func:`~nbdebug.capture.stats.stats_and_units`."""
    if t.dim() < 2 or not t.is_floating_point():
        return None
    if on_device or not isinstance(raw, np.ndarray):
        return unit_alive(t, 0, True)
    if raw[_NZ] < raw[_N]:
        return unit_alive(t, 1 if raw[_MIN] >= 0 else (-1 if raw[_MAX] <= 0 else 0))
    return None


class ForwardHooks:
    """The forward hooks of a capture and what they record (see the module doc).

    Inputs: ``rows`` (the row table), ``rec`` (the open step's records), ``passes`` (the pass rules),
    ``budget`` (samples, histograms, incident copies), ``log`` (the incident log: has a forward
    incident been found, and its snapshots), ``next_step()`` (the number the open step will have);
    options ``device_path``, ``grads``, ``sample_size``, ``histograms``, ``bins``, ``break_on`` and
    ``short_path`` (the common one-tensor call's short path; False: every call takes the general path,
    the reference the short path is tested against), ``read_loss`` (a loss in the model's output is
    the step's: no user ``loss()``). ``truncated``: some step had more than
    :data:`MAX_CALLS` calls (later ones not recorded)."""

    def __init__(self, rows: RowTable, rec: OpenStep, passes: Passes, budget: Budget, log: IncidentLog,
                 next_step: Callable[[], int], *, device_path: bool, grads: bool, sample_size: int, histograms: bool,
                 bins: int, break_on: str | None, short_path: bool = True, read_loss: bool = True) -> None:
        self.rows, self.rec, self.passes, self.budget, self.log = rows, rec, passes, budget, log
        self.next_step = next_step
        self.device_path, self.grads, self.sample_size = device_path, grads, sample_size
        self.histograms, self.bins, self.break_on, self.short_path = histograms, bins, break_on, short_path
        self.truncated = False
        self.read_loss = read_loss  # the loss is read from the model's output (no user loss())
        self.may_alias_any = False  # some selected module can return an alias of a recorded output
        self._broke = False

    def hooks(self, modules: list[tuple[str, nn.Module]]) -> list[tuple[nn.Module, Any]]:
        """``(module, hook)`` for each selected module (registered ``with_kwargs=True`` by the capture)."""
        # some selected module can return an alias of a recorded output (no parameters, not saturating)
        self.may_alias_any = any(SATURATING.get(type(m).__name__) is None and not any(True for _ in m.parameters(recurse=False))
                                 for _, m in modules)
        return [(module, self._make_hook(name, module)) for name, module in modules]

    def on_root_out(self, _m: nn.Module, _args: Any, output: Any) -> None:
        """The model's own forward returned: the loss in its output, when it holds one (no ``loss=``),
        and its classifier output (a ``[N, C]`` tensor, or a mapping's ``logits``), whose gradient gives
        the batch's class make-up (:mod:`.classes`)."""
        if self.passes.eval or in_backward():
            return
        if self.read_loss:
            loss = loss_of_output(output)
            if loss is not None:
                self.rec.losses.append(as_float_later(loss, self.device_path))
        t = output if isinstance(output, torch.Tensor) else output.get("logits") if isinstance(output, Mapping) else None
        if t is None or not classifier_output(t):
            return
        rec = self.rec
        call = rec.by_tensor.get(id(t))
        if call is not None and call.ref is not None and call.ref() is t:
            rec.head = call  # its output-gradient hook reads the make-up
        else:  # made after the last recorded module (a squeeze, a scale): a hook of its own
            rec.head = None
            rec.handles.append(tensor_hook(t, _HeadGrad(rec, rec.mark)))

    def _link_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any], call: Call, check: bool) -> None:
        """Link a call to the recorded calls that produced its inputs (by tensor identity).

        Inputs not produced by a recorded call of this step are checked for NaN/Inf only when
        ``check`` (the output was non-finite, or the device cannot tell without a sync): that check
        separates "this layer made the NaN" from "the NaN came in with the input". The check stays
        on the device (float32 min/max; never float64 there).
        """
        if not kwargs and len(args) == 1 and isinstance(args[0], torch.Tensor):
            leaves: Any = (args[0],)
        else:
            leaves = [t for _, t in tensor_leaves((args, kwargs))]
        by_tensor = self.rec.by_tensor
        for t in leaves:
            if not t.is_floating_point():
                continue
            hit = by_tensor.get(id(t))
            if hit is not None and hit.ref() is t:
                call.link_input(hit)
            elif check and t.numel():
                mn, mx = torch.aminmax(t.detach())
                call.check_input(torch.stack([mn, mx]).to(torch.float32))

    def _aliased_stats(self, t: torch.Tensor) -> Raw | None:
        """Stats of an already-recorded tensor of this step with the same elements, or None (same
        start, size and dtype of a live storage, both contiguous, unchanged version counter; inference
        tensors have none and are always recomputed). ``rec.by_storage`` maps a recorded output's
        ``data_ptr`` to its call (the latest one at that address)."""
        hit = self.rec.by_storage.get(t.data_ptr())
        if hit is None:
            return None
        src = hit.ref()
        if (src is None or hit.version is None or t.is_inference() or not t.is_contiguous() or not src.is_contiguous()
                or t.numel() != src.numel() or not t.numel() or t.dtype != src.dtype or src.data_ptr() != t.data_ptr()
                or t._version != hit.version):
            return None
        raw = hit.raw
        return raw.copy() if isinstance(raw, np.ndarray) else raw.clone()  # type: ignore[union-attr]

    def _sample(self, t: torch.Tensor) -> torch.Tensor | None:
        n = t.numel()
        if n == 0 or self.sample_size <= 0 or not self.budget.keep(min(n, self.sample_size) * 4):
            return None
        x = t.detach().reshape(-1)
        if n <= self.sample_size:
            return x.float().clone()
        # An evenly strided sample; the step is odd and not a multiple of 3, 5 or 7 so that it does
        # not lock onto channel or spatial periods.
        step = n // self.sample_size
        while step > 1 and any(step % p == 0 for p in (2, 3, 5, 7)):
            step -= 1
        return x[step // 2 :: step][: self.sample_size].float().clone()

    def _make_hook(self, name: str, mod: nn.Module) -> Any:
        type_name = type(mod).__name__
        saturation = SATURATING.get(type_name)
        on_device = self.device_path
        may_alias = saturation is None and not any(True for _ in mod.parameters(recurse=False))
        Tensor = torch.Tensor
        rec, passes, rows, fw = self.rec, self.passes, self.rows, self
        occurrence, row_of, by_tensor, by_storage = rec.occurrence, rows.by_key, rec.by_tensor, rec.by_storage
        task_id, grad_enabled, ref = torch._C._current_graph_task_id, torch.is_grad_enabled, weakref.ref
        ndarray = np.ndarray
        may_alias_any, short_path, grads = self.may_alias_any, self.short_path, self.grads

        def hook(module: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if task_id() != -1:  # inside a backward: checkpoint recomputation
                if not passes.eval:
                    fw._on_recompute(name, output)
                return
            if not passes.root_depth:  # called outside the model's forward
                passes.rootless(name)
            if passes.eval:
                return
            if not passes.open:  # not expected (every pass opens a step); never lose the call
                passes.open_unexpected()
            step_calls = rec.calls
            if len(step_calls) >= MAX_CALLS:
                fw.truncated = True
                return
            if type(output) is not Tensor or not short_path or output.is_complex():
                fw._record_leaves(name, type_name, saturation, may_alias, module, inputs, kwargs, output)
                return
            # the short path: one plain tensor out
            t = output
            starts = occurrence.get(name)
            if starts is None:
                starts = occurrence[name] = []
                key = name
            else:
                key = call_name(name, len(starts))
            row = row_of.get(key)
            if row is None:
                row = rows.new(key, name, type_name, t)
            # an aliasing output (Flatten, in-place ops) starts where a recorded output does
            raw = fw._aliased_stats(t) if may_alias and by_storage and t.data_ptr() in by_storage else None
            if raw is None:
                raw, alive = stats_and_units(t, saturation=saturation, units=True, on_device=on_device)
            else:
                alive = _units_of(t, raw, on_device)
            call = Call(rec, row, name, tuple(t.shape), rec.mark)
            call.raw, call.alive = raw, alive
            if not row.units and t.dim() >= 2 and t.is_floating_point() and t.shape[1]:
                rows.set_units(row, t.shape[1])  # the step layouts list the unit rows
            check = on_device or type(raw) is not ndarray or raw[_NAN] + raw[_INF] > 0
            if check:
                rec.maybe_bad = True
            starts.append([call])
            if not kwargs and len(inputs) == 1 and type(x := inputs[0]) is Tensor and not check:
                if x.is_floating_point():
                    hit = by_tensor.get(id(x))
                    if hit is not None and hit.ref() is x:
                        call.input_calls = [hit]
            else:
                fw._link_inputs(inputs, kwargs, call, check)
            if not row.sample_tried:
                fw._first_sample(row, t)
            step_calls.append(call)
            call.ref = ref(t)
            by_tensor[id(t)] = call
            if may_alias_any:  # what an aliasing output (Flatten, Identity, in-place ops) copies its stats from
                call.version = None if t.is_inference() else t._version
                by_storage[t.data_ptr()] = call
            if grads and t.requires_grad and grad_enabled():
                call.hooked = True
                rec.handles.append(tensor_hook(t, call))
            if check and rec.hot is None:
                fw._check_forward(module, inputs, kwargs, output, [(call, t)])

        # run eagerly, never traced: in a cell that compiles the model's caller, TorchDynamo broke the graph
        # inside this hook 3-4 times per call and compiled the pieces as ~50 frames (test_compiled.py); ~1 µs a call
        return eager(hook)

    def _first_sample(self, row: Row, t: torch.Tensor) -> None:
        """The row's kept sample (and histogram), from its first call."""
        row.sample_tried = True
        row.sample = self._sample(t)
        if self.histograms and t.numel() and self.budget.keep(self.bins * 4 + 8):
            row.hist = device_histogram(t, self.bins)

    def _record_leaves(self, name: str, type_name: str, saturation: tuple[float, float] | None, may_alias: bool,
                       module: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """The general path of the forward hook: every tensor leaf of the output (tuples, dicts,
        ``ModelOutput``), complex leaves skipped, leaves of one call recorded together."""
        on_device = self.device_path
        rec, rows = self.rec, self.rows
        leaves = tensor_leaves(output, name)
        starts = rec.occurrence.get(name)
        if starts is None:
            starts = rec.occurrence[name] = []
        k = len(starts)
        new: list[tuple[Call, torch.Tensor]] = []
        check = on_device
        for leaf_name, t in leaves:
            if t.is_complex():
                continue
            key = leaf_name if k == 0 else call_name(leaf_name, k)
            row = rows.by_key.get(key)
            if row is None:
                row = rows.new(key, name, type_name, t)
            call = Call(rec, row, name, tuple(t.shape), rec.mark)
            raw = self._aliased_stats(t) if may_alias else None
            if raw is None:
                raw, call.alive = stats_and_units(t, saturation=saturation, units=True, on_device=on_device)
            else:
                call.alive = _units_of(t, raw, on_device)
            call.raw = raw
            if not row.units and t.dim() >= 2 and t.is_floating_point() and t.shape[1]:
                rows.set_units(row, t.shape[1])
            if not check and (not isinstance(raw, np.ndarray) or raw[_NAN] + raw[_INF] > 0):
                check = True
            new.append((call, t))
        if not new:
            return
        if check:
            rec.maybe_bad = True
        starts.append([c for c, _ in new])
        first = new[0][0]
        self._link_inputs(inputs, kwargs, first, check)
        grads = self.grads and torch.is_grad_enabled()
        step_calls, handles, by_tensor, by_storage = rec.calls, rec.handles, rec.by_tensor, rec.by_storage
        for call, t in new:
            if call is not first:
                call.input_calls = first.input_calls
            row = call.row
            if not row.sample_tried:
                self._first_sample(row, t)
            step_calls.append(call)
            call.ref = weakref.ref(t)
            by_tensor[id(t)] = call
            call.version = None if t.is_inference() else t._version
            by_storage[t.data_ptr()] = call
            if grads and t.requires_grad:
                call.hooked = True
                handles.append(tensor_hook(t, call))
        if check and rec.hot is None:
            self._check_forward(module, inputs, kwargs, output, new)

    def _check_forward(self, module: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], output: Any,
                       new: list[tuple[Call, torch.Tensor]]) -> None:
        """The flight recorder's forward part: on the CPU the first non-finite output is known here
        (copy the call now); on the device path hold the call's inputs/output until the step's check,
        or (``break_on``) sync now."""
        first = new[0][0]
        if self.device_path and self.break_on is None:
            # Hold the call's tensors until the step's one check (copied only for the origin). Under
            # autograd they stay alive anyway; in a no-grad pass holding them would keep every
            # activation of the step, so an inference step's incident has no copies.
            if self.log.fwd_step is None and torch.is_grad_enabled():
                first.held = (inputs, output)
            return
        bad = any(float(c.raw.counts[2:4].sum()) > 0 if not isinstance(c.raw, np.ndarray) else c.raw[_NAN] + c.raw[_INF] > 0
                  for c, _ in new)
        if not bad:
            return
        if self.log.fwd_step is None and self.rec.hot is None:
            self.rec.snapshot(self.log.forward_incident(first, inputs, output), first)
        if self.break_on == "nonfinite" and not self._broke:
            self._broke = True
            step = self.next_step()
            raise NonFiniteError(
                f"step {step}: `{first.row.key}` produced a non-finite output (break_on='nonfinite'); "
                f"`inputs`, `output` and `module` are in this frame",
                step=step, module=first.module, row=first.row.key, inputs=inputs, output=output)

    def _on_recompute(self, name: str, output: Any) -> None:
        """A forward run by autograd during backward (checkpointing): no new call or row.

        With ``use_reentrant=True`` the original forward ran without grad and the backward flows
        through the recomputed graph, so the output-gradient hook goes on the recomputed tensor,
        for the first call of ``name`` in this step that has no hook yet (and the same output
        shape). With the non-reentrant implementation every original output was hooked already.
        """
        rec = self.rec
        starts = rec.occurrence.get(name)
        if not starts or not (self.grads and torch.is_grad_enabled()):
            return
        leaves = [t for _, t in tensor_leaves(output, name) if not t.is_complex()]
        if not leaves or not leaves[0].requires_grad:
            return
        shape = tuple(leaves[0].shape)
        free = [c for c in starts if not c[0].hooked and c[0].shape == shape]
        if not free:
            return
        first = next((c for c in free if id(c[0]) not in rec.claimed), None)
        if first is None:  # a second backward through the same graph (retain_graph)
            rec.claimed.difference_update(id(c[0]) for c in free)
            first = free[0]
        rec.claimed.add(id(first[0]))
        for call, t in zip(first, leaves):
            if t.requires_grad:
                rec.handles.append(tensor_hook(t, call))


class _HeadGrad:
    """The output-gradient hook of a classifier output no recorded call produced: the batch's class
    make-up, while its step is open."""

    __slots__ = ("mark", "rec")

    def __init__(self, rec: OpenStep, mark: StepMark) -> None:
        self.rec, self.mark = rec, mark

    def __call__(self, g: torch.Tensor) -> None:
        if not self.mark.closed:
            self.rec.classes = batch_classes(g, self.rec.device_path)
