"""Round 5 (h-dout): faults the capture's rows do not show by themselves — what the top module's own
``forward`` does after its last layer (a functional sigmoid or softmax, a bounded head, a half-precision
exp), a loss fed scores it cannot take, a recurrent layer fed raw values, an init scale that blows the
forward up, raw inputs whose large updates look like a learning rate too high. Each with its healthy twin."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Setup, digits, fault, first_batch, mlp, sgd_loop
from .classes import EXPLODING, FP16, INPUT_SCALE, OUTPUT_LOSS


class Squashed(nn.Module):
    """An MLP whose ``forward`` ends in ``.sigmoid()`` (faulty) or returns the raw scores (twin)."""

    def __init__(self, squash: bool, seed: int) -> None:
        super().__init__()
        self.net, self.squash = mlp(seed=seed), squash

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.net(x)
        return z.sigmoid() if self.squash else z


@fault(OUTPUT_LOSS, "sigmoid_scores_to_cross_entropy", doctor=("overfit_batch",))
def sigmoid_scores_to_cross_entropy(faulty: bool) -> Setup:
    """digits, the forward returns z.sigmoid() and the loop calls nn.CrossEntropyLoss on it (twin: z)."""
    x, y = digits()
    m = Squashed(faulty, seed=80)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    return Setup(m, sgd_loop(m, opt, x, y, loss_fn=loss_fn), (*first_batch(x, y), loss_fn, opt), steps=80)


@fault(OUTPUT_LOSS, "nll_loss_without_log_softmax", doctor=("overfit_batch", "init_loss"))
def nll_loss_without_log_softmax(faulty: bool) -> Setup:
    """a digits CNN (no BatchNorm) trained with F.nll_loss on its raw scores (twin: on F.log_softmax of them)."""
    from .base import cnn

    x, y = digits(image=True)
    m = cnn(seed=81, bn=False)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(out if faulty else F.log_softmax(out, dim=1), target)

    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y, loss_fn=loss_fn), (*first_batch(x, y), loss_fn, opt))


class Rating(nn.Module):
    """A regression MLP whose ``forward`` ends in ``torch.tanh`` (faulty) or in its last Linear (twin)."""

    def __init__(self, bounded: bool) -> None:
        super().__init__()
        self.net, self.bounded = mlp(8, 64, 1, seed=82), bounded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.net(x)
        return torch.tanh(y) if self.bounded else y


@fault(OUTPUT_LOSS, "tanh_head_on_ratings", doctor=("overfit_batch",))
def tanh_head_on_ratings(faulty: bool) -> Setup:
    """ratings 1–9 (mean 5) regressed through torch.tanh in forward: outputs cannot leave (−1, 1) (twin: no tanh)."""
    g = torch.Generator().manual_seed(82)
    x = torch.randn(1024, 8, generator=g)
    t = (5 + 1.5 * torch.tanh(x[:, :3].sum(1, keepdim=True)) + 0.8 * x[:, 3:4]).clamp(1, 9)
    m = Rating(faulty)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    return Setup(m, sgd_loop(m, opt, x, t, loss_fn=F.mse_loss), (*first_batch(x, t), F.mse_loss, opt))


class MeterLSTM(nn.Module):
    """An LSTM over a (B, T, 1) series, read out from its last state (3 classes of a meter series by default)."""

    def __init__(self, hidden: int = 32, out: int = 3, seed: int = 83) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.rnn, self.head = nn.LSTM(1, hidden, batch_first=True), nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(x)
        return self.head(h[:, -1])


def _meter(raw: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Household power readings (watts, ~2,000 ± 400) over 24 steps; the class: falling, flat or rising."""
    g = torch.Generator().manual_seed(83)
    n, steps = 1536, 24
    y = torch.randint(0, 3, (n,), generator=g)
    slope = (y.float() - 1).unsqueeze(1) * 25.0
    w = 2000 + 400 * torch.randn(n, 1, generator=g) + slope * torch.arange(steps) + 30 * torch.randn(n, steps, generator=g)
    x = w if raw else (w - w.mean(1, keepdim=True)) / 100.0
    return x.unsqueeze(2), y


@fault(INPUT_SCALE, "lstm_raw_watts", doctor=("input_scale",))
def lstm_raw_watts(faulty: bool) -> Setup:
    """an LSTM fed raw power readings (≈ 2,000 W): its gates saturate (twin: each series centred, / 100)."""
    x, y = _meter(faulty)
    m = MeterLSTM()
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt), steps=80)


@fault(INPUT_SCALE, "cnn_raw_bytes_sgd", doctor=("input_scale",))
def cnn_raw_bytes_sgd(faulty: bool) -> Setup:
    """a BatchNorm-free digits CNN fed raw 0–255 bytes, SGD lr=0.05 + momentum (twin: bytes / 255)."""
    from .base import cnn

    x, _ = digits(raw=True, image=True)
    _, y = digits()
    x = x * (255.0 / 16.0)
    if not faulty:
        x = x / 255.0
    m = cnn(seed=84, bn=False)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt), steps=80)


@fault(EXPLODING, "cnn_unit_normal_init", doctor=("init_loss",))
def cnn_unit_normal_init(faulty: bool) -> Setup:
    """a 4-conv digits CNN whose weights are drawn from N(0, 1) (twin: He init, N(0, 2 / fan_in))."""
    torch.manual_seed(85)
    m = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 1.0) if faulty else nn.init.kaiming_normal_(p, nonlinearity="relu")
    x, y = digits(image=True)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt), steps=80)


class HalfTemperature(nn.Module):
    """An MLP whose ``forward`` ends in a softmax with temperature 0.05 written by hand: in float16 (faulty:
    exp overflows past 11.09) or with ``log_softmax`` in float32 (twin). Returns log-probabilities."""

    def __init__(self, half: bool) -> None:
        super().__init__()
        self.net, self.half = mlp(seed=86), half

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.net(x) / 0.05
        if self.half:
            e = torch.exp(z.half())
            return torch.log(e / e.sum(1, keepdim=True)).float()
        return F.log_softmax(z, dim=1)


@fault(FP16, "half_temperature_softmax", doctor=("nonfinite",))
def half_temperature_softmax(faulty: bool) -> Setup:
    """log-probabilities by a hand-written softmax at temperature 0.05 in float16 inside forward (twin: log_softmax)."""
    x, y = digits()
    m = HalfTemperature(faulty)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y, loss_fn=F.nll_loss), (*first_batch(x, y), F.nll_loss, opt))
