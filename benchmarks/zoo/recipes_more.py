"""More healthy recipes (issue 26: nothing may fire on them): other optimizers and schedules, a GRU, a
ViT block, a conv autoencoder, a siamese pair loss, and healthy models of the kinds the output findings
watch (a Sigmoid + BCELoss classifier, a LogSoftmax + nll_loss classifier)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .base import Setup, digits, first_batch, mlp, recipe, sgd_loop


@recipe("rmsprop_mlp")
def rmsprop_mlp() -> Setup:
    """digits MLP, RMSprop lr=1e-3."""
    x, y = digits()
    m = mlp(seed=200)
    opt = torch.optim.RMSprop(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("adagrad_mlp")
def adagrad_mlp() -> Setup:
    """digits MLP, Adagrad lr=1e-2."""
    x, y = digits()
    m = mlp(seed=201)
    opt = torch.optim.Adagrad(m.parameters(), lr=1e-2)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("onecycle_sgd")
def onecycle_sgd() -> Setup:
    """digits MLP, SGD momentum with OneCycleLR (max lr 0.1) stepped per batch, as documented."""
    x, y = digits()
    m = mlp(seed=202)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=61)
    return Setup(m, sgd_loop(m, opt, x, y, sched=sched), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("plateau_adam")
def plateau_adam() -> Setup:
    """digits MLP, Adam lr=2e-3 with ReduceLROnPlateau fed the loss every 10 steps."""
    x, y = digits()
    m = mlp(seed=203)
    opt = torch.optim.Adam(m.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1)
    inner = sgd_loop(m, opt, x, y)

    def loop(n: int) -> None:
        for k in range(0, n, 10):
            inner(min(10, n - k))
            with torch.no_grad():
                sched.step(float(F.cross_entropy(m(x[:256]), y[:256])))

    return Setup(m, loop, (*first_batch(x, y), F.cross_entropy, opt))


class RowGRU(nn.Module):
    """Digits read row by row by a GRU, a head on the last step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(204)
        self.gru = nn.GRU(8, 48, batch_first=True)
        self.head = nn.Linear(48, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(x.reshape(-1, 8, 8))[0][:, -1])


@recipe("gru_classifier")
def gru_classifier() -> Setup:
    """digits rows through a GRU, Adam lr=3e-3."""
    x, y = digits()
    m = RowGRU()
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


class TinyViT(nn.Module):
    """8×8 digits as 16 patches of 2×2, a class token, one pre-norm encoder layer (batch_first)."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        torch.manual_seed(205)
        self.patch = nn.Linear(4, d)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, 17, d) * 0.02)
        self.block = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = x.reshape(-1, 4, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(-1, 16, 4)
        h = torch.cat([self.cls.expand(len(p), -1, -1), self.patch(p)], 1) + self.pos
        return self.head(self.norm(self.block(h)[:, 0]))


@recipe("tiny_vit_block")
def tiny_vit_block() -> Setup:
    """a one-block ViT on digit patches, AdamW lr=1e-3."""
    x, y = digits()
    m = TinyViT()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.05)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("conv_autoencoder")
def conv_autoencoder() -> Setup:
    """digits images (scaled to 0–1) through a conv autoencoder ending in a Sigmoid, MSE, Adam lr=3e-3."""
    x, _ = digits(raw=True, image=True)
    x = x / 16.0
    torch.manual_seed(206)
    m = nn.Sequential(nn.Conv2d(1, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                      nn.ReLU(), nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1), nn.ReLU(),
                      nn.ConvTranspose2d(16, 1, 4, stride=2, padding=1), nn.Sigmoid())
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    return Setup(m, sgd_loop(m, opt, x, x, loss_fn=F.mse_loss), (*first_batch(x, x), F.mse_loss, opt))


class Siamese(nn.Module):
    """One embedding net applied to both halves of a pair (B × 2 × 64)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp(d_out=16, seed=207)

    def forward(self, pair: torch.Tensor) -> torch.Tensor:
        return F.pairwise_distance(self.net(pair[:, 0]), self.net(pair[:, 1]))


@recipe("siamese_contrastive")
def siamese_contrastive() -> Setup:
    """digit pairs (same class or not, half each), contrastive loss with margin 2, Adam lr=1e-3."""
    x, y = digits()
    g = torch.Generator().manual_seed(208)
    a = torch.randint(len(y), (2048,), generator=g)
    same = torch.arange(2048) % 2 == 0
    b = torch.randint(len(y), (2048,), generator=g)
    by = [torch.nonzero(y == c).flatten() for c in range(10)]
    for i in torch.nonzero(same).flatten().tolist():
        pool = by[int(y[a[i]])]
        b[i] = pool[torch.randint(len(pool), (1,), generator=g)]
    pairs, t = torch.stack([x[a], x[b]], 1), (y[a] == y[b]).float()

    def contrastive(d: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return (s * d ** 2 + (1 - s) * F.relu(2.0 - d) ** 2).mean()

    m = Siamese()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, pairs, t, loss_fn=contrastive), (*first_batch(pairs, t), contrastive, opt))


@recipe("sigmoid_bce_classifier")
def sigmoid_bce_classifier() -> Setup:
    """even vs odd digits: an MLP ending in a Sigmoid trained with BCELoss (probabilities, rightly)."""
    x, y = digits()
    t = (y % 2).float().unsqueeze(1)
    m = mlp(d_out=1, seed=209)
    m.append(nn.Sigmoid())
    loss_fn: Any = nn.BCELoss()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, t, loss_fn=loss_fn), (*first_batch(x, t), loss_fn, opt))


@recipe("log_softmax_nll")
def log_softmax_nll() -> Setup:
    """digits MLP ending in LogSoftmax(dim=1), nll_loss, SGD momentum lr=0.05."""
    x, y = digits()
    m = mlp(seed=210)
    m.append(nn.LogSoftmax(dim=1))
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y, loss_fn=F.nll_loss), (*first_batch(x, y), F.nll_loss, opt))
