"""``nbdebug.doctor``: the pre-training checklist, run automatically on a copy of the model.

>>> report = nbdebug.doctor(model, x, y)                     # doctest: +SKIP
>>> report.failed                                            # doctest: +SKIP
['overfit_batch']
>>> report.checks["overfit_batch"].advice                    # doctest: +SKIP
'the loss only fell to 1.47 ... It flattens near ln(1 + (C−1)/e) = 1.46 ...'

Everything runs on a deep copy of the model without the user's hooks (:func:`~nbdebug.runs.own.hookless_copy`;
a re-created optimizer) with the random number
generators forked and seeded, so the user's model, optimizer state and random stream are exactly
as before, and two runs give the same report. This module runs the passes in order; their hooks and
measurements are in :mod:`nbdebug.doctor.passes`, the batch and loss helpers in
:mod:`nbdebug.doctor.batch`, each check's judgement in :mod:`nbdebug.inspectors.doctor`. The passes:

1. one training-mode forward + backward on the whole batch: ``init_loss``, ``dead_units`` (every
   leaf module's output, dropout excluded), ``gradient_flow`` and ``nonfinite``;
2. eval mode (dropout off, BatchNorm on running statistics): ``input_dependence`` (zeroed inputs)
   and ``batch_independence`` (∂ sample i's output / ∂ every input);
3. training mode again: ``overfit_batch`` (up to ``steps`` optimizer steps on the first
   ``overfit_size`` samples, stopping once the loss is near zero);
4. no pass: ``input_scale`` from the inputs themselves, and ``optimizer`` (given the user's optimizer:
   it must hold every trainable parameter of the model, by identity; skipped without one).

Losses: ``loss_fn(output, targets)``; default cross-entropy for integer targets (a N×…×C output with
N×… targets is flattened, the classes on the last dim), MSE otherwise. Classification (cross-entropy,
NLL; C from the output's class dim) compares the initial loss with ln C; regression (MSE, L1,
Huber) with the loss of predicting the targets' mean. The training mode is used for the training
passes whatever mode the model is in (it is a copy).
"""

from __future__ import annotations

import math
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..capture.hooks import HookSet
from ..inspectors import doctor as judge
from ..inspectors.doctor import CHECKS, CheckResult
from ..inspectors.doctor import DoctorReport as _Report
from ..runs.own import NotCopyable, hookless_copy
from .batch import (
    are_probabilities,
    call_model,
    channel_stats,
    class_dim,
    default_loss,
    head_samples,
    loss_kind,
    mean_baseline,
    primary_input,
    replace_primary,
    scalar_loss,
)
from .passes import (
    batch_grads,
    copy_optimizer,
    grad_norms,
    optimizer_coverage,
    overfit,
    seeded,
    unit_hooks,
)

__all__ = ["CheckResult", "DoctorReport", "doctor"]

#: the dropout layers the overfit run switches off (eval) on its copy
DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


