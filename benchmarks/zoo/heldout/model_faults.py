"""Held-out faults in the model: dead units, saturation, vanishing and exploding signals from a bad
init, NaN made in the forward or the backward, fp16 overflow, BatchNorm fed one sample, the graph cut,
samples mixed across the batch. ``make(True)`` plants the bug; ``make(False)`` is the same code fixed."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..base import Setup, fault
from ..classes import (
    BATCH_MIXED,
    BN_ONE,
    DEAD,
    EXPLODING,
    FP16,
    GRAPH_CUT,
    NAN_BWD,
    NAN_FWD,
    SATURATED,
    VANISHING,
)
from . import kit
from . import models as M


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, y)


def _bce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(out, y)


@fault(DEAD, "ho_bag_hidden_bias_negative", doctor=("dead_units",))
def bag_hidden_bias_negative(faulty: bool) -> Setup:
    """EmbeddingBag classifier, the hidden layer's bias set to -1 "for sparse activations" (twin: 0)."""
    x, y, v = kit.words()
    m = M.BagNet(v, seed=20)
    nn.init.constant_(m.hidden.bias, -1.0 if faulty else 0.0)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, y, kit.ce, steps=120)


@fault(DEAD, "ho_unet_conv_bias_negative", doctor=("dead_units",))
def unet_conv_bias_negative(faulty: bool) -> Setup:
    """UNet-ish segmenter, every conv bias initialised to -2 (twin: the default init)."""
    x, y = kit.segmentation()
    m = M.UNetish(seed=21)
    if faulty:
        for mod in m.modules():
            if isinstance(mod, nn.Conv2d):
                nn.init.constant_(mod.bias, -2.0)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, y, _bce, steps=80)


def _init_normal(model: nn.Module, std: float) -> None:
    for mod in model.modules():
        if isinstance(mod, nn.Linear | nn.Conv1d | nn.Conv2d):
            nn.init.normal_(mod.weight, std=std)
            nn.init.zeros_(mod.bias)


@fault(SATURATED, "ho_moons_tanh_init_std4")
def moons_tanh_init_std4(faulty: bool) -> Setup:
    """moons tanh MLP (3×64) initialised N(0, 4²) (twin: the default init), SGD momentum lr=0.05."""
    x, y = kit.moons(seed=22)
    m = M.moon_mlp(seed=22, act=nn.Tanh, width=64, depth=3)
    if faulty:
        _init_normal(m, 4.0)
    return kit.train(m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), x, y, kit.ce, steps=150)


@fault(VANISHING, "ho_moons_deep_sigmoid_sgd", doctor=("gradient_flow",))
def moons_deep_sigmoid_sgd(faulty: bool) -> Setup:
    """moons MLP 10 hidden layers of Sigmoid, SGD momentum lr=0.05 (twin: ReLU with Kaiming init)."""
    x, y = kit.moons(seed=23)
    m = M.moon_mlp(seed=23, act=nn.Sigmoid if faulty else nn.ReLU, width=32, depth=10)
    if not faulty:
        for mod in m.modules():
            if isinstance(mod, nn.Linear):
                nn.init.kaiming_normal_(mod.weight, nonlinearity="relu")
                nn.init.zeros_(mod.bias)
    return kit.train(m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), x, y, kit.ce, steps=150)


