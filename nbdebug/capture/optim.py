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

Several optimizer steps between two :meth:`OptimizerWatch.take` calls: ``stepped`` counts them,
each module keeps the numbers of the *last* step that touched it (several optimizers usually own
disjoint modules, so each module gets its own optimizer's), ``skipped`` is true if any was skipped.
Numbers are floats on the CPU and 0-d float32 tensors on the device path (accelerators, or
``on_device=True``) for the capture's one per-step transfer: no ``.item()`` per step there.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from .budget import format_bytes
from .hooks import HookSet, SharedPatch
from .leaves import local

__all__ = ["NO_OPTIMIZER_NOTE", "OptimizerWatch", "StepUpdates", "as_float_later", "loss_of_output", "scaler_patched"]

Number = float | torch.Tensor  # a float, or a 0-d float32 tensor on the device path

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


_FLAT_MAX = 1 << 20  # float32 CPU parameters up to this many elements in all: the numpy path of _Group
_BATCH = 4  # on the CPU, this many parameters of one shape are copied and normed as one stacked tensor


class _Group:
    """Parameters of one device and dtype in a plan (single ones first, then runs of one shape that
    are stacked on the CPU: one op instead of one per tensor), and which module each norm belongs to."""

    __slots__ = ("_index", "_views", "batches", "entries", "flat", "n_single", "originals", "params", "positions")

    def __init__(self, params: list[torch.Tensor], entries: list[int], positions: list[int], stack: bool,
                 originals: list[torch.Tensor]) -> None:
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, p in enumerate(params):
            by_shape.setdefault(tuple(p.shape), []).append(i)
        runs = [ix for ix in by_shape.values() if stack and len(ix) >= _BATCH]
        batched = {i for ix in runs for i in ix}
        order = [i for i in range(len(params)) if i not in batched] + [i for ix in runs for i in ix]
        where = {old: new for new, old in enumerate(order)}
        self.params = [params[i] for i in order]
        self.originals = [originals[i] for i in order]  # the optimizer's own tensors (``params`` may be FSDP2 shards)
        self.n_single = len(params) - len(batched)
        self.batches: list[slice] = []
        start = self.n_single
        for ix in runs:
            self.batches.append(slice(start, start + len(ix)))
            start += len(ix)
        self.entries = entries  # module index (in the plan) of each (parameter, module) pair
        self.positions = [where[i] for i in positions]  # parameter position (in ``self.params``) of each pair
        self._index: tuple[torch.Tensor, torch.Tensor | None] | None = None
        # small float32 CPU parameters: the snapshot is one numpy concatenation and the norms BLAS dots
        # (a few µs per step instead of a dozen torch dispatches)
        self.flat: list[int] | None = None
        self._views: tuple[list[int], list[np.ndarray], list[np.ndarray]] | None = None  # (data_ptrs, numpy views, 2 buffers)
        if stack and self.params and all(
                p.dtype == torch.float32 and p.device.type == "cpu" and p.layout == torch.strided and p.is_contiguous()
                and not p.is_inference() for p in self.params) and sum(p.numel() for p in self.params) <= _FLAT_MAX:
            ends = np.cumsum([p.numel() for p in self.params]).tolist()
            self.flat = [0, *ends]

    def index(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``entries`` and ``positions`` (None when one pair per parameter, in order) as device tensors."""
        if self._index is None or self._index[0].device != device:
            identity = self.positions == list(range(len(self.params)))
            self._index = (torch.tensor(self.entries, device=device),
                           None if identity else torch.tensor(self.positions, device=device))
        return self._index

    def _flat(self, slot: int) -> np.ndarray:
        """The parameters' values copied into buffer ``slot`` (0: before the step, 1: after). The two
        buffers live as long as the group: a fresh megabyte-sized array per step costs page faults."""
        views = self._views
        ptrs = [p.data_ptr() for p in self.params]
        if views is None or views[0] != ptrs:  # first use, or a parameter's storage was replaced (p.data = ...)
            assert self.flat is not None
            views = self._views = (ptrs, [p.detach().numpy().reshape(-1) for p in self.params],
                                   [np.empty(self.flat[-1], np.float32), np.empty(self.flat[-1], np.float32)])
        return np.concatenate(views[1], out=views[2][slot])

    def snapshot(self) -> Any:
        """Copies of the parameters before the step: the single ones, and one stacked tensor per run
        (small CPU parameters: one flat numpy copy)."""
        if self.flat is not None:
            return self._flat(0)
        return _clone(self.params[: self.n_single]), [torch.stack(self.params[s]) for s in self.batches]

    def norms(self, copy: tuple[list[torch.Tensor], list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(‖θ_before‖, ‖Δθ‖) per parameter, in ``params`` order, from the snapshot (consumed)."""
        if self.flat is not None:
            before_flat: np.ndarray = copy  # type: ignore[assignment]
            diff_flat = np.subtract(before_flat, self._flat(1), out=self._views[2][1])  # type: ignore[index]
            b, d = [], []
            with np.errstate(over="ignore", invalid="ignore"):
                for lo, hi in zip(self.flat, self.flat[1:]):
                    x, y = before_flat[lo:hi], diff_flat[lo:hi]
                    b.append(math.sqrt(float(np.dot(x, x))))
                    d.append(math.sqrt(float(np.dot(y, y))))
            return np.array(b), np.array(d)  # type: ignore[return-value]
        singles, stacks = copy
        before: list[torch.Tensor] = []
        diff: list[torch.Tensor] = []
        if singles:
            before.append(torch.stack(_norms(singles)))
            torch._foreach_sub_(singles, self.params[: self.n_single])  # θ_before − θ_after, on our copy
            diff.append(torch.stack(_norms(singles)))
        for s, snap in zip(self.batches, stacks):
            before.append(_row_norms(snap))
            diff.append(_row_norms(torch.stack(self.params[s]).sub_(snap)))
        return torch.cat(before).float(), torch.cat(diff).float()


class _Plan:
    """What one optimizer steps of the watched modules (cached; rebuilt when its groups or the set of
    parameters with a gradient change)."""

    __slots__ = ("candidates", "closure", "groups", "key", "mask", "module_group", "names", "nbytes", "pending", "posts")

    def __init__(self, key: tuple[int, ...], candidates: list[tuple[torch.Tensor, int, list[str]]]) -> None:
        self.key = key
        self.candidates = candidates  # (parameter, its param group, watched modules owning it)
        self.mask: tuple[bool, ...] | None = None
        self.groups: list[_Group] = []
        self.names: list[str] = []
        self.module_group: list[int] = []
        self.nbytes = 0
        # per group, before the step: the snapshot, or (over budget) the parameter norms
        self.pending: list[tuple[list[torch.Tensor], list[torch.Tensor]] | torch.Tensor] | None = None
        self.posts = 0  # completed steps (post-hook calls) of this optimizer
        self.closure = False  # the pending step was given a closure (gradients appear inside the step)


# -- GradScaler: one wrapper per process, shared by every entered watch ---------------------------
def _wrap_scaler_step(original: Any) -> Any:
    @functools.wraps(original)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        watches = tuple(_SCALER.users)
        if not watches or not getattr(self, "_enabled", True):
            return original(self, optimizer, *args, **kwargs)
        for w in watches:
            w._note_scale(self)
        tokens = [w._scaler_before(optimizer) for w in watches]
        out = original(self, optimizer, *args, **kwargs)
        for w, token in zip(watches, tokens):
            w._scaler_after(optimizer, token)
        return out

    return step


# torch.amp.GradScaler since torch 2.3 (torch.cuda.amp.GradScaler subclasses it); before, the CUDA one
_SCALER = SharedPatch(getattr(torch.amp, "GradScaler", None) or getattr(torch.cuda.amp, "GradScaler", None),
                      "step", _wrap_scaler_step)


def _wrap_scaler_scale(original: Any) -> Any:
    @functools.wraps(original)
    def scale(self: Any, outputs: Any) -> Any:
        out = original(self, outputs)
        if getattr(self, "_enabled", True):
            for w in tuple(_SCALE.users):
                w._note_scale(self)
        return out

    return scale


_SCALE = SharedPatch(_SCALER.owner, "scale", _wrap_scaler_scale)


def scaler_patched() -> bool:
    """Whether ``torch.amp.GradScaler.step`` (or ``.scale``) is wrapped right now (for hygiene checks)."""
    return _SCALER.active or _SCALE.active


class OptimizerWatch:
    """Context manager watching every ``torch.optim`` optimizer step while entered (see the module doc).

    ``modules``: the watched ``(name, module)`` pairs; ``hooks``: the capture's :class:`HookSet`
    (every hook and the scaler patch go through it, so they are removed on every exit path even if
    ``__exit__`` is never reached); ``max_bytes``: the largest parameter copy one step may make.
    ``model``: an optimizer counts when it holds one of its parameters (default: those of
    ``modules``, recursively). ``on_device``: numbers as 0-d tensors (default: when the parameters
    are not on the CPU). ``on_step``: called after every optimizer step (and skipped scaler step)
    of the model's optimizers, once this watch has counted it.
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
    ) -> None:
        self.hooks = hooks
        self.max_bytes = int(max_bytes)
        self.on_device = on_device
        self.on_step = on_step
        self.notes: list[str] = []
        self.optimizer_steps = 0  # over the whole capture
        self._modules = {name: weakref.ref(m) for name, m in modules}
        self._owners: dict[int, tuple[torch.Tensor, list[str]]] = {}  # id(param) → (param, modules owning it)
        for name, m in modules:
            for p in m.parameters(recurse=False):
                self._owners.setdefault(id(p), (p, []))[1].append(name)
        source = model.parameters() if model is not None else (p for _, m in modules for p in m.parameters())
        self._model_params = {id(p) for p in source}
        self._plans: weakref.WeakKeyDictionary[torch.optim.Optimizer, _Plan | None] = weakref.WeakKeyDictionary()
        self._seen: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._handles: list[Any] = []
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
            self._handles.append(self.hooks.on_remove(self._clear))
            self._handles.append(self.hooks.optimizer_step_pre(self._pre))
            self._handles.append(self.hooks.optimizer_step_post(self._post))
            self._handles.append(_SCALER.hold(self.hooks, self))
            self._handles.append(_SCALE.hold(self.hooks, self))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """Remove this watch's hooks and scaler wrapping (the HookSet's other handles stay)."""
        while self._handles:
            self._handles.pop().remove()
        _SCALER.release(self)  # idempotent
        _SCALE.release(self)
        self._clear()

    def _clear(self) -> None:
        """Drop every strong reference to the model's parameters (the result outlives the cell)."""
        self._plans = weakref.WeakKeyDictionary()
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
        if mod is None:
            return {}
        out: dict[str, dict[str, float]] = {}
        pending: list[tuple[dict[str, float], str, torch.Tensor]] = []
        for pname, p in mod.named_parameters(recurse=False):
            for opt in list(self._seen):
                group = next((g for g in opt.param_groups if any(q is p for q in g["params"])), None)
                if group is None:
                    continue
                entry = out[pname] = {"lr": _to_float(group.get("lr"))}
                for key, value in opt.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor) and value.numel() and not value.is_complex():
                        pending.append((entry, str(key), local(value).detach().float().norm() if value.numel() > 1 else local(value).detach().float().reshape(())))
                    elif isinstance(value, (int, float)) and not isinstance(value, bool):
                        entry[str(key)] = float(value)
                break
        if pending:
            with torch.no_grad():
                values = torch.stack([v.cpu() for _, _, v in pending]).tolist()
            for (entry, key, _), v in zip(pending, values):
                entry[key] = v
        return out

    # -- plans --------------------------------------------------------------------------------
    def _plan(self, opt: torch.optim.Optimizer, closure: bool = False) -> _Plan | None:
        """The optimizer's plan, grouped for the parameters it will step: those with a gradient, or with
        a ``closure`` (the gradients appear inside the step) every one that requires a gradient."""
        groups = opt.param_groups
        key = tuple(len(g["params"]) for g in groups)
        plan = self._plans.get(opt, False)
        if plan is False or (plan is not None and plan.key != key):
            plan = self._new_plan(opt, key)
            self._plans[opt] = plan
            if plan is not None:
                self._seen.add(opt)
        if plan is not None:
            mask = tuple((p.requires_grad if closure else p.grad is not None) for p, _, _ in plan.candidates)
            if mask != plan.mask:
                self._group(plan, mask)
        return plan

    def _new_plan(self, opt: torch.optim.Optimizer, key: tuple[int, ...]) -> _Plan | None:
        owners, ours = self._owners, self._model_params
        belongs = False
        candidates: list[tuple[torch.Tensor, int, list[str]]] = []
        for gi, g in enumerate(opt.param_groups):
            for p in g["params"]:
                belongs = belongs or id(p) in ours
                hit = owners.get(id(p))
                if (hit is not None and hit[0] is p and p.is_floating_point() and p.layout == torch.strided
                        and p.device.type != "meta"):  # offloaded weights have no values to diff
                    candidates.append((p, gi, hit[1]))
        return _Plan(key, candidates) if belongs or candidates else None

    def _group(self, plan: _Plan, mask: tuple[bool, ...]) -> None:
        """Group the parameters that have a gradient by device and dtype (the optimizer steps those)."""
        plan.mask = mask
        names: dict[str, int] = {}
        module_group: list[int] = []
        by: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[int], list[int], list[torch.Tensor]]] = {}
        nbytes = 0
        for (p, gi, mods), has_grad in zip(plan.candidates, mask):
            if not has_grad:
                continue
            params, entries, positions, originals = by.setdefault((p.device, p.dtype), ([], [], [], []))
            originals.append(p)
            for m in mods:
                if m not in names:
                    names[m] = len(names)
                    module_group.append(gi)
                entries.append(names[m])
                positions.append(len(params))
            p = local(p)  # FSDP2: this rank's shard
            params.append(p)
            nbytes += p.numel() * p.element_size()
        plan.names, plan.module_group = list(names), module_group
        stack = self.on_device is not True
        plan.groups = [_Group(params, entries, positions, stack and dev.type == "cpu", originals)
                       for (dev, _), (params, entries, positions, originals) in by.items()]
        # the snapshot, and for stacked runs the stacked parameters after the step
        plan.nbytes = nbytes = nbytes + sum(p.numel() * p.element_size() for g in plan.groups for p in g.params[g.n_single:])
        if plan.groups and nbytes > self.max_bytes:
            note = (f"update ratio unavailable: a copy of the parameters the optimizer steps ({format_bytes(nbytes)}) "
                    f"does not fit in --max-bytes ({format_bytes(self.max_bytes)}); parameter norms and learning rates are kept")
            if note not in self.notes:
                self.notes.append(note)

    def _device_path(self, plan: _Plan) -> bool:
        if self.on_device is not None:
            return self.on_device
        return bool(plan.groups) and plan.groups[0].params[0].device.type != "cpu"

    # -- hooks --------------------------------------------------------------------------------
    def _pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # opt.step(closure) (Lightning's default): backward runs inside the step, so which parameters
        # get a gradient is known only after it; snapshot all that can, sort them out in _post
        rest = args[1:] if args and args[0] is opt else args  # torch passes (self, closure?) as args
        closure = callable(kwargs.get("closure") if kwargs else None) or (bool(rest) and callable(rest[0]))
        plan = self._plan(opt, closure)
        if plan is None:
            return
        plan.closure = closure
        if not plan.groups:
            return
        with torch.no_grad():
            if plan.nbytes <= self.max_bytes:
                plan.pending = [g.snapshot() for g in plan.groups]
            else:
                plan.pending = [torch.stack(_norms(g.params)).float() for g in plan.groups]

    def _post(self, opt: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        plan = self._plans.get(opt)
        if plan is None:
            return
        plan.posts += 1
        self._stepped += 1
        self.optimizer_steps += 1
        pending, plan.pending = plan.pending, None
        on_device = self._device_path(plan)
        if pending is not None:
            missing = None
            if plan.closure:  # parameters the closure gave no gradient: the optimizer did not step them
                missing = [[p.grad is None for p in g.originals] for g in plan.groups]
                if not any(any(m) for m in missing):
                    missing = None
            self._record(opt, plan, pending, on_device, missing)
        self._step_done(opt, plan, on_device)

    def _step_done(self, opt: torch.optim.Optimizer, plan: _Plan, on_device: bool) -> None:
        """Learning rates of the step (what it used: read before a scheduler moves them), then tell the capture."""
        lrs = [_number(g.get("lr"), on_device) for g in opt.param_groups]
        if lrs:
            self._lr.setdefault("", lrs[0])
        self._lr.update(zip(plan.names, (lrs[gi] for gi in plan.module_group)))
        if self.on_step is not None:
            self.on_step()

    def _record(self, opt: torch.optim.Optimizer, plan: _Plan, pending: list[Any], on_device: bool,
                missing: list[list[bool]] | None = None) -> None:
        """Ratios and norms of the step; ``missing`` (per group, per parameter): not stepped (no gradient
        after a closure), left out of its module's numbers (a module with none stepped: ratio NaN)."""
        with torch.no_grad():
            have_diff = not isinstance(pending[0], torch.Tensor)
            norms = [g.norms(p) if have_diff else (p, None) for g, p in zip(plan.groups, pending)]
            found_inf = getattr(opt, "found_inf", None)  # set by GradScaler on fused optimizers during step()
            if not isinstance(found_inf, torch.Tensor):
                found_inf = None
            aggregate = self._aggregate_on_device if on_device else self._aggregate
            ratios, pnorms = aggregate(plan, norms, found_inf, missing)
        if have_diff:
            self._ratio.update(zip(plan.names, ratios))
        self._pnorm.update(zip(plan.names, pnorms))

    def _aggregate(self, plan: _Plan, norms: list[tuple[torch.Tensor, torch.Tensor | None]],
                   found_inf: torch.Tensor | None, missing: list[list[bool]] | None = None) -> tuple[list[float], list[float]]:
        """CPU: per-parameter norms to the host in one op per group, summed per module in Python."""
        m = len(plan.names)
        d2, b2 = [0.0] * m, [0.0] * m
        all2, unstepped = [0.0] * m, [missing is not None] * m  # ‖θ‖² over every parameter; no parameter stepped
        for gi, (g, (before, diff)) in enumerate(zip(plan.groups, norms)):
            n = len(g.params)
            if isinstance(before, np.ndarray):
                values = (before if diff is None else np.concatenate([before, diff])).tolist()
            else:
                values = (before if diff is None else torch.cat([before, diff])).tolist()
            miss = missing[gi] if missing is not None else None
            for pos, mi in zip(g.positions, g.entries):
                if miss is not None:
                    all2[mi] += values[pos] ** 2
                    if miss[pos]:
                        continue
                    unstepped[mi] = False
                b2[mi] += values[pos] ** 2
                if diff is not None:
                    d2[mi] += values[n + pos] ** 2
        # a module none of whose parameters the step touched: its norm over all of them, no ratio
        pnorms = [math.sqrt(a if no else b) for a, b, no in zip(all2, b2, unstepped)]
        skipped = found_inf is not None and bool(found_inf.reshape(-1)[0] > 0)
        if skipped:
            self._skipped = True
        nan = float("nan")
        ratios = [nan if skipped or no else (math.sqrt(d) / b if b else (nan if d == 0 else math.inf))
                  for d, b, no in zip(d2, pnorms, unstepped)]
        return ratios, pnorms

    def _aggregate_on_device(self, plan: _Plan, norms: list[tuple[torch.Tensor, torch.Tensor | None]],
                             found_inf: torch.Tensor | None, missing: list[list[bool]] | None = None,
                             ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Device path: everything stays a tensor (0-d results), no host sync."""
        # [‖Δθ‖² per module, ‖θ‖² per module], and with ``missing`` [‖θ‖² over all, stepped parameters]
        acc: torch.Tensor | None = None
        for gi, (g, (before, diff)) in enumerate(zip(plan.groups, norms)):
            sq = torch.stack([torch.full_like(before, torch.nan) if diff is None else diff, before]).square()
            if missing is not None:
                keep = torch.tensor([not x for x in missing[gi]], dtype=sq.dtype, device=sq.device)
                sq = torch.cat([sq * keep, sq[1:], keep[None]])
            if acc is None:
                acc = torch.zeros(sq.shape[0], len(plan.names), dtype=torch.float32, device=sq.device)
            entries, positions = g.index(acc.device)
            if positions is not None:
                sq = sq.index_select(1, positions.to(sq.device))
            acc.index_add_(1, entries, sq.to(acc.device))
        assert acc is not None
        norm = acc.sqrt()
        ratio = norm[0] / norm[1]
        pnorm = norm[1]
        if missing is not None:  # a module none of whose parameters the step touched: no ratio, norm over all
            none = acc[3] == 0
            ratio = torch.where(none, torch.nan, ratio)
            pnorm = torch.where(none, norm[2], pnorm)
        if found_inf is not None:
            skipped = found_inf.to(acc.device).reshape(-1)[0] > 0
            ratio = torch.where(skipped, torch.nan, ratio)
            if isinstance(self._skipped, torch.Tensor):
                self._skipped = self._skipped | skipped.to(self._skipped.device)
            elif self._skipped is False:
                self._skipped = skipped
        return list(ratio.unbind()), list(pnorm.unbind())

    def _note_scale(self, scaler: Any) -> None:
        """The scale ``scaler`` applies now (before its ``update()`` changes it in place): a float on
        the CPU, a 0-d device tensor copy otherwise (no host sync: it crosses with the step)."""
        sc = getattr(scaler, "_scale", None)
        if not isinstance(sc, torch.Tensor) or not self._handles:
            return
        with torch.no_grad():
            self._scale = float(sc) if sc.device.type == "cpu" else sc.detach().reshape(()).to(torch.float32, copy=True)

    def _scaler_before(self, opt: Any) -> int | None:
        if not isinstance(opt, torch.optim.Optimizer) or not self._handles:
            return None
        plan = self._plan(opt)
        return None if plan is None else plan.posts

    def _scaler_after(self, opt: Any, token: int | None) -> None:
        """After ``scaler.step(opt)`` returned: no step hook fired in between → the scaler skipped it."""
        if token is None or getattr(opt, "_step_supports_amp_scaling", False):
            return  # fused optimizers always run step(); their found_inf is read in the post-hook
        if not getattr(type(opt).step, "hooked", False):
            return  # step hooks cannot fire for this class: nothing to conclude
        plan = self._plans.get(opt)
        if plan is None or plan.posts != token:
            return
        self._skipped = True
        self._step_done(opt, plan, self._device_path(plan))


_HALF = (torch.float16, torch.bfloat16)


def _norms(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms in one batched op (accumulated in float32 for half-precision tensors)."""
    return torch._foreach_norm(ts, 2, dtype=torch.float32) if ts and ts[0].dtype in _HALF else torch._foreach_norm(ts)


def _row_norms(x: torch.Tensor) -> torch.Tensor:
    """L2 norm of each x[i] (a stack of same-shape parameters), in float32 for half precision."""
    return torch.linalg.vector_norm(x.reshape(x.shape[0], -1), dim=1, dtype=torch.float32 if x.dtype in _HALF else None)


def _clone(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    clone = getattr(torch, "_foreach_clone", None)
    return list(clone(ts)) if clone is not None and ts else [t.clone() for t in ts]


def _to_float(x: Any) -> float:
    if isinstance(x, torch.Tensor):
        return float(x.detach().float().reshape(-1)[0]) if x.numel() else float("nan")
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _number(x: Any, on_device: bool) -> Number:
    """A learning rate as a float, or as a 0-d float32 tensor when it is a device tensor."""
    if isinstance(x, torch.Tensor) and on_device and x.device.type != "cpu":
        return x.detach().reshape(-1)[0].to(torch.float32, copy=True)
    return _to_float(x)


def loss_of_output(output: Any) -> Any | None:
    """The loss in a model's own output, detached, or None: a 0-d floating tensor; the ``loss`` of a
    ``ModelOutput``/dict (Hugging Face models given labels); the first item of a tuple when it is a
    0-d floating tensor (``return_dict=False`` with labels)."""
    def scalar(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.dim() == 0 and t.is_floating_point()

    if scalar(output):
        return output.detach()
    if isinstance(output, dict):
        loss = output.get("loss")
    elif isinstance(output, (tuple, list)):
        loss = output[0] if output else None
    else:
        loss = getattr(output, "loss", None)
    return loss.detach() if scalar(loss) else None


def as_float_later(x: Any) -> float | torch.Tensor:
    """``x`` (a loss: tensor, number or None) as a float, or as a detached 1-element float32 copy when it
    is an accelerator tensor (read with the capture's one per-step transfer, never synced here).
    A tensor of several values gives its mean (a ``reduction="none"`` loss); anything else NaN."""
    if isinstance(x, torch.Tensor):
        if not x.numel() or x.is_complex():
            return float("nan")
        t = x.detach()
        t = t.reshape(1) if t.numel() == 1 else t.float().mean().reshape(1)
        if t.device.type == "cpu":
            return float(t[0])
        return t.to(torch.float32, copy=True)
    if isinstance(x, bool) or x is None:
        return float("nan")
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")
