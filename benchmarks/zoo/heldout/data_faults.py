"""Held-out faults in the data and the loss: NaN in the inputs or made by the loss, inputs and labels
unrelated, data never shuffled, inputs far off scale, an output that does not fit its loss, a
broadcasting loss. ``make(True)`` plants the bug; ``make(False)`` is the same code fixed."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..base import Setup, fault
from ..classes import (
    BROADCAST,
    INPUT_SCALE,
    NAN_INPUT,
    NAN_LOSS,
    OUTPUT_LOSS,
    UNRELATED,
    UNSHUFFLED,
)
from . import kit
from . import models as M


def _reg(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.squeeze(-1), y)


@fault(NAN_INPUT, "ho_friedman_missing_values", doctor=("nonfinite",))
def friedman_missing_values(faulty: bool) -> Setup:
    """Friedman regression read from a table where 1% of cells are missing (NaN), not imputed (twin: each
    missing cell filled with its column's mean)."""
    x, y = kit.friedman(seed=40)
    g = torch.Generator().manual_seed(40)
    x[torch.rand(x.shape, generator=g) < 0.01] = float("nan")
    if not faulty:
        x = torch.where(x.isnan(), x.nanmean(0, keepdim=True).expand_as(x), x)
    m = M.friedman_mlp(seed=40)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, y, _reg, steps=100)


@fault(NAN_INPUT, "ho_signal_maxabs_dead_sensor", doctor=("nonfinite",))
def signal_maxabs_dead_sensor(faulty: bool) -> Setup:
    """1-D signals scaled by each signal's max |x|, and 2% of recordings are a dead sensor (all zeros):
    0/0 (twin: the max clamped at 1e-6)."""
    x, y = kit.signals(seed=41)
    g = torch.Generator().manual_seed(41)
    x[torch.rand(len(x), generator=g) < 0.02] = 0.0
    peak = x.abs().amax(-1, keepdim=True)
    x = x / (peak if faulty else peak.clamp_min(1e-6))
    m = M.SignalNet(seed=41)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, y, kit.ce, steps=100)


def _msle(fixed: bool):  # type: ignore[no-untyped-def]
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        pred = F.softplus(out.squeeze(-1)) if fixed else out.squeeze(-1)
        return F.mse_loss(torch.log1p(pred), torch.log1p(y))  # log1p of a negative prediction below -1: NaN

    return loss


@fault(NAN_LOSS, "ho_counts_msle_negative_pred", doctor=("nonfinite", "init_loss"))
def counts_msle_negative_pred(faulty: bool) -> Setup:
    """Count regression with a mean-squared-log loss on a plain linear output: log1p of a prediction
    below -1 is NaN (the model's output finite; twin: softplus on the output)."""
    x, y = kit.counts(seed=42)
    torch.manual_seed(42)
    m = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    with torch.no_grad():
        m[-1].bias.fill_(-1.5)  # the user's "start near zero counts"
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, y, _msle(not faulty), steps=100)


@fault(UNRELATED, "ho_moons_labels_from_other_draw")
def moons_labels_from_other_draw(faulty: bool) -> Setup:
    """moons: features from one ``make_moons`` call, labels from another (another random_state: the
    order of samples differs; twin: one call)."""
    x, _ = kit.moons(seed=43)
    _, y = kit.moons(seed=44 if faulty else 43)
    m = M.moon_mlp(seed=43)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, y, kit.ce, steps=120)


@fault(UNRELATED, "ho_words_shuffled_separately")
def words_shuffled_separately(faulty: bool) -> Setup:
    """text windows and topic labels shuffled with two separate shuffles (twin: one permutation for both)."""
    x, y, v = kit.words()
    p = torch.randperm(len(y), generator=torch.Generator().manual_seed(45))
    q = torch.randperm(len(y), generator=torch.Generator().manual_seed(46)) if faulty else p
    m = M.BagNet(v, seed=45)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=1e-2), x[p], y[q], kit.ce, steps=120)


@fault(UNSHUFFLED, "ho_signals_by_class_no_shuffle")
def signals_by_class_no_shuffle(faulty: bool) -> Setup:
    """1-D signals stored class after class, DataLoader(shuffle=False) (twin: shuffle=True)."""
    x, y = kit.signals(seed=47)
    order = torch.argsort(y, stable=True)
    m = M.SignalNet(seed=47)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=3e-3), x[order], y[order], kit.ce,
                     shuffle=not faulty, steps=120)


