"""Learning rate far too high or too low, a scheduler stepped per batch, clipping at 1e-5."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Setup, cnn, digits, fault, first_batch, mlp, sgd_loop
from .classes import CLIPPING, LR_HIGH, LR_LOW, SCHEDULE


@fault(LR_HIGH, "lr_sgd_3", doctor=("overfit_batch", "nonfinite"))
def lr_sgd_3(faulty: bool) -> Setup:
    """digits MLP, SGD lr=3.0 (twin: lr=0.1), the README's story."""
    x, y = digits()
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=3.0 if faulty else 0.1)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(LR_HIGH, "lr_adam_high", doctor=("overfit_batch", "nonfinite"))
def lr_adam_high(faulty: bool) -> Setup:
    """digits MLP, Adam lr=0.5 (twin: 1e-3)."""
    x, y = digits()
    m = mlp(hidden=128, seed=1)
    opt = torch.optim.Adam(m.parameters(), lr=0.5 if faulty else 1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(LR_LOW, "lr_sgd_low", doctor=("overfit_batch",))
def lr_sgd_low(faulty: bool) -> Setup:
    """digits MLP, SGD+momentum lr=1e-6 (twin: 0.05)."""
    x, y = digits()
    m = mlp(seed=2)
    opt = torch.optim.SGD(m.parameters(), lr=1e-6 if faulty else 0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(LR_LOW, "lr_adam_low", doctor=("overfit_batch",))
def lr_adam_low(faulty: bool) -> Setup:
    """digits BatchNorm CNN, Adam lr=1e-7 (twin: 1e-3)."""
    x, y = digits(image=True)
    m = cnn(seed=3)
    opt = torch.optim.Adam(m.parameters(), lr=1e-7 if faulty else 1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(SCHEDULE, "scheduler_per_batch")
def scheduler_per_batch(faulty: bool) -> Setup:
    """StepLR(step_size=1, gamma=0.7) meant per epoch, stepped per batch (twin: once per epoch of 28 batches)."""
    x, y = digits()
    m = mlp(seed=4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1 if faulty else 28, gamma=0.7)
    return Setup(m, sgd_loop(m, opt, x, y, sched=sched), (*first_batch(x, y), F.cross_entropy, opt))


@fault(CLIPPING, "clip_1e-5")
def clip_tiny(faulty: bool) -> Setup:
    """clip_grad_norm_(max_norm=1e-5) (twin: max_norm=1.0), SGD lr=0.1."""
    x, y = digits()
    m = mlp(seed=5)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y, clip=1e-5 if faulty else 1.0), (*first_batch(x, y), F.cross_entropy, opt))
