"""The doctor's measurements on its copy of the model: each pass's hooks and numbers.

:func:`nbdebug.doctor.doctor` runs them on ``copy.deepcopy(model)`` inside :func:`seeded`: per
leaf-module call the units zero for every sample (:func:`unit_hooks`), the parameter-gradient norms
per module (:func:`grad_norms`), how much one sample's output depends on the others' inputs
(:func:`batch_grads`), and the overfit curve on a few samples (:func:`overfit`, with the user's
optimizer re-created for the copy by :func:`copy_optimizer`). The judgements are in
:mod:`nbdebug.inspectors.doctor`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..capture.hooks import HookSet
from ..capture.leaves import tensor_leaves
from ..capture.names import call_name
from ..capture.select import select_modules
from .batch import call_model, primary_input, replace_primary, scalar_loss

__all__ = ["batch_grads", "copy_optimizer", "grad_norms", "optimizer_coverage", "overfit", "seeded", "unit_hooks"]

_NOT_UNITS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.Identity)


def copy_optimizer(optimizer: torch.optim.Optimizer | None, params: list[nn.Parameter], memo: dict[int, Any]) -> torch.optim.Optimizer:
    """Adam lr 1e-3, or the user's optimizer re-created for the copy: same class, the same
    param-group hyperparameters, a deep copy of its state (mapped to the copy's parameters by order)."""
    if optimizer is None:
        return torch.optim.Adam([p for p in params if p.requires_grad], lr=1e-3)
    groups = []
    for g in optimizer.param_groups:
        mapped = [memo[id(p)] if id(p) in memo else copy.deepcopy(p, memo) for p in g["params"]]
        groups.append({**{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}, "params": mapped})
    try:
        new = type(optimizer)(groups)
    except TypeError:  # an optimizer whose constructor requires arguments beyond the groups
        new = type(optimizer)(groups, **copy.deepcopy(optimizer.defaults))
    new.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    for g in new.param_groups:  # a scheduler's start (warmup, a cycle's low phase) is not its learning rate
        g["lr"] = schedule_peak(g)
    return new


def schedule_peak(group: dict[str, Any]) -> Any:
    """A param group's learning rate at its schedule's peak: the largest of its current ``lr``, the
    ``initial_lr`` a torch scheduler records (warmup's target) and the ``max_lr`` OneCycleLR records
    (CyclicLR keeps its peak on the scheduler, which the doctor is not given)."""
    lr = group["lr"]
    if isinstance(lr, torch.Tensor):  # a tensor lr (capturable/fused optimizers) is left as the user set it
        return lr
    peaks = [v for v in (group.get("initial_lr"), group.get("max_lr")) if isinstance(v, (int, float))]
    return max([lr, *peaks])


def optimizer_coverage(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[list[str], list[str], int]:
    """The model's trainable parameter names, those in no param group of ``optimizer`` (by identity), and
    how many parameters the optimizer holds (whichever model they belong to)."""
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [n for n, _ in trainable], [n for n, p in trainable if id(p) not in held], len(held)


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Fork every random generator (CPU and initialised CUDA devices) and seed it: the user's stream is untouched."""
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        yield


# -- pass 1: train-mode forward and backward ----------------------------------------------------
def unit_hooks(model: nn.Module, hooks: HookSet, rows: list[tuple[str, int, int]], bad: list[str]) -> None:
    """Per leaf-module call: units zero for every sample (channel dim 1 of N×C×…, else the last dim), and
    the first call with a non-finite output."""
    counts: dict[str, int] = {}

    def make(name: str) -> Callable[..., None]:
        def hook(_m: nn.Module, _args: Any, output: Any) -> None:
            k = counts.get(name, 0)
            counts[name] = k + 1
            t = next((t for _, t in tensor_leaves(output) if t.is_floating_point()), None)
            if t is None or t.dim() < 2 or t.numel() == 0:
                return
            row = call_name(name, k)
            t = t.detach()
            if not bad and not bool(torch.isfinite(t).all()):
                bad.append(row)
            dim = 1 if t.dim() >= 3 else t.dim() - 1
            alive = (t != 0).transpose(0, dim).reshape(t.shape[dim], -1).any(1)
            dead = int(alive.numel() - alive.sum())
            if 0 < dead < alive.numel() and t.shape[0] > 1 and bool((t == t[:1]).all()):
                return  # the same output for every sample: which units are zero says nothing about the batch
            rows.append((row, dead, int(alive.numel())))
        return hook

    for name, module in select_modules(model, None):
        if not isinstance(module, _NOT_UNITS):
            hooks.forward(module, make(name))


def grad_norms(model: nn.Module) -> tuple[list[str], list[float], list[str], str | None]:
    """Gradient norm per module owning parameters (its own, not its children's), in model order."""
    names, norms, unused, nonfinite = [], [], [], None
    for name, module in model.named_modules():
        ps = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if not ps:
            continue
        gs = [p.grad for p in ps if p.grad is not None]
        if not gs:
            unused.append(name)
            continue
        sq = sum(float(g.detach().float().pow(2).sum()) for g in gs)
        if nonfinite is None and not math.isfinite(sq):
            nonfinite = name
        names.append(name)
        norms.append(math.sqrt(sq) if math.isfinite(sq) else math.nan)
    return names, norms, unused, nonfinite


# -- pass 2: eval mode -----------------------------------------------------------------------------
def batch_grads(model: nn.Module, inputs: Any, sample: int, seed: int) -> tuple[torch.Tensor | None, str]:
    """|∂(r·out_i)/∂x| per sample (max over the sample's elements), r a fixed random projection (a plain
    sum could cancel, e.g. softmax rows sum to 1). Integer inputs: w.r.t. the first nn.Embedding's output."""
    x = primary_input(inputs)
    held: list[torch.Tensor] = []
    with torch.enable_grad(), HookSet() as hooks:
        if x.is_floating_point():
            leaf = x.detach().clone().requires_grad_(True)
            inputs, via = replace_primary(inputs, leaf), "input"
        else:
            emb = next(((n, m) for n, m in model.named_modules() if isinstance(m, nn.Embedding)), None)
            if emb is None:
                return None, "integer inputs and no nn.Embedding to differentiate through"
            via = f"embedding `{emb[0]}`"

            def hook(_m: nn.Module, _a: Any, out: torch.Tensor) -> torch.Tensor:
                held.append(out.detach().requires_grad_(True))
                return held[-1]

            hooks.forward(emb[1], hook)
        out = call_model(model, inputs)
        target = held[0] if held else leaf
        if out.dim() == 0 or out.shape[0] != x.shape[0] or target.shape[0] != x.shape[0]:
            return None, f"the output's first dim ({list(out.shape)}) is not the batch of {x.shape[0]}"
        r = torch.randn(tuple(out[sample].shape), generator=torch.Generator().manual_seed(seed)).to(out.device)
        (g,) = torch.autograd.grad((out[sample].float() * r).sum(), target, allow_unused=True)
    if g is None:
        return torch.zeros(x.shape[0]), via
    return g.detach().abs().float().reshape(g.shape[0], -1).amax(1).cpu(), via


def overfit(net: nn.Module, opt: torch.optim.Optimizer, loss_fn: Callable[..., Any], xb: Any, yb: torch.Tensor,
             steps: int, target: float | None) -> list[float]:
    """The loss before each step (and after the last), stopping early once it is at most ``target``."""
    curve: list[float] = []
    with torch.enable_grad():
        for k in range(steps + 1):
            opt.zero_grad(set_to_none=True)
            loss = scalar_loss(loss_fn(call_model(net, xb), yb))
            curve.append(float(loss.detach()))
            if k == steps or not math.isfinite(curve[-1]) or (target is not None and curve[-1] <= target):
                break
            loss.backward()
            opt.step()
    return curve
