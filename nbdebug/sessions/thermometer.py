"""Module ablation for the thermometer: does this layer matter for the loss of the last step?

:class:`LastCall` keeps the inputs of the model's last top-level call while the cell runs (references,
as the user passed them; its only hook, a pre-hook on the model's own call, goes through
:func:`~nbdebug.runs.interventions.edit_activations`). :class:`ModuleAblation` re-runs that call
twice on request, as it is and with one module's output zeroed (or mean-replaced,
:func:`nbdebug.ablate` ``layers=``), both with the weights as they are now (after the last optimizer
step, when the cell trained), and reports the change of the loss: the loss in the model's own output
(a scalar output, or ``.loss`` of a Hugging Face output given labels). When the output carries no loss
(a plain ``loss_fn(model(x), y)`` loop: nbdebug does not know the loss function or the target), the
change of the output is reported instead: mean ``|Δ logits|`` and how often the top-1 class agrees.

Both re-runs are nbdebug's own passes (:func:`~nbdebug.runs.patchrun.own_pass`): no grad, buffers
cloned (BatchNorm running statistics are not updated), the RNG forked (dropout draws the same masks in
both runs and the user's random stream does not move), modes as found, ``.grad`` and the optimizer
untouched, the user's hooks not called, no hook left.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from ..adapters.outputs import logits_of
from ..capture.losses import loss_of_output
from ..capture.weak import ModelRef
from ..runs.interventions import edit_activations
from ..runs.patchrun import own_pass
from ..workbench import ablate
from .ablation_io import AblationRequest, Answered, ablation_answer

__all__ = ["OUTPUT_NOTE", "LastCall", "ModuleAblation"]

#: said when the loss cannot be recomputed
OUTPUT_NOTE = ("the model's output carries no loss (nbdebug does not know your loss function or targets): "
               "Δ of the output instead, mean |Δ logits| and top-1 agreement")


def _detached(x: Any) -> Any:
    return x.detach() if isinstance(x, torch.Tensor) else x


class LastCall:
    """While entered, the ``(args, kwargs)`` of ``model``'s last top-level call (``inputs``; None if
    it never ran). Enter/exit once."""

    def __init__(self, model: nn.Module) -> None:
        self.model_ref: ModelRef[nn.Module] = ModelRef(model)
        self.inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self.calls = 0
        self.stack = ExitStack()

    def keep(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The model's pre-call hook: keep this call's inputs (references)."""
        self.calls += 1
        # detached views (same storage): a kept input never holds the user's autograd graph alive
        self.inputs = tree_map(_detached, (tuple(args), dict(kwargs)))

    def __enter__(self) -> LastCall:
        model = self.model_ref.get()
        self.stack.enter_context(edit_activations([], root=model, on_call=self.keep))
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()


def _call(model: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]], module: str | None, mode: str) -> Any:
    args, kwargs = inputs
    with own_pass(model), ExitStack() as stack:
        if module is not None:
            stack.enter_context(ablate(model, layers=[module], mode=mode))
        return model(*args, **kwargs)


def _scalar(x: Any) -> float:
    return float(x.detach().cpu().double().mean()) if isinstance(x, torch.Tensor) else float("nan")


class ModuleAblation:
    """The last call's inputs on a weakly held model; :meth:`ablate` one module (see the module docstring)."""

    def __init__(self, model: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]]) -> None:
        self.model_ref: ModelRef[nn.Module] = ModelRef(model)
        self.inputs = inputs
        self.clean: Any = None
        self.requests = 0

    def clean_output(self) -> Any:
        """The call re-run as it is (once): ``{"loss": float}`` or ``{"logits": tensor}``."""
        if self.clean is None:
            self.clean = self.measure(_call(self.model_ref.get(), self.inputs, None, "zero"))
        return self.clean

    @staticmethod
    def measure(output: Any) -> dict[str, Any]:
        """What an output is compared by: its loss when it carries one, else its logits (float64, CPU)."""
        loss = loss_of_output(output)
        if loss is not None:
            return {"loss": _scalar(loss)}
        logits = logits_of(output)
        if logits is None and isinstance(output, torch.Tensor):
            logits = output
        if logits is None:
            raise ValueError("the model's output is neither a loss nor logits: nothing to compare")
        return {"logits": logits.detach().cpu().double()}

    def ablate(self, module: str, mode: str = "zero") -> dict[str, Any]:
        """``{module, mode, kind, clean, ablated, delta, note}``; ``kind`` "loss" (Δ loss) or "output"
        (``delta`` = mean |Δ logits|, ``agreement`` = share of rows whose top-1 class is unchanged)."""
        clean = self.clean_output()
        out = self.measure(_call(self.model_ref.get(), self.inputs, module, mode))
        self.requests += 1
        if "loss" in clean and "loss" in out:
            return {"module": module, "mode": mode, "kind": "loss", "clean": clean["loss"], "ablated": out["loss"],
                    "delta": out["loss"] - clean["loss"], "note": ""}
        a, b = clean["logits"], out["logits"]
        diff = float((b - a).abs().mean()) if a.shape == b.shape else float("nan")
        agree = float((a.argmax(-1) == b.argmax(-1)).double().mean()) if a.shape == b.shape and a.dim() else float("nan")  # cpu: measure()
        return {"module": module, "mode": mode, "kind": "output", "clean": float(a.abs().mean()),
                "ablated": float(b.abs().mean()), "delta": diff, "agreement": agree, "note": OUTPUT_NOTE}

    def respond(self, request: AblationRequest) -> Answered:
        """A view's ablation request (kind ``modules``: one module, no units) as :meth:`ablate` answers
        it, in the one answer shape (:mod:`nbdebug.sessions.ablation_io`): ``metric.kind`` "loss", or
        "output" (mean |logits|, ``delta`` the mean |Δ logits|) with the top-1 ``agreement``."""
        t0 = time.perf_counter()
        (target,) = request["targets"]
        out = self.ablate(str(target["layer"]), request["mode"])
        label = "loss" if out["kind"] == "loss" else "mean |logits|"
        metric = {"label": label, "kind": out["kind"], "clean": out["clean"], "ablated": out["ablated"],
                  "delta": out["delta"], "of": None}
        extra = {"agreement": out["agreement"]} if "agreement" in out else {}
        return ablation_answer(request, metric, note=out["note"], t0=t0, **extra), {}  # type: ignore[arg-type]
