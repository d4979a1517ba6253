"""Inputs and labels unrelated, data sorted by class and never shuffled, inputs not normalised."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Setup, digits, fault, first_batch, mlp, sgd_loop
from .classes import INPUT_SCALE, UNRELATED, UNSHUFFLED
from .output_kinds import MeterLSTM


@fault(UNRELATED, "labels_shuffled_apart")
def labels_shuffled_apart(faulty: bool) -> Setup:
    """the labels shuffled on their own (y = y[randperm]) while the inputs keep their order (twin: together)."""
    x, y = digits()
    g = torch.Generator().manual_seed(50)
    if faulty:
        y = y[torch.randperm(len(y), generator=g)]
    m = mlp(seed=50)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt), steps=80)


@fault(UNRELATED, "constant_input_column", doctor=("input_dependence",))
def constant_input_column(faulty: bool) -> Setup:
    """the wrong columns: the model fed the digits' always-blank border pixels 0, 8, 16, 24 (twin: all 64 pixels)."""
    x, y = digits()
    cols = torch.tensor([0, 8, 16, 24]) if faulty else torch.arange(64)
    x = x[:, cols].contiguous()
    torch.manual_seed(51)
    m = nn.Sequential(nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt), steps=80)


@fault(UNSHUFFLED, "sorted_by_class")
def sorted_by_class(faulty: bool) -> Setup:
    """digits sorted by class, batches taken in order without shuffling (twin: shuffled each epoch)."""
    x, y = digits(sort=True)
    m = mlp(seed=52)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y, shuffle=not faulty), (*first_batch(x, y), F.cross_entropy, opt), steps=80)


@fault(INPUT_SCALE, "raw_pixels_0_255", doctor=("input_scale",))
def raw_pixels_0_255(faulty: bool) -> Setup:
    """digits as raw 0–255 pixel values, Adam lr=1e-3 (twin: standardised)."""
    x, y = digits(raw=True) if faulty else digits()
    if faulty:
        x = x * 16.0
    m = mlp(seed=53)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(INPUT_SCALE, "raw_features_regression", doctor=("input_scale",))
def raw_features_regression(faulty: bool) -> Setup:
    """a regression on features in the thousands (house-price-like), SGD lr=1e-6 (twin: standardised, lr=1e-2)."""
    g = torch.Generator().manual_seed(54)
    z = torch.randn(1024, 8, generator=g)
    t = (z @ torch.randn(8, 1, generator=g)).squeeze(1) + 0.1 * torch.randn(1024, generator=g)
    x = z * 1000.0 + 3000.0 if faulty else z
    m = mlp(8, 32, 1, seed=54)
    opt = torch.optim.SGD(m.parameters(), lr=1e-7 if faulty else 1e-2, momentum=0.9)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out.squeeze(1), target)

    return Setup(m, sgd_loop(m, opt, x, t, loss_fn=loss_fn), (*first_batch(x, t), loss_fn, opt))


@fault(INPUT_SCALE, "lstm_kelvin_sgd", doctor=("input_scale",))
def lstm_kelvin_sgd(faulty: bool) -> Setup:
    """round 6: an LSTM forecasting the next hour's temperature from 12 hourly readings in kelvin (≈ 288 ± 8),
    SGD lr=0.05 + momentum, MSE on the standardised target (twin: the readings standardised too)."""
    g = torch.Generator().manual_seed(91)
    n, t = 1536, 13
    day = torch.rand(n, 1, generator=g) * 6.283
    series = 288 + 8 * torch.randn(n, 1, generator=g) + 5 * torch.sin(day + 0.26 * torch.arange(t)) + 0.5 * torch.randn(n, t, generator=g)
    mu, sd = series.mean(), series.std()
    x, y = series[:, :-1].unsqueeze(2), ((series[:, -1:] - mu) / sd)
    if not faulty:
        x = (x - mu) / sd
    m = MeterLSTM(hidden=24, out=1, seed=91)  # the next hour's temperature from the last state
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y, loss_fn=F.mse_loss), (*first_batch(x, y), F.mse_loss, opt), steps=100)
