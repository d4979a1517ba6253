"""Parameter-gradient norms of a :class:`~nbdebug.capture.session.Capture`, without a hook per parameter.

Which gradients a backward wrote is read from the gradients themselves: a parameter's ``.grad`` is
*fresh* when it is a new tensor or the same one with a moved version counter (autograd accumulates in
place, which bumps it) since the last look. The selected modules' own parameters are looked at
(:meth:`ParamGrads._scan`, a few attribute reads each, no host sync):

* when a step opens (gradients left over from before it, or zeroed in place by
  ``zero_grad(set_to_none=False)``, are not this step's);
* at the end of every backward that reached a recorded output: the first output-gradient hook of
  the backward queues an engine callback (when a process group exists, queued once more from there,
  so that it runs after the callbacks distributed wrappers queue during the backward: DDP's averaged
  gradients are read; one the engine drops uncalled, the backward having raised, is not waited for);
  the norms of the step's fresh gradients are then taken in one batch
  (:func:`~nbdebug.capture.gradnorms.grad_norms`);
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

from .gradnorms import grad_norms
from .leaves import local

__all__ = ["ParamGrads"]

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
    calls :meth:`ParamGrads.backward_ended`. When the engine drops it uncalled (the backward raised, or
    was interrupted), the watch stops waiting for it, so the step's later backwards queue their own."""

    __slots__ = ("calls", "watch")

    def __init__(self, watch: ParamGrads) -> None:
        self.watch, self.calls = watch, 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls == 1 and _distributed():  # only distributed wrappers queue such callbacks
            try:
                _engine().queue_callback(self)
                return
            except Exception:
                pass
        self.calls = 2
        self.watch.backward_ended()

    def __del__(self) -> None:
        if getattr(self, "calls", 2) < 2:  # (a copy made without __init__, by TorchDynamo tracing the hook: nothing)
            self.watch.queued = 0


