"""Held-out healthy recipes: standard training set-ups people run, on the held-out zoo's data and
models (none may warn): SGD Nesterov + StepLR, AdamW + cosine with warm restarts, mixup with label
smoothing, EMA weights, gradient accumulation + clipping, a frozen-embedding fine-tune, a multi-task
loss, a small VAE, Huber regression, BCE + Dice segmentation, NAdam, CyclicLR, warmup with dropout."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..base import Setup, recipe
from . import kit
from . import models as M


@recipe("ho_sgd_nesterov_steplr")
def sgd_nesterov_steplr() -> Setup:
    """1-D conv, SGD lr=0.05 Nesterov momentum 0.9, StepLR(step_size=1, gamma=0.5) once per epoch of 32 batches."""
    x, y = kit.signals(seed=60)
    m = M.SignalNet(seed=60)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    return kit.train(m, opt, x, y, kit.ce, sched=sched, sched_every=32, steps=120)


@recipe("ho_adamw_cosine_restarts")
def adamw_cosine_restarts() -> Setup:
    """tiny batch-first transformer, AdamW lr=3e-3 wd 0.05, CosineAnnealingWarmRestarts(T_0=40) per batch."""
    x, y = kit.tokens(seed=61)
    m = M.TinyTF(seed=61)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=40)
    return kit.train(m, opt, x, y, kit.ce, sched=sched, steps=120)


@recipe("ho_mixup_label_smoothing")
def mixup_label_smoothing() -> Setup:
    """1-D conv with mixup (Beta(0.4, 0.4)) and label smoothing 0.1 on the soft targets, Adam lr=3e-3."""
    x, y = kit.signals(seed=62)
    m = M.SignalNet(seed=62)
    g = torch.Generator().manual_seed(62)
    beta = torch.distributions.Beta(0.4, 0.4)

    def fwd(xb: torch.Tensor) -> Any:
        return xb

    def loss(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        lam = float(beta.sample())
        p = torch.randperm(len(yb), generator=g)
        soft = F.one_hot(yb, 4).float() * 0.9 + 0.1 / 4
        return F.cross_entropy(m(lam * xb + (1 - lam) * xb[p]), lam * soft + (1 - lam) * soft[p])

    setup = kit.train(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, y, loss, forward=fwd, steps=120)
    return setup


@recipe("ho_ema_weights")
def ema_weights() -> Setup:
    """EmbeddingBag classifier, Adam lr=1e-2, an EMA copy of the weights (swa_utils.AveragedModel, decay 0.99)
    updated after every step."""
    x, y, v = kit.words()
    m = M.BagNet(v, seed=63)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    ema = torch.optim.swa_utils.AveragedModel(m, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.99))

    class EmaStep:
        def zero_grad(self) -> None:
            opt.zero_grad()

        def step(self) -> None:
            opt.step()
            ema.update_parameters(m)

    setup = kit.train(m, EmaStep(), x, y, kit.ce, steps=120, keep={"ema": ema})
    setup.doctor = (*setup.doctor[:3], opt) if setup.doctor else None
    return setup


@recipe("ho_grad_accumulation_clip")
def grad_accumulation_clip() -> Setup:
    """GRU regressor, Adam lr=5e-3, gradients accumulated over 4 micro-batches of 16 (loss / 4), clip 1.0."""
    x, y = kit.series(seed=64)
    m = M.GRUReg(seed=64)
    opt = torch.optim.Adam(m.parameters(), lr=5e-3)
    losses: list[torch.Tensor] = []
    g = torch.Generator().manual_seed(64)

    def loop(n: int) -> None:
        m.train()
        for _ in range(n):
            opt.zero_grad()
            for _ in range(4):
                i = torch.randint(0, len(y), (16,), generator=g)
                loss = F.mse_loss(m(x[i]), y[i]) / 4
                losses.append(4 * loss.detach())
                loss.backward()
            nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()

    return Setup(m, loop, (x[:16], y[:16], F.mse_loss, opt), 60, keep={"losses": losses})


@recipe("ho_frozen_embedding_finetune")
def frozen_embedding_finetune() -> Setup:
    """EmbeddingBag classifier whose embeddings are frozen on purpose (requires_grad_(False)), only the
    layers above optimised (Adam lr=1e-2 over the trainable parameters)."""
    x, y, v = kit.words()
    m = M.BagNet(v, seed=65)
    m.bag.requires_grad_(False)
    opt = torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    return kit.train(m, opt, x, y, kit.ce, steps=120)


class TwoHeads(M.SignalNet):
    """SignalNet with a second head regressing the sine's frequency."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed=seed)
        self.freq = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.pool(self.features(x)).flatten(1)
        return torch.cat([self.head(f), self.freq(f)], 1)


