"""The doctor's batch and loss: what the inputs, the targets and the loss function are.

Pure helpers on tensors for :func:`nbdebug.doctor.doctor` and its passes
(:mod:`nbdebug.doctor.passes`): the default loss, the kind of problem (classification or
regression) and its class dimension, the batch's primary tensor and how to perturb or cut it, how
to call the model and read its scores, the loss of predicting the targets' mean, and the inputs'
per-channel statistics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..adapters.outputs import logits_of
from ..capture.leaves import tensor_leaves

__all__ = ["are_probabilities", "call_model", "channel_stats", "class_dim", "default_loss", "head_samples", "loss_kind",
           "mean_baseline", "primary_input", "replace_primary", "scalar_loss"]

_CLASSIFICATION = ("cross_entropy", "crossentropy", "nll")
_REGRESSION = ("mse", "l1", "huber")


def default_loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for integer targets (classes on the last dim when the targets are the output's
    leading dims, else dim 1 as ``F.cross_entropy`` expects), MSE otherwise."""
    if not targets.is_floating_point():
        if output.dim() > 2 and tuple(targets.shape) == tuple(output.shape[:-1]):
            return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))
        return F.cross_entropy(output, targets)
    return F.mse_loss(output, targets.to(output.dtype))


default_loss.__name__ = "cross_entropy_or_mse"


def loss_kind(loss_fn: Callable[..., Any], out: torch.Tensor, targets: torch.Tensor, loss: float | None = None) -> str:
    """"classification" | "regression" | "unknown": from the loss function's name, else from the
    targets' dtype and the output's shape. A loss of another name on class indices counts as
    classification only when it is cross-entropy on the output (``loss`` equal to it within 1e-3): a
    contrastive or metric loss on integer labels has no chance level ln C, so no expected initial loss
    and no overfit target."""
    if loss_fn is default_loss:
        return "regression" if targets.is_floating_point() else "classification"
    name = (getattr(loss_fn, "__name__", "") or type(loss_fn).__name__).lower()
    if any(k in name for k in _CLASSIFICATION):
        return "classification"
    if any(k in name for k in _REGRESSION):
        return "regression"
    if not targets.is_floating_point() and out.is_floating_point() and out.dim() >= 2:
        return "classification" if loss is None or _is_cross_entropy(loss, out, targets) else "unknown"
    if targets.is_floating_point() and targets.numel() == out.numel():
        return "regression"
    return "unknown"


def _is_cross_entropy(loss: float, out: torch.Tensor, targets: torch.Tensor) -> bool:
    """Whether ``loss`` is a class loss of ``out`` at ``targets`` (within 1e-3): its mean cross-entropy
    (raw scores), or its mean negative log-likelihood (``nll_loss``, on log-probabilities or, wrongly, on
    raw scores — a bug the checks are there to catch)."""
    try:
        with torch.no_grad():
            scores = out.float().movedim(class_dim(out, targets), 1) if out.dim() > 2 else out.float()
            t = targets.long()
            candidates = (float(F.cross_entropy(scores, t)), float(F.nll_loss(scores, t)))
    except Exception:  # targets that are no class indices of this output
        return False
    return math.isfinite(loss) and any(abs(loss - c) <= 1e-3 * max(1.0, abs(c)) for c in candidates)


def class_dim(out: torch.Tensor, targets: torch.Tensor) -> int:
    """The output's class dimension: the last when the targets are its leading dims (or it is 2-D), else 1."""
    return out.dim() - 1 if tuple(targets.shape) == tuple(out.shape[:-1]) or out.dim() <= 2 else 1


def primary_input(inputs: Any) -> torch.Tensor:
    """The batch's first tensor (the one the checks perturb); TypeError when there is none."""
    if isinstance(inputs, torch.Tensor):
        return inputs
    for _, t in tensor_leaves(inputs):
        return t
    raise TypeError(f"doctor needs a tensor input (or a tuple/list/dict holding one), got {type(inputs).__name__}")


def replace_primary(inputs: Any, new: torch.Tensor) -> Any:
    """``inputs`` with its primary tensor replaced by ``new``."""
    if isinstance(inputs, torch.Tensor):
        return new
    old = primary_input(inputs)
    if isinstance(inputs, dict):
        return {k: (new if v is old else v) for k, v in inputs.items()}
    return type(inputs)(new if v is old else v for v in inputs)


def head_samples(x: Any, n: int, batch: int) -> Any:
    """The first ``n`` samples of every tensor with ``batch`` rows."""
    if isinstance(x, torch.Tensor):
        return x[:n] if x.dim() and x.shape[0] == batch else x
    if isinstance(x, dict):
        return {k: head_samples(v, n, batch) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(head_samples(v, n, batch) for v in x)
    return x


def call_model(model: nn.Module, inputs: Any) -> torch.Tensor:
    """``model`` called on ``inputs`` (a dict as keywords, a tuple/list as arguments), its scores as a tensor."""
    if isinstance(inputs, dict):
        out = model(**inputs)
    elif isinstance(inputs, (tuple, list)):
        out = model(*inputs)
    else:
        out = model(inputs)
    logits = logits_of(out)
    if logits is None:
        raise TypeError(f"doctor could not find a tensor in the model's output ({type(out).__name__})")
    return logits


def mean_baseline(loss_fn: Callable[..., Any], targets: torch.Tensor) -> float | None:
    """The loss of predicting the targets' mean for every sample (the best constant under MSE)."""
    if not targets.is_floating_point():
        return None
    mean = targets.detach().mean(0, keepdim=True).expand_as(targets)
    try:
        with torch.no_grad():
            return float(scalar_loss(loss_fn(mean, targets)))
    except Exception:
        return None


def scalar_loss(loss: Any) -> torch.Tensor:
    """The loss as a scalar tensor (a per-sample loss, ``reduction="none"``, is averaged)."""
    loss = loss if isinstance(loss, torch.Tensor) else torch.as_tensor(loss)
    return loss.mean() if loss.dim() else loss


def are_probabilities(out: torch.Tensor, dim: int, loss_fn: Callable[..., Any]) -> bool:
    """Outputs that are already a softmax (non-negative, summing to 1 over the classes) fed to cross-entropy."""
    name = (getattr(loss_fn, "__name__", "") or type(loss_fn).__name__).lower()
    if "nll" in name or out.numel() == 0:
        return False
    total = out.float().sum(dim)
    return bool((out >= 0).all()) and bool(torch.allclose(total, torch.ones_like(total), atol=1e-3))


def channel_stats(x: torch.Tensor) -> tuple[list[float], list[float]]:
    """Mean and std per channel (dim 1 of ≥ 2-D inputs; 1-D inputs: one channel)."""
    if not x.is_floating_point() or x.numel() == 0:
        return [], []
    v = x.detach().float()
    v = v.reshape(1, -1) if v.dim() < 2 else v.transpose(0, 1).reshape(v.shape[1], -1)
    return v.mean(1).tolist(), v.std(1, correction=0).tolist()
