"""The output and the loss disagreeing: ReLU on a regression output, sigmoid before BCEWithLogitsLoss,
double softmax, ReLU on the logits, a broadcasting MSE."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Setup, digits, fault, first_batch, mlp, sgd_loop
from .classes import BROADCAST, OUTPUT_LOSS


def _regression(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised synthetic regression: 8 features, a smooth nonlinear target of mean 0, std 1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1024, 8, generator=g)
    t = torch.sin(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] + 0.3 * x[:, 3] + 0.05 * torch.randn(1024, generator=g)
    return x, ((t - t.mean()) / t.std()).unsqueeze(1)


@fault(OUTPUT_LOSS, "relu_on_regression_output", doctor=("overfit_batch", "dead_units"))
def relu_on_regression_output(faulty: bool) -> Setup:
    """a regression whose model ends with ReLU: half the standardised targets are negative (twin: no ReLU)."""
    x, t = _regression(60)
    m = mlp(8, 64, 1, seed=60)
    if faulty:
        m.append(nn.ReLU())
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, t, loss_fn=F.mse_loss), (*first_batch(x, t), F.mse_loss, opt))


@fault(OUTPUT_LOSS, "sigmoid_before_bce_logits", doctor=("overfit_batch",))
def sigmoid_before_bce_logits(faulty: bool) -> Setup:
    """even vs odd digits: BCEWithLogitsLoss fed sigmoid(z) (twin: fed z)."""
    x, y = digits()
    t = (y % 2).float().unsqueeze(1)
    m = mlp(d_out=1, seed=61)
    if faulty:
        m.append(nn.Sigmoid())
    loss_fn = nn.BCEWithLogitsLoss()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, t, loss_fn=loss_fn), (*first_batch(x, t), loss_fn, opt))


@fault(OUTPUT_LOSS, "double_softmax", doctor=("overfit_batch",))
def double_softmax(faulty: bool) -> Setup:
    """a model ending in nn.Softmax(dim=1) trained with F.cross_entropy (twin: no softmax)."""
    x, y = digits()
    m = mlp(seed=62)
    if faulty:
        m.append(nn.Softmax(dim=1))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(OUTPUT_LOSS, "double_softmax_cnn", doctor=("overfit_batch",))
def double_softmax_cnn(faulty: bool) -> Setup:
    """a BatchNorm CNN ending in F.softmax in forward, trained with nn.CrossEntropyLoss (twin: no softmax)."""
    from .base import cnn

    x, y = digits(image=True)
    body = cnn(seed=63)
    m = nn.Sequential(body, nn.Softmax(dim=1)) if faulty else nn.Sequential(body)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y, loss_fn=loss_fn), (*first_batch(x, y), loss_fn, opt))


@fault(OUTPUT_LOSS, "relu_on_logits", doctor=("overfit_batch", "dead_units"))
def relu_on_logits(faulty: bool) -> Setup:
    """a classifier whose last Linear is followed by ReLU (twin: raw logits)."""
    x, y = digits()
    m = mlp(seed=64)
    if faulty:
        m.append(nn.ReLU())
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(BROADCAST, "mse_broadcast", doctor=("overfit_batch",))
def mse_broadcast(faulty: bool) -> Setup:
    """F.mse_loss(out (N×1), target (N)): broadcasts to N×N, PyTorch warns (twin: target (N×1))."""
    x, t = _regression(65)
    t = t.squeeze(1) if faulty else t
    m = mlp(8, 64, 1, seed=65)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, t, loss_fn=F.mse_loss), (*first_batch(x, t), F.mse_loss, opt))