class DoctorReport(_Report):
    """What :func:`doctor` found (:class:`nbdebug.inspectors.doctor.DoctorReport`: ``checks``,
    ``failed``, ``kind``, ``classes``, ``elapsed_s``, ``notes``), shown in a notebook as the
    checklist widget (:meth:`widget`); the pure report stays free of widgets."""

    def widget(self) -> Any:
        """The checklist as a :class:`nbdebug.widgets.doctor.DoctorWidget`."""
        from ..widgets.doctor import DoctorWidget

        return DoctorWidget(self)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The checklist widget where a front-end can show it; the static table otherwise."""
        try:
            bundle = self.widget()._repr_mimebundle_(**kwargs)
        except Exception:  # no widget front-end (plain terminal, broken install): the table still shows
            return {"text/plain": repr(self), "text/html": self._repr_html_()}
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        return {**data, "text/plain": repr(self)}, meta


def doctor(model: nn.Module, inputs: Any, targets: torch.Tensor, loss_fn: Callable[..., Any] | None = None,
           optimizer: torch.optim.Optimizer | None = None, steps: int = 200, *, overfit_size: int = 8,
           seed: int = 0) -> DoctorReport:
    """Run the pre-training checklist on a copy of ``model`` and return a :class:`DoctorReport`.

    ``inputs``: one batch (a tensor, or a tuple/list/dict passed as ``*args``/``**kwargs``; the first
    tensor is the one perturbed); ``targets``: its targets; ``loss_fn(output, targets)`` (default:
    cross-entropy for integer targets, MSE otherwise); ``optimizer``: checked to hold the model's
    trainable parameters, then re-created for the copy (default Adam, lr 1e-3); ``steps``: the overfit budget; ``overfit_size``: samples in the overfit
    batch; ``seed``: the copies' random seed. The user's model, optimizer and RNG are left unchanged.

    >>> report = nbdebug.doctor(model, x, y, steps=200)          # doctest: +SKIP
    >>> report.checks["init_loss"].evidence["loss"]              # doctest: +SKIP
    """
    t0 = time.perf_counter()
    coverage = optimizer_coverage(model, optimizer) if optimizer is not None else ([], [], 0)
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"steps must be ≥ 0, got {steps}")
    loss_fn = default_loss if loss_fn is None else loss_fn
    memo: dict[int, Any] = {}
    try:
        net = hookless_copy(model, memo)  # the user's hooks are neither copied nor called
    except NotCopyable as exc:
        raise ValueError(f"doctor trains a copy of the model: {exc}") from None
    except Exception as exc:
        raise TypeError(f"doctor runs on a deep copy of the model, and copy.deepcopy failed: {type(exc).__name__}: {exc}") from exc
    params = list(net.parameters())
    for p in params:
        p.grad = None
    x = primary_input(inputs)
    batch = int(x.shape[0]) if x.dim() else 1
    checks: dict[str, CheckResult] = {}
    with seeded(seed):
        # pass 1 -----------------------------------------------------------------------------
        net.train()
        rows: list[tuple[str, int, int]] = []
        bad: list[str] = []
        with torch.enable_grad(), HookSet() as hooks:
            unit_hooks(net, hooks, rows, bad)
            out = call_model(net, inputs)
            hooks.remove()
            loss = scalar_loss(loss_fn(out, targets))
            loss0 = float(loss.detach())
            if loss.requires_grad:
                loss.backward()
        kind = loss_kind(loss_fn, out, targets, loss0)
        out = out.detach()
        classes = int(out.shape[class_dim(out, targets)]) if kind == "classification" and out.dim() >= 2 else None
        baseline = mean_baseline(loss_fn, targets) if kind == "regression" else None
        logit_std = float(out.float().std()) if out.numel() > 1 else 0.0
        checks["init_loss"] = judge.judge_init_loss(kind, loss=loss0, classes=classes, baseline=baseline, logit_std=logit_std)
        probabilities = bool(classes and are_probabilities(out, class_dim(out, targets), loss_fn))
        names, norms, unused, grad_bad = grad_norms(net)
        checks["dead_units"] = judge.judge_dead_units(rows, batch)
        checks["gradient_flow"] = judge.judge_gradient_flow(names, norms, unused)
        origin, phase = ("input", "input") if x.is_floating_point() and not bool(torch.isfinite(x).all()) else \
            (bad[0], "forward") if bad else ("loss", "loss") if not math.isfinite(loss0) else \
            (grad_bad, "param_grad") if grad_bad else (None, None)
        # pass 2 -----------------------------------------------------------------------------
        net.eval()
        with torch.no_grad():
            out1 = call_model(net, inputs).float()
            out0 = call_model(net, replace_primary(inputs, torch.zeros_like(x))).float()
        change = float((out1 - out0).abs().max()) if out1.shape == out0.shape else math.inf
        checks["input_dependence"] = judge.judge_input_dependence(change, float(out1.abs().max()) if out1.numel() else 0.0)
        if batch < 2:
            checks["batch_independence"] = judge.skip("a batch of one sample: nothing to mix")
        else:
            grads, via = batch_grads(net, inputs, 0, seed)
            if grads is None:
                checks["batch_independence"] = judge.skip(via)
            else:
                others = grads.clone()
                others[0] = -1.0
                j = int(others.argmax())
                changes = checks["input_dependence"].status == "pass"
                checks["batch_independence"] = judge.judge_batch_independence(float(grads[0]), float(grads[j]), j, 0, via,
                                                                              changes=changes)
        # pass 3 -----------------------------------------------------------------------------
        net.train()
        dropped = [m for m in net.modules() if isinstance(m, DROPOUT)]
        for m in dropped:  # dropout's noise floors the loss: the check asks whether the model can fit the batch
            m.eval()
        for p in params:
            p.grad = None
        opt = copy_optimizer(optimizer, params, memo)
        raised = [(g["lr"], float(o["lr"])) for g, o in zip(opt.param_groups, optimizer.param_groups, strict=True)
                  if not isinstance(o["lr"], torch.Tensor) and g["lr"] > o["lr"]] if optimizer is not None else []
        n = max(1, min(int(overfit_size), batch))
        xb, yb = head_samples(inputs, n, batch), head_samples(targets, n, batch)
        reference = math.log(classes) if classes and classes > 1 else mean_baseline(loss_fn, yb) if kind == "regression" else None
        eps = float(getattr(loss_fn, "label_smoothing", 0.0) or 0.0)  # nn.CrossEntropyLoss(label_smoothing=ε)
        lowest = judge.smoothing_floor(eps, classes) if classes else 0.0
        curve = overfit(net, opt, loss_fn, xb, yb, steps, None if reference is None else judge.overfit_target(reference, lowest))
        checks["overfit_batch"] = judge.judge_overfit(curve, kind=kind, classes=classes, reference=reference, steps=steps,
                                                      batch=n, probabilities=probabilities, lowest=lowest)
    bad_step = next((i for i, v in enumerate(curve) if not math.isfinite(v)), None)
    if origin is None and bad_step is not None:
        origin, phase = "loss", "overfit"
    checks["nonfinite"] = judge.judge_nonfinite(origin, phase, bad_step if phase == "overfit" else None)
    checks["optimizer"] = judge.judge_optimizer(*coverage, given=optimizer is not None)
    xs = primary_input(inputs)
    checks["input_scale"] = judge.judge_input_scale(*channel_stats(xs), integer=not xs.is_floating_point())
    ordered = {name: checks[name] for name in CHECKS}
    judge.cross_reference(ordered)
    return DoctorReport(ordered, kind=kind, classes=classes, elapsed_s=time.perf_counter() - t0,
                        notes=[f"ran on a deep copy (batch of {batch}; overfit on {n} samples, up to {steps} steps, seed {seed})"]
                        + ([f"overfit with dropout off ({len(dropped)} dropout layers)"] if dropped else [])
                        + ([f"overfit at the schedule's peak learning rate {raised[0][0]:.3g} (the optimizer's lr now: "
                            f"{raised[0][1]:.3g})"] if raised else []))


class _DoctorModule(types.ModuleType):
    """``nbdebug.doctor`` names both this module and its function: importing the submodule (``from
    nbdebug.doctor import DoctorReport``) binds the *module* to the package attribute, so calling the
    module runs the checklist and ``nbdebug.doctor(model, x, y)`` works whatever was imported first."""

    def __call__(self, *args: Any, **kwargs: Any) -> DoctorReport:
        return doctor(*args, **kwargs)


sys.modules[__name__].__class__ = _DoctorModule
