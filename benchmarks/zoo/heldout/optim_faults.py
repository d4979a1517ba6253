"""Held-out faults of the optimizer and the loop: the learning rate, schedules, clipping, weight decay,
zero_grad, step, and optimizers that hold the wrong parameters. Each ``make(True)`` plants the bug as
a user writes it; ``make(False)`` is the same code fixed."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..base import Setup, fault
from ..classes import (
    CLIPPING,
    LR_HIGH,
    LR_LOW,
    NO_STEP,
    NOT_IN_OPT,
    NOT_ZEROED,
    SCHEDULE,
    WEIGHT_DECAY,
)
from . import kit
from . import models as M


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, y)


@fault(LR_HIGH, "ho_signal_sgd_lr_high")
def signal_sgd_lr_high(faulty: bool) -> Setup:
    """1-D conv on noisy sines, SGD momentum 0.9 at lr=1.0 ("a bigger rate trains faster"; twin: 0.05)."""
    x, y = kit.signals()
    m = M.SignalNet(seed=1)
    opt = torch.optim.SGD(m.parameters(), lr=1.0 if faulty else 0.05, momentum=0.9)
    return kit.train(m, opt, x, y, kit.ce, steps=100)


@fault(LR_HIGH, "ho_bag_adam_lr_high")
def bag_adam_lr_high(faulty: bool) -> Setup:
    """EmbeddingBag text classifier, Adam lr=0.5 (twin: 1e-2)."""
    x, y, v = kit.words()
    m = M.BagNet(v, seed=1)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=0.5 if faulty else 1e-2), x, y, kit.ce, steps=100)


@fault(LR_HIGH, "ho_gru_rmsprop_lr_high")
def gru_rmsprop_lr_high(faulty: bool) -> Setup:
    """GRU regressor on sine series, RMSprop lr=0.5 (twin: 5e-3)."""
    x, y = kit.series()
    m = M.GRUReg(seed=2)
    return kit.train(m, torch.optim.RMSprop(m.parameters(), lr=0.5 if faulty else 5e-3), x, y, _mse, steps=100)


@fault(LR_LOW, "ho_bag_sgd_lr_low")
def bag_sgd_lr_low(faulty: bool) -> Setup:
    """EmbeddingBag text classifier, SGD momentum lr=1e-5 (twin: lr=0.5)."""
    x, y, v = kit.words()
    m = M.BagNet(v, seed=3)
    return kit.train(m, torch.optim.SGD(m.parameters(), lr=1e-5 if faulty else 0.5, momentum=0.9), x, y, kit.ce, steps=120)


@fault(LR_LOW, "ho_tf_adamw_lr_low")
def tf_adamw_lr_low(faulty: bool) -> Setup:
    """tiny batch-first transformer, AdamW lr=1e-6 (a fine-tuning rate on a model from scratch; twin: 3e-3)."""
    x, y = kit.tokens()
    m = M.TinyTF(seed=4)
    return kit.train(m, torch.optim.AdamW(m.parameters(), lr=1e-6 if faulty else 3e-3), x, y, kit.ce, steps=120)


@fault(SCHEDULE, "ho_exponential_lr_per_batch")
def exponential_lr_per_batch(faulty: bool) -> Setup:
    """moons MLP, SGD lr=0.1 with ExponentialLR(gamma=0.9) meant per epoch, stepped every batch
    (twin: stepped once per epoch of 31 batches)."""
    x, y = kit.moons(seed=5)
    m = M.moon_mlp(seed=5)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    return kit.train(m, opt, x, y, kit.ce, sched=sched, sched_every=1 if faulty else 31, steps=150)


@fault(SCHEDULE, "ho_steplr_per_batch")
def steplr_per_batch(faulty: bool) -> Setup:
    """1-D conv, Adam lr=3e-3 with StepLR(step_size=5, gamma=0.5) for 5-epoch steps, stepped every batch
    (twin: per epoch of 32 batches)."""
    x, y = kit.signals(seed=6)
    m = M.SignalNet(seed=6)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    return kit.train(m, opt, x, y, kit.ce, sched=sched, sched_every=1 if faulty else 32, steps=100)


@fault(CLIPPING, "ho_clip_norm_tiny")
def clip_norm_tiny(faulty: bool) -> Setup:
    """Friedman regression MLP, SGD momentum lr=0.05, clip_grad_norm_(max_norm=1e-4) (twin: max_norm=1.0)."""
    x, y = kit.friedman(seed=7)
    m = M.friedman_mlp(seed=7)
    return kit.train(m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), x, y,
                     lambda o, t: F.mse_loss(o.squeeze(-1), t), order="zfbcs", clip=1e-4 if faulty else 1.0, steps=120)


@fault(WEIGHT_DECAY, "ho_sgd_weight_decay_half")
def sgd_weight_decay_half(faulty: bool) -> Setup:
    """1-D conv, SGD lr=0.05 momentum 0.9 with weight_decay=0.5 (meant 5e-4; twin: 5e-4)."""
    x, y = kit.signals(seed=8)
    m = M.SignalNet(seed=8)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=0.5 if faulty else 5e-4)
    return kit.train(m, opt, x, y, kit.ce, steps=120)


@fault(WEIGHT_DECAY, "ho_adam_l2_strong")
def adam_l2_strong(faulty: bool) -> Setup:
    """EmbeddingBag text classifier, Adam lr=1e-2 with weight_decay=0.1 (L2 inside Adam; twin: 1e-5)."""
    x, y, v = kit.words()
    m = M.BagNet(v, seed=9)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2, weight_decay=0.1 if faulty else 1e-5)
    return kit.train(m, opt, x, y, kit.ce, steps=120)


@fault(NOT_ZEROED, "ho_zero_grad_before_loop")
def zero_grad_before_loop(faulty: bool) -> Setup:
    """1-D conv, SGD momentum: opt.zero_grad() called once, before the loop, not per batch (twin: per batch)."""
    x, y = kit.signals(seed=10)
    m = M.SignalNet(seed=10)
    opt = torch.optim.SGD(m.parameters(), lr=0.02, momentum=0.9)
    opt.zero_grad()
    return kit.train(m, opt, x, y, kit.ce, order="fbs" if faulty else "zfbs", steps=100)


@fault(NOT_ZEROED, "ho_zero_grad_forgotten_gru")
def zero_grad_forgotten_gru(faulty: bool) -> Setup:
    """GRU regressor, Adam lr=5e-3: no zero_grad anywhere in the loop (twin: zero_grad per batch)."""
    x, y = kit.series(seed=11)
    m = M.GRUReg(seed=11)
    opt = torch.optim.Adam(m.parameters(), lr=5e-3)
    return kit.train(m, opt, x, y, _mse, order="fbs" if faulty else "zfbs", steps=100)


@fault(NO_STEP, "ho_scheduler_instead_of_step")
def scheduler_instead_of_step(faulty: bool) -> Setup:
    """tiny transformer, AdamW + a cosine schedule: ``scheduler.step()`` written where ``optimizer.step()``
    belongs (twin: both)."""
    x, y = kit.tokens(seed=12)
    m = M.TinyTF(seed=12)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=120)
    return kit.train(m, opt, x, y, kit.ce, sched=sched, order="zfbS" if faulty else "zfbsS", steps=120)


class _NoCall:
    """``opt.step`` written without parentheses: the attribute is read, nothing runs."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.opt = opt

    def zero_grad(self) -> None:
        self.opt.zero_grad()

    def step(self) -> None:
        self.opt.step  # noqa: B018 - the user's bug: the method is never called