@recipe("ho_multitask_loss")
def multitask_loss() -> Setup:
    """1-D conv trunk with two heads: class cross-entropy + 0.5 × MSE on the frequency, Adam lr=3e-3."""
    x, y = kit.signals(seed=66)
    m = TwoHeads(66)

    def loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out[:, :4], t) + 0.5 * F.mse_loss(out[:, 4], (t.float() - 1.5) / 1.1)

    return kit.train(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, y, loss, steps=120)


class VAE(nn.Module):
    """digits (64 pixels in [0, 1]) → 2-D latent → 64 logits."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.enc = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
        self.dec = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu, logvar = self.enc(x).chunk(2, 1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(1, keepdim=True)
        return torch.cat([self.dec(z), kl], 1)


@recipe("ho_vae_kl")
def vae_kl() -> Setup:
    """a small VAE on digits: Bernoulli reconstruction (BCE with logits, summed) + KL, Adam lr=3e-3."""
    from sklearn.datasets import load_digits

    x = torch.tensor(load_digits().data, dtype=torch.float32) / 16

    def loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        rec = F.binary_cross_entropy_with_logits(out[:, :64], t, reduction="none").sum(1)
        return (rec + out[:, 64]).mean()

    m = VAE(67)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, x, loss, steps=120)


@recipe("ho_huber_friedman")
def huber_friedman() -> Setup:
    """Friedman regression MLP (SiLU), Huber loss (delta 1), Adam lr=3e-3."""
    x, y = kit.friedman(seed=68)
    m = M.friedman_mlp(seed=68)
    return kit.train(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, y,
                     lambda o, t: F.huber_loss(o.squeeze(-1), t), steps=120)


@recipe("ho_unet_bce_dice")
def unet_bce_dice() -> Setup:
    """UNet-ish segmenter, BCE with logits + soft Dice, Adam lr=1e-2."""
    x, y = kit.segmentation()
    m = M.UNetish(seed=69)

    def loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(out)
        dice = 1 - (2 * (p * t).sum() + 1) / (p.sum() + t.sum() + 1)
        return F.binary_cross_entropy_with_logits(out, t) + dice

    return kit.train(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, y, loss, steps=80)


@recipe("ho_nadam_moons")
def nadam_moons() -> Setup:
    """moons MLP (3×32, GELU), NAdam lr=5e-3, binary logits with BCEWithLogitsLoss."""
    x, y = kit.moons(seed=70)
    m = M.moon_mlp(seed=70, act=nn.GELU, depth=3, out=1)
    return kit.train(m, torch.optim.NAdam(m.parameters(), lr=5e-3), x, y.float(),
                     lambda o, t: F.binary_cross_entropy_with_logits(o.squeeze(-1), t), steps=120)


@recipe("ho_cyclic_lr_sgd")
def cyclic_lr_sgd() -> Setup:
    """GRU regressor, SGD momentum 0.9 with CyclicLR (1e-3 to 5e-2, 20 steps up) per batch."""
    x, y = kit.series(seed=71)
    m = M.GRUReg(seed=71)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    sched = torch.optim.lr_scheduler.CyclicLR(opt, 1e-3, 5e-2, step_size_up=20)
    return kit.train(m, opt, x, y, F.mse_loss, sched=sched, steps=120)


class DropTF(M.TinyTF):
    def __init__(self, seed: int) -> None:
        super().__init__(seed=seed)
        self.drop = nn.Dropout(0.1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.encoder(self.drop(self.tok(ids) + self.pos)).mean(1)))


@recipe("ho_warmup_dropout_tf")
def warmup_dropout_tf() -> Setup:
    """tiny transformer with dropout 0.1, Adam lr=2e-3 with 15 linear warmup steps (LambdaLR), clip 1.0."""
    x, y = kit.tokens(seed=72)
    m = DropTF(72)
    opt = torch.optim.Adam(m.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 15))
    return kit.train(m, opt, x, y, kit.ce, sched=sched, order="zfbcs", clip=1.0, steps=120)
