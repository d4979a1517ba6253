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

Parts, in the order data flows through them; each is a small object built here with what it reads,
and what must go back up (close a step, a step opened, look at the parameter gradients) is a callback
handed to it when it is built. None of them imports this module:

    hooks (ForwardHooks, Passes, Call, ParamGrads, OptimizerWatch)
      -> per-call records of the open step (OpenStep, RowTable)
      -> step close (closing.close_step: one ClosedStep -> host -> StepData)
      -> step folding / batching (Steps, Batch, Layout, RunTotals)
      -> history (History) and incident log (IncidentLog)
      -> result at exit (assemble.assemble -> CaptureResult)

:mod:`.passes` (root hooks, where steps begin and end), :mod:`.forward` (the forward hooks),
:mod:`.calls` (per-call records, output-gradient hooks), :mod:`.paramgrads` (parameter-gradient
norms), :mod:`.closing` / :mod:`.steps` / :mod:`.fold` / :mod:`.batch` (closing and folding a step),
:mod:`.incidents` (first non-finite value, loss spikes), :mod:`.optim` (the optimizer
watch), :mod:`.assemble` (the result at exit).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from .assemble import assemble, grad_snapshot, param_grad_norms
from .budget import DEFAULT_MAX_BYTES, Budget
from .calls import OpenStep
from .closing import ClosedStep, close_step
from .eager import eager
from .errors import ErrorSite, locate
from .forward import MAX_CALLS, ForwardHooks
from .history import History
from .hooks import HookSet
from .incidents import Incident, IncidentLog, NonFiniteError
from .losses import BACKWARD, BACKWARD_NOTES, UserLoss
from .optim import OptimizerWatch
from .paramgrads import ParamGrads
from .passes import Passes
from .result import CaptureResult, LayerRecord
from .rows import RowTable
from .select import LayerFilter, select_modules
from .steps import Steps
from .warned import Warned
from .weak import ModelRef

__all__ = ["MAX_CALLS", "Capture", "CaptureOptions", "CaptureResult", "LayerRecord"]


def device_path_default() -> bool:
    """``NBDEBUG_DEVICE_PATH=1`` runs the accelerator path (stats stay on device) on the CPU too."""
    return os.environ.get("NBDEBUG_DEVICE_PATH", "") not in ("", "0")


