"""Dead ReLUs from a bad bias, saturated tanh, vanishing and exploding gradients (deep nets, RNNs)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Setup, cnn, digits, fault, first_batch, mlp, sgd_loop
from .classes import DEAD, EXPLODING, SATURATED, VANISHING


@fault(DEAD, "dead_relu_bias", doctor=("dead_units", "gradient_flow"))
def dead_relu_bias(faulty: bool) -> Setup:
    """digits MLP whose first layer's bias was set to -10 (twin: default init)."""
    x, y = digits()
    m = mlp(seed=10)
    if faulty:
        with torch.no_grad():
            m[0].bias.fill_(-10.0)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(DEAD, "dead_relu_cnn", doctor=("dead_units", "gradient_flow"))
def dead_relu_cnn(faulty: bool) -> Setup:
    """digits CNN without BatchNorm whose second conv's bias was set to -8 (twin: default init)."""
    x, y = digits(image=True)
    m = cnn(seed=11, bn=False)
    if faulty:
        with torch.no_grad():
            m[4].bias.fill_(-8.0)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(SATURATED, "tanh_saturated")
def tanh_saturated(faulty: bool) -> Setup:
    """digits tanh MLP with its hidden weights scaled ×30 (twin: default init). Round 4: the fault was ×8, which
    does no harm (36% of the tanh outputs within 1e-3 of ±1, the loss 2.27 → 0.21 against its twin's 0.11, and
    faster than the twin at step 10: 1.03 vs 1.60), so it was no fault to name. ×30 saturates 81% of them and the
    run learns slower than its twin (1.05 vs 0.83 at step 20, 0.35 vs 0.11 at step 60)."""
    x, y = digits()
    m = mlp(act=nn.Tanh, seed=12)
    if faulty:
        with torch.no_grad():
            m[0].weight.mul_(30.0)
            m[2].weight.mul_(30.0)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


def _kaiming(m: nn.Module, gain: float = 1.0) -> None:
    """He-normal init of every Linear (variance kept through ReLU layers), weights × ``gain``, biases 0."""
    with torch.no_grad():
        for layer in m.modules():
            if isinstance(layer, nn.Linear):
                nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
                layer.weight.mul_(gain)
                layer.bias.zero_()


@fault(VANISHING, "deep_sigmoid", doctor=("gradient_flow",))
def deep_sigmoid(faulty: bool) -> Setup:
    """a 10-layer sigmoid MLP with weights ×0.3 (twin: 10 layers of ReLU, He init, lr 0.02: at lr 0.05 that
    twin itself never left ln 10, so it was no healthy run)."""
    x, y = digits()
    m = mlp(hidden=32, depth=10, act=nn.Sigmoid if faulty else nn.ReLU, seed=13)
    if faulty:
        with torch.no_grad():
            for layer in m[:-1]:
                if isinstance(layer, nn.Linear):
                    layer.weight.mul_(0.3)
    else:
        _kaiming(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.05 if faulty else 0.02, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


class RowRNN(nn.Module):
    """Digits read row by row (8 steps of 8 pixels): input projection, an RNN, a head on the last step."""

    def __init__(self, nonlinearity: str = "tanh", hidden: int = 32) -> None:
        super().__init__()
        self.proj = nn.Linear(8, hidden)
        self.rnn = nn.RNN(hidden, hidden, batch_first=True, nonlinearity=nonlinearity)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.proj(x.reshape(-1, 8, 8)))
        return self.head(h[:, -1])


@fault(VANISHING, "rnn_vanishing", doctor=("gradient_flow",))
def rnn_vanishing(faulty: bool) -> Setup:
    """tanh RNN over digit rows, its input and recurrent weights scaled ×0.01 (twin: default init)."""
    x, y = digits()
    torch.manual_seed(14)
    m = RowRNN()
    if faulty:
        with torch.no_grad():
            m.rnn.weight_ih_l0.mul_(0.01)
            m.rnn.weight_hh_l0.mul_(0.01)
            m.proj.weight.mul_(0.01)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(EXPLODING, "rnn_exploding", doctor=("gradient_flow", "nonfinite"))
def rnn_exploding(faulty: bool) -> Setup:
    """ReLU RNN over digit rows, its recurrent matrix ×6 (twin: ×1), SGD lr=1e-2 + momentum. Round 6: the
    pair before (a 32-step sign task, orthogonal ×1.3 against ×0.8) was unfair both ways — the fault did not
    explode (ReLU halves the gain) and the twin never left ln 2 — see docs/diagnosis.md."""
    x, y = digits()
    torch.manual_seed(15)
    m = RowRNN("relu")
    with torch.no_grad():
        m.rnn.weight_hh_l0.mul_(6.0 if faulty else 1.0)
    opt = torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(EXPLODING, "deep_mlp_exploding", doctor=("gradient_flow", "nonfinite"))
def deep_mlp_exploding(faulty: bool) -> Setup:
    """an 8-layer ReLU MLP with He init ×3, SGD lr=1e-4 (twin: He init, lr=3e-3; at lr=1e-2 that twin
    itself never left ln 10 and half its last ReLU died, so it was no healthy run)."""
    x, y = digits()
    m = mlp(hidden=64, depth=8, seed=16)
    _kaiming(m, 3.0 if faulty else 1.0)
    opt = torch.optim.SGD(m.parameters(), lr=1e-4 if faulty else 3e-3, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))
