"""``nbdebug.doctor``: the pre-training checklist, run automatically on a copy of the model.

>>> report = nbdebug.doctor(model, x, y)                     # doctest: +SKIP
>>> report.failed                                            # doctest: +SKIP
['overfit_batch']
>>> report.checks["overfit_batch"].advice                    # doctest: +SKIP
'the loss only fell to 1.47 ... It flattens near ln(1 + (C−1)/e) = 1.46 ...'

Everything runs on ``copy.deepcopy(model)`` (and a re-created optimizer) with the random number
generators forked and seeded, so the user's model, optimizer state and random stream are exactly
as before, and two runs give the same report. The passes (each check's judgement is in
:mod:`nbdebug.inspectors.doctor`):

1. one training-mode forward + backward on the whole batch: ``init_loss``, ``dead_units`` (every
   leaf module's output, dropout excluded), ``gradient_flow`` and ``nonfinite``;
2. eval mode (dropout off, BatchNorm on running statistics): ``input_dependence`` (zeroed inputs)
   and ``batch_independence`` (∂ sample i's output / ∂ every input);
3. training mode again: ``overfit_batch`` (up to ``steps`` optimizer steps on the first
   ``overfit_size`` samples, stopping once the loss is near zero);
4. no pass: ``input_scale`` from the inputs themselves.

Losses: ``loss_fn(output, targets)``; default cross-entropy for integer targets (a N×…×C output with
N×… targets is flattened, the classes on the last dim), MSE otherwise. Classification (cross-entropy,
NLL; C from the output's class dim) compares the initial loss with ln C; regression (MSE, L1,
Huber) with the loss of predicting the targets' mean. The training mode is used for the training
passes whatever mode the model is in (it is a copy).
"""

from __future__ import annotations

import copy
import math
import sys
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .adapters.outputs import logits_of
from .capture.hooks import HookSet
from .capture.leaves import tensor_leaves
from .capture.names import call_name
from .capture.select import select_modules
from .capture.state import suspend_hooks
from .inspectors import doctor as judge
from .inspectors.doctor import CHECKS, CheckResult, DoctorReport

__all__ = ["CheckResult", "DoctorReport", "doctor"]

_CLASSIFICATION = ("cross_entropy", "crossentropy", "nll")
_REGRESSION = ("mse", "l1", "huber")
_NOT_UNITS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.Identity)


def default_loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for integer targets (classes on the last dim when the targets are the output's
    leading dims, else dim 1 as ``F.cross_entropy`` expects), MSE otherwise."""
    if not targets.is_floating_point():
        if output.dim() > 2 and tuple(targets.shape) == tuple(output.shape[:-1]):
            return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))
        return F.cross_entropy(output, targets)
    return F.mse_loss(output, targets.to(output.dtype))


default_loss.__name__ = "cross_entropy_or_mse"


def _loss_kind(loss_fn: Callable[..., Any], out: torch.Tensor, targets: torch.Tensor) -> str:
    if loss_fn is default_loss:
        return "regression" if targets.is_floating_point() else "classification"
    name = (getattr(loss_fn, "__name__", "") or type(loss_fn).__name__).lower()
    if any(k in name for k in _CLASSIFICATION):
        return "classification"
    if any(k in name for k in _REGRESSION):
        return "regression"
    if not targets.is_floating_point() and out.is_floating_point() and out.dim() >= 2:
        return "classification"
    if targets.is_floating_point() and targets.numel() == out.numel():
        return "regression"
    return "unknown"


def _class_dim(out: torch.Tensor, targets: torch.Tensor) -> int:
    return out.dim() - 1 if tuple(targets.shape) == tuple(out.shape[:-1]) or out.dim() <= 2 else 1


# -- inputs ------------------------------------------------------------------------------------
def _primary(inputs: Any) -> torch.Tensor:
    if isinstance(inputs, torch.Tensor):
        return inputs
    for _, t in tensor_leaves(inputs):
        return t
    raise TypeError(f"doctor needs a tensor input (or a tuple/list/dict holding one), got {type(inputs).__name__}")


def _replace(inputs: Any, new: torch.Tensor) -> Any:
    """``inputs`` with its primary tensor replaced by ``new``."""
    if isinstance(inputs, torch.Tensor):
        return new
    old = _primary(inputs)
    if isinstance(inputs, dict):
        return {k: (new if v is old else v) for k, v in inputs.items()}
    return type(inputs)(new if v is old else v for v in inputs)


def _head(x: Any, n: int, batch: int) -> Any:
    """The first ``n`` samples of every tensor with ``batch`` rows."""
    if isinstance(x, torch.Tensor):
        return x[:n] if x.dim() and x.shape[0] == batch else x
    if isinstance(x, dict):
        return {k: _head(v, n, batch) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_head(v, n, batch) for v in x)
    return x


def _call(model: nn.Module, inputs: Any) -> torch.Tensor:
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


# -- copies --------------------------------------------------------------------------------------
def _copy_optimizer(optimizer: torch.optim.Optimizer | None, params: list[nn.Parameter], memo: dict[int, Any]) -> torch.optim.Optimizer:
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
    return new


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Fork every random generator (CPU and initialised CUDA devices) and seed it: the user's stream is untouched."""
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        yield


