"""Healthy recipes whose loss is unusual for the findings (review 26 R11; nothing may fire on them): a loss negative
by design (a heteroscedastic regression's Gaussian NLL, a policy gradient on a bandit, a SimSiam-style −cosine) and a
summed multi-label BCE on a Sigmoid head (far above cross-entropy's range on probabilities)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Setup, batches, digits, first_batch, mlp, recipe, sgd_loop


def _gaussian_nll(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.gaussian_nll_loss(out[:, 0], t, out[:, 1].exp())


@recipe("gaussian_nll_regression")
def gaussian_nll_regression() -> Setup:
    """digits → the digit's value (standardised) with a (mean, log-variance) head, F.gaussian_nll_loss, Adam lr=3e-3:
    the loss goes negative as the predicted variance shrinks."""
    x, y = digits()
    t = (y.float() - 4.5) / 2.9
    m = mlp(d_out=2, seed=300)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    return Setup(m, sgd_loop(m, opt, x, t, loss_fn=_gaussian_nll), (*first_batch(x, t), _gaussian_nll, opt), steps=120)


@recipe("reinforce_bandit")
def reinforce_bandit() -> Setup:
    """a contextual bandit on digits (reward 1 for the right class): REINFORCE with a mean baseline,
    −(log π(a)·(r − r̄)).mean() on N×10 logits, Adam lr=3e-3 (the loss is negative about half the time)."""
    x, y = digits()
    m = mlp(seed=301)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    nxt = batches(len(y), 64, 301)
    g = torch.Generator().manual_seed(301)

    def loop(n: int) -> None:
        m.train()
        for _ in range(n):
            i = nxt()
            logits = m(x[i])
            p = logits.softmax(-1)
            a = torch.multinomial(p.detach(), 1, generator=g).squeeze(1)
            r = (a == y[i]).float()
            loss = -(torch.log_softmax(logits, -1).gather(1, a[:, None]).squeeze(1) * (r - r.mean())).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    return Setup(m, loop, None, steps=100)


class SimSiam(nn.Module):
    """An MLP encoder with a projector and a predictor: −cosine between one view's prediction and the other's
    (stop-gradient) projection, symmetrised."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(302)
        self.enc = nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 32))
        self.pred = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.enc(x)
        return torch.stack([z, self.pred(z)], 1)  # (N, 2, 32): projection and prediction


def _neg_cosine(out: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    n = len(out) // 2
    z1, z2, p1, p2 = out[:n, 0], out[n:, 0], out[:n, 1], out[n:, 1]
    return -(F.cosine_similarity(p1, z2.detach()).mean() + F.cosine_similarity(p2, z1.detach()).mean()) / 2


@recipe("simsiam_cosine")
def simsiam_cosine() -> Setup:
    """SimSiam-style self-supervision on digits: two noisy views per batch in one forward, −cosine with stop-gradient,
    Adam lr=3e-3 (the loss starts near 0 and goes to about −1)."""
    x, y = digits()
    m = SimSiam()
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    nxt = batches(len(y), 64, 302)
    g = torch.Generator().manual_seed(302)

    def loop(n: int) -> None:
        m.train()
        for _ in range(n):
            xb = x[nxt()]
            views = torch.cat([xb + 0.3 * torch.randn(xb.shape, generator=g), xb + 0.3 * torch.randn(xb.shape, generator=g)])
            loss = _neg_cosine(m(views), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    return Setup(m, loop, None, steps=80)


def _bce_sum(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy(out, t, reduction="sum")


@recipe("multilabel_bce_sum")
def multilabel_bce_sum() -> Setup:
    """digits → 4 labels at once (even, ≥ 5, prime, has a loop), an MLP ending in nn.Sigmoid, BCELoss(reduction="sum"),
    Adam lr=1e-3."""
    x, y = digits()
    t = torch.stack([y % 2 == 0, y >= 5, (y == 2) | (y == 3) | (y == 5) | (y == 7),
                     (y == 0) | (y == 6) | (y == 8) | (y == 9)], 1).float()
    torch.manual_seed(303)
    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4), nn.Sigmoid())
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, t, loss_fn=_bce_sum), (*first_batch(x, t), _bce_sum, opt), steps=80)
