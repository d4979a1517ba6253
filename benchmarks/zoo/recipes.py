"""Healthy recipes people run on small data: each must leave the header quiet (no warning or error)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .base import Setup, batches, cnn, digits, first_batch, mlp, recipe, sgd_loop


@recipe("sgd_momentum_mlp")
def sgd_momentum_mlp() -> Setup:
    """digits MLP, SGD lr=0.05 momentum 0.9, batch 64."""
    x, y = digits()
    m = mlp(seed=100)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("adam_mlp")
def adam_mlp() -> Setup:
    """digits MLP, Adam lr=1e-3 (the issue's first false alarm)."""
    x, y = digits()
    m = mlp(seed=101)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("full_batch_sgd")
def full_batch_sgd() -> Setup:
    """digits MLP, full-batch SGD lr=0.1 (loss falls smoothly)."""
    x, y = digits()
    m = mlp(seed=102)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    return Setup(m, sgd_loop(m, opt, x, y, size=len(y)), (x, y, F.cross_entropy, opt))


@recipe("adamw_warmup_cosine")
def adamw_warmup_cosine() -> Setup:
    """digits MLP, AdamW lr=3e-3 wd 0.01, linear warmup 10 steps then cosine decay."""
    x, y = digits()
    m = mlp(hidden=128, seed=103)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01)
    total = 60
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / 10 if s < 10 else 0.5 * (1 + math.cos(math.pi * min(s - 10, total) / total)))
    return Setup(m, sgd_loop(m, opt, x, y, sched=sched), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("batchnorm_cnn_adam")
def batchnorm_cnn_adam() -> Setup:
    """digits BatchNorm CNN, Adam lr=2e-3 (the issue's second false alarm)."""
    x, y = digits(image=True)
    m = cnn(seed=104)
    opt = torch.optim.Adam(m.parameters(), lr=2e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("cnn_sgd_steplr")
def cnn_sgd_steplr() -> Setup:
    """digits CNN without BatchNorm, SGD lr=0.05 momentum 0.9 wd 5e-4, StepLR per epoch."""
    x, y = digits(image=True)
    m = cnn(seed=105, bn=False)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=28, gamma=0.5)
    return Setup(m, sgd_loop(m, opt, x, y, sched=sched), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("dropout_mlp")
def dropout_mlp() -> Setup:
    """digits MLP with Dropout(0.3) after each hidden layer, Adam lr=1e-3."""
    x, y = digits()
    torch.manual_seed(106)
    m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 64), nn.ReLU(), nn.Dropout(0.3),
                      nn.Linear(64, 10))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("label_smoothing")
def label_smoothing() -> Setup:
    """digits MLP, CrossEntropyLoss(label_smoothing=0.1), Adam lr=1e-3."""
    x, y = digits()
    m = mlp(seed=107)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y, loss_fn=loss_fn), (*first_batch(x, y), loss_fn, opt))


def _regression(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1024, 8, generator=g)
    t = torch.sin(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] + 0.3 * x[:, 3] + 0.05 * torch.randn(1024, generator=g)
    return x, ((t - t.mean()) / t.std()).unsqueeze(1)


@recipe("mse_regression")
def mse_regression() -> Setup:
    """an MLP regression on 8 standardised features, MSE, Adam lr=1e-3."""
    x, t = _regression(108)
    m = mlp(8, 64, 1, seed=108)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, t, loss_fn=F.mse_loss), (*first_batch(x, t), F.mse_loss, opt))


@recipe("huber_regression_sgd")
def huber_regression_sgd() -> Setup:
    """an MLP regression with Huber loss, SGD lr=0.01 momentum 0.9."""
    x, t = _regression(109)
    m = mlp(8, 32, 1, act=nn.Tanh, seed=109)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, t, loss_fn=F.huber_loss), (*first_batch(x, t), F.huber_loss, opt))


@recipe("logistic_bce")
def logistic_bce() -> Setup:
    """even vs odd digits, MLP with BCEWithLogitsLoss on raw logits, Adam lr=1e-3."""
    x, y = digits()
    t = (y % 2).float().unsqueeze(1)
    m = mlp(d_out=1, seed=110)
    loss_fn = nn.BCEWithLogitsLoss()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, t, loss_fn=loss_fn), (*first_batch(x, t), loss_fn, opt))


class RowLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(111)
        self.lstm = nn.LSTM(8, 64, batch_first=True)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x.reshape(-1, 8, 8))[0][:, -1])


