"""Gradients of a layer's output, from a forward pass of nbdebug's own.

:func:`layer_pass` runs the model once more on the cell's inputs with the target layer's
output swapped for a leaf (so the graph starts there), on clones of the buffers, with parameters
not requiring grad; :func:`class_grads` then differentiates K scores with respect to that leaf
in one batched backward; :func:`target_grads` does both for a selector of the scores, and
:func:`probe_pass` runs one inference pass under an :class:`~nbdebug.capture.probe.OutputProbe` (the
shape of every module call, to find the layers Grad-CAM can explain). These are the model passes
behind Grad-CAM; the CAM math is in :mod:`nbdebug.inspectors.gradcam`. The user's model, its
``.grad`` and any graph the user still holds are left alone.

>>> args, kwargs = autograd_inputs(args, kwargs)                           # doctest: +SKIP
>>> with layer_pass(model, args, kwargs, "layer4", None) as (output, leaf):  # doctest: +SKIP
...     grads = class_grads(output.gather(1, classes), leaf)                 # K×B×C×h×w
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..capture.eager import eager
from ..capture.hooks import HookSet
from ..capture.leaves import replace_first_output
from ..capture.probe import OutputProbe
from ..capture.select import unwrap_compiled
from .own import own_pass
from .points import CallCounter

__all__ = ["LayerDidNotRun", "autograd_inputs", "class_grads", "layer_pass", "probe_pass", "swap_first", "target_grads", "weight_versions"]


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


#: the former name of :func:`nbdebug.capture.leaves.replace_first_output`
swap_first = replace_first_output


def _requiring_grad(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    def req(v: Any) -> Any:
        return v.detach().requires_grad_(True) if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    return tuple(req(a) for a in args), {k: req(v) for k, v in kwargs.items()}


@contextmanager
def layer_pass(model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any], module: str, call: int | None) -> Iterator[tuple[Any, torch.Tensor]]:
    """Yields ``(output, leaf)`` of one forward pass whose graph starts at ``module``'s output.

    Differentiate inside the block (:func:`class_grads`): until it ends nbdebug's forward runs on
    clones of the buffers, parameters do not require grad, gradients are enabled (also when
    called under ``no_grad``/``inference_mode``), the user's own hooks are set aside (not called
    again) and ours stays, and all of that also covers the recomputation of checkpointed segments
    during backward. A ``torch.compile``d model runs as its eager module. ``call`` is the 0-based call of a
    module that runs several times (None: the last call). The output is replaced by
    ``leaf.clone()`` so in-place ops downstream cannot touch the leaf. Pass the inputs through
    :func:`autograd_inputs` first.

    Checkpointed segments (``torch.utils.checkpoint``) recompute their modules during backward: a
    recomputed output equal to the leaf's value is swapped for the same leaf, so the gradient
    reaches it through the recomputation too. A reentrant segment runs its forward under
    ``no_grad``; when the layer sits inside one, the pass is repeated with the (detached copies of
    the) inputs requiring grad so the segment's output carries a graph.
    """
    model = unwrap_compiled(model)
    target = model.get_submodule(module)
    leaves: list[torch.Tensor] = []
    calls = CallCounter(1)
    active = [False]
    under_no_grad = [False]

    def hook(_m: nn.Module, _args: Any, out: Any) -> Any:
        if not active[0]:  # a checkpoint recomputation during backward
            if not leaves:
                return None

            def again(t: torch.Tensor) -> torch.Tensor:
                same = t.shape == leaves[-1].shape and torch.equal(t.detach(), leaves[-1].detach())
                return leaves[-1].clone() if same else t

            return replace_first_output(out, again)
        if not calls.this_one(0, call):
            return None
        under_no_grad[0] = not torch.is_grad_enabled()

        def swap(t: torch.Tensor) -> torch.Tensor:
            leaf = t.detach().requires_grad_(True)
            leaves.append(leaf)
            return leaf.clone()

        return replace_first_output(out, swap)

    with own_pass(model, grad=True), HookSet() as hooks:
        hooks.forward(target, eager(hook))  # (a model compiled in place: dynamo leaves it alone)
        for attempt in range(2):
            leaves.clear()
            calls.reset()
            active[0] = True
            try:
                output = model(*args, **kwargs)
            finally:
                active[0] = False
            if not leaves:
                which = "" if call is None else f" (call {call + 1})"
                raise LayerDidNotRun(f"layer {module!r}{which} did not run in the forward pass")
            if not under_no_grad[0] or attempt == 1:
                break
            args, kwargs = _requiring_grad(args, kwargs)
        yield output, leaves[-1]


def _reentrant_checkpoint(t: torch.Tensor, limit: int = 100_000) -> bool:
    """Whether ``t``'s graph goes through a reentrant ``torch.utils.checkpoint`` segment."""
    todo, seen = [t.grad_fn], set()
    while todo and len(seen) < limit:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if "CheckpointFunction" in type(fn).__name__:
            return True
        todo.extend(f for f, _ in fn.next_functions)
    return False


