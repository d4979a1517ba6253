"""The held-out zoo's data and its loop: other data than the project zoo's (synthetic 1-D signals,
windows of words from ``pydoc_data``, sklearn's ``make_moons``/``make_regression``/``make_friedman1``,
token sequences, noisy sine series, digit images as segmentation masks), and one training loop that
keeps its losses (``Setup.keep["losses"]``) so ``curves.py`` can check each fault harms and each twin
learns. Everything seeded, CPU seconds, nothing downloaded."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..base import Setup

__all__ = ["Setup", "counts", "friedman", "moons", "segmentation", "series", "signals", "tokens", "train", "words"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@functools.cache
def _signals(n: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    t = torch.arange(length, dtype=torch.float32)
    freq = (y.float() + 1.0) * 0.05  # class k: a sine of frequency (k+1)/20 cycles per sample
    phase = torch.rand(n, 1, generator=g) * 6.283
    amp = 0.5 + torch.rand(n, 1, generator=g)
    x = amp * torch.sin(6.283 * freq[:, None] * t[None] + phase) + 0.5 * torch.randn(n, length, generator=g)
    return x[:, None, :], y


def signals(n: int = 1024, length: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy sines of 4 frequencies (N×1×L, labels 0–3), zero mean, unit-ish scale."""
    x, y = _signals(n, length, seed)
    return x.clone(), y.clone()


@functools.lru_cache(maxsize=1)
def _words() -> tuple[list[list[int]], list[int], int]:
    from pydoc_data.topics import topics

    names = ("specialnames", "compound", "formatstrings", "debugger")
    toks = [re.findall(r"[a-z_]+", topics[k].lower()) for k in names]
    freq: dict[str, int] = {}
    for ws in toks:
        for w in ws:
            freq[w] = freq.get(w, 0) + 1
    vocab = {w: i + 1 for i, w in enumerate(sorted(freq, key=lambda w: (-freq[w], w))[:1500])}  # 0: unknown
    docs, labels = [], []
    for label, ws in enumerate(toks):
        ids = [vocab.get(w, 0) for w in ws]
        for at in range(0, len(ids) - 16, 8):
            docs.append(ids[at:at + 16])
            labels.append(label)
    return docs, labels, len(vocab) + 1


def words(*, grouped: bool = False) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Windows of 16 words from 4 pydoc topics (N×16 ids, labels = topic, vocabulary size); shuffled
    once (seeded) unless ``grouped`` (topic after topic, as the text comes)."""
    docs, labels, v = _words()
    x, y = torch.tensor(docs), torch.tensor(labels)
    if not grouped:
        p = torch.randperm(len(y), generator=_gen(1))
        x, y = x[p], y[p]
    return x, y, v


def moons(n: int = 1000, noise: float = 0.2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """sklearn make_moons, standardised (N×2 float, labels 0/1 long)."""
    from sklearn.datasets import make_moons

    a, b = make_moons(n, noise=noise, random_state=seed)
    x = torch.tensor(a, dtype=torch.float32)
    return (x - x.mean(0)) / x.std(0), torch.tensor(b)


def friedman(n: int = 1024, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """sklearn make_friedman1 regression (10 features in [0, 1], 5 used), target standardised (N,)."""
    from sklearn.datasets import make_friedman1

    a, b = make_friedman1(n, noise=0.5, random_state=seed)
    y = torch.tensor(b, dtype=torch.float32)
    return torch.tensor(a, dtype=torch.float32), (y - y.mean()) / y.std()


def counts(n: int = 1024, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Poisson counts from 6 standardised features (log-rate linear in them): N×6, N float counts ≥ 0."""
    g = _gen(seed)
    x = torch.randn(n, 6, generator=g)
    rate = torch.exp(0.8 + x @ torch.tensor([0.5, -0.4, 0.3, 0.0, 0.2, -0.3]))
    return x, torch.poisson(rate, generator=g)


def series(n: int = 768, length: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy sine series (N×L×1) and the next clean value (N,), for a recurrent regressor."""
    g = _gen(seed)
    freq = 0.05 + 0.2 * torch.rand(n, 1, generator=g)
    phase = torch.rand(n, 1, generator=g) * 6.283
    t = torch.arange(length + 1, dtype=torch.float32)
    clean = torch.sin(6.283 * freq * t + phase)
    x = clean[:, :length] + 0.1 * torch.randn(n, length, generator=g)
    return x[..., None], clean[:, length]


def tokens(n: int = 1024, length: int = 12, vocab: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences; label: which of tokens 1, 2, 3 occurs most (ties broken by the lower id)."""
    g = _gen(seed)
    x = torch.randint(0, vocab, (n, length), generator=g)
    c = torch.stack([(x == k).sum(1) for k in (1, 2, 3)], 1).float() - 0.01 * torch.arange(3)
    return x, c.argmax(1)


def segmentation() -> tuple[torch.Tensor, torch.Tensor]:
    """Digit images (N×1×8×8 in [0, 1], with noise) and their ink masks (pixel > 8 of 16) to segment."""
    from sklearn.datasets import load_digits

    d = torch.tensor(load_digits().data, dtype=torch.float32).reshape(-1, 1, 8, 8)
    noisy = d / 16 + 0.3 * torch.randn(d.shape, generator=_gen(2))
    return noisy, (d > 8).float()


def train(model: nn.Module, opt: Any, x: Any, y: torch.Tensor, loss_fn: Callable[..., torch.Tensor], *,
          bs: int = 32, seed: int = 0, order: str = "zfbs", clip: float | None = None, sched: Any = None,
          sched_every: int = 1, forward: Callable[[Any], torch.Tensor] | None = None, shuffle: bool = True,
          drop_last: bool = True, steps: int = 80, doctor: bool = True, keep: dict[str, Any] | None = None) -> Setup:
    """A user's loop over a seeded DataLoader-like index stream: per batch the calls in ``order``
    (z zero_grad, f forward+loss, b backward, c clip, s step, S scheduler step; without S in
    ``order`` the scheduler steps after every ``sched_every`` batches); losses kept (as tensors: no sync) in ``keep["losses"]``."""
    losses: list[torch.Tensor] = []
    n = len(y)
    g = _gen(seed)
    state: dict[str, Any] = {"batches": [], "t": 0}
    fwd = forward or model

    def next_batch() -> torch.Tensor:
        if not state["batches"]:
            idx = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
            cut = list(idx.split(bs))
            if drop_last and len(cut[-1]) < bs:
                cut.pop()
            state["batches"] = cut
        return state["batches"].pop(0)

    def loop(k: int) -> None:
        model.train()
        for _ in range(k):
            i = next_batch()
            loss = None
            for c in order:
                if c == "z":
                    opt.zero_grad()
                elif c == "f":
                    loss = loss_fn(fwd(x[i]), y[i])
                    losses.append(loss.detach())
                elif c == "b":
                    loss.backward()
                elif c == "c" and clip is not None:
                    nn.utils.clip_grad_norm_(model.parameters(), clip)
                elif c == "s":
                    opt.step()
                elif c == "S":
                    sched.step()
            state["t"] += 1
            if sched is not None and "S" not in order and state["t"] % sched_every == 0:
                sched.step()

    first = torch.randperm(n, generator=_gen(seed + 1000))[:bs]
    doc = (x[first], y[first], loss_fn, opt) if doctor and forward is None else None
    return Setup(model, loop, doc, steps, keep={**(keep or {}), "losses": losses})


def ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y)
