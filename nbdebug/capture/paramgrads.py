"""Parameter-gradient norms of a :class:`~nbdebug.capture.session.Capture`, without a hook per parameter.

Which gradients a backward wrote is read from the gradients themselves: a parameter's ``.grad`` is
*fresh* when it is a new tensor or the same one with a moved version counter (autograd accumulates in
place, which bumps it) since the last look. The selected modules' own parameters are looked at
(:meth:`_ParamGrads._pg_scan`, a few attribute reads each, no host sync):

* when a step opens (gradients left over from before it, or zeroed in place by
  ``zero_grad(set_to_none=False)``, are not this step's);
* at the end of every backward that reached a recorded output: the first output-gradient hook of
  the backward queues an engine callback (when a process group exists, queued once more from there,
  so that it runs after the callbacks distributed wrappers queue during the backward: DDP's averaged
  gradients are read; one the engine drops uncalled, the backward having raised, is not waited for);
  the norms of the step's fresh gradients are then taken in one batch
  (:func:`~nbdebug.capture.calls.grad_norms`);
* otherwise (no recorded output was on the backward's path) before the optimizer step (under a
  GradScaler, before each optimizer step of the step: the scaler unscales one optimizer's gradients at
  a time), or at the step's close: those norms are *late* (a GradScaler has unscaled the gradients by
  then).

When the step closes the norms are summed per module (a parameter shared by several modules counts
for each) into ``param_grad_norm`` on the module's first row.

The limit of having no hook per parameter: a backward that reaches the parameters without passing a
recorded output (a loss on the parameters alone), in a loop without a ``torch.optim`` optimizer,
whose gradients are removed (``zero_grad()``, ``p.grad = None``) before the step closes, is not seen
(that step's ``param_grad_norm`` is NaN). Once a backward of the step reached a recorded output, a
later backward of the same step that reaches none (a second loss on the parameters alone, backward
on its own) is not seen either: the norms stay those at the end of the last backward that reached one.
Late norms are of the gradients as the optimizer gets them (after a ``clip_grad_norm_``, say).
Zeroing in place after the step opened (``out = model(x); opt.zero_grad(set_to_none=False);
loss.backward()``) writes the gradients too: a parameter that backward then does not reach has norm
0, not NaN (with the per-parameter hooks it was NaN). A per-parameter hook cost ~4 µs per parameter
per step.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import numpy as np
import torch
from torch import nn

from .calls import grad_norms
from .leaves import local

__all__: list[str] = []  # private to the capture package

_Tensor = torch.Tensor
_STRIDED = torch.strided
_ref = weakref.ref


def _engine() -> Any:
    return torch.autograd.Variable._execution_engine


def _distributed() -> bool:
    """Whether a default process group exists (DDP, FSDP and the like need one; only then can
    callbacks that change the gradients have been queued during the backward)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


class _BackwardEnd:
    """The engine callback of one backward: with a process group, its first call queues it once more
    (so that it runs after the callbacks queued during the backward), the second (else the first)
    calls ``_on_backward_end``. When the engine drops it uncalled (the backward raised, or was
    interrupted), the capture stops waiting for it, so the step's later backwards queue their own."""

    __slots__ = ("calls", "cap")

    def __init__(self, cap: _ParamGrads) -> None:
        self.cap, self.calls = cap, 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls == 1 and _distributed():  # only distributed wrappers queue such callbacks
            try:
                _engine().queue_callback(self)
                return
            except Exception:
                pass
        self.calls = 2
        self.cap._on_backward_end()

    def __del__(self) -> None:
        if getattr(self, "calls", 2) < 2:  # (a copy made without __init__, by TorchDynamo tracing the hook: nothing)
            self.cap._pg_queued = 0