@fault(NO_STEP, "ho_step_without_parentheses")
def step_without_parentheses(faulty: bool) -> Setup:
    """moons MLP, Adam lr=1e-2: ``optimizer.step`` without ``()`` (twin: ``optimizer.step()``)."""
    x, y = kit.moons(seed=13)
    m = M.moon_mlp(seed=13)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    setup = kit.train(m, _NoCall(opt) if faulty else opt, x, y, kit.ce, steps=100)
    setup.doctor = (*setup.doctor[:3], opt) if setup.doctor else None
    return setup


@fault(NOT_IN_OPT, "ho_head_replaced_after_optimizer", doctor=("optimizer",))
def head_replaced_after_optimizer(faulty: bool) -> Setup:
    """1-D conv "fine-tune": the optimizer is built, then ``model.head`` is replaced by a new Linear
    for the new task; the new head is never updated (twin: the optimizer built after the swap)."""
    x, y = kit.signals(seed=14)
    m = M.SignalNet(seed=14)
    if faulty:
        opt = torch.optim.Adam(m.parameters(), lr=3e-3)
        m.head = nn.Linear(32, 4)
    else:
        m.head = nn.Linear(32, 4)
        opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    return kit.train(m, opt, x, y, kit.ce, steps=100)


@fault(NOT_IN_OPT, "ho_unet_encoder_only", doctor=("optimizer",))
def unet_encoder_only(faulty: bool) -> Setup:
    """UNet-ish segmenter: ``Adam(list(enc.parameters()) + list(down.parameters()))``, the decoder left out
    (twin: ``model.parameters()``)."""
    x, y = kit.segmentation()
    m = M.UNetish(seed=15)
    params = list(m.enc.parameters()) + list(m.down.parameters()) if faulty else list(m.parameters())
    return kit.train(m, torch.optim.Adam(params, lr=1e-2), x, y, F.binary_cross_entropy_with_logits, steps=80)


@fault(NOT_IN_OPT, "ho_optimizer_from_first_fold", doctor=("optimizer",))
def optimizer_from_first_fold(faulty: bool) -> Setup:
    """k-fold: the optimizer is built once before the folds; fold 2 builds a fresh model and trains it with
    the fold-1 optimizer (twin: an optimizer per fold)."""
    x, y = kit.moons(seed=16)
    fold1 = M.moon_mlp(seed=16)
    opt = torch.optim.SGD(fold1.parameters(), lr=0.1, momentum=0.9)
    fold1_loop = kit.train(fold1, opt, x, y, kit.ce, steps=30)
    fold1_loop.loop(30)
    m = M.moon_mlp(seed=17)
    if not faulty:
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    return kit.train(m, opt, x, y, kit.ce, steps=100, keep={"fold1": fold1})