class DeepConv1d(nn.Module):
    """Six 1-D convs with Tanh, average pooling, a head."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        c = 1
        for _ in range(6):
            layers += [nn.Conv1d(c, 16, 5, padding=2), nn.Tanh()]
            c = 16
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean(-1))


@fault(VANISHING, "ho_deep_conv1d_tiny_init", doctor=("gradient_flow",))
def deep_conv1d_tiny_init(faulty: bool) -> Setup:
    """six Tanh 1-D convs, weights initialised N(0, 0.01²) (twin: Xavier normal with tanh's gain 5/3),
    SGD momentum lr=0.05."""
    x, y = kit.signals(seed=24)
    m = DeepConv1d(24)
    for mod in m.body:
        if isinstance(mod, nn.Conv1d):
            if faulty:
                nn.init.normal_(mod.weight, std=0.01)
            else:
                nn.init.xavier_normal_(mod.weight, gain=5 / 3)
    return kit.train(m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), x, y, kit.ce, steps=120)


@fault(EXPLODING, "ho_moons_deep_relu_init_half")
def moons_deep_relu_init_half(faulty: bool) -> Setup:
    """moons ReLU MLP 8×64 initialised N(0, 0.5²) ("a small std"; twin: Kaiming, std √(2/64)), SGD lr=0.01."""
    x, y = kit.moons(seed=25)
    m = M.moon_mlp(seed=25, width=64, depth=8)
    for mod in m.modules():
        if isinstance(mod, nn.Linear):
            nn.init.normal_(mod.weight, std=0.5 if faulty else (2 / mod.in_features) ** 0.5)
            nn.init.zeros_(mod.bias)
    return kit.train(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), x, y, kit.ce, steps=120)


@fault(EXPLODING, "ho_unet_init_unit_normal")
def unet_init_unit_normal(faulty: bool) -> Setup:
    """UNet-ish segmenter with every conv initialised N(0, 1) (twin: the default init), SGD momentum lr=0.05."""
    x, y = kit.segmentation()
    m = M.UNetish(seed=26)
    if faulty:
        for mod in m.modules():
            if isinstance(mod, nn.Conv2d | nn.ConvTranspose2d):
                nn.init.normal_(mod.weight, std=1.0)
    return kit.train(m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), x, y, _bce, steps=80)


class PaddedTF(M.TinyTF):
    """TinyTF over padded sequences (id 0 = padding), pooled by a hand-written attention pooling whose
    scores are set to -inf on padding; ``inverted``: set to -inf on the real tokens instead."""

    def __init__(self, seed: int, inverted: bool) -> None:
        super().__init__(seed=seed, vocab=17)
        self.score = nn.Linear(32, 1)
        self.inverted = inverted

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == 0
        h = self.encoder(self.tok(ids) + self.pos, src_key_padding_mask=pad)
        s = self.score(h).squeeze(-1).masked_fill(~pad if self.inverted else pad, float("-inf"))
        return self.head((s.softmax(1).unsqueeze(-1) * h).sum(1))


def padded_tokens(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences of 6–12 real tokens (ids 1–16) padded with 0 to 12; label: the most frequent of 2, 3, 4."""
    x, _ = kit.tokens(seed=seed)
    x = x + 1
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, 13, (len(x), 1), generator=g)
    x[torch.arange(12)[None] >= lengths] = 0
    c = torch.stack([(x == k).sum(1) for k in (2, 3, 4)], 1).float() - 0.01 * torch.arange(3)
    return x, c.argmax(1)


@fault(NAN_FWD, "ho_tf_padding_mask_inverted", doctor=("nonfinite",))
def tf_padding_mask_inverted(faulty: bool) -> Setup:
    """batch-first transformer pooled by attention whose mask is inverted (``masked_fill(ids != PAD, -inf)``):
    a full-length sequence has every score -inf, its softmax is 0/0 (twin: ``masked_fill(ids == PAD, -inf)``)."""
    x, y = padded_tokens(27)
    m = PaddedTF(27, inverted=faulty)
    return kit.train(m, torch.optim.AdamW(m.parameters(), lr=3e-3), x, y, kit.ce, steps=100)


class LogEnergyNet(M.SignalNet):
    """SignalNet with log-energy features: ``log(relu(conv))`` (twin: ``log1p``)."""

    def __init__(self, seed: int, log1p: bool) -> None:
        super().__init__(seed=seed)
        self.log1p = log1p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.features(x)
        f = torch.log1p(f) if self.log1p else torch.log(f)
        return self.head(self.pool(f).flatten(1))


