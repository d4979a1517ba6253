"""NaN/Inf made in the forward, in the backward, brought by the inputs, by the loss, by fp16 overflow."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Setup, digits, fault, first_batch, sgd_loop
from .classes import FP16, NAN_BWD, NAN_FWD, NAN_INPUT, NAN_LOSS


class Head(nn.Module):
    """Linear → ``op`` → Linear: the op is where the bug (or its fix) lives."""

    def __init__(self, op: nn.Module, d: int = 64, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1, self.op, self.fc2 = nn.Linear(d, 64), op, nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.op(self.fc1(x)))


class LogFeatures(nn.Module):
    """log of the features: of raw pre-activations (NaN where negative) or of softplus + ε."""

    def __init__(self, safe: bool) -> None:
        super().__init__()
        self.safe = safe

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.log(F.softplus(h) + 1e-6) if self.safe else torch.log(h)


@fault(NAN_FWD, "nan_forward_log", doctor=("nonfinite",))
def nan_forward_log(faulty: bool) -> Setup:
    """a layer taking log of raw pre-activations (negative → NaN; twin: log(softplus + ε))."""
    x, y = digits()
    m = Head(LogFeatures(not faulty), seed=20)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


class GroupUnitNorm(nn.Module):
    """ReLU features in groups of 4, each group divided by its norm: without ε a group whose four
    ReLUs are all off gives 0/0."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        g = F.relu(h).reshape(h.shape[0], -1, 4)
        return (g / (g.norm(dim=2, keepdim=True) + self.eps)).reshape(h.shape)


@fault(NAN_FWD, "nan_forward_div0", doctor=("nonfinite",))
def nan_forward_div0(faulty: bool) -> Setup:
    """ReLU features normalised per group of 4 without ε: a group all off gives 0/0 (twin: + 1e-6)."""
    x, y = digits()
    m = Head(GroupUnitNorm(0.0 if faulty else 1e-6), seed=21)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


class SafeSqrt(nn.Module):
    """``torch.where(h > 0, sqrt(h), 0)``: finite forward, NaN gradient from the branch not taken
    (twin: sqrt of ``h.clamp_min(1e-6)`` in that branch)."""

    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.fixed = fixed

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        inner = h.clamp_min(1e-6) if self.fixed else h
        return torch.where(h > 0, torch.sqrt(inner), torch.zeros_like(h))


@fault(NAN_BWD, "nan_backward_where_sqrt", doctor=("nonfinite",))
def nan_backward_where_sqrt(faulty: bool) -> Setup:
    """where(h > 0, sqrt(h), 0): the forward is finite, the backward NaN (twin: sqrt of h clamped)."""
    x, y = digits()
    m = Head(SafeSqrt(not faulty), seed=22)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(NAN_INPUT, "nan_input_missing", doctor=("nonfinite",))
def nan_input_missing(faulty: bool) -> Setup:
    """1% of the input values missing (NaN) in the data (twin: filled with 0)."""
    x, y = digits()
    g = torch.Generator().manual_seed(23)
    x[torch.rand(x.shape, generator=g) < 0.01] = float("nan")
    if not faulty:
        x = torch.nan_to_num(x)
    torch.manual_seed(23)
    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(NAN_INPUT, "nan_input_zscore", doctor=("nonfinite",))
def nan_input_zscore(faulty: bool) -> Setup:
    """digits z-scored per pixel without ε: the always-blank pixels give 0/0 (twin: std clamped)."""
    x, y = digits(raw=True)
    std = x.std(0)
    x = (x - x.mean(0)) / (std if faulty else std.clamp_min(1e-3))
    torch.manual_seed(24)
    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


def _by_hand_ce(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    p = torch.softmax(z, dim=1)
    return -(F.one_hot(y, z.shape[1]) * torch.log(p)).sum(1).mean()


@fault(NAN_LOSS, "nan_loss_log_softmax", doctor=("nonfinite",))
def nan_loss_log_softmax(faulty: bool) -> Setup:
    """cross-entropy by hand, log(softmax(z)) with confident logits: softmax underflows to 0 and 0·log 0 = NaN
    in the loss while the model's output is finite (twin: F.cross_entropy)."""
    x, y = digits()
    torch.manual_seed(25)
    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    with torch.no_grad():
        m[2].weight.mul_(60.0)
    loss_fn = _by_hand_ce if faulty else F.cross_entropy
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y, loss_fn=loss_fn), (*first_batch(x, y), loss_fn, opt))


class HalfLogSumExp(nn.Module):
    """A log-sum-exp pooling written by hand in float16 (exp overflows past 11.09; twin: torch.logsumexp in float32)."""

    def __init__(self, half: bool) -> None:
        super().__init__()
        self.half = half

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = 4.0 * h
        if self.half:
            lse = torch.log(torch.exp(h.half()).sum(1, keepdim=True)).float()
        else:
            lse = torch.logsumexp(h, 1, keepdim=True)
        return h - lse


@fault(FP16, "fp16_overflow", doctor=("nonfinite",))
def fp16_overflow(faulty: bool) -> Setup:
    """a log-sum-exp computed by hand in float16 overflows to inf (twin: torch.logsumexp in float32)."""
    x, y = digits()
    m = Head(HalfLogSumExp(faulty), seed=26)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))