# -- pass 1: train-mode forward and backward ----------------------------------------------------
def _unit_hooks(model: nn.Module, hooks: HookSet, rows: list[tuple[str, int, int]], bad: list[str]) -> None:
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


def _grad_norms(model: nn.Module) -> tuple[list[str], list[float], list[str], str | None]:
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
def _batch_grads(model: nn.Module, inputs: Any, sample: int, seed: int) -> tuple[torch.Tensor | None, str]:
    """|∂(r·out_i)/∂x| per sample (max over the sample's elements), r a fixed random projection (a plain
    sum could cancel, e.g. softmax rows sum to 1). Integer inputs: w.r.t. the first nn.Embedding's output."""
    x = _primary(inputs)
    held: list[torch.Tensor] = []
    with torch.enable_grad(), HookSet() as hooks:
        if x.is_floating_point():
            leaf = x.detach().clone().requires_grad_(True)
            inputs, via = _replace(inputs, leaf), "input"
        else:
            emb = next(((n, m) for n, m in model.named_modules() if isinstance(m, nn.Embedding)), None)
            if emb is None:
                return None, "integer inputs and no nn.Embedding to differentiate through"
            via = f"embedding `{emb[0]}`"

            def hook(_m: nn.Module, _a: Any, out: torch.Tensor) -> torch.Tensor:
                held.append(out.detach().requires_grad_(True))
                return held[-1]

            hooks.forward(emb[1], hook)
        out = _call(model, inputs)
        target = held[0] if held else leaf
        if out.dim() == 0 or out.shape[0] != x.shape[0] or target.shape[0] != x.shape[0]:
            return None, f"the output's first dim ({list(out.shape)}) is not the batch of {x.shape[0]}"
        r = torch.randn(tuple(out[sample].shape), generator=torch.Generator().manual_seed(seed)).to(out.device)
        (g,) = torch.autograd.grad((out[sample].float() * r).sum(), target, allow_unused=True)
    if g is None:
        return torch.zeros(x.shape[0]), via
    return g.detach().abs().float().reshape(g.shape[0], -1).amax(1).cpu(), via


