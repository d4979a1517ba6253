"""Round 5 (h-ddata): healthy recipes of the kinds that drew false alarms elsewhere — a deep Kaiming ReLU MLP,
a VAE, a small UNet-ish segmenter, a cosine classifier at scale 30 (many ReLU units silent, or large first
updates, in runs that learn) — and two faults with twins: an ExponentialLR meant per epoch stepped per batch,
and SGD weight decay far too strong on a CNN."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Setup, cnn, digits, fault, first_batch, recipe, sgd_loop
from .classes import SCHEDULE, WEIGHT_DECAY


@recipe("deep_kaiming_relu")
def deep_kaiming_relu() -> Setup:
    """digits MLP (pixels in [0, 1]) of 10 ReLU layers of 16 units, Kaiming-normal init, Adam lr=3e-3."""
    x, y = digits(raw=True)
    x = x / 16
    torch.manual_seed(300)
    layers: list[nn.Module] = []
    d = 64
    for _ in range(10):
        lin = nn.Linear(d, 16)
        nn.init.kaiming_normal_(lin.weight, nonlinearity="relu")
        nn.init.zeros_(lin.bias)
        layers += [lin, nn.ReLU()]
        d = 16
    m = nn.Sequential(*layers, nn.Linear(16, 10))
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt), steps=100)


class DigitsVAE(nn.Module):
    """A VAE of the digits (64 → 32 ReLU → 2×4 latent → 32 ReLU → 64); returns (reconstruction, mu, logvar)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(301)
        self.encoder = nn.Sequential(nn.Linear(64, 32), nn.ReLU())
        self.mu, self.logvar = nn.Linear(32, 4), nn.Linear(32, 4)
        self.decoder = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.encoder(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.decoder(z), mu, logvar


def _elbo(out: tuple[torch.Tensor, torch.Tensor, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    rec, mu, logvar = out
    kl = -0.5 * torch.sum(1 + logvar - mu ** 2 - logvar.exp(), dim=1)
    return F.binary_cross_entropy_with_logits(rec, x, reduction="none").sum(1).mean() + kl.mean()


@recipe("vae_digits")
def vae_digits() -> Setup:
    """a VAE of the digits' ink in [0, 1] (Bernoulli decoder: summed BCE with logits + KL), Adam lr=1e-2."""
    x = digits(raw=True)[0] / 16
    m = DigitsVAE()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    return Setup(m, sgd_loop(m, opt, x, x, loss_fn=_elbo), None, steps=120)


class TinyUNet(nn.Module):
    """A UNet-ish segmenter of 8×8 digit ink (skip + a down/up path), one logit per pixel."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(302)
        self.enc = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU())
        self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.enc(x)
        return self.dec(torch.cat([s, self.up(self.down(s))], 1))


@recipe("unet_ink")
def unet_ink() -> Setup:
    """a small UNet segmenting digit ink (raw pixel > 4) from noisy images, BCEWithLogits, Adam lr=3e-3."""
    x, _ = digits(raw=True, image=True)
    target = (x > 4).float()
    g = torch.Generator().manual_seed(302)
    noisy = (x / 16 + 0.3 * torch.randn(x.shape, generator=g) - 0.3) / 0.4
    m = TinyUNet()
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    return Setup(m, sgd_loop(m, opt, noisy, target, loss_fn=F.binary_cross_entropy_with_logits), None, steps=80)


class CosineNet(nn.Module):
    """An MLP whose head is a cosine classifier: logits = scale · cos(features, class weights)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        torch.manual_seed(303)
        self.body = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))
        self.weight = nn.Parameter(torch.randn(10, 32))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * F.normalize(self.body(x), dim=1) @ F.normalize(self.weight, dim=1).t()


@recipe("cosine_classifier")
def cosine_classifier() -> Setup:
    """digits cosine classifier at scale 30 (normalised features and class weights), SGD lr=0.1 momentum 0.9."""
    x, y = digits()
    m = CosineNet(30.0)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt), steps=80)


@fault(SCHEDULE, "exponential_lr_per_batch")
def exponential_lr_per_batch(faulty: bool) -> Setup:
    """digits BatchNorm CNN, Adam lr=3e-3 with ExponentialLR(gamma=0.8) meant per epoch, stepped per batch (twin:
    once per epoch of 28 batches)."""
    x, y = digits(image=True)
    m = cnn(seed=304)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.8)
    inner = sgd_loop(m, opt, x, y, sched=sched if faulty else None)
    done = [0]

    def loop(n: int) -> None:
        for _ in range(n):
            inner(1)
            done[0] += 1
            if not faulty and done[0] % 28 == 0:
                sched.step()

    return Setup(m, loop, (*first_batch(x, y), F.cross_entropy, opt), steps=100)


@fault(WEIGHT_DECAY, "sgd_weight_decay_cnn")
def sgd_weight_decay_cnn(faulty: bool) -> Setup:
    """digits CNN without BatchNorm, SGD lr=0.05 momentum 0.9 with weight_decay=0.3 (twin: 5e-4)."""
    x, y = digits(image=True)
    m = cnn(seed=305, bn=False)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=0.3 if faulty else 5e-4)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt), steps=100)