@fault(NAN_FWD, "ho_signal_log_of_relu", doctor=("nonfinite",))
def signal_log_of_relu(faulty: bool) -> Setup:
    """1-D conv with ``torch.log`` of ReLU features (log 0 = -inf, then -inf + inf in the head; twin: log1p)."""
    x, y = kit.signals(seed=28)
    m = LogEnergyNet(28, log1p=not faulty)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, y, kit.ce, steps=100)


def _contrastive(eps: float):  # type: ignore[no-untyped-def]
    def loss(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        d = ((z[:, None] - z[None]).pow(2).sum(-1) + eps).sqrt()  # every pair, the diagonal too
        same = (y[:, None] == y[None]).float()
        return (same * d.pow(2) + (1 - same) * F.relu(1.0 - d).pow(2)).mean()

    return loss


@fault(NAN_BWD, "ho_contrastive_sqrt_of_zero", doctor=("nonfinite",))
def contrastive_sqrt_of_zero(faulty: bool) -> Setup:
    """moons embedding net with a pairwise contrastive loss whose distances include each sample with itself:
    sqrt(0) has an infinite derivative, the backward makes NaN (twin: sqrt(d² + 1e-9))."""
    x, y = kit.moons(seed=29)
    m = M.moon_mlp(seed=29, out=8)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, y, _contrastive(0.0 if faulty else 1e-9), steps=80)


class CosineMoons(nn.Module):
    """A moons embedding net and a cosine classifier at scale 30 (normalised features and class vectors),
    probabilities from a hand-written softmax ``exp(z) / sum exp(z)``."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.net = M.moon_mlp(seed=seed, out=16)
        self.classes = nn.Parameter(torch.randn(2, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = 30.0 * F.normalize(self.net(x), dim=1) @ F.normalize(self.classes, dim=1).T
        e = torch.exp(z)  # float32 holds exp(30); float16 stops at 65504 = exp(11.1)
        return e / e.sum(1, keepdim=True)


def _nll_of_probs(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.nll_loss(torch.log(p.float() + 1e-8), y)


@fault(FP16, "ho_half_cosine_softmax", doctor=("nonfinite",))
def half_cosine_softmax(faulty: bool) -> Setup:
    """``model.half()`` "to save memory" on a cosine classifier at scale 30 with a hand-written softmax:
    exp overflows float16 (twin: the model left in float32)."""
    x, y = kit.moons(seed=30)
    m = CosineMoons(30)
    if faulty:
        m, x = m.half(), x.half()
    return kit.train(m, torch.optim.SGD(m.parameters(), lr=0.01), x, y, _nll_of_probs, steps=80)


@fault(BN_ONE, "ho_bn1d_last_batch_of_one")
def bn1d_last_batch_of_one(faulty: bool) -> Setup:
    """Friedman MLP with BatchNorm1d, 1,025 samples in batches of 32 without drop_last: the epoch's last
    batch holds one sample and BatchNorm raises (twin: drop_last=True)."""
    x, y = kit.friedman(n=1025, seed=31)
    torch.manual_seed(31)
    m = nn.Sequential(nn.Linear(10, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 1))
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, y, lambda o, t: F.mse_loss(o.squeeze(-1), t),
                     drop_last=not faulty, steps=80)


class DetachedGRU(M.GRUReg):
    def __init__(self, seed: int, cut: bool) -> None:
        super().__init__(seed=seed)
        self.cut = cut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(x)
        if self.cut:
            h = h.detach()  # "detach the hidden state" copied from a truncated-BPTT loop
        return self.head(h[:, -1]).squeeze(-1)


@fault(GRAPH_CUT, "ho_gru_hidden_detached", doctor=("gradient_flow",))
def gru_hidden_detached(faulty: bool) -> Setup:
    """GRU regressor whose forward detaches the GRU's output before the head (twin: no detach)."""
    x, y = kit.series(seed=32)
    m = DetachedGRU(32, cut=faulty)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, y, _mse, steps=100)


