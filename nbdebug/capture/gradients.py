"""Gradients of a layer's output, from a forward pass of nbdebug's own.

:func:`run_from_layer` runs the model once more on the cell's inputs with the target layer's
output swapped for a leaf (so the graph starts there), on clones of the buffers, with parameters
not requiring grad; :func:`class_grads` then differentiates K scores with respect to that leaf
in one batched backward. The user's model, its ``.grad`` and any graph the user still holds are
left alone.

>>> inputs = autograd_inputs(args, kwargs)                        # doctest: +SKIP
>>> output, leaf = run_from_layer(model, *inputs, "layer4", None)   # doctest: +SKIP
>>> grads = class_grads(logits.gather(1, classes), leaf)            # K×B×C×h×w
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .hooks import HookSet, no_param_grads
from .state import preserve_buffers

__all__ = ["LayerDidNotRun", "autograd_inputs", "class_grads", "run_from_layer"]


class LayerDidNotRun(ValueError):
    """The target module (or its requested call) did not run in nbdebug's forward pass."""


def _usable(value: Any, depth: int = 0) -> Any:
    if isinstance(value, torch.Tensor):
        if value.is_inference():
            with torch.inference_mode(False):
                return value.clone()
        return value.detach()
    if depth > 4:
        return value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_usable(v, depth + 1) for v in value)
    if isinstance(value, list):
        return [_usable(v, depth + 1) for v in value]
    if type(value) is dict:
        return {k: _usable(v, depth + 1) for k, v in value.items()}
    return value


def autograd_inputs(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The cell's inputs made fit for a forward pass with autograd: tensors detached (so nothing of
    the user's accumulates a gradient), inference tensors (from ``torch.inference_mode``) cloned
    outside inference mode (autograd refuses them). Other values are passed as they are."""
    return tuple(_usable(a) for a in args), {k: _usable(v) for k, v in kwargs.items()}


def _swap_first(output: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``output`` with its first tensor leaf replaced by ``fn(tensor)`` (tensor, tuple, list, dict/ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return fn(output)
    if isinstance(output, (tuple, list)):
        items = list(output)
        for i, v in enumerate(items):
            new = _swap_first(v, fn)
            if new is not v:
                items[i] = new
                return type(output)(items) if not hasattr(output, "_fields") else type(output)(*items)
        return output
    if isinstance(output, Mapping):
        for k, v in output.items():
            new = _swap_first(v, fn)
            if new is not v:
                data = dict(output)
                data[k] = new
                return type(output)(**data) if type(output) is not dict else data
        return output
    return output


def run_from_layer(model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any], module: str, call: int | None) -> tuple[Any, torch.Tensor]:
    """``(output, leaf)`` of one forward pass whose graph starts at ``module``'s output.

    ``call`` is the 0-based call of a module that runs several times (None: the last call; then
    every call gets its own leaf and the last is returned). The output is replaced by
    ``leaf.clone()`` so in-place ops downstream cannot touch the leaf. Only calls during this
    top-level forward count (a checkpointed segment recomputed in backward is left alone). Runs
    on clones of the buffers, with parameters not requiring grad, gradients enabled (also when
    called under ``no_grad``/``inference_mode``); backward may happen after it returns. Pass the
    inputs through :func:`autograd_inputs` first.
    """
    target = model.get_submodule(module)
    leaves: list[torch.Tensor] = []
    seen = [0]
    active = [False]

    def hook(_m: nn.Module, _args: Any, out: Any) -> Any:
        if not active[0]:
            return None
        k = seen[0]
        seen[0] += 1
        if call is not None and k != call:
            return None

        def swap(t: torch.Tensor) -> torch.Tensor:
            leaf = t.detach().requires_grad_(True)
            leaves.append(leaf)
            return leaf.clone()

        return _swap_first(out, swap)

    with torch.inference_mode(False), preserve_buffers(model), no_param_grads(model), torch.enable_grad(), HookSet() as hooks:
        hooks.forward(target, hook)
        active[0] = True
        try:
            output = model(*args, **kwargs)
        finally:
            active[0] = False
    if not leaves:
        which = "" if call is None else f" (call {call + 1})"
        raise LayerDidNotRun(f"layer {module!r}{which} did not run in the forward pass")
    return output, leaves[-1]


def _one_by_one(picked: torch.Tensor, leaf: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    k = picked.shape[1]
    try:
        return torch.stack([
            torch.autograd.grad(picked, leaf, grad_outputs=grad_out[i], retain_graph=True, allow_unused=True, materialize_grads=True)[0]
            for i in range(k)
        ])
    except RuntimeError as exc:
        if "heckpoint" not in str(exc):
            raise
    # Reentrant torch.utils.checkpoint refuses autograd.grad; .backward() into our own leaf works
    # (the inputs are detached and parameters do not require grad, so nothing else accumulates).
    out = []
    for i in range(k):
        leaf.grad = None
        picked.backward(grad_out[i], retain_graph=True)
        out.append(leaf.grad if leaf.grad is not None else torch.zeros_like(leaf))
    leaf.grad = None
    return torch.stack(out)


def class_grads(picked: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    """K×(leaf shape): gradient of each column of ``picked`` (B×K) w.r.t. ``leaf``, one batched backward.

    Falls back to one backward per class for ops without a batching rule, and to ``.backward()``
    into the leaf for reentrant checkpointing (which refuses ``autograd.grad``).
    """
    k = picked.shape[1]
    if not picked.requires_grad:  # the scores do not depend on this layer's output at all
        return torch.zeros((k, *leaf.shape), dtype=leaf.dtype, device=leaf.device)
    eye = torch.eye(k, dtype=picked.dtype, device=picked.device)
    grad_out = eye[:, None, :].expand(k, picked.shape[0], k).contiguous()  # one-hot per class
    with torch.inference_mode(False), torch.enable_grad():
        try:
            return torch.autograd.grad(picked, leaf, grad_outputs=grad_out, is_grads_batched=True,
                                       allow_unused=True, materialize_grads=True, retain_graph=True)[0]
        except RuntimeError:  # an op without a batching rule, or reentrant checkpointing
            return _one_by_one(picked, leaf, grad_out)
