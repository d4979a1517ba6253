"""`Capture`: per-layer statistics of outputs and output gradients while user code runs, per step.

>>> with Capture(model) as cap:                      # doctest: +SKIP
...     for x, y in data:
...         opt.zero_grad(); loss = criterion(model(x), y); loss.backward(); opt.step()
>>> cap.result.layers[0].stats["mean"], cap.result.series("0", "mean")   # doctest: +SKIP

A *step* is one grad-enabled call of the model's top-level ``forward`` (its backward and the
optimizer step that follow belong to it; with ``step_on="optimizer"`` a step runs instead until the
first training forward after an ``optimizer.step()``, so gradient-accumulation micro-batches merge and
two optimizers stepped after one backward belong to the same step). When a step closes
(at the next step's forward, or at exit) its calls are folded into the whole-run rows and one
:class:`~nbdebug.capture.history.History` entry, in one host transfer on the device path (no
per-layer sync; on the CPU path the usual training step's array work waits in a batch of up to 64 steps,
folded before anything reads it: :mod:`.batch`). Evaluation: once a grad-enabled forward has been seen, forwards under
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

Parts: :mod:`.passes` (root hooks, where steps begin and end), :mod:`.forward` (the forward hooks),
:mod:`.calls` (per-call records, output-gradient hooks), :mod:`.paramgrads` (parameter-gradient
norms), :mod:`.steps` / :mod:`.fold` / :mod:`.batch` (closing a step), :mod:`.optim` (the optimizer
watch), :mod:`.assemble` (the result at exit).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from . import assemble as _asm
from .batch import _Held, flush, take
from .budget import DEFAULT_MAX_BYTES
from .calls import _Call, _Row, _StepMark, _version
from .errors import ErrorSite, locate
from .forward import MAX_CALLS, _Forward
from .history import History
from .hooks import HookSet
from .incidents import Incident, LossSpikes, NonFiniteError
from .optim import OptimizerWatch
from .paramgrads import _ParamGrads
from .passes import _Passes
from .result import CaptureResult, LayerRecord
from .select import LayerFilter, select_modules
from .stats import N_FIELDS, SATURATING
from .steps import PENDING_NO_GRAD, close_step, commit, finish
from .weak import ModelRef

__all__ = ["MAX_CALLS", "Capture", "CaptureResult", "LayerRecord"]


def device_path_default() -> bool:
    """``NBDEBUG_DEVICE_PATH=1`` runs the accelerator path (stats stay on device) on the CPU too."""
    return os.environ.get("NBDEBUG_DEVICE_PATH", "") not in ("", "0")


class Capture(_Passes, _Forward, _ParamGrads):
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
        self._history = copy.deepcopy(resume.history) if resume is not None and resume.history is not None else History(self.max_bytes)
        self._batch: list[Any] = []  # closed steps whose numbers wait to be folded (batch.py)
        self._batch_sig: Any = None
        self._hooks = HookSet()
        # Output-gradient hooks: removed at exit (through the HookSet), pruned when a step closes once
        # their tensor's graph is gone (a long loop does not accumulate millions of handles).
        self._tensor_handles: list[Any] = []
        self._prune_at = 256  # prune the handles when there are this many
        self.watch: Any = None  # OptimizerWatch while entered
        self._rows: list[_Row] = []
        self._row_of: dict[str, _Row] = {}
        # whole-run accumulators per row id (see fold.accumulate_step): outputs' and gradients' raw stats
        # side by side in run_rg, run_raw / run_grad its two halves
        self.run_rg = np.zeros((0, 2 * N_FIELDS))
        self.run_raw, self.run_grad = self.run_rg[:, :N_FIELDS], self.run_rg[:, N_FIELDS:]
        self.run_calls = np.zeros(0, np.int64)
        self.run_units = np.zeros(0, bool)
        self.units_known = 0  # rows whose ``units`` are in run_units
        self.first_row: dict[str, _Row] = {}  # module name → its first row (param/optimizer stats go there)
        self.module_of: dict[str, nn.Module] = dict(self.modules)
        self._step_calls: list[_Call] = []
        self._by_tensor: dict[int, _Call] = {}  # id(output) → its call (call.ref checks identity)
        # data_ptr of recorded outputs → their call (its weak ref and version): an output that aliases one of
        # them unchanged (Identity, Dropout in eval, Flatten, views; same size and dtype, both contiguous)
        # has the same stats, so they are copied instead of recomputed.
        self._by_storage: dict[int, _Call] = {}
        # some selected module can return an alias of a recorded output (no parameters, not saturating)
        self._may_alias_any = any(SATURATING.get(type(m).__name__) is None and not any(True for _ in m.parameters(recurse=False))
                                  for _, m in self.modules)
        self._occurrence: dict[str, list[list[_Call]]] = {}  # module → leaves of each of its calls in this pass
        self._claimed: set[int] = set()  # id of first leaves whose recomputation was hooked in this step
        self.step = resume.steps if resume is not None else 0  # last committed step
        self._passes = 0
        self._open = False  # a step is being recorded
        self._opt_stepped = False  # step_on="optimizer": an optimizer stepped in the open step (passes.py)
        self._mark = _StepMark()  # shared by the open step's calls (closed when it closes)
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
        self._pg_params: list[torch.Tensor] = []  # the watched parameters (paramgrads), while entered
        self._pg_seen: list[Any] = []  # per watched parameter: (weakref to its .grad, version) at the last look
        self._pg_queued = 0  # 1: the backward-end callback is queued (paramgrads)
        self._pg_scanned = False  # the open step's gradients were looked at after a backward
        self._pg_late = False  # ... and its norms were taken late (before the optimizer step, or at close)
        self.pg_seen = False  # some step had fresh parameter gradients
        self._pg_norms: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self._param_owner: dict[int, list[str]] = {}
        self._grad_snapshot: dict[int, tuple[int, int | None]] = {}
        self._pg_map: tuple[tuple[int, ...], Any] | None = None  # the last parameter list's owners (paramgrads)
        self._layout: Any = None  # the last step's fold.Layout (rows of its calls, in order)
        self._maybe_bad = False  # a hook of the open step saw a NaN/Inf count (or stats it cannot read on the host)
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
            self._mark.closed = True  # the step's calls: a gradient from now on is late
            self._mark = _StepMark()
            self._step_calls = []
            self._prune_tensor_hooks()
            self._by_tensor.clear()
            self._by_storage.clear()
            self._losses = []
            self._last_grad = None
            self._pg_norms = None
            self._hot, self._hot_call = None, None
            self._maybe_bad = False

    def _remove_tensor_hooks(self) -> None:
        handles, self._tensor_handles = self._tensor_handles, []
        for h in handles:
            h.remove()

    def _prune_tensor_hooks(self) -> None:
        """Drop the handles of gradient hooks whose tensor is gone, once the list has doubled since the
        last pruning (a long loop keeps only the hooks of graphs still alive, at no cost per step)."""
        if len(self._tensor_handles) < self._prune_at:
            return
        self._tensor_handles = [h for h in self._tensor_handles if h.hooks_dict_ref() is not None]
        self._prune_at = max(256, 2 * len(self._tensor_handles))

    @property
    def history(self) -> History:
        """The per-step history so far (steps waiting in the batch are folded first)."""
        if self._batch:
            try:
                flush(self)
            except Exception as err:  # never break a reader (a live view) with ours: those steps are lost
                note = f"nbdebug could not summarise a step: {type(err).__name__}: {err}"
                if note not in self.notes:
                    self.notes.append(note)
        return self._history

    def _hold_back(self, step: Any) -> None:
        """Hold back a no-grad step closed before any training forward (a ``_StepData``, or a ``_Held``
        one waiting for the batch); after :data:`PENDING_NO_GRAD` of them the cell is an inference cell."""
        self._pending.append(step)
        if len(self._pending) >= PENDING_NO_GRAD:
            self._commit_pending()

    def _commit_pending(self) -> None:
        """The held-back no-grad steps are an inference cell's: fold them, in order (those that qualified
        for the batch are taken into it, after the steps already there)."""
        pending, self._pending = self._pending, []
        for data in pending:
            if type(data) is _Held:
                take(self, data.sig, data.waiting, data.lrs, data.skipped)
            else:
                flush(self)
                commit(self, data)

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
                                        on_device=True if self.device_path else None, on_step=self._on_optimizer_step,
                                        on_pre=self._pg_pre if self.grads else None)
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
            try:  # a KeyboardInterrupt while folding the last steps still lets go of the model (below)
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
                self._pg_params, self._pg_seen = [], []
                self._loss_prev = None