@fault(UNSHUFFLED, "ho_words_topic_by_topic")
def words_topic_by_topic(faulty: bool) -> Setup:
    """text windows read topic after topic as the files come, never shuffled (twin: shuffled per epoch)."""
    x, y, v = kit.words(grouped=True)
    m = M.BagNet(v, seed=48)
    return kit.train(m, torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9), x, y, kit.ce,
                     shuffle=not faulty, steps=150)


@fault(INPUT_SCALE, "ho_gru_raw_pressure", doctor=("input_scale",))
def gru_raw_pressure(faulty: bool) -> Setup:
    """GRU regressor on barometer readings in pascals (~101,325 ± 50; twin: standardised), SGD momentum."""
    x, y = kit.series(seed=49)
    raw = 101_325.0 + 50.0 * x
    x = raw if faulty else (raw - raw.mean()) / raw.std()
    m = M.GRUReg(seed=49)
    return kit.train(m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), x, y,
                     lambda o, t: F.mse_loss(o, t), steps=100)


@fault(INPUT_SCALE, "ho_signal_adc_counts", doctor=("input_scale",))
def signal_adc_counts(faulty: bool) -> Setup:
    """1-D signals as 12-bit ADC counts (0–4095 around 2048; twin: standardised), SGD momentum lr=0.01."""
    x, y = kit.signals(seed=50)
    raw = (2048 + 600 * x).round().clamp(0, 4095)
    x = raw if faulty else (raw - raw.mean()) / raw.std()
    m = M.SignalNet(seed=50)
    return kit.train(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), x, y, kit.ce, steps=100)


class SigmoidTF(M.TinyTF):
    def __init__(self, seed: int, squash: bool) -> None:
        super().__init__(seed=seed)
        self.squash = squash

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        z = super().forward(ids)
        return torch.sigmoid(z) if self.squash else z


@fault(OUTPUT_LOSS, "ho_tf_sigmoid_before_ce")
def tf_sigmoid_before_ce(faulty: bool) -> Setup:
    """tiny transformer ending in ``torch.sigmoid`` before ``F.cross_entropy`` (twin: raw logits)."""
    x, y = kit.tokens(seed=51)
    m = SigmoidTF(51, squash=faulty)
    return kit.train(m, torch.optim.AdamW(m.parameters(), lr=3e-3), x, y, kit.ce, steps=120)


@fault(OUTPUT_LOSS, "ho_bag_nll_on_logits")
def bag_nll_on_logits(faulty: bool) -> Setup:
    """EmbeddingBag classifier trained with ``F.nll_loss(logits, y)``, no log_softmax: the loss falls
    without bound (twin: ``F.nll_loss(F.log_softmax(logits, 1), y)``)."""
    x, y, v = kit.words()
    m = M.BagNet(v, seed=52)

    def loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(out if faulty else F.log_softmax(out, 1), t)

    return kit.train(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, y, loss, steps=120)


@fault(OUTPUT_LOSS, "ho_friedman_sigmoid_head")
def friedman_sigmoid_head(faulty: bool) -> Setup:
    """Friedman regression (target ≈ 14 ± 5, not standardised) through a final ``nn.Sigmoid`` copied from
    a classifier: outputs in (0, 1) (twin: no sigmoid)."""
    x, _ = kit.friedman(seed=53)
    from sklearn.datasets import make_friedman1

    y = torch.tensor(make_friedman1(1024, noise=0.5, random_state=53)[1], dtype=torch.float32)
    torch.manual_seed(53)
    layers: list[nn.Module] = [nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1)]
    m = nn.Sequential(*layers, nn.Sigmoid()) if faulty else nn.Sequential(*layers)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, y, _reg, steps=120)


class KeepDimGRU(M.GRUReg):
    def __init__(self, seed: int, keepdim: bool) -> None:
        super().__init__(seed=seed)
        self.keepdim = keepdim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(x)
        out = self.head(h[:, -1])
        return out if self.keepdim else out.squeeze(-1)


@fault(BROADCAST, "ho_gru_huber_broadcast")
def gru_huber_broadcast(faulty: bool) -> Setup:
    """GRU regressor whose head returns (B, 1) against a (B,) target in ``F.huber_loss``: broadcast to
    B×B (twin: the output squeezed)."""
    x, y = kit.series(seed=54)
    m = KeepDimGRU(54, keepdim=faulty)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, y, F.huber_loss, steps=100)