class _ParamGrads:
    """Mixin of :class:`~nbdebug.capture.session.Capture`: parameter-gradient freshness and norms."""

    modules: list[tuple[str, nn.Module]]
    device_path: bool
    watch: Any  # Capture's OptimizerWatch (its _scale: a GradScaler scaled the open step's loss)
    _open: bool
    _pg_params: list[torch.Tensor]
    _pg_seen: list[tuple[Any, int] | None]
    _pg_fresh: dict[int, torch.Tensor]
    _pg_queued: int
    _pg_scanned: bool
    _pg_late: bool
    _pg_norms: tuple[list[torch.Tensor], Any] | None
    _param_owner: dict[int, list[str]]
    _pg_map: tuple[tuple[int, ...], Any] | None

    def _watch_params(self) -> None:
        """The selected modules' own parameters whose gradients are watched (their gradients now are
        not fresh)."""
        params: list[torch.Tensor] = []
        for name, module in self.modules:
            for p in module.parameters(recurse=False):
                if not p.requires_grad or not p.is_leaf:
                    continue
                owners = self._param_owner.get(id(p))
                if owners is not None:
                    owners.append(name)
                    continue
                self._param_owner[id(p)] = [name]
                params.append(p)
        self._pg_params, self._pg_seen = params, [None] * len(params)
        self._pg_scan(False)

    def _pg_scan(self, collect: bool) -> bool:
        """Look at every watched gradient; with ``collect``, add those written since the last look to
        the step's fresh ones. True when some were."""
        seen, fresh, new = self._pg_seen, self._pg_fresh, False
        for i, p in enumerate(self._pg_params):
            g = p.grad
            if g is None:
                seen[i] = None
                continue
            try:
                v = g._version
            except RuntimeError:  # an inference tensor assigned as .grad: no version counter
                v = -1
            s = seen[i]
            if s is not None and s[1] == v and v >= 0 and s[0]() is g:
                continue
            seen[i] = (_ref(g), v)
            if collect:
                fresh[id(p)] = p
                new = True
        return new

    def _pg_step_opens(self) -> None:
        """A step opens: gradients present now are not its own (and a callback lost to a backward
        that raised is not waited for)."""
        self._pg_scanned = self._pg_late = False
        self._pg_queued = 0
        if self._pg_params:
            self._pg_scan(False)

    def _pg_backward(self) -> None:
        """Called by the first output-gradient hook of a backward: look at the gradients once it ends.
        Not under compiled autograd: it traces the hook, and an engine callback queued from traced
        code fails the user's backward (the gradients are then looked at before the optimizer step,
        or at the step's close)."""
        ca = sys.modules.get("torch._dynamo.compiled_autograd")
        if ca is not None and (ca.in_compiled_autograd_region or ca.compiled_autograd_enabled):
            return
        self._pg_queued = 1
        try:
            _engine().queue_callback(_BackwardEnd(self))
        except Exception:  # no engine callback: looked at before the optimizer step or at the step's close
            self._pg_queued = 0

    def _on_backward_end(self) -> None:
        """End of a backward (after the callbacks queued during it, e.g. DDP's gradient averaging): the
        norms of the step's fresh gradients, in one batch."""
        self._pg_queued = 0
        self._pg_scanned = True
        if self._pg_scan(True) or (self._pg_norms is None and self._pg_fresh):
            self._pg_late = False
            self._take_param_norms()

    def _pg_pre(self) -> None:
        """Before an optimizer step: when no backward of the step reached a recorded output, the
        gradients are looked at now (late norms). Under a GradScaler they are looked at again before
        each later optimizer step of the step (the scaler unscales one optimizer's gradients at a time:
        by the last one every gradient is unscaled)."""
        if self._pg_scanned or not self._pg_params:
            return
        scaled = self.watch._scale is not None
        if not scaled:
            self._pg_scanned = True
        # (unscaling in place does not move a gradient's version: under a scaler, taken again regardless)
        if self._pg_scan(True) or (scaled and self._pg_late and self._pg_fresh):
            self._pg_late = True
            self._take_param_norms()

    def _pg_fallback(self) -> None:
        """At a step's close: when neither a backward reaching a recorded output nor an optimizer step
        looked at the step's gradients, they are looked at now (late norms)."""
        if self._pg_scanned or self._pg_late or not self._pg_params:
            return
        self._pg_scanned = True
        if self._pg_scan(True):
            self._pg_late = True
            self._take_param_norms()

    def _take_param_norms(self) -> None:
        params: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        for p in self._pg_fresh.values():
            g = p.grad
            if g is None or g.layout is not _STRIDED:
                continue
            params.append(p)
            if type(g) is not _Tensor:
                g = local(g)
            elif not g.requires_grad:  # the usual gradient
                grads.append(g)
                continue
            grads.append(g.detach() if g.requires_grad else g)
        if params:
            self._pg_norms = (params, grad_norms(grads, self.device_path))

    def _pg_modules(self, params: list[torch.Tensor]) -> tuple[np.ndarray | None, np.ndarray, tuple[str, ...]]:
        """For per-module sums of ``params``' squared norms: (index of the parameter of each
        (parameter, owner) pair, or None when that is every parameter once in order; owner index of
        each pair; owner names in first-seen order). Cached for the last list of parameters."""
        key = tuple(map(id, params))
        hit = self._pg_map
        if hit is not None and hit[0] == key:
            return hit[1]
        names: dict[str, int] = {}
        rep: list[int] = []
        idx: list[int] = []
        owner = self._param_owner
        for i, p in enumerate(params):
            for mod in owner.get(id(p), ()):
                rep.append(i)
                idx.append(names.setdefault(mod, len(names)))
        out = (None if rep == list(range(len(params))) else np.array(rep, dtype=np.intp),
               np.array(idx, dtype=np.intp), tuple(names))
        self._pg_map = (key, out)
        return out
