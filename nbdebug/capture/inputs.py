"""Remembering how the user called the model, so a view can run it again (Grad-CAM, logit lens).

>>> with ModelCall(model) as call:     # doctest: +SKIP
...     model(x)
>>> call.args, call.kwargs, call.output   # the first top-level call inside the block
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .hooks import HookSet

__all__ = ["ModelCall"]


class ModelCall:
    """Records the first call of ``model`` (args, kwargs, output, grad mode) while entered.

    References are kept, not copies: views re-run the model on exactly what the user passed.
    ``calls`` counts every top-level call, so views can say "the cell ran the model 3 times; the
    first call is shown".
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.args: tuple[Any, ...] | None = None
        self.kwargs: dict[str, Any] | None = None
        self.output: Any = None
        self.grad_enabled: bool | None = None
        self.calls = 0
        self._hooks = HookSet()

    @property
    def seen(self) -> bool:
        return self.args is not None

    def _pre(self, _m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import torch

        self.calls += 1
        if self.args is None:
            self.args, self.kwargs = args, dict(kwargs)
            self.grad_enabled = torch.is_grad_enabled()

    def _post(self, _m: nn.Module, _args: Any, _kwargs: Any, output: Any) -> None:
        if self.output is None and self.calls == 1:
            self.output = output

    def __enter__(self) -> ModelCall:
        self._hooks.forward_pre(self.model, self._pre, with_kwargs=True)
        self._hooks.forward(self.model, self._post, with_kwargs=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.remove()