@dataclass(frozen=True)
class CaptureOptions:
    """A capture's options, as given to :class:`Capture` (see its docstring)."""

    grads: bool = True
    histograms: bool = False
    sample_size: int = 4096
    max_bytes: int = DEFAULT_MAX_BYTES
    near_zero_eps: float = 1e-6
    bins: int = 32
    device_path: bool = False
    every: int = 1
    step_on: str = "forward"
    loss: Callable[[], Any] | None = None
    break_on: str | None = None
    resume: CaptureResult | None = None
    on_step: Callable[[Capture], None] | None = None
    fast_paths: bool = True


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
    or has ``.loss``, else the tensor ``backward()`` ran on), ``break_on`` (``"nonfinite"``: raise :class:`NonFiniteError` at the first
    non-finite forward output; syncs once per module call on accelerators), ``resume`` (a previous
    result: steps and history continue), ``on_step`` (called with the capture after each appended step),
    ``fast_paths`` (False: the reference path the fast ones are tested against, same numbers: every module
    call through the forward hook's general path, every step folded alone, scanned for non-finite
    values and accumulated row by row).
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
        fast_paths: bool = True,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an integer ≥ 1, got {every!r}")
        if step_on not in ("forward", "optimizer"):
            raise ValueError(f"step_on must be 'forward' or 'optimizer', got {step_on!r}")
        if break_on not in (None, "nonfinite"):
            raise ValueError(f"break_on must be None or 'nonfinite', got {break_on!r}")
        if resume is not None and not isinstance(resume, CaptureResult):
            raise ValueError(f"resume must be a CaptureResult (an earlier run's result), got {type(resume).__name__}")
        o = self.options = CaptureOptions(
            grads, histograms, int(sample_size), int(max_bytes), near_zero_eps, bins,
            device_path_default() if device_path is None else bool(device_path), every, step_on, loss, break_on,
            resume, on_step, fast_paths)
        self._model = ModelRef(model)  # weak after __exit__: a result outliving the cell never keeps the model
        self._hold: nn.Module | None = model  # strong until __exit__
        self.modules = select_modules(model, layers)  # strong until __exit__ (hooks need them), then dropped
        self.result: CaptureResult | None = None
        self.notes: list[str] = []
        self.watch: OptimizerWatch | None = None  # while entered
        self._warned = Warned(lambda: self._steps.count)  # bug-pointing PyTorch warnings shown in the cell
        self._hooks = HookSet()
        self.rows = RowTable()
        self._budget = Budget(o.max_bytes)
        self._log = IncidentLog(self._budget, dict(self.modules), self._optimizer_state, resume)
        history = copy.deepcopy(resume.history) if resume is not None and resume.history is not None else History(o.max_bytes)
        self._steps = Steps(self.rows, history, self._log, every=every, first=(resume.steps if resume is not None else 0) + 1,
                            on_step=None if on_step is None else self._stepped, batching=fast_paths)
        self._pg = ParamGrads(o.device_path)
        self._rec = OpenStep(o.device_path, self._pg)
        self._passes = Passes(step_on, close_step=self._close_step, step_opens=self._pg.step_opens,
                              new_pass=self._rec.new_pass, drop_held=self._steps.drop_pending)
        self._forward = ForwardHooks(self.rows, self._rec, self._passes, self._budget, self._log, self._steps.next_number,
                                     device_path=o.device_path, grads=grads, sample_size=o.sample_size,
                                     histograms=histograms, bins=bins, break_on=break_on, short_path=fast_paths,
                                     read_loss=loss is None)
        self._loss = UserLoss(loss, self.notes, o.device_path) if loss is not None else None
        self._t0 = 0.0
        self._error: ErrorSite | None = None
        self._raised: str | None = None
        self._grads_before: dict[int, tuple[int, int | None]] = {}

    # -- what readers see while it runs ------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The captured model (raises :class:`~nbdebug.capture.ModelGoneError` once it is deleted)."""
        return self._model.get()

    @property
    def history(self) -> History:
        """The per-step history so far (steps waiting in the batch are folded first)."""
        steps = self._steps
        if len(steps.batch):
            try:
                steps.flush()
            except Exception as err:  # never break a reader (a live view) with ours: those steps are lost
                self._note(f"nbdebug could not summarise a step: {type(err).__name__}: {err}")
        return steps.history

    @property
    def incidents(self) -> list[Incident]:
        """The run's incidents so far (first non-finite value, loss spikes)."""
        return self._log.incidents

    @property
    def step(self) -> int:
        """The last committed step (1-based; steps still held back are not counted yet)."""
        return self._steps.count

    @property
    def every(self) -> int:
        """The history keeps every ``every``-th step."""
        return self.options.every

    @property
    def stale_loss(self) -> list[int]:
        """Steps whose ``loss()`` returned the previous step's very object (their loss is NaN)."""
        return self._loss.stale if self._loss is not None else []

    @property
    def batched_steps(self) -> int:
        """Steps that waited in a batch to be folded (the fast path; 0 with ``fast_paths=False``)."""
        return self._steps.batched

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    # -- callbacks of the parts -------------------------------------------------------------------
    def _stepped(self) -> None:
        """A step was appended to the history: the user's ``on_step(capture)``."""
        on_step = self.options.on_step
        if on_step is not None:
            on_step(self)

    def _optimizer_state(self, module: str) -> dict[str, dict[str, float]]:
        return self.watch.state_of(module) if self.watch is not None else {}

    def _optimizer_pre(self, scaled: bool) -> None:
        self._pg.before_optimizer_step(scaled)

    def _losses(self, rec: OpenStep) -> tuple[list[Any], bool]:
        """The closing step's losses, and whether they are its backward calls' (summed): the user's
        ``loss()``, else the model's own, else what ``backward()`` ran on (see :mod:`.losses`)."""
        if self._loss is not None:
            return self._loss.read(self._steps.count + 1, bool(rec.calls)), False
        if rec.losses or not rec.backward_losses:
            return list(rec.losses), False
        if len(rec.backward_losses) > 1:
            self._note(BACKWARD_NOTES["several"])
        if rec.nonscalar:
            self._note(BACKWARD_NOTES["nonscalar"])
        return list(rec.backward_losses), True

    def _close_step(self) -> None:
        """Fold the open step into the rows and the history (see :func:`~.closing.close_step`)."""
        rec, pg = self._rec, self._pg
        try:
            norms, pg_late = pg.take()
            upd = self.watch.take() if self.watch is not None else None
            losses, total = self._losses(rec)
            passes = self._passes
            # fast_paths=False: every step is scanned for non-finite values as if a hook had seen one
            maybe_bad = rec.maybe_bad or not self.options.fast_paths
            closed = ClosedStep(rec.calls, losses, rec.take_late(), maybe_bad, rec.hot, rec.hot_call, norms, pg_late,
                                None if norms is None else pg.modules_of(norms[0]), upd,
                                not passes.open_grad and not passes.seen_training, self.options.device_path, total,
                                rec.classes)
            close_step(closed, self._steps)
        except Exception as err:  # never break the user's loop with ours: the step is lost, a note says so
            self._note(f"nbdebug could not summarise a step: {type(err).__name__}: {err}")
        finally:
            rec.reset()  # the step's calls: a gradient from now on is late
            pg.drop()

    # -- context manager --------------------------------------------------------------------
    def __enter__(self) -> Capture:
        self._t0 = time.perf_counter()
        model, o, hooks = self.model, self.options, self._hooks
        self._grads_before = grad_snapshot(model)
        try:
            # every hook and callback of ours runs eagerly, never traced by TorchDynamo (eager.py)
            hooks.forward_pre(model, eager(self._passes.on_root_pre))
            hooks.forward(model, eager(self._forward.on_root_out))  # the loss in the output, the classifier output
            if o.loss is None:
                BACKWARD.hold(hooks, self._rec.on_backward)  # no loss in the output: what backward() ran on
            for module, hook in self._forward.hooks(self.modules):
                hooks.forward(module, hook, with_kwargs=True)
            # after the modules' hooks (a selected root's own hook still sees its forward running), and
            # also called when the forward raises
            end = model.register_forward_hook(eager(self._passes.on_root_end), always_call=True)
            hooks.on_remove(end.remove)
            if o.grads:
                self._pg.watch(self.modules)
            hooks.on_remove(self._rec.remove_hooks)
            self.watch = OptimizerWatch(self.modules, hooks, o.max_bytes, model=model,
                                        on_device=True if o.device_path else None, on_step=eager(self._passes.optimizer_stepped),
                                        on_pre=self._optimizer_pre if o.grads else None)
            self.watch.__enter__()
            self._warned.hold(hooks)
        except BaseException:
            hooks.remove()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None, tb: Any = None) -> None:
        if exc is not None:
            text = str(exc).strip().splitlines()
            self._raised = type(exc).__name__ + (f": {text[0]}" if text else "")
            try:
                self._error = None if isinstance(exc, NonFiniteError) else locate(exc, self.model, self._rec.producer, tb)
            except Exception:  # never mask the user's exception with ours
                self._error = None
        try:
            self._hooks.remove()
        finally:
            try:  # a KeyboardInterrupt while folding the last steps still lets go of the model (below)
                try:
                    if self._passes.open:
                        self._passes.close()
                    self._steps.finish(self._rec.take_late(), self.options.device_path)
                except Exception as err:
                    if exc is None:
                        raise
                    self.notes.append(f"nbdebug could not fold the last step: {type(err).__name__}: {err}")
                try:
                    self.result = self._assemble()
                except Exception as err:
                    if exc is None:
                        raise
                    # The user's exception is what the cell must show: ours becomes a note.
                    self.rows.clear()
                    self.result = self._assemble()
                    self.result.notes.append(f"nbdebug could not summarise what ran before the error: {type(err).__name__}: {err}")
            finally:
                self.modules = []  # the model's submodules (and their parameters) are not ours to keep
                self._hold = None
                self.watch = None
                self._steps.drop_pending()
                self._rec.release()
                self._pg.release()
                self._log.release()
                if self._loss is not None:
                    self._loss.release()

    def _assemble(self) -> CaptureResult:
        o, passes = self.options, self._passes
        res = assemble(self.rows, self._steps, self._log, self._budget,
                        param_norms=param_grad_norms(self.modules, self._grads_before) if self.modules else {},
                        device_path=o.device_path, bins=o.bins, near_zero_eps=o.near_zero_eps, sample_size=o.sample_size,
                        passes=passes.passes, eval_steps=passes.eval_steps, truncated=self._forward.truncated,
                        notes=self.notes, watch=self.watch, params_seen=self._pg.any_seen, error=self._error,
                        raised=self._raised, elapsed=time.perf_counter() - self._t0, every=o.every, resume=o.resume)
        res.loop = {**(self.watch.loop() if self.watch is not None else {}), "warnings": list(self._warned.seen),
                    "trainable_modules": sorted({n for ns in self._pg.owners.values() for n in ns})}
        return res
