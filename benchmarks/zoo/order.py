"""The batch order (h-shuffle): a second fault of the "data not shuffled" class (a CNN fed the digits class after
class, its twin shuffled) and healthy recipes built to fool a "one class per batch" rule — binary data at 90/10
(most batches nearly all one class, shuffled), batches of 4 samples of 10 classes (a batch of one class by chance
now and then), and a model whose head predicts one class for every batch at init."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Setup, cnn, digits, fault, first_batch, mlp, recipe, sgd_loop
from .classes import UNSHUFFLED


@fault(UNSHUFFLED, "cnn_sorted_by_class")
def cnn_sorted_by_class(faulty: bool) -> Setup:
    """a BatchNorm digits CNN, Adam lr=2e-3, batches of 32 read class after class as the files come (twin:
    shuffled per epoch)."""
    x, y = digits(image=True, sort=True)
    m = cnn(seed=401)
    opt = torch.optim.Adam(m.parameters(), lr=2e-3)
    return Setup(m, sgd_loop(m, opt, x, y, size=32, shuffle=not faulty), (*first_batch(x, y), F.cross_entropy, opt),
                 steps=100)


@recipe("imbalanced_binary")
def imbalanced_binary() -> Setup:
    """two Gaussian blobs at 90/10 (fraud-like), a 2-logit MLP, cross-entropy, SGD momentum, batches of 32
    shuffled: most batches are nearly all the majority class."""
    g = torch.Generator().manual_seed(402)
    n = 2000
    y = (torch.rand(n, generator=g) < 0.1).long()
    x = torch.randn(n, 16, generator=g) + 1.2 * y[:, None].float() * torch.linspace(-1, 1, 16)
    m = mlp(16, 32, 2, seed=402)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y, size=32), (*first_batch(x, y), F.cross_entropy, opt), steps=120)


@recipe("tiny_batches")
def tiny_batches() -> Setup:
    """a digits MLP on batches of 4 (10 classes), SGD lr=0.02 + momentum, shuffled: batches of one class by chance."""
    x, y = digits()
    m = mlp(seed=403)
    opt = torch.optim.SGD(m.parameters(), lr=0.02, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y, size=4), (*first_batch(x, y, size=4), F.cross_entropy, opt), steps=200)


@recipe("one_class_at_init")
def one_class_at_init() -> Setup:
    """a digits MLP whose head's bias favours class 3 by 6 logits (every sample of every batch predicted 3 at init),
    Adam lr=1e-3, shuffled: it learns its way out."""
    x, y = digits()
    m = mlp(seed=404)
    with torch.no_grad():
        head = m[-1]
        assert isinstance(head, nn.Linear)
        head.bias[3] += 6.0
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt), steps=100)