class ParamGrads:
    """Parameter-gradient freshness and norms of the selected modules' own parameters (see the module
    doc). ``device_path``: norms stay on the device; :meth:`watch` (at the capture's entry: the
    gradients then are not fresh) says which parameters. ``params`` (watched), ``queued`` (1: the backward-end callback is queued) are
    read by the gradient hooks; :meth:`take` hands the step's norms to its close."""

    __slots__ = (
        "_map",
        "_seen_grads",
        "device_path",
        "fresh",
        "late",
        "norms",
        "owners",
        "params",
        "queued",
        "scanned",
        "seen",
    )

    def __init__(self, device_path: bool) -> None:
        self.device_path = device_path
        self.owners: dict[int, list[str]] = {}  # id(parameter) → the selected modules owning it
        self.params: list[torch.Tensor] = []  # the watched parameters
        self.fresh: dict[int, torch.Tensor] = {}  # params whose .grad a backward of this step wrote
        self.queued = 0
        self.scanned = False  # the open step's gradients were looked at after a backward
        self.late = False  # ... and its norms were taken late (before the optimizer step, or at close)
        self.norms: tuple[list[torch.Tensor], Any] | None = None  # (parameters, their norms) of the open step
        self._seen_grads = False  # some step had fresh parameter gradients
        self._map: tuple[tuple[int, ...], Any] | None = None  # the last parameter list's owners
        self.seen: list[Any] = []  # per watched parameter: (weakref to its .grad, version) at the last look

    @property
    def any_seen(self) -> bool:
        """Some closed step had fresh parameter gradients."""
        return self._seen_grads

    def watch(self, modules: list[tuple[str, nn.Module]]) -> None:
        """The selected modules' own parameters whose gradients are watched (their gradients now are
        not fresh)."""
        params: list[torch.Tensor] = []
        for name, module in modules:
            for p in module.parameters(recurse=False):
                if not p.requires_grad or not p.is_leaf:
                    continue
                owners = self.owners.get(id(p))
                if owners is not None:
                    owners.append(name)
                    continue
                self.owners[id(p)] = [name]
                params.append(p)
        self.params, self.seen = params, [None] * len(params)
        self._scan(False)

    def _scan(self, collect: bool) -> bool:
        """Look at every watched gradient; with ``collect``, add those written since the last look to
        the step's fresh ones. True when some were."""
        seen, fresh, new = self.seen, self.fresh, False
        for i, p in enumerate(self.params):
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

    def step_opens(self) -> None:
        """A step opens: gradients present now are not its own (and a callback lost to a backward
        that raised is not waited for)."""
        self.scanned = self.late = False
        self.queued = 0
        if self.params:
            self._scan(False)

    def backward_started(self) -> None:
        """Called by the first output-gradient hook of a backward: look at the gradients once it ends.
        Not under compiled autograd: it traces the hook, and an engine callback queued from traced
        code fails the user's backward (the gradients are then looked at before the optimizer step,
        or at the step's close)."""
        ca = sys.modules.get("torch._dynamo.compiled_autograd")
        if ca is not None and (ca.in_compiled_autograd_region or ca.compiled_autograd_enabled):
            return
        self.queued = 1
        try:
            _engine().queue_callback(_BackwardEnd(self))
        except Exception:  # no engine callback: looked at before the optimizer step or at the step's close
            self.queued = 0

    def backward_ended(self) -> None:
        """End of a backward (after the callbacks queued during it, e.g. DDP's gradient averaging): the
        norms of the step's fresh gradients, in one batch."""
        self.queued = 0
        self.scanned = True
        if self._scan(True) or (self.norms is None and self.fresh):
            self.late = False
            self._take_norms()

    def before_optimizer_step(self, scaled: bool) -> None:
        """Before an optimizer step: when no backward of the step reached a recorded output, the
        gradients are looked at now (late norms). Under a GradScaler (``scaled``) they are looked at
        again before each later optimizer step of the step (the scaler unscales one optimizer's
        gradients at a time: by the last one every gradient is unscaled)."""
        if self.scanned or not self.params:
            return
        if not scaled:
            self.scanned = True
        # (unscaling in place does not move a gradient's version: under a scaler, taken again regardless)
        if self._scan(True) or (scaled and self.late and self.fresh):
            self.late = True
            self._take_norms()

    def take(self) -> tuple[tuple[list[torch.Tensor], Any] | None, bool]:
        """At a step's close: its norms ``(parameters, norms)`` or None, and whether they were taken
        late (a ``scaler.step`` has unscaled them by then). When neither a backward reaching a recorded
        output nor an optimizer step looked at the step's gradients, they are looked at now."""
        if not (self.scanned or self.late or not self.params):
            self.scanned = True
            if self._scan(True):
                self.late = True
                self._take_norms()
        pg, self.norms = self.norms, None
        if pg is not None:
            self._seen_grads = True
        self.fresh.clear()
        return pg, self.late

    def drop(self) -> None:
        """Forget the open step's norms (its close failed, or the capture ended)."""
        self.norms = None

    def release(self) -> None:
        """At exit: hold no parameter or gradient of the model."""
        self.fresh.clear()
        self.norms = None
        self.params, self.seen = [], []

    def _take_norms(self) -> None:
        params: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        for p in self.fresh.values():
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
            self.norms = (params, grad_norms(grads, self.device_path))

    def modules_of(self, params: list[torch.Tensor]) -> tuple[np.ndarray | None, np.ndarray, tuple[str, ...]]:
        """For per-module sums of ``params``' squared norms: (index of the parameter of each
        (parameter, owner) pair, or None when that is every parameter once in order; owner index of
        each pair; owner names in first-seen order). Cached for the last list of parameters (the same
        object while nothing changed: a batch of steps compares it by identity)."""
        key = tuple(map(id, params))
        hit = self._map
        if hit is not None and hit[0] == key:
            return hit[1]
        names: dict[str, int] = {}
        rep: list[int] = []
        idx: list[int] = []
        owner = self.owners
        for i, p in enumerate(params):
            for mod in owner.get(id(p), ()):
                rep.append(i)
                idx.append(names.setdefault(mod, len(names)))
        out = (None if rep == list(range(len(params))) else np.array(rep, dtype=np.intp),
               np.array(idx, dtype=np.intp), tuple(names))
        self._map = (key, out)
        return out
