"""BatchNorm1d fed one sample, weight decay far too strong."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Setup, digits, fault, first_batch, sgd_loop
from .classes import BN_ONE, WEIGHT_DECAY


@fault(BN_ONE, "batchnorm_one_sample")
def batchnorm_one_sample(faulty: bool) -> Setup:
    """MLP with BatchNorm1d on 129 samples in batches of 64: the third batch holds one sample (twin: drop_last)."""
    x, y = digits()
    x, y = x[:129], y[:129]
    torch.manual_seed(6)
    m = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)

    def loop(n: int) -> None:
        m.train()
        k = 0
        while k < n:
            for s in range(0, len(y), 64):
                i = slice(s, s + 64)
                if not faulty and len(y[i]) < 64:
                    continue  # drop_last
                opt.zero_grad()
                F.cross_entropy(m(x[i]), y[i]).backward()
                opt.step()
                k += 1
                if k >= n:
                    return

    return Setup(m, loop, (*first_batch(x, y), F.cross_entropy, opt))


@fault(WEIGHT_DECAY, "weight_decay_sgd")
def weight_decay_sgd(faulty: bool) -> Setup:
    """SGD lr=0.1 momentum 0.9 with weight_decay=0.5 (twin: 5e-4): the weights shrink every step."""
    x, y = digits()
    torch.manual_seed(7)
    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=0.5 if faulty else 5e-4)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(WEIGHT_DECAY, "weight_decay_adamw")
def weight_decay_adamw(faulty: bool) -> Setup:
    """AdamW lr=1e-2 with weight_decay=50 (twin: 0.01): decoupled decay wipes the weights out."""
    x, y = digits()
    torch.manual_seed(8)
    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=50.0 if faulty else 0.01)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))
