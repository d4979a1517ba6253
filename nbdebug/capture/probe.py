"""Recording every module call's output shape (and, on request, a bounded copy of the output).

The vision views enter an :class:`OutputProbe` around the user's cell (or a forward pass of
nbdebug's own); :mod:`nbdebug.adapters.vision` then decides which outputs have a spatial grid.

Only the first step is described (one call of the model's top-level ``forward``), and only while
that call runs: module calls that happen after it returns, e.g. the recomputation of a
``torch.utils.checkpoint`` segment during backward, add no rows. Calls are named with
:func:`~nbdebug.capture.names.call_name` (``act``, ``act#2`` …).

>>> with OutputProbe(model) as probe:       # doctest: +SKIP
...     model(x)
>>> [(r.name, r.shape) for r in probe.records]       # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .budget import DEFAULT_MAX_BYTES
from .eager import eager
from .hooks import HookSet
from .leaves import first_tensor
from .names import call_name
from .select import model_modules, unwrap_compiled
from .weak import ModelRef

__all__ = ["CallRecord", "OutputProbe"]


@dataclass(frozen=True)
class CallRecord:
    """One call of one module in the first step: its (first) output's shape and dtype."""

    module: str
    call: int  # 0-based index of this call of ``module`` within the step
    shape: tuple[int, ...]
    kind: str  # the module's class name
    dtype: torch.dtype = torch.float32

    @property
    def name(self) -> str:
        """The call's name in every view: ``module`` for the first call, ``module#2`` … after."""
        return call_name(self.module, self.call)


class OutputProbe:
    """Hooks that record each module call's output shape during the model's first top-level call.

    ``keep(name, output)`` (a call name, the output tensor) selects outputs to copy: floating-point, ≥ 3-d, the first
    ``max_samples`` samples, while the copies fit in ``max_bytes`` (the calls that did not fit are
    listed in ``dropped``). Copies, not references: in-place ops later in the forward
    (``ReLU(inplace=True)``) would change a reference. ``on_first_call(args, kwargs)`` runs once
    with the first top-level call's inputs (the vision adapter reads the image size there). The
    model is held weakly.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        keep: Callable[[str, torch.Tensor], bool] | None = None,
        max_samples: int = 16,
        max_bytes: int = DEFAULT_MAX_BYTES,
        on_first_call: Callable[[tuple[Any, ...], dict[str, Any]], None] | None = None,
    ) -> None:
        self._model = ModelRef(model)
        self.keep = keep
        self.max_samples = max_samples
        self.max_bytes = max_bytes
        self.on_first_call = on_first_call
        self.records: list[CallRecord] = []
        self.tensors: dict[str, torch.Tensor] = {}
        self.kept_bytes = 0
        self.dropped: list[tuple[str, int]] = []  # (call name, bytes it would have taken)
        self.steps = 0
        self.calls: dict[str, int] = {}
        #: the autograd mode of the first call: "grad", "no_grad" or "inference_mode"
        self.grad_mode = ""
        #: whether the first call returned (False: it raised, e.g. a shape mismatch in the cell)
        self.completed = False
        self._active = False
        self._hooks = HookSet()

    def _pre(self, _m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.steps += 1
        if self.steps == 1:
            self._active = True
            self.grad_mode = ("inference_mode" if torch.is_inference_mode_enabled()
                              else "grad" if torch.is_grad_enabled() else "no_grad")
            if self.on_first_call is not None:
                self.on_first_call(args, kwargs)

    def _post(self, *_: Any) -> None:
        if self._active:
            self.completed = True
        self._active = False

    def _make_hook(self, module: str, kind: str) -> Callable[..., None]:
        def hook(_m: nn.Module, _args: Any, output: Any) -> None:
            if not self._active:
                return
            t = first_tensor(output)
            call = self.calls.get(module, 0)
            self.calls[module] = call + 1
            if t is None:
                return
            rec = CallRecord(module, call, tuple(t.shape), kind, t.dtype)
            self.records.append(rec)
            if self.keep is not None and t.dim() >= 3 and t.is_floating_point() and self.keep(rec.name, t):
                self._copy(rec.name, t)

        return hook

    def _copy(self, name: str, t: torch.Tensor) -> None:
        part = t.detach()[: self.max_samples]
        size = part.numel() * part.element_size()
        if self.kept_bytes + size > self.max_bytes:
            self.dropped.append((name, size))
            return
        self.kept_bytes += size
        self.tensors[name] = part.clone()

    def __enter__(self) -> OutputProbe:
        model = self._model.get()
        try:
            self._hooks.forward_pre(model, eager(self._pre), with_kwargs=True)
            self._hooks.forward(model, eager(self._post))
            for name, module in model_modules(unwrap_compiled(model)):  # a compiled model's own names
                self._hooks.forward(module, eager(self._make_hook(name, type(module).__name__)))
        except BaseException:
            self._hooks.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.remove()
        self._active = False

    def describe_all(self, limit: int = 12) -> str:
        """A short list of the recorded output shapes, first calls only (for error messages)."""
        seen = [f"{r.module} {list(r.shape)}" for r in self.records if r.call == 0]
        more = f" … (+{len(seen) - limit})" if len(seen) > limit else ""
        return ", ".join(seen[-limit:]) + more