def _via_backward(picked: torch.Tensor, leaf: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """Reentrant ``torch.utils.checkpoint`` hides the leaf from ``autograd.grad`` (its segment is
    differentiated by a backward of its own); ``.backward()`` reaches it. Only our own tensors
    require grad here (inputs detached, parameters frozen), so nothing of the user's accumulates."""
    out = []
    for i in range(grad_out.shape[0]):
        leaf.grad = None
        picked.backward(grad_out[i], retain_graph=True)
        out.append(leaf.grad if leaf.grad is not None else torch.zeros_like(leaf))
    leaf.grad = None
    return torch.stack(out)


def _one_by_one(picked: torch.Tensor, leaf: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor | None:
    grads = []
    for i in range(grad_out.shape[0]):
        (g,) = torch.autograd.grad(picked, leaf, grad_outputs=grad_out[i], retain_graph=True, allow_unused=True)
        if g is None:
            return None
        grads.append(g)
    return torch.stack(grads)


def class_grads(picked: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    """K×(leaf shape): gradient of each column of ``picked`` (B×K) w.r.t. ``leaf``, one batched backward.

    Falls back to one backward per class for ops without a batching rule, and to ``.backward()``
    into the leaf when ``autograd.grad`` cannot see it (reentrant checkpointing). Zeros when the
    scores do not depend on the leaf.
    """
    k = picked.shape[1]
    zeros = torch.zeros((k, *leaf.shape), dtype=leaf.dtype, device=leaf.device)
    if not picked.requires_grad:  # the scores do not depend on this layer's output at all
        return zeros
    eye = torch.eye(k, dtype=picked.dtype, device=picked.device)
    grad_out = eye[:, None, :].expand(k, picked.shape[0], k).contiguous()  # one-hot per class
    with torch.inference_mode(False), torch.enable_grad():
        grads: torch.Tensor | None
        try:
            (grads,) = torch.autograd.grad(picked, leaf, grad_outputs=grad_out, is_grads_batched=True,
                                           allow_unused=True, retain_graph=True)
        except RuntimeError as exc:  # an op without a batching rule, or reentrant checkpointing
            grads = None if "heckpoint" in str(exc) else _one_by_one(picked, leaf, grad_out)
        if grads is None and _reentrant_checkpoint(picked):  # hidden from autograd.grad
            grads = _via_backward(picked, leaf, grad_out)
    return grads if grads is not None and grads.shape == zeros.shape else zeros


def target_grads(model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any], module: str, call: int | None,
                 pick: Callable[[Any], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(activation, gradients)`` of ``module``'s output (call ``call``; None: the last) in one
    :func:`layer_pass`: ``pick(output)`` chooses the B×K scores, differentiated in one batched
    backward (:func:`class_grads`, K×(activation shape)). Both are detached from any graph.
    """
    with layer_pass(model, args, kwargs, module, call) as (output, leaf):
        grads = class_grads(pick(output), leaf)
    return leaf.detach(), grads.detach()


def probe_pass(model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any],
               on_first_call: Callable[[tuple[Any, ...], dict[str, Any]], None] | None = None) -> OutputProbe:
    """One inference pass of nbdebug's own under an :class:`~nbdebug.capture.probe.OutputProbe`
    (shapes only): no grad, buffers cloned with the RNG forked, the user's hooks not called."""
    model = unwrap_compiled(model)
    with own_pass(model), OutputProbe(model, on_first_call=on_first_call) as pr:
        model(*args, **kwargs)
    return pr


def weight_versions(model: nn.Module) -> tuple[int, ...]:
    """The version counters of ``model``'s parameters (an in-place update, e.g. an optimizer step,
    moves them; -1 for inference tensors, which have none): compare two readings to tell whether the
    weights changed in between, without copying them."""
    out = []
    for p in model.parameters():
        try:
            out.append(int(p._version))
        except RuntimeError:
            out.append(-1)
    return tuple(out)