def doctor(model: nn.Module, inputs: Any, targets: torch.Tensor, loss_fn: Callable[..., Any] | None = None,
           optimizer: torch.optim.Optimizer | None = None, steps: int = 200, *, overfit_size: int = 8,
           seed: int = 0) -> DoctorReport:
    """Run the pre-training checklist on a copy of ``model`` and return a :class:`DoctorReport`.

    ``inputs``: one batch (a tensor, or a tuple/list/dict passed as ``*args``/``**kwargs``; the first
    tensor is the one perturbed); ``targets``: its targets; ``loss_fn(output, targets)`` (default:
    cross-entropy for integer targets, MSE otherwise); ``optimizer``: re-created for the copy
    (default Adam, lr 1e-3); ``steps``: the overfit budget; ``overfit_size``: samples in the overfit
    batch; ``seed``: the copies' random seed. The user's model, optimizer and RNG are left unchanged.

    >>> report = nbdebug.doctor(model, x, y, steps=200)          # doctest: +SKIP
    >>> report.checks["init_loss"].evidence["loss"]              # doctest: +SKIP
    """
    t0 = time.perf_counter()
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"steps must be ≥ 0, got {steps}")
    loss_fn = default_loss if loss_fn is None else loss_fn
    memo: dict[int, Any] = {}
    try:
        net = copy.deepcopy(model, memo)
    except Exception as exc:
        raise TypeError(f"doctor runs on a deep copy of the model, and copy.deepcopy failed: {type(exc).__name__}: {exc}") from exc
    params = list(net.parameters())
    for p in params:
        p.grad = None
    x = _primary(inputs)
    batch = int(x.shape[0]) if x.dim() else 1
    checks: dict[str, CheckResult] = {}
    with _seeded(seed), suspend_hooks(net):
        # pass 1 -----------------------------------------------------------------------------
        net.train()
        rows: list[tuple[str, int, int]] = []
        bad: list[str] = []
        with torch.enable_grad(), HookSet() as hooks:
            _unit_hooks(net, hooks, rows, bad)
            out = _call(net, inputs)
            hooks.remove()
            loss = _scalar(loss_fn(out, targets))
            loss0 = float(loss.detach())
            if loss.requires_grad:
                loss.backward()
        kind = _loss_kind(loss_fn, out, targets)
        out = out.detach()
        classes = int(out.shape[_class_dim(out, targets)]) if kind == "classification" and out.dim() >= 2 else None
        baseline = _mean_baseline(loss_fn, targets) if kind == "regression" else None
        logit_std = float(out.float().std()) if out.numel() > 1 else 0.0
        checks["init_loss"] = judge.judge_init_loss(kind, loss=loss0, classes=classes, baseline=baseline, logit_std=logit_std)
        probabilities = bool(classes and _are_probabilities(out, _class_dim(out, targets), loss_fn))
        names, norms, unused, grad_bad = _grad_norms(net)
        checks["dead_units"] = judge.judge_dead_units(rows, batch)
        checks["gradient_flow"] = judge.judge_gradient_flow(names, norms, unused)
        origin, phase = ("input", "input") if x.is_floating_point() and not bool(torch.isfinite(x).all()) else \
            (bad[0], "forward") if bad else ("loss", "loss") if not math.isfinite(loss0) else \
            (grad_bad, "param_grad") if grad_bad else (None, None)
        # pass 2 -----------------------------------------------------------------------------
        net.eval()
        with torch.no_grad():
            out1 = _call(net, inputs).float()
            out0 = _call(net, _replace(inputs, torch.zeros_like(x))).float()
        change = float((out1 - out0).abs().max()) if out1.shape == out0.shape else math.inf
        checks["input_dependence"] = judge.judge_input_dependence(change, float(out1.abs().max()) if out1.numel() else 0.0)
        if batch < 2:
            checks["batch_independence"] = judge.skip("a batch of one sample: nothing to mix")
        else:
            grads, via = _batch_grads(net, inputs, 0, seed)
            if grads is None:
                checks["batch_independence"] = judge.skip(via)
            else:
                others = grads.clone()
                others[0] = -1.0
                j = int(others.argmax())
                checks["batch_independence"] = judge.judge_batch_independence(float(grads[0]), float(grads[j]), j, 0, via)
        # pass 3 -----------------------------------------------------------------------------
        net.train()
        for p in params:
            p.grad = None
        opt = _copy_optimizer(optimizer, params, memo)
        n = max(1, min(int(overfit_size), batch))
        xb, yb = _head(inputs, n, batch), _head(targets, n, batch)
        reference = math.log(classes) if classes and classes > 1 else _mean_baseline(loss_fn, yb) if kind == "regression" else None
        curve = _overfit(net, opt, loss_fn, xb, yb, steps, None if reference is None else judge.OVERFIT_FRACTION * reference)
        checks["overfit_batch"] = judge.judge_overfit(curve, kind=kind, classes=classes, reference=reference, steps=steps,
                                                      batch=n, probabilities=probabilities)
    bad_step = next((i for i, v in enumerate(curve) if not math.isfinite(v)), None)
    if origin is None and bad_step is not None:
        origin, phase = "loss", "overfit"
    checks["nonfinite"] = judge.judge_nonfinite(origin, phase, bad_step if phase == "overfit" else None)
    xs = _primary(inputs)
    checks["input_scale"] = judge.judge_input_scale(*_channel_stats(xs), integer=not xs.is_floating_point())
    ordered = {name: checks[name] for name in CHECKS}
    judge.cross_reference(ordered)
    return DoctorReport(ordered, kind=kind, classes=classes, elapsed_s=time.perf_counter() - t0,
                        notes=[f"ran on a deep copy (batch of {batch}; overfit on {n} samples, up to {steps} steps, seed {seed})"])