class NumpyNormNet(M.SignalNet):
    def __init__(self, seed: int, numpy: bool) -> None:
        super().__init__(seed=seed)
        self.numpy = numpy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.pool(self.features(x)).flatten(1)
        if self.numpy:  # standardise the features with numpy, as in the preprocessing notebook
            a = f.detach().numpy()
            f = torch.from_numpy((a - a.mean(0)) / (a.std(0) + 1e-5))
        else:
            f = (f - f.mean(0)) / (f.std(0, unbiased=False) + 1e-5)
        return self.head(f)


@fault(GRAPH_CUT, "ho_signal_numpy_standardise", doctor=("gradient_flow",))
def signal_numpy_standardise(faulty: bool) -> Setup:
    """1-D conv whose pooled features are standardised in numpy inside forward (twin: the same in torch)."""
    x, y = kit.signals(seed=33)
    m = NumpyNormNet(33, numpy=faulty)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, y, kit.ce, steps=100)


class DataUNet(M.UNetish):
    def __init__(self, seed: int, cut: bool) -> None:
        super().__init__(seed=seed)
        self.cut = cut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.enc(x)
        deep = self.down(skip)
        if self.cut:
            deep = deep.data  # the old-style .data: no gradient to the down path
        return self.dec(torch.cat([skip, self.up(deep)], 1))


@fault(GRAPH_CUT, "ho_unet_dot_data", doctor=("gradient_flow",))
def unet_dot_data(faulty: bool) -> Setup:
    """UNet-ish whose down path's output is read through ``.data`` (twin: the tensor itself)."""
    x, y = kit.segmentation()
    m = DataUNet(34, cut=faulty)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, y, _bce, steps=80)


class ViewGRU(M.GRUReg):
    def __init__(self, seed: int, view: bool) -> None:
        super().__init__(seed=seed, batch_first=False)
        self.view = view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        seq = x.view(t, b, d) if self.view else x.transpose(0, 1)  # the GRU wants (T, B, D)
        h, _ = self.gru(seq)
        return self.head(h[-1]).squeeze(-1)


@fault(BATCH_MIXED, "ho_gru_view_not_transpose", doctor=("batch_independence",))
def gru_view_not_transpose(faulty: bool) -> Setup:
    """GRU (batch_first=False) fed ``x.view(T, B, D)`` of a (B, T, D) batch: series cut and mixed across
    samples (twin: ``x.transpose(0, 1)``)."""
    x, y = kit.series(seed=35)
    m = ViewGRU(35, view=faulty)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, y, _mse, steps=100)


class MHAClassifier(nn.Module):
    def __init__(self, seed: int, batch_first: bool) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.tok = nn.Embedding(16, 32)
        self.pos = nn.Parameter(0.02 * torch.randn(12, 32))
        self.attn = nn.MultiheadAttention(32, 4, batch_first=batch_first)
        self.head = nn.Linear(32, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tok(ids) + self.pos
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.head((h + a).mean(1))


@fault(BATCH_MIXED, "ho_mha_without_batch_first", doctor=("batch_independence",))
def mha_without_batch_first(faulty: bool) -> Setup:
    """nn.MultiheadAttention built without batch_first, fed (B, T, D): it attends across the batch
    (twin: batch_first=True)."""
    x, y = kit.tokens(seed=36)
    m = MHAClassifier(36, batch_first=not faulty)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, y, kit.ce, steps=120)


class NormBag(M.BagNet):
    def __init__(self, vocab: int, seed: int, dim: int) -> None:
        super().__init__(vocab, seed=seed)
        self.dim = dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = F.normalize(self.bag(ids), dim=self.dim)
        return self.out(self.act(self.hidden(e)))


@fault(BATCH_MIXED, "ho_bag_normalize_dim0", doctor=("batch_independence",))
def bag_normalize_dim0(faulty: bool) -> Setup:
    """EmbeddingBag classifier with ``F.normalize(e, dim=0)``: each feature normalised over the batch
    (twin: dim=1, each sample's vector)."""
    x, y, v = kit.words()
    m = NormBag(v, 37, dim=0 if faulty else 1)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, y, kit.ce, steps=120)



