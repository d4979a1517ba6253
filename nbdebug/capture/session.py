"""`Capture`: per-layer statistics of outputs and output gradients while user code runs, per step.

>>> with Capture(model) as cap:                      # doctest: +SKIP
...     for x, y in data:
...         opt.zero_grad(); loss = criterion(model(x), y); loss.backward(); opt.step()
>>> cap.result.layers[0].stats["mean"], cap.result.series("0", "mean")   # doctest: +SKIP

A *step* is one grad-enabled call of the model's top-level ``forward`` (its backward and the
optimizer step that follow belong to it; ``step_on="optimizer"`` ends a step after each
``optimizer.step()`` instead, so gradient-accumulation micro-batches merge). When a step closes
(at the next step's forward, or at exit) its calls are folded into the whole-run rows and one
:class:`~nbdebug.capture.history.History` entry, in one host transfer on the device path (no
per-layer sync). Evaluation: once a grad-enabled forward has been seen, forwards under
``no_grad``/``inference_mode`` are not steps (counted in ``eval_steps``, not recorded). No-grad
forwards *before* the first grad-enabled one are held back: they become evaluation when training
starts, and steps when it never does (an inference cell), or once 16 of them are waiting.
Forward passes that autograd runs during backward (checkpoint recomputation) are not new calls.
When the loop calls submodules directly and never the model's own ``forward`` (Lightning's
``training_step`` doing ``self.decoder(self.encoder(x))``), a *pass* stands in for that call: it
begins at a selected module's call when no step is open, after a top-level forward, when grad mode
changes, or when the pass's first module (the first selected module that ran in it) runs again; the
same rules then apply to passes (a loop of ``m.decoder(m.encoder(x))`` with backward and optimizer step
is one step per iteration with either ``step_on``; its ``inference_mode`` validation passes are
evaluation). A no-grad call inside a training pass that is not its first module (a target network) is
part of that pass, not an evaluation (not recorded).
Hooks are removed on every exit path and the model is left exactly as it was.

GradScaler (mixed precision): backward runs on the scaled loss, so output gradients and parameter
gradients are seen multiplied by the scale. The optimizer watch records the scale in effect for the
step (``GradScaler.scale``/``.step``; a float on the CPU, a device tensor folded into the step's one
transfer otherwise) and the step's gradient statistics (mean/std/min/max/norm, not the NaN/Inf
counts) and parameter-gradient norms are divided by it when the step closes, before they are merged
into the whole-run rows. Parameter-gradient norms are taken at the end of backward (scaled, even when
the user calls ``scaler.unscale_(opt)`` before ``step`` to clip): divided too; if they could only be
taken when the step closes (no engine callback), ``scaler.step`` has already unscaled them: as is.
Gradients arriving after their step closed (a delayed backward) are not unscaled.

``loss``: when it returns the very object it returned at the previous step's close (the variable was
not reassigned: the forward raised before it, or the loop forgot), the step's loss is unknown (NaN),
with a note listing those steps (``stale_loss``).
"""

from __future__ import annotations

import copy
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from . import assemble as _asm
from .budget import DEFAULT_MAX_BYTES
from .calls import _EMPTY, _Call, _in_backward, _Row, _version, grad_norms
from .errors import ErrorSite, locate
from .history import History
from .hooks import HookSet
from .incidents import Incident, LossSpikes, NonFiniteError, forward_incident
from .leaves import local, tensor_leaves
from .names import call_name
from .optim import OptimizerWatch, as_float_later, loss_of_output
from .result import CaptureResult, LayerRecord
from .select import LayerFilter, select_modules
from .stats import (
    IDX,
    N_FIELDS,
    SATURATING,
    Raw,
    device_histogram,
    tensor_stats,
    unit_alive,
)
from .steps import close_step, commit, finish
from .weak import ModelRef

__all__ = ["Capture", "CaptureResult", "LayerRecord"]

_NAN, _INF, _NZ, _N, _MIN, _MAX = IDX["nan"], IDX["inf"], IDX["nonzero"], IDX["numel"], IDX["min"], IDX["max"]
MAX_CALLS = 200_000  # per-call records kept per step



