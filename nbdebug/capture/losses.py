"""The loss of a training step, in this order: what the user's ``loss()`` returns (:class:`UserLoss`:
unknown when it is the previous step's very object, with a note); the loss in the model's own output
(:func:`loss_of_output`); else the tensor ``.backward()`` ran on (:data:`BACKWARD`: ``loss.backward()``,
``torch.autograd.backward(loss)``, ``scaler.scale(loss).backward()`` divided by the scale; a backward on
a non-scalar tensor counts its sum, several backwards in one step their sum, each with a note). Read
without a host sync on accelerators (:func:`as_float_later`: a float on the CPU, a 1-element device
copy otherwise, brought over with the capture's one per-step transfer).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .hooks import SharedPatch

__all__ = ["BACKWARD", "BACKWARD_NOTES", "UserLoss", "as_float_later", "loss_of_output"]

#: the capture's notes when a step's loss came from a backward that was not one scalar
BACKWARD_NOTES = {
    "several": "loss from backward(): several backward calls in one step, the step's loss is their sum",
    "nonscalar": "loss from backward(): a backward on a non-scalar tensor, the step's loss is its sum",
}


def _wrap_backward(original: Any) -> Any:
    @functools.wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        users = BACKWARD.users
        # not a backward that autograd itself runs inside a backward (reentrant checkpointing)
        if users and torch._C._current_graph_task_id() == -1:
            for user in tuple(users):
                try:
                    user(tensors)
                except Exception:  # never break the user's backward with ours
                    pass
        return original(tensors, *args, **kwargs)

    return backward


#: ``torch.autograd.backward`` (which ``Tensor.backward`` calls) seen by every entered capture: each
#: user is called with the tensors the backward runs on, before it runs
BACKWARD = SharedPatch(torch.autograd, "backward", _wrap_backward)  # type: ignore[arg-type]


def loss_of_output(output: Any) -> Any | None:
    """The loss in a model's own output, detached, or None: a 0-d floating tensor; the ``loss`` of a
    ``ModelOutput``/dict (Hugging Face models given labels); the first item of a tuple when it is a
    0-d floating tensor (``return_dict=False`` with labels)."""
    if _scalar(output):
        return output.detach()
    if isinstance(output, dict):
        loss = output.get("loss")
    elif isinstance(output, (tuple, list)):
        loss = output[0] if output else None
    else:
        loss = getattr(output, "loss", None)
    return loss.detach() if _scalar(loss) else None


def _scalar(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 0 and t.is_floating_point()


def as_float_later(x: Any, on_device: bool = False) -> float | torch.Tensor:
    """``x`` (a loss: tensor, number or None) as a float, or as a detached 1-element float32 copy when it
    is an accelerator tensor or ``on_device`` (the capture's device path: read with its one per-step
    transfer, never synced here). A tensor of several values gives its mean (a ``reduction="none"``
    loss); anything else NaN."""
    if isinstance(x, torch.Tensor):
        if not x.numel() or x.is_complex():
            return float("nan")
        if x.is_cpu and x.numel() == 1 and not on_device:
            return float(x.item())
        t = x.detach()
        t = t.reshape(1) if t.numel() == 1 else t.float().mean().reshape(1)
        if t.device.type == "cpu" and not on_device:
            return float(t[0])
        return t.to(torch.float32, copy=True)
    if isinstance(x, bool) or x is None:
        return float("nan")
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


class UserLoss:
    """The step's loss from the user's ``loss()``: unknown (no entry, so NaN) when it returns the very
    object of the previous step's close (the variable was not reassigned: a forward that raised, or a
    loop that forgot to). ``stale`` lists those steps; their note is kept up to date in ``notes`` (the
    capture's list of notes, handed in). ``on_device``: the capture's device path, where a tensor loss is
    read with the step's one transfer (see :func:`as_float_later`), never synced here."""

    __slots__ = ("fn", "notes", "on_device", "prev", "stale")

    def __init__(self, fn: Callable[[], Any], notes: list[str], on_device: bool = False) -> None:
        self.fn, self.notes, self.on_device = fn, notes, bool(on_device)
        self.prev: Any = None  # what fn() returned at the previous close (weakref / 1-tuple)
        self.stale: list[int] = []  # steps whose loss() returned the previous step's object (NaN loss)

    def read(self, step: int, has_calls: bool) -> list[Any]:
        """The loss of the step closing now (to be numbered ``step``): ``[]`` (unknown) or one value."""
        try:
            v = self.fn()
        except Exception:  # the user's name may not exist yet
            v = None
        if v is None:
            return []
        prev, self.prev = self.prev, _identity(v)
        if prev is not None and (prev() if isinstance(prev, weakref.ref) else prev[0]) is v:
            if has_calls:
                old = _stale_note(self.stale)
                self.stale.append(step)
                new = _stale_note(self.stale)
                notes = self.notes
                notes[:] = [new if n == old else n for n in notes] if old in notes else [*notes, new]
            return []
        return [as_float_later(v, self.on_device)]

    def release(self) -> None:
        """At exit: hold nothing the user's loss returned."""
        self.prev = None


def _stale_note(steps: list[int]) -> str:
    shown = ", ".join(map(str, steps[:5])) + (f" and {len(steps) - 5} more" if len(steps) > 5 else "")
    return (f"loss unknown (NaN) at step{'s' if len(steps) > 1 else ''} {shown}: the loss variable still held "
            "the previous step's loss object (not reassigned, e.g. the forward raised before it)")


def _identity(v: Any) -> Any:
    """A reference to ``v`` for the next step's identity check: weak for tensors (never keeps a graph
    alive), else the object itself in a 1-tuple (floats: tiny)."""
    try:
        return weakref.ref(v)
    except TypeError:
        return (v,)
