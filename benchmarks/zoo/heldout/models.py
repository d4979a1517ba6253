"""The held-out zoo's models: other architectures than the project zoo's (a 1-D conv net, an
EmbeddingBag text classifier, a moons MLP, a GRU regressor, a tiny batch-first transformer, a small
UNet-ish segmenter, a Friedman regression MLP). Each seeded; the faults change one thing in them."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["BagNet", "GRUReg", "SignalNet", "TinyTF", "UNetish", "friedman_mlp", "moon_mlp"]


class SignalNet(nn.Module):
    """Two 1-D convolutions over a signal, global average pooling, a linear head (4 classes)."""

    def __init__(self, seed: int = 0, act: type[nn.Module] = nn.ReLU, width: int = 16) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.features = nn.Sequential(nn.Conv1d(1, width, 7, padding=3), act(), nn.MaxPool1d(2),
                                      nn.Conv1d(width, 2 * width, 5, padding=2), act())
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(2 * width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.features(x)).flatten(1))


class BagNet(nn.Module):
    """Mean of word embeddings (EmbeddingBag), one hidden layer, 4 topics."""

    def __init__(self, vocab: int, seed: int = 0, dim: int = 48) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.bag = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.hidden = nn.Linear(dim, 64)
        self.act = nn.ReLU()
        self.out = nn.Linear(64, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.hidden(self.bag(ids))))


def moon_mlp(seed: int = 0, act: type[nn.Module] = nn.ReLU, width: int = 32, depth: int = 2, out: int = 2) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    d = 2
    for _ in range(depth):
        layers += [nn.Linear(d, width), act()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, out))


def friedman_mlp(seed: int = 0, d_in: int = 10) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 1))


class GRUReg(nn.Module):
    """A GRU over a series, a linear head on the last hidden state: the next value (N,)."""

    def __init__(self, seed: int = 0, hidden: int = 32, d_in: int = 1, batch_first: bool = True) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.batch_first = batch_first
        self.gru = nn.GRU(d_in, hidden, batch_first=batch_first)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(x)
        last = h[:, -1] if self.batch_first else h[-1]
        return self.head(last).squeeze(-1)


class TinyTF(nn.Module):
    """Token + position embeddings, one ``nn.TransformerEncoder`` layer (batch_first=True), mean pooling,
    a linear head (3 classes)."""

    def __init__(self, seed: int = 0, vocab: int = 16, d: int = 32, length: int = 12) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.02 * torch.randn(length, d))
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(d, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.tok(ids) + self.pos).mean(1))


class UNetish(nn.Module):
    """conv → (pool → conv → transposed conv) → concatenated skip → conv → 1×1 conv: one logit per pixel."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.enc = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU())
        self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.enc(x)
        return self.dec(torch.cat([skip, self.up(self.down(skip))], 1))