def device_path_default() -> bool:
    """``NBDEBUG_DEVICE_PATH=1`` runs the accelerator path (stats stay on device) on the CPU too."""
    return os.environ.get("NBDEBUG_DEVICE_PATH", "") not in ("", "0")


class Capture:
    """Context manager recording statistics of selected modules' outputs (and their gradients) per step.

    Parameters: ``layers`` (see :func:`nbdebug.capture.select_modules`; default: every leaf
    module), ``grads`` (hook output gradients when a backward runs inside the block),
    ``histograms`` (exact 32-bin histograms of every output, computed on the device),
    ``sample_size`` (values kept per layer for on-demand histograms and the near-zero fraction),
    ``max_bytes`` (budget for everything kept beyond scalar stats, and the history), ``near_zero_eps``,
    ``device_path`` (keep stats on the device and sync once per step even on the CPU; default from
    ``NBDEBUG_DEVICE_PATH``; always on for accelerators), ``every`` (the history keeps steps 1, 1+N, …,
    the last and the first non-finite one; the check runs every step), ``step_on`` (``"forward"`` or
    ``"optimizer"``), ``loss`` (returns the step's loss; default: the model's output when it is a scalar
    or has ``.loss``), ``break_on`` (``"nonfinite"``: raise :class:`NonFiniteError` at the first
    non-finite forward output; syncs once per module call on accelerators), ``resume`` (a previous
    result: steps and history continue), ``on_step`` (called with the capture after each appended step).
    """

    def __init__(
        self,
        model: nn.Module,
        layers: LayerFilter = None,
        *,
        grads: bool = True,
        histograms: bool = False,
        sample_size: int = 4096,
        max_bytes: int = DEFAULT_MAX_BYTES,
        near_zero_eps: float = 1e-6,
        bins: int = 32,
        device_path: bool | None = None,
        every: int = 1,
        step_on: str = "forward",
        loss: Callable[[], Any] | None = None,
        break_on: str | None = None,
        resume: CaptureResult | None = None,
        on_step: Callable[[Capture], None] | None = None,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an integer ≥ 1, got {every!r}")
        if step_on not in ("forward", "optimizer"):
            raise ValueError(f"step_on must be 'forward' or 'optimizer', got {step_on!r}")
        if break_on not in (None, "nonfinite"):
            raise ValueError(f"break_on must be None or 'nonfinite', got {break_on!r}")
        if resume is not None and not isinstance(resume, CaptureResult):
            raise ValueError(f"resume must be a CaptureResult (an earlier run's result), got {type(resume).__name__}")
        self._model = ModelRef(model)  # weak after __exit__: a result outliving the cell never keeps the model
        self._hold: nn.Module | None = model  # strong until __exit__
        self.modules = select_modules(model, layers)  # strong until __exit__ (hooks need them), then dropped
        self.grads = grads
        self.histograms = histograms
        self.sample_size = int(sample_size)
        self.max_bytes = int(max_bytes)
        self.near_zero_eps = near_zero_eps
        self.bins = bins
        self.device_path = device_path_default() if device_path is None else bool(device_path)
        self.every, self.step_on, self.loss_fn, self.break_on = every, step_on, loss, break_on
        self.resume, self.on_step = resume, on_step
        self.result: CaptureResult | None = None
        self.history = copy.deepcopy(resume.history) if resume is not None and resume.history is not None else History(self.max_bytes)
        self._hooks = HookSet()
        # Output-gradient hooks: removed at exit (through the HookSet), pruned when a step closes once
        # their tensor's graph is gone (a long loop does not accumulate millions of handles).
        self._tensor_handles: list[Any] = []
        self.watch: Any = None  # OptimizerWatch while entered
        self._rows: list[_Row] = []
        self._row_of: dict[str, _Row] = {}
        self.run_raw = np.zeros((0, N_FIELDS))  # whole-run accumulators per row id (see assemble.commit)
        self.run_grad = np.zeros((0, N_FIELDS))
        self.run_calls = np.zeros(0, np.int64)
        self.run_units = np.zeros(0, bool)
        self.units_known = 0  # rows whose ``units`` are in run_units
        self.first_row: dict[str, _Row] = {}  # module name → its first row (param/optimizer stats go there)
        self.module_of: dict[str, nn.Module] = dict(self.modules)
        self._step_calls: list[_Call] = []
        self._by_tensor: dict[int, _Call] = {}  # id(output) → its call (call.ref checks identity)
        # (data_ptr, numel, dtype) of recorded contiguous outputs → (tensor, call, version): an output
        # that aliases one of them unchanged (Identity, Dropout in eval, Flatten, views) has the same
        # stats, so they are copied instead of recomputed.
        self._by_storage: dict[tuple[int, int, torch.dtype], _Call] = {}
        self._occurrence: dict[str, list[list[_Call]]] = {}  # module → leaves of each of its calls in this pass
        self._claimed: set[int] = set()  # id of first leaves whose recomputation was hooked in this step
        self.step = resume.steps if resume is not None else 0  # last committed step
        self._passes = 0
        self._open = False  # a step is being recorded
        self._open_grad = False  # ... and it is a training step
        self._eval = False  # the current top-level pass is an evaluation (not recorded)
        self._seen_training = False
        self._root_depth = 0  # the model's own forward is running (nesting depth)
        self._first: str | None = None  # first selected module of the open pass when the root is not called
        self._eval_first: str | None = None  # ... of the evaluation pass
        self._eval_stretch = 0  # evaluation passes since the last training/no-grad pass
        self.eval_steps = 0
        self._pending: list[Any] = []  # closed no-grad steps not yet known to be steps or evaluation
        self._late: list[_Call] = []  # calls of closed steps whose gradients arrived late
        self._grad_counter = 0
        self._last_grad: tuple[Any, ...] | None = None  # the last output gradient's (ref, ptr, numel, dtype, version, stats)
        self._bytes = 0
        self._dropped_bytes = 0
        self._budget_exceeded = False
        self._truncated = False
        self._losses: list[Any] = []  # the open step's losses (floats or device tensors)
        self._loss_prev: Any = None  # what loss() returned at the previous close (weakref / 1-tuple)
        self.stale_loss: list[int] = []  # steps whose loss() returned the previous step's object (NaN loss)
        self._pg_fresh: dict[int, torch.Tensor] = {}  # params whose .grad a backward of this step wrote
        self._pg_queued = False
        self.pg_seen = False  # some step had fresh parameter gradients
        self._pg_norms: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self._param_owner: dict[int, list[str]] = {}
        self._grad_snapshot: dict[int, tuple[int, int | None]] = {}
        self._t0 = 0.0
        self._error: ErrorSite | None = None
        self._raised: str | None = None
        # first non-finite bookkeeping (filled when steps close; see assemble.close_step)
        self.fwd_origin: tuple[int, bool] | None = None
        self.fwd_step: int | None = resume.forward_nonfinite_step if resume is not None else None
        self.bwd_row: int | None = None
        self.bwd_origin: int | None = None
        self.bwd_step: int | None = resume.backward_nonfinite_step if resume is not None else None
        self.pg_step: int | None = resume.param_grad_nonfinite_step if resume is not None else None
        self.incidents: list[Incident] = list(resume.incidents) if resume is not None else []
        self.skipped: list[int] = []
        self.lrs: dict[str, float] = {}
        self.spikes = LossSpikes()
        self.prev_values: np.ndarray | None = None  # the last committed step's history values (rows × fields)
        self.prev_rows: np.ndarray | None = None
        self.unappended: Any = None  # the last committed step when --every left it out
        self._hot: Incident | None = None  # CPU path: the forward incident snapshotted in the hook
        self._hot_call: _Call | None = None
        self._broke = False
        self.notes: list[str] = []

    # -- steps --------------------------------------------------------------------------------
    def _on_root_pre(self, *_: Any) -> None:
        if _in_backward():  # the whole model recomputed by checkpointing: not a new step
            return
        self._root_depth += 1
        self._first = None
        self._begin_pass()

    def _on_root_end(self, *_: Any) -> None:
        if not _in_backward() and self._root_depth:
            self._root_depth -= 1

    def _rootless(self, name: str) -> None:
        """A selected module ran while the model's own ``forward`` is not running: a new pass begins
        when nothing is open, after a top-level forward, when grad mode changes, or when the pass's
        first module runs again."""
        grad = torch.is_grad_enabled()
        if not grad and self._seen_training:  # evaluation
            if not self._eval or name == self._eval_first:
                self._begin_pass()
                self._eval_first = name
            return
        if self._eval:
            if self._open and self._open_grad and self._first is not None and name != self._first \
                    and self._eval_stretch == 1:
                # a no-grad call inside a training pass (a target network): part of that pass
                self._eval, self._eval_stretch = False, 0
                self.eval_steps -= 1
                return
        elif self._open and grad == self._open_grad and self._first is not None and name != self._first:
            return
        self._begin_pass()
        self._first = name

    def _begin_pass(self) -> None:
        """A top-level pass begins: an evaluation, or a pass of the open step, or a new step."""
        grad = torch.is_grad_enabled()
        if not grad and self._seen_training:
            self._eval = True
            self._eval_stretch += 1
            self.eval_steps += 1
            return
        self._eval, self._eval_stretch = False, 0
        if grad and not self._seen_training:
            if self._open and not self._open_grad:
                self._close_step()  # held back: it becomes an evaluation just below
            self._seen_training = True
            if self._pending:
                self.eval_steps += len(self._pending)
                self._pending.clear()
        if self._open and (self.step_on == "forward" or not grad or not self._open_grad):
            self._close_step()
        if not self._open:
            self._open, self._open_grad = True, grad
        self._passes += 1
        self._occurrence.clear()
        self._claimed.clear()

    def _on_root_out(self, _m: nn.Module, _args: Any, output: Any) -> None:
        if self._eval or _in_backward() or self.loss_fn is not None:
            return
        loss = loss_of_output(output)
        if loss is not None:
            self._losses.append(as_float_later(loss))

    def _on_optimizer_step(self) -> None:
        if self.step_on == "optimizer" and self._open and self._open_grad:
            self._close_step()

    def _close_step(self) -> None:
        """Fold the open step into the rows and the history (see :func:`assemble.close_step`)."""
        self._open = False
        try:
            close_step(self)
        except Exception as err:  # never break the user's loop with ours: the step is lost, a note says so
            note = f"nbdebug could not summarise a step: {type(err).__name__}: {err}"
            if note not in self.notes:
                self.notes.append(note)
        finally:
            self._step_calls = []
            self._prune_tensor_hooks()
            self._by_tensor.clear()
            self._by_storage.clear()
            self._losses = []
            self._last_grad = None
            self._pg_norms = None
            self._hot, self._hot_call = None, None

    def _remove_tensor_hooks(self) -> None:
        handles, self._tensor_handles = self._tensor_handles, []
        for h in handles:
            h.remove()

    def _prune_tensor_hooks(self) -> None:
        self._tensor_handles = [h for h in self._tensor_handles if h.hooks_dict_ref() is not None]

    def _commit_pending(self) -> None:
        pending, self._pending = self._pending, []
        for data in pending:
            commit(self, data)

    # -- forward hooks -------------------------------------------------------------------------
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
        start, size and dtype of a live storage, unchanged version counter; inference tensors have
        none and are always recomputed)."""
        if not self._by_storage or not t.is_contiguous() or not t.numel():
            return None
        hit = self._by_storage.get((t.data_ptr(), t.numel(), t.dtype))
        if hit is None:
            return None
        src = hit.ref()
        if t.is_inference() or src is None or src.data_ptr() != t.data_ptr() or _version(t) != hit.version:
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
        tensor_cls = torch.Tensor
        occurrence, row_of, by_tensor, by_storage = self._occurrence, self._row_of, self._by_tensor, self._by_storage
        task_id = torch._C._current_graph_task_id

        def hook(module: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if not self._root_depth and task_id() == -1:  # called outside the model's forward
                self._rootless(name)
            if self._eval:
                return
            if task_id() != -1:  # inside a backward: checkpoint recomputation
                self._on_recompute(name, output)
                return
            if not self._open:  # not expected (every pass opens a step); never lose the call
                self._open, self._open_grad = True, torch.is_grad_enabled()
                self._passes += 1
            if len(self._step_calls) >= MAX_CALLS:
                self._truncated = True
                return
            leaves = ((name, output),) if isinstance(output, tensor_cls) else tensor_leaves(output, name)
            starts = occurrence.get(name)
            if starts is None:
                starts = occurrence[name] = []
            k = len(starts)
            new: list[tuple[_Call, torch.Tensor]] = []
            check = on_device
            for leaf_name, t in leaves:
                if t.is_complex():
                    continue
                key = leaf_name if k == 0 else call_name(leaf_name, k)
                row = row_of.get(key)
                if row is None:
                    row = self._new_row(key, name, type_name, t)
                call = _Call(self, row, name, tuple(t.shape))
                raw = self._aliased_stats(t) if may_alias else None
                if raw is None:
                    raw = tensor_stats(t, saturation=saturation, on_device=on_device)
                call.raw = raw
                if t.dim() >= 2 and t.is_floating_point():
                    if on_device or not isinstance(raw, np.ndarray):
                        call.alive = unit_alive(t, 0, True)
                    elif raw[_NZ] < raw[_N]:
                        call.alive = unit_alive(t, 1 if raw[_MIN] >= 0 else (-1 if raw[_MAX] <= 0 else 0))
                    if not row.units:
                        row.units = t.shape[1]
                if not check and (not isinstance(raw, np.ndarray) or raw[_NAN] + raw[_INF] > 0):
                    check = True
                new.append((call, t))
            if not new:
                return
            starts.append([c for c, _ in new])
            first = new[0][0]
            self._link_inputs(inputs, kwargs, first, check)
            grads = self.grads and torch.is_grad_enabled()
            step_calls, tensor_handles = self._step_calls, self._tensor_handles
            for call, t in new:
                if call is not first:
                    call.input_calls = first.input_calls
                row = call.row
                if not row.sample_tried:
                    row.sample_tried = True
                    row.sample = self._sample(t)
                    if self.histograms and t.numel() and self._keep(self.bins * 4 + 8):
                        row.hist = device_histogram(t, self.bins)
                step_calls.append(call)
                call.ref = weakref.ref(t)
                by_tensor[id(t)] = call
                if t.is_contiguous() and t.numel():
                    call.version = None if t.is_inference() else t._version
                    by_storage[(t.data_ptr(), t.numel(), t.dtype)] = call
                if grads and t.requires_grad:
                    call.hooked = True
                    tensor_handles.append(t.register_hook(call))
            if check and self._hot is None:
                self._check_forward(module, inputs, kwargs, output, new)

        return hook

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
                self._tensor_handles.append(t.register_hook(call))

    def _grad_stats(self, g: torch.Tensor) -> Raw:
        """Stats of one output gradient (for :class:`~nbdebug.capture.calls._Call`'s gradient hook)."""
        return tensor_stats(g, on_device=self.device_path)

    # -- parameter gradients ------------------------------------------------------------------
    def _on_param_grad(self, p: torch.Tensor) -> None:
        self._pg_fresh[id(p)] = p
        if not self._pg_queued:
            self._pg_queued = True
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
            except Exception:  # no engine callback: norms are taken when the step closes
                self._pg_queued = False

    def _on_backward_end(self) -> None:
        """End of a backward: one ``_foreach_norm`` over the parameters whose gradients it wrote."""
        self._pg_queued = False
        self._take_param_norms()

    def _take_param_norms(self) -> None:
        params = [p for p in self._pg_fresh.values() if p.grad is not None and p.grad.layout == torch.strided]
        if not params:
            return
        grads = [local(p.grad).detach() for p in params]  # type: ignore[union-attr]
        self._pg_norms = (params, grad_norms(grads, self.device_path))  # type: ignore[assignment]

    def _watch_params(self) -> None:
        """Post-accumulate-grad hooks on the selected modules' own parameters (removed at exit)."""
        for name, module in self.modules:
            for p in module.parameters(recurse=False):
                if not p.requires_grad or not p.is_leaf:
                    continue
                owners = self._param_owner.get(id(p))
                if owners is not None:
                    owners.append(name)
                    continue
                self._param_owner[id(p)] = [name]
                was_none = p._post_accumulate_grad_hooks is None
                handle = p.register_post_accumulate_grad_hook(self._on_param_grad)

                def undo(p: torch.Tensor = p, handle: Any = handle, was_none: bool = was_none) -> None:
                    handle.remove()
                    if was_none and not p._post_accumulate_grad_hooks:
                        p._post_accumulate_grad_hooks = None

                self._hooks.on_remove(undo)

    def _producer(self, t: torch.Tensor) -> tuple[str, tuple[int, ...] | None] | None:
        """Row name of the captured call that produced ``t``, and that call's first input shape."""
        call = self._by_tensor.get(id(t))
        if call is None or call.ref is None or call.ref() is not t:
            return None
        src = call.input_calls[0].shape if call.input_calls else None
        return call.row.key, src

    @property
    def model(self) -> nn.Module:
        """The captured model (raises :class:`~nbdebug.capture.ModelGoneError` once it is deleted)."""
        return self._model.get()

    # -- context manager --------------------------------------------------------------------
    def __enter__(self) -> Capture:
        self._t0 = time.perf_counter()
        model = self.model
        self._grad_snapshot = {id(p): (id(p.grad), _version(p.grad)) for p in model.parameters() if p.grad is not None}
        try:
            self._hooks.forward_pre(model, self._on_root_pre)
            if self.loss_fn is None:
                self._hooks.forward(model, self._on_root_out)
            for name, module in self.modules:
                self._hooks.forward(module, self._make_forward_hook(name, module), with_kwargs=True)
            # after the modules' hooks (a selected root's own hook still sees its forward running), and
            # also called when the forward raises
            end = model.register_forward_hook(self._on_root_end, always_call=True)
            self._hooks.on_remove(end.remove)
            if self.grads:
                self._watch_params()
            self._hooks.on_remove(self._remove_tensor_hooks)
            self.watch = OptimizerWatch(self.modules, self._hooks, self.max_bytes, model=model,
                                        on_device=True if self.device_path else None, on_step=self._on_optimizer_step)
            self.watch.__enter__()
        except BaseException:
            self._hooks.remove()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None, tb: Any = None) -> None:
        if exc is not None:
            text = str(exc).strip().splitlines()
            self._raised = type(exc).__name__ + (f": {text[0]}" if text else "")
            try:
                self._error = None if isinstance(exc, NonFiniteError) else locate(exc, self.model, self._producer, tb)
            except Exception:  # never mask the user's exception with ours
                self._error = None
        try:
            self._hooks.remove()
        finally:
            try:
                finish(self)
            except Exception as err:
                if exc is None:
                    raise
                self.notes.append(f"nbdebug could not fold the last step: {type(err).__name__}: {err}")
            try:
                self.result = _asm.assemble(self)
            except Exception as err:
                if exc is None:
                    raise
                # The user's exception is what the cell must show: ours becomes a note.
                self._rows = []
                self.result = _asm.assemble(self)
                self.result.notes.append(f"nbdebug could not summarise what ran before the error: {type(err).__name__}: {err}")
            finally:
                self.modules, self.module_of = [], {}  # the model's submodules (and their parameters) are not ours to keep
                self._hold = None
                self.watch = None
                self._step_calls, self._late, self._pending = [], [], []
                self._by_tensor.clear()
                self._by_storage.clear()
                self._pg_fresh.clear()
                self._pg_norms = None
                self._loss_prev = None