def _overfit(net: nn.Module, opt: torch.optim.Optimizer, loss_fn: Callable[..., Any], xb: Any, yb: torch.Tensor,
             steps: int, target: float | None) -> list[float]:
    """The loss before each step (and after the last), stopping early once it is at most ``target``."""
    curve: list[float] = []
    with torch.enable_grad():
        for k in range(steps + 1):
            opt.zero_grad(set_to_none=True)
            loss = _scalar(loss_fn(_call(net, xb), yb))
            curve.append(float(loss.detach()))
            if k == steps or not math.isfinite(curve[-1]) or (target is not None and curve[-1] <= target):
                break
            loss.backward()
            opt.step()
    return curve


def _mean_baseline(loss_fn: Callable[..., Any], targets: torch.Tensor) -> float | None:
    """The loss of predicting the targets' mean for every sample (the best constant under MSE)."""
    if not targets.is_floating_point():
        return None
    mean = targets.detach().mean(0, keepdim=True).expand_as(targets)
    try:
        with torch.no_grad():
            return float(_scalar(loss_fn(mean, targets)))
    except Exception:
        return None


def _scalar(loss: Any) -> torch.Tensor:
    """The loss as a scalar tensor (a per-sample loss, ``reduction="none"``, is averaged)."""
    loss = loss if isinstance(loss, torch.Tensor) else torch.as_tensor(loss)
    return loss.mean() if loss.dim() else loss


def _are_probabilities(out: torch.Tensor, dim: int, loss_fn: Callable[..., Any]) -> bool:
    """Outputs that are already a softmax (non-negative, summing to 1 over the classes) fed to cross-entropy."""
    name = (getattr(loss_fn, "__name__", "") or type(loss_fn).__name__).lower()
    if "nll" in name or out.numel() == 0:
        return False
    total = out.float().sum(dim)
    return bool((out >= 0).all()) and bool(torch.allclose(total, torch.ones_like(total), atol=1e-3))


def _channel_stats(x: torch.Tensor) -> tuple[list[float], list[float]]:
    """Mean and std per channel (dim 1 of ≥ 2-D inputs; 1-D inputs: one channel)."""
    if not x.is_floating_point() or x.numel() == 0:
        return [], []
    v = x.detach().float()
    v = v.reshape(1, -1) if v.dim() < 2 else v.transpose(0, 1).reshape(v.shape[1], -1)
    return v.mean(1).tolist(), v.std(1, correction=0).tolist()


class _DoctorModule(types.ModuleType):
    """``nbdebug.doctor`` names both this module and its function: importing the submodule (``from
    nbdebug.doctor import DoctorReport``) binds the *module* to the package attribute, so calling the
    module runs the checklist and ``nbdebug.doctor(model, x, y)`` works whatever was imported first."""

    def __call__(self, *args: Any, **kwargs: Any) -> DoctorReport:
        return doctor(*args, **kwargs)


sys.modules[__name__].__class__ = _DoctorModule
