"""The loss of a training step: found in the model's own output (:func:`loss_of_output`) and read
without a host sync on accelerators (:func:`as_float_later`: a float on the CPU, a 1-element device
copy otherwise, brought over with the capture's one per-step transfer).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["as_float_later", "loss_of_output"]


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


def as_float_later(x: Any) -> float | torch.Tensor:
    """``x`` (a loss: tensor, number or None) as a float, or as a detached 1-element float32 copy when it
    is an accelerator tensor (read with the capture's one per-step transfer, never synced here).
    A tensor of several values gives its mean (a ``reduction="none"`` loss); anything else NaN."""
    if isinstance(x, torch.Tensor):
        if not x.numel() or x.is_complex():
            return float("nan")
        if x.is_cpu and x.numel() == 1:
            return float(x.item())
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
