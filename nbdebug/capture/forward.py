"""The forward hooks of a :class:`~nbdebug.capture.session.Capture`: one recorded call per tensor
leaf of a selected module's output, its stats and dead-unit mask (one
:func:`~nbdebug.capture.stats.stats_and_units` call), its inputs linked to the calls that produced
them, its output-gradient hook, and the forward part of the flight recorder.

A module called outside the model's forward (a rootless pass) or during a backward (checkpoint
recomputation) is routed to the pass rules (:mod:`.passes`) or :meth:`_Forward._on_recompute`.
The common call (one plain tensor out) takes a short path: same records, same order of effects as
the general one (tuple, dict and ``ModelOutput`` outputs, complex leaves), only fewer Python steps.

An output that aliases an already-recorded tensor of the step (Identity, Flatten, eval Dropout, a
view: same start, size and dtype) reuses its stats when the version counter has not moved. Writes
that bypass the counter (through ``.data`` or a ``.numpy()`` view) are not seen: such an alias shows
the stats from before the write.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from .calls import _EMPTY, _Call, _Row, _StepMark
from .hooks import tensor_hook
from .incidents import NonFiniteError, forward_incident
from .leaves import tensor_leaves
from .names import call_name
from .stats import IDX, SATURATING, Raw, device_histogram, stats_and_units, unit_alive

__all__ = ["MAX_CALLS"]

_NAN, _INF, _NZ, _N, _MIN, _MAX = IDX["nan"], IDX["inf"], IDX["nonzero"], IDX["numel"], IDX["min"], IDX["max"]
MAX_CALLS = 200_000  # per-call records kept per step
#: the forward hook's short path for a plain tensor output (tests turn it off to compare with the general path)
SHORT_PATH = True


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


class _Forward:
    """Mixin of :class:`~nbdebug.capture.session.Capture`: the forward hooks and what they record."""

    # attributes of the Capture (see its __init__)
    _rows: list[_Row]
    _row_of: dict[str, _Row]
    first_row: dict[str, _Row]
    _by_tensor: dict[int, _Call]
    _by_storage: dict[int, _Call]
    _may_alias_any: bool
    _occurrence: dict[str, list[list[_Call]]]
    _claimed: set[int]
    _step_calls: list[_Call]
    _mark: _StepMark
    _tensor_handles: list[Any]
    _bytes: int
    _dropped_bytes: int
    _budget_exceeded: bool
    _truncated: bool
    _layout: Any
    _maybe_bad: bool
    _hot: Any
    _hot_call: _Call | None
    _broke: bool
    _pending: list[Any]
    _root_depth: int
    _eval: bool
    _open: bool
    _open_grad: bool
    _passes: int
    max_bytes: int
    sample_size: int
    histograms: bool
    bins: int
    grads: bool
    device_path: bool
    break_on: str | None
    fwd_step: int | None
    step: int
    _rootless: Callable[[str], None]  # _Passes'
    _open_step: Callable[[bool], None]  # _Passes'

    def _new_row(self, key: str, module: str, type_: str, t: torch.Tensor) -> _Row:
        row = _Row(len(self._rows), key, module, type_, tuple(t.shape), str(t.dtype).replace("torch.", ""))
        self._rows.append(row)
        self._row_of[key] = row
        self.first_row.setdefault(module, row)
        return row

    def _link_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any], call: _Call, check: bool) -> None:
        """Link a call to the captured calls that produced its inputs (by tensor identity).

        Inputs not produced by a captured call of this step are checked for NaN/Inf only when
        ``check`` (the output was non-finite, or the device cannot tell without a sync): that check
        separates "this layer made the NaN" from "the NaN came in with the input". The check stays
        on the device (float32 min/max; never float64 there).
        """
        if not kwargs and len(args) == 1 and isinstance(args[0], torch.Tensor):
            leaves: Any = (args[0],)
        else:
            leaves = [t for _, t in tensor_leaves((args, kwargs))]
        for t in leaves:
            if not t.is_floating_point():
                continue
            hit = self._by_tensor.get(id(t))
            if hit is not None and hit.ref() is t:
                if call.input_calls is _EMPTY:
                    call.input_calls = [hit]
                elif hit not in call.input_calls:
                    call.input_calls.append(hit)
            elif check and t.numel():
                mn, mx = torch.aminmax(t.detach())
                if call.input_checks is _EMPTY:
                    call.input_checks = []
                call.input_checks.append(torch.stack([mn, mx]).to(torch.float32))

    def _aliased_stats(self, t: torch.Tensor) -> Raw | None:
        """Stats of an already-recorded tensor of this step with the same elements, or None (same
        start, size and dtype of a live storage, both contiguous, unchanged version counter; inference
        tensors have none and are always recomputed). ``_by_storage`` maps a recorded output's
        ``data_ptr`` to its call (the latest one at that address)."""
        hit = self._by_storage.get(t.data_ptr())
        if hit is None:
            return None
        src = hit.ref()
        if (src is None or hit.version is None or t.is_inference() or not t.is_contiguous() or not src.is_contiguous()
                or t.numel() != src.numel() or not t.numel() or t.dtype != src.dtype or src.data_ptr() != t.data_ptr()
                or t._version != hit.version):
            return None
        raw = hit.raw
        return raw.copy() if isinstance(raw, np.ndarray) else raw.clone()  # type: ignore[union-attr]

    def _keep(self, nbytes: int) -> bool:
        if self._bytes + nbytes > self.max_bytes:
            self._budget_exceeded = True
            self._dropped_bytes += nbytes
            return False
        self._bytes += nbytes
        return True

    def _sample(self, t: torch.Tensor) -> torch.Tensor | None:
        n = t.numel()
        if n == 0 or self.sample_size <= 0 or not self._keep(min(n, self.sample_size) * 4):
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

    def _make_forward_hook(self, name: str, mod: nn.Module) -> Any:
        type_name = type(mod).__name__
        saturation = SATURATING.get(type_name)
        on_device = self.device_path
        may_alias = saturation is None and not any(True for _ in mod.parameters(recurse=False))
        Tensor = torch.Tensor
        occurrence, row_of, by_tensor, by_storage = self._occurrence, self._row_of, self._by_tensor, self._by_storage
        task_id, grad_enabled, ref = torch._C._current_graph_task_id, torch.is_grad_enabled, weakref.ref
        ndarray = np.ndarray
        cap = self
        may_alias_any = self._may_alias_any

        def hook(module: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if task_id() != -1:  # inside a backward: checkpoint recomputation
                if not cap._eval:
                    cap._on_recompute(name, output)
                return
            if not cap._root_depth:  # called outside the model's forward
                cap._rootless(name)
            if cap._eval:
                return
            if not cap._open:  # not expected (every pass opens a step); never lose the call
                cap._open_step(grad_enabled())
                cap._passes += 1
            step_calls = cap._step_calls
            if len(step_calls) >= MAX_CALLS:
                cap._truncated = True
                return
            if type(output) is not Tensor or not SHORT_PATH or output.is_complex():
                cap._record_leaves(name, type_name, saturation, may_alias, module, inputs, kwargs, output)
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
                row = cap._new_row(key, name, type_name, t)
            # an aliasing output (Flatten, in-place ops) starts where a recorded output does
            raw = cap._aliased_stats(t) if may_alias and by_storage and t.data_ptr() in by_storage else None
            if raw is None:
                raw, alive = stats_and_units(t, saturation=saturation, units=True, on_device=on_device)
            else:
                alive = _units_of(t, raw, on_device)
            call = _Call(cap, row, name, tuple(t.shape), cap._mark)
            call.raw, call.alive = raw, alive
            if not row.units and t.dim() >= 2 and t.is_floating_point() and t.shape[1]:
                row.units = t.shape[1]
                cap._layout = None  # the step layouts list the unit rows
            check = on_device or type(raw) is not ndarray or raw[_NAN] + raw[_INF] > 0
            if check:
                cap._maybe_bad = True
            starts.append([call])
            if not kwargs and len(inputs) == 1 and type(x := inputs[0]) is Tensor and not check:
                if x.is_floating_point():
                    hit = by_tensor.get(id(x))
                    if hit is not None and hit.ref() is x:
                        call.input_calls = [hit]
            else:
                cap._link_inputs(inputs, kwargs, call, check)
            if not row.sample_tried:
                cap._first_sample(row, t)
            step_calls.append(call)
            call.ref = ref(t)
            by_tensor[id(t)] = call
            if may_alias_any:  # what an aliasing output (Flatten, Identity, in-place ops) copies its stats from
                call.version = None if t.is_inference() else t._version
                by_storage[t.data_ptr()] = call
            if cap.grads and t.requires_grad and grad_enabled():
                call.hooked = True
                cap._tensor_handles.append(tensor_hook(t, call))
            if check and cap._hot is None:
                cap._check_forward(module, inputs, kwargs, output, [(call, t)])

        return hook

    def _first_sample(self, row: _Row, t: torch.Tensor) -> None:
        """The row's kept sample (and histogram), from its first call."""
        row.sample_tried = True
        row.sample = self._sample(t)
        if self.histograms and t.numel() and self._keep(self.bins * 4 + 8):
            row.hist = device_histogram(t, self.bins)

    def _record_leaves(self, name: str, type_name: str, saturation: tuple[float, float] | None, may_alias: bool,
                       module: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """The general path of the forward hook: every tensor leaf of the output (tuples, dicts,
        ``ModelOutput``), complex leaves skipped, leaves of one call recorded together."""
        on_device = self.device_path
        leaves = tensor_leaves(output, name)
        starts = self._occurrence.get(name)
        if starts is None:
            starts = self._occurrence[name] = []
        k = len(starts)
        new: list[tuple[_Call, torch.Tensor]] = []
        check = on_device
        for leaf_name, t in leaves:
            if t.is_complex():
                continue
            key = leaf_name if k == 0 else call_name(leaf_name, k)
            row = self._row_of.get(key)
            if row is None:
                row = self._new_row(key, name, type_name, t)
            call = _Call(self, row, name, tuple(t.shape), self._mark)
            raw = self._aliased_stats(t) if may_alias else None
            if raw is None:
                raw, call.alive = stats_and_units(t, saturation=saturation, units=True, on_device=on_device)
            else:
                call.alive = _units_of(t, raw, on_device)
            call.raw = raw
            if not row.units and t.dim() >= 2 and t.is_floating_point() and t.shape[1]:
                row.units = t.shape[1]
                self._layout = None
            if not check and (not isinstance(raw, np.ndarray) or raw[_NAN] + raw[_INF] > 0):
                check = True
            new.append((call, t))
        if not new:
            return
        if check:
            self._maybe_bad = True
        starts.append([c for c, _ in new])
        first = new[0][0]
        self._link_inputs(inputs, kwargs, first, check)
        grads = self.grads and torch.is_grad_enabled()
        step_calls, tensor_handles, by_tensor, by_storage = self._step_calls, self._tensor_handles, self._by_tensor, self._by_storage
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
                tensor_handles.append(tensor_hook(t, call))
        if check and self._hot is None:
            self._check_forward(module, inputs, kwargs, output, new)

    def _check_forward(self, module: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], output: Any,
                       new: list[tuple[_Call, torch.Tensor]]) -> None:
        """The flight recorder's forward part: on the CPU the first non-finite output is known here
        (copy the call now); on the device path hold the call's inputs/output until the step's check,
        or (``break_on``) sync now."""
        first = new[0][0]
        if self.device_path and self.break_on is None:
            # Hold the call's tensors until the step's one check (copied only for the origin). Under
            # autograd they stay alive anyway; in a no-grad pass holding them would keep every
            # activation of the step, so an inference step's incident has no copies.
            if self.fwd_step is None and torch.is_grad_enabled():
                first.held = (inputs, output)
            return
        bad = any(float(c.raw.counts[2:4].sum()) > 0 if not isinstance(c.raw, np.ndarray) else c.raw[_NAN] + c.raw[_INF] > 0
                  for c, _ in new)
        if not bad:
            return
        if self.fwd_step is None and self._hot is None:
            self._hot, self._hot_call = forward_incident(self, first, inputs, output), first
        if self.break_on == "nonfinite" and not self._broke:
            self._broke = True
            step = self.step + len(self._pending) + 1
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
        starts = self._occurrence.get(name)
        if not starts or not (self.grads and torch.is_grad_enabled()):
            return
        leaves = [t for _, t in tensor_leaves(output, name) if not t.is_complex()]
        if not leaves or not leaves[0].requires_grad:
            return
        shape = tuple(leaves[0].shape)
        free = [c for c in starts if not c[0].hooked and c[0].shape == shape]
        if not free:
            return
        first = next((c for c in free if id(c[0]) not in self._claimed), None)
        if first is None:  # a second backward through the same graph (retain_graph)
            self._claimed.difference_update(id(c[0]) for c in free)
            first = free[0]
        self._claimed.add(id(first[0]))
        for call, t in zip(first, leaves):
            if t.requires_grad:
                self._tensor_handles.append(tensor_hook(t, call))
