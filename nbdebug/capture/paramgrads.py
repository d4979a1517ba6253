"""Parameter-gradient norms of a :class:`~nbdebug.capture.session.Capture`: post-accumulate-grad hooks
on the selected modules' own parameters note which gradients a backward wrote; at the end of that
backward (an engine callback) their norms are taken in one batch (:func:`~nbdebug.capture.calls.grad_norms`);
when the step closes they are summed per module (a parameter shared by several modules counts for
each) into ``param_grad_norm`` on the module's first row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from .calls import grad_norms
from .hooks import HookSet
from .leaves import local

__all__: list[str] = []  # private to the capture package

_Tensor = torch.Tensor
_STRIDED = torch.strided


def _engine() -> Any:
    return torch.autograd.Variable._execution_engine


class _ParamGrads:
    """Mixin of :class:`~nbdebug.capture.session.Capture`: parameter-gradient hooks and norms."""

    modules: list[tuple[str, nn.Module]]
    device_path: bool
    _hooks: HookSet
    _pg_fresh: dict[int, torch.Tensor]
    _pg_queued: bool
    _pg_norms: tuple[list[torch.Tensor], Any] | None
    _param_owner: dict[int, list[str]]
    _pg_map: tuple[tuple[int, ...], Any] | None

    def _on_param_grad(self, p: torch.Tensor) -> None:
        self._pg_fresh[id(p)] = p
        if not self._pg_queued:
            self._pg_queued = True
            try:
                _engine().queue_callback(self._on_backward_end)
            except Exception:  # no engine callback: norms are taken when the step closes
                self._pg_queued = False

    def _on_backward_end(self) -> None:
        """End of a backward: the norms of the parameter gradients it wrote, in one batch."""
        self._pg_queued = False
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