@recipe("lstm_clipping")
def lstm_clipping() -> Setup:
    """an LSTM reading digit rows, Adam lr=3e-3, clip_grad_norm_(1.0)."""
    x, y = digits()
    m = RowLSTM()
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    return Setup(m, sgd_loop(m, opt, x, y, clip=1.0), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("gru_regression")
def gru_regression() -> Setup:
    """a GRU predicting the running mean of a noisy sequence, MSE, Adam lr=3e-3."""
    g = torch.Generator().manual_seed(112)
    x = torch.randn(1024, 16, 2, generator=g)
    t = x[:, :, :1].mean(1) * 4.0

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(112)
            self.gru = nn.GRU(2, 32, batch_first=True)
            self.head = nn.Linear(32, 1)

        def forward(self, v: torch.Tensor) -> torch.Tensor:
            return self.head(self.gru(v)[0][:, -1])

    m = Net()
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    return Setup(m, sgd_loop(m, opt, x, t, loss_fn=F.mse_loss), (*first_batch(x, t), F.mse_loss, opt))


@recipe("residual_layernorm_gelu")
def residual_layernorm_gelu() -> Setup:
    """a 4-block residual MLP (LayerNorm, GELU), AdamW lr=1e-3."""
    x, y = digits()

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.fc1, self.fc2 = nn.LayerNorm(64), nn.Linear(64, 128), nn.Linear(128, 64)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h + self.fc2(F.gelu(self.fc1(self.norm(h))))

    torch.manual_seed(113)
    m = nn.Sequential(nn.Linear(64, 64), *[Block() for _ in range(4)], nn.LayerNorm(64), nn.Linear(64, 10))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("transformer_batch_first")
def transformer_batch_first() -> Setup:
    """a one-layer TransformerEncoder (batch_first=True) over digit rows, AdamW lr=1e-3, clipping 1.0."""
    from .mixing import RowTransformer

    x, y = digits()
    m = RowTransformer(batch_first=True)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y, clip=1.0), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("frozen_body")
def frozen_body() -> Setup:
    """transfer learning: body frozen on purpose (requires_grad_(False)), only the head optimised."""
    x, y = digits()
    m = mlp(seed=114)
    for layer in m[:-1]:
        layer.requires_grad_(False)
    opt = torch.optim.Adam(m[-1].parameters(), lr=1e-2)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("grad_accumulation")
def grad_accumulation() -> Setup:
    """gradient accumulation on purpose: 4 micro-batches of 16 per optimizer step, loss / 4."""
    x, y = digits()
    m = mlp(seed=115)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    nxt = batches(len(y), 16, 115)

    def loop(n: int) -> None:
        m.train()
        opt.zero_grad()
        for k in range(n):
            i = nxt()
            (F.cross_entropy(m(x[i]), y[i]) / 4).backward()
            if (k + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()

    return Setup(m, loop, (*first_batch(x, y), F.cross_entropy, opt), steps=120)


@recipe("autocast_bf16_scaler")
def autocast_bf16_scaler() -> Setup:
    """autocast(cpu, bfloat16) forward with a GradScaler-style loop (torch.amp.GradScaler, disabled on CPU)."""
    x, y = digits(image=True)
    m = cnn(seed=116)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    nxt = batches(len(y), 64, 116)

    def loop(n: int) -> None:
        m.train()
        for _ in range(n):
            i = nxt()
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(m(x[i]), y[i])
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()

    return Setup(m, loop, (*first_batch(x, y), F.cross_entropy, opt))


@recipe("gan_two_optimizers")
def gan_two_optimizers() -> Setup:
    """a small GAN on 2-D points: generator and discriminator, two Adam optimizers (betas 0.5, 0.999)."""
    torch.manual_seed(117)

    class GAN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.G = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
            self.D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))

    m = GAN()
    opt_g = torch.optim.Adam(m.G.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(m.D.parameters(), lr=1e-3, betas=(0.5, 0.999))
    g = torch.Generator().manual_seed(117)
    bce = nn.BCEWithLogitsLoss()

    def loop(n: int) -> None:
        for _ in range(n):
            angle = torch.rand(64, generator=g) * 2 * math.pi
            real = torch.stack([angle.cos(), angle.sin()], 1) + 0.05 * torch.randn(64, 2, generator=g)
            fake = m.G(torch.randn(64, 4, generator=g))
            opt_d.zero_grad()
            d_loss = bce(m.D(real), torch.ones(64, 1)) + bce(m.D(fake.detach()), torch.zeros(64, 1))
            d_loss.backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(m.D(fake), torch.ones(64, 1)).backward()
            opt_g.step()

    return Setup(m, loop, None)
