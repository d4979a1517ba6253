"""What the optimizer did to the watched modules each step: update ratios, learning rates, skipped steps.

>>> hooks = HookSet()                                              # doctest: +SKIP
>>> with hooks, OptimizerWatch(select_modules(model, None), hooks, max_bytes=2**26) as watch:
...     loss_fn(model(x), y).backward(); opt.step()
...     upd = watch.take()     # upd.update_ratio["fc"] == ‖Δθ‖/‖θ‖ of fc's own weight and bias

* **Update ratio** ‖Δθ‖/‖θ‖ (θ before the step) of each module over its own parameters
  (``recurse=False``), per optimizer step, from ``torch.optim``'s *global* step hooks (optimizers
  created before the capture are covered). The pre-hook copies the parameters the step touches
  (those with a ``.grad``), the post-hook norms the copy and its difference to the parameters:
  batched ``torch._foreach_*`` ops per device and dtype (on the CPU, runs of same-shape parameters
  as one stacked tensor). With ``opt.step(closure)`` the gradients appear inside the step: every
  parameter that requires a gradient is copied, and one still without ``.grad`` after the step is
  left out (a module with none stepped: ratio NaN, "unavailable"). A copy that does not fit in ``max_bytes`` means no ratio (and a note),
  never an approximate one; a hand-written update loop has none either. ‖θ‖ = 0 gives inf (NaN
  when Δθ = 0 too).
* **Learning rate** of the parameter group holding each module's parameters, read right after the
  step (what it used; schedulers move it later); ``""`` is the first group's.
* **GradScaler**: ``torch.amp.GradScaler.step`` is wrapped while any watch is entered (reference
  counted, restored on every exit path). A scaler that finds inf/NaN gradients does not call
  ``optimizer.step()``: no step hook firing during ``scaler.step`` is the sign, so no host sync
  beyond the scaler's own. Fused optimizers (``_step_supports_amp_scaling``) always step; their
  skip is read from the scaler's ``found_inf`` tensor (kept on the device path, no sync).
  ``GradScaler.scale`` and ``.step`` also record the scale in effect (``StepUpdates.scale``: the
  scaler's ``_scale`` as a float on the CPU, a cloned 0-d device tensor on the device path, folded
  into the capture's one per-step transfer): the capture divides the step's gradient statistics by
  it, since backward ran on the scaled loss.

Parts: :mod:`.plans` (what an optimizer steps, snapshots), :mod:`.updates` (per-module sums), :mod:`.scaler`
(the GradScaler wrappers), :mod:`.losses` (the step's loss; re-exported here).

Several optimizer steps between two :meth:`OptimizerWatch.take` calls: ``stepped`` counts them,
each module keeps the numbers of the *last* step that touched it (several optimizers usually own
disjoint modules, so each module gets its own optimizer's), ``skipped`` is true if any was skipped.
Numbers are floats on the CPU and 0-d float32 tensors on the device path (accelerators, or
``on_device=True``) for the capture's one per-step transfer: no ``.item()`` per step there.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from .hooks import HookSet
from .losses import as_float_later, loss_of_output
from .plans import Plan, new_plan, norms_of
from .scaler import SCALER_SCALE, SCALER_STEP, scaler_patched
from .updates import aggregate, aggregate_on_device, as_number, flat_update, optimizer_state

__all__ = ["NO_OPTIMIZER_NOTE", "OptimizerWatch", "StepUpdates", "as_float_later", "loss_of_output", "scaler_patched"]

Number = float | torch.Tensor  # a float, or a 0-d float32 tensor on the device path
_NO_CONTEXT = contextlib.nullcontext()
_ndarray = np.ndarray

#: for the capture's notes when the model trained (gradients flowed) but no torch.optim optimizer stepped it
NO_OPTIMIZER_NOTE = ("update ratio unavailable: no torch.optim optimizer stepped the model's parameters "
                     "(a hand-written update loop is not seen)")


@dataclass
class StepUpdates:
    """What the optimizers did to the watched modules since the previous :meth:`OptimizerWatch.take`.

    ``stepped``: ``optimizer.step()`` calls of optimizers holding the model's parameters.
    ``skipped``: a GradScaler skipped an optimizer step (inf/NaN gradients): a bool, or a 0-d bool
    tensor for fused optimizers on the device path. ``update_ratio``: module name → ‖Δθ‖/‖θ‖ (θ
    before the step; modules without a ratio are absent). ``param_norm``: module name → ‖θ‖ before
    the step. ``lr``: module name → its parameter group's learning rate, and ``""`` → the first
    group's. ``scale``: the GradScaler scale in effect when the step's loss was scaled (None when
    no enabled scaler scaled or stepped). Values are floats, or 0-d float32 tensors on the device path.
    """

    stepped: int = 0
    skipped: bool | torch.Tensor = False
    update_ratio: dict[str, Number] = field(default_factory=dict)
    param_norm: dict[str, Number] = field(default_factory=dict)
    lr: dict[str, Number] = field(default_factory=dict)
    scale: Number | None = None  # the GradScaler scale the step's backward used (None: no scaler)


class OptimizerWatch:
    """Context manager watching every ``torch.optim`` optimizer step while entered (see the module doc).

    ``modules``: the watched ``(name, module)`` pairs; ``hooks``: the capture's :class:`HookSet`
    (every hook and the scaler patch go through it, so they are removed on every exit path even if
    ``__exit__`` is never reached); ``max_bytes``: the largest parameter copy one step may make.
    ``model``: an optimizer counts when it holds one of its parameters (default: those of
    ``modules``, recursively). ``on_device``: numbers as 0-d tensors (default: when the parameters
    are not on the CPU). ``on_step``: called after every optimizer step (and skipped scaler step)
    of the model's optimizers, once this watch has counted it. ``on_pre(scaled)``: called before every
    optimizer step of the model's optimizers (the gradients it will use are in place; ``scaled``: a
    GradScaler scaled the loss of the step).
    """

    def __init__(
        self,
        modules: list[tuple[str, nn.Module]],
        hooks: HookSet,
        max_bytes: int,
        *,
        model: nn.Module | None = None,
        on_device: bool | None = None,
        on_step: Callable[[], Any] | None = None,
        on_pre: Callable[[bool], Any] | None = None,
    ) -> None:
        self.hooks = hooks
        self.max_bytes = int(max_bytes)
        self.on_device = on_device
        self.on_step = on_step
        self.on_pre = on_pre
        self.notes: list[str] = []
        self.optimizer_steps = 0  # over the whole capture
        # the loop as seen (issue 26; no host sync: attribute reads): steps of optimizers holding none of the
        # model's parameters, steps of the model's where none of its parameters had a .grad, and at how many
        # steps (of how many looked at) the first gradient was the very tensor of the previous step's
        self.foreign_steps = self.empty_steps = self.grad_kept = self.grad_checked = 0
        self._last_grad: weakref.ref[torch.Tensor] | None = None
        self._held_names: set[str] = set()  # watched modules with a parameter in an optimizer that stepped
        self._modules = {name: weakref.ref(m) for name, m in modules}
        self._owners: dict[int, tuple[torch.Tensor, list[str]]] = {}  # id(param) → (param, modules owning it)
        for name, m in modules:
            for p in m.parameters(recurse=False):
                self._owners.setdefault(id(p), (p, []))[1].append(name)
        source = model.parameters() if model is not None else (p for _, m in modules for p in m.parameters())
        self._model_params = {id(p) for p in source}
        self._plans: weakref.WeakKeyDictionary[torch.optim.Optimizer, Plan | None] = weakref.WeakKeyDictionary()
        self._seen: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._last: tuple[weakref.ref[torch.optim.Optimizer], Plan | None] | None = None  # the last optimizer's plan
        self._held: list[Any] = []
        self._reset()

    def _reset(self) -> None:
        self._stepped = 0
        self._skipped: bool | torch.Tensor = False
        self._ratio: dict[str, Number] = {}
        self._pnorm: dict[str, Number] = {}
        self._lr: dict[str, Number] = {}
        self._scale: Number | None = None

    # -- context manager ----------------------------------------------------------------------
    def __enter__(self) -> OptimizerWatch:
        try:
            self._held.append(self.hooks.on_remove(self._clear))
            self._held.append(self.hooks.optimizer_step_pre(self._pre))
            self._held.append(self.hooks.optimizer_step_post(self._post))
            self._held.append(SCALER_STEP.hold(self.hooks, self))
            self._held.append(SCALER_SCALE.hold(self.hooks, self))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """Remove this watch's hooks and scaler wrapping (the HookSet's other handles stay)."""
        while self._held:
            self._held.pop().remove()
        SCALER_STEP.release(self)  # idempotent
        SCALER_SCALE.release(self)
        self._clear()

    def _clear(self) -> None:
        """Drop every strong reference to the model's parameters (the result outlives the cell)."""
        self._plans = weakref.WeakKeyDictionary()
        self._last = None
        self._owners = {}

    # -- results ------------------------------------------------------------------------------
    def take(self) -> StepUpdates:
        """What happened since the previous call (see :class:`StepUpdates`), and start afresh."""
        out = StepUpdates(self._stepped, self._skipped, self._ratio, self._pnorm, self._lr, self._scale)
        self._reset()
        return out

    def state_of(self, module: str) -> dict[str, dict[str, float]]:
        """Parameter name (``weight``, ``bias``) → ``{"lr", and for each optimizer state entry its value
        (L2 norm of a tensor: ``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``…; ``step`` as is)}`` for
        ``module``'s own parameters held by an optimizer that stepped during the capture. Syncs once
        (for the flight recorder, not per step); ``{}`` when the module or optimizers are gone."""
        ref = self._modules.get(module)
        mod = ref() if ref is not None else None
        return {} if mod is None else optimizer_state(mod, list(self._seen))

    # -- plans --------------------------------------------------------------------------------
    def _plan(self, opt: torch.optim.Optimizer, closure: bool = False) -> Plan | None:
        """The optimizer's plan, grouped for the parameters it will step: those with a gradient, or with
        a ``closure`` (the gradients appear inside the step) every one that requires a gradient."""
        last = self._last
        plan = last[1] if last is not None and last[0]() is opt else self._cached(opt)
        if plan is False or (plan is not None and plan.key != [len(g["params"]) for g in opt.param_groups]):
            plan = new_plan(opt, [len(g["params"]) for g in opt.param_groups], self._owners, self._model_params)
            self._plans[opt] = plan
            self._last = (weakref.ref(opt), plan)
            if plan is not None:
                self._seen.add(opt)
                self._held_names.update(m for _, _, mods in plan.candidates for m in mods)
        if plan is not None:
            mask = [p.requires_grad for p in plan.params] if closure else [p.grad is not None for p in plan.params]
            if mask != plan.mask:
                note = plan.regroup(mask, self.on_device, self.max_bytes)
                if note is not None and note not in self.notes:
                    self.notes.append(note)
        return plan

    def _cached(self, opt: torch.optim.Optimizer) -> Plan | bool | None:
        """The optimizer's plan (None: not one of the model's), False when it has none yet; the last
        optimizer's without a weak-dictionary lookup."""
        last = self._last
        if last is not None and last[0]() is opt:
            return last[1]
        plan = self._plans.get(opt, False)
        if plan is not False:
            self._last = (weakref.ref(opt), plan)
        return plan

    # -- hooks --------------------------------------------------------------------------------
    def _pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        try:
            self._before_step(opt, args, kwargs)
        except Exception as err:  # never break the user's loop with ours: this step's numbers are lost
            self._failed(opt, err)

    def _post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        try:
            self._after_step(opt, args, kwargs)
        except Exception as err:
            self._failed(opt, err)

    def _failed(self, opt: torch.optim.Optimizer, err: Exception) -> None:
        plan = self._plans.get(opt)
        if plan:
            plan.pending = None
        note = f"nbdebug could not read an optimizer step: {type(err).__name__}: {err}"
        if note not in self.notes:
            self.notes.append(note)

    def _before_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if kwargs or len(args) != 1 or args[0] is not opt:  # not the usual opt.step(): look for a closure
            # opt.step(closure) (Lightning's default): backward runs inside the step, so which parameters
            # get a gradient is known only after it; snapshot all that can, sort them out in _post
            rest = args[1:] if args and args[0] is opt else args  # torch passes (self, closure?) as args
            closure = callable(kwargs.get("closure") if kwargs else None) or (bool(rest) and callable(rest[0]))
        else:
            closure = False
        plan = self._plan(opt, closure)
        if plan is None:
            return
        if not closure:
            self._look_at_grads(plan)
        if self.on_pre is not None:
            self.on_pre(self._scale is not None)
        plan.closure = closure
        if not plan.groups:
            return
        if plan.nbytes <= self.max_bytes:
            if plan.fast is not None:  # one numpy copy: no autograd to keep out
                plan.pending = [plan.fast.snapshot()]
                return
            with torch.no_grad():
                plan.pending = [g.snapshot() for g in plan.groups]
        else:
            with torch.no_grad():
                plan.pending = [torch.stack(norms_of(g.params)).float() for g in plan.groups]

    def _look_at_grads(self, plan: Plan) -> None:
        """Before a step of the model's optimizer: none of its parameters has a gradient (empty), or the
        first one's gradient is the tensor it was at the previous step (kept: never set to None)."""
        g = next((p.grad for p in plan.params if p.grad is not None), None)
        if g is None:
            self.empty_steps += 1
            return
        last = self._last_grad
        self.grad_checked += 1
        if last is not None and last() is g:
            self.grad_kept += 1
        self._last_grad = weakref.ref(g)

    def loop(self) -> dict[str, Any]:
        """What the watch saw of the loop (for ``CaptureResult.loop``)."""
        return {"optimizer_steps": self.optimizer_steps, "foreign_steps": self.foreign_steps,
                "empty_steps": self.empty_steps, "grad_kept_steps": self.grad_kept, "grad_checked_steps": self.grad_checked,
                "held_modules": sorted(self._held_names)}

    def _after_step(self, opt: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        last = self._last
        plan = last[1] if last is not None and last[0]() is opt else self._cached(opt)
        if plan is None or plan is False:
            self.foreign_steps += 1
            return
        plan.posts += 1
        self._stepped += 1
        self.optimizer_steps += 1
        pending, plan.pending = plan.pending, None
        if pending is not None:
            missing = None
            if plan.closure:  # parameters the closure gave no gradient: the optimizer did not step them
                missing = [[p.grad is None for p in g.originals] for g in plan.groups]
                if not any(any(m) for m in missing):
                    missing = None
            fast = plan.fast
            if fast is not None and missing is None and type(pending[0]) is _ndarray:  # the usual CPU step
                found_inf = getattr(opt, "found_inf", None)  # set by GradScaler on fused optimizers during step()
                skipped = isinstance(found_inf, torch.Tensor) and bool(found_inf.reshape(-1)[0] > 0)
                ratios, pnorms = flat_update(fast, pending[0], len(plan.names), skipped)
                if skipped:
                    self._skipped = True
                self._ratio.update(zip(plan.names, ratios))
                self._pnorm.update(zip(plan.names, pnorms))
            else:
                self._record(opt, plan, pending, plan.on_device, missing)
        self._step_done(opt, plan, plan.on_device)

    def _step_done(self, opt: torch.optim.Optimizer, plan: Plan, on_device: bool) -> None:
        """Learning rates of the step (what it used: read before a scheduler moves them), then tell the capture."""
        groups = opt.param_groups
        if plan.lr_one and groups:  # every watched module in the first param group: one lr
            lr = groups[0].get("lr")
            if type(lr) is not float:
                lr = as_number(lr, on_device)
            self._lr.setdefault("", lr)
            self._lr.update(dict.fromkeys(plan.names, lr))
        else:
            lrs = [lr if type(lr := g.get("lr")) is float else as_number(lr, on_device) for g in groups]
            if lrs:
                self._lr.setdefault("", lrs[0])
            self._lr.update(zip(plan.names, [lrs[gi] for gi in plan.module_group]))
        if self.on_step is not None:
            self.on_step()

    def _record(self, opt: torch.optim.Optimizer, plan: Plan, pending: list[Any], on_device: bool,
                missing: list[list[bool]] | None = None) -> None:
        """Ratios and norms of the step; ``missing`` (per group, per parameter): not stepped (no gradient
        after a closure), left out of its module's numbers (a module with none stepped: ratio NaN)."""
        with torch.no_grad() if not plan.flat else _NO_CONTEXT:  # the flat path reads numpy copies only
            have_diff = not isinstance(pending[0], torch.Tensor)
            norms = [g.norms(p) if have_diff else (p, None, False) for g, p in zip(plan.groups, pending)]
            found_inf = getattr(opt, "found_inf", None)  # set by GradScaler on fused optimizers during step()
            if not isinstance(found_inf, torch.Tensor):
                found_inf = None
            if on_device:
                ratios, pnorms, skip = aggregate_on_device(plan, norms, found_inf, missing)
                if skip is not None:
                    if isinstance(self._skipped, torch.Tensor):
                        self._skipped = self._skipped | skip.to(self._skipped.device)
                    elif self._skipped is False:
                        self._skipped = skip
            else:
                ratios, pnorms, skipped = aggregate(plan, norms, found_inf, missing)
                if skipped:
                    self._skipped = True
        if have_diff:
            self._ratio.update(zip(plan.names, ratios))
        self._pnorm.update(zip(plan.names, pnorms))

    def note_scale(self, scaler: Any) -> None:
        """The scale ``scaler`` applies now (before its ``update()`` changes it in place): a float on
        the CPU, a 0-d device tensor copy otherwise (no host sync: it crosses with the step)."""
        sc = getattr(scaler, "_scale", None)
        if not isinstance(sc, torch.Tensor) or not self._held:
            return
        with torch.no_grad():
            self._scale = float(sc) if sc.device.type == "cpu" else sc.detach().reshape(()).to(torch.float32, copy=True)

    def scaler_before(self, opt: Any) -> int | None:
        if not isinstance(opt, torch.optim.Optimizer) or not self._held:
            return None
        plan = self._plan(opt)
        return None if plan is None else plan.posts

    def scaler_after(self, opt: Any, token: int | None) -> None:
        """After ``scaler.step(opt)`` returned: no step hook fired in between → the scaler skipped it."""
        if token is None or getattr(opt, "_step_supports_amp_scaling", False):
            return  # fused optimizers always run step(); their found_inf is read in the post-hook
        if not getattr(type(opt).step, "hooked", False):
            return  # step hooks cannot fire for this class: nothing to conclude
        plan = self._cached(opt)
        if plan is None or plan is False or plan.posts != token:
            return
        self._skipped = True
        self._step_done(opt, plan, plan.on_device)

