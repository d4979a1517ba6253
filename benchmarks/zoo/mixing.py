"""Samples mixed across the batch: softmax over dim 0, a reshape that interleaves samples, a
TransformerEncoderLayer fed (B, T, D) without batch_first; and a healthy normalisation over the batch written by hand."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Setup, digits, fault, first_batch, mlp, recipe, sgd_loop
from .classes import BATCH_MIXED


@fault(BATCH_MIXED, "softmax_over_batch", doctor=("batch_independence",))
def softmax_over_batch(faulty: bool) -> Setup:
    """log_softmax over dim 0 (the batch) before nll_loss (twin: dim 1)."""
    x, y = digits()
    m = mlp(seed=70)
    m.append(nn.LogSoftmax(dim=0 if faulty else 1))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y, loss_fn=F.nll_loss), (*first_batch(x, y), F.nll_loss, opt))


class RowsNet(nn.Module):
    """Digit rows embedded one by one, then the rows flattened per sample into an MLP head; ``mix``: the
    (B, 8, 16) features reshaped to (8, B, 16) where a transpose was meant, so each "sample" of the head
    holds rows of 8 different digits."""

    def __init__(self, mix: bool) -> None:
        super().__init__()
        torch.manual_seed(71)
        self.embed = nn.Linear(8, 16)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
        self.mix = mix

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.reshape(-1, 8, 8))  # B × rows × 16
        rows_first = h.reshape(8, -1, 16) if self.mix else h.transpose(0, 1)  # rows × B × 16
        return self.head(rows_first.transpose(0, 1).reshape(h.shape[0], 128))


@fault(BATCH_MIXED, "reshape_mixes_samples", doctor=("batch_independence",))
def reshape_mixes_samples(faulty: bool) -> Setup:
    """(B, T, D) reshaped to (T, B, D) where a transpose was meant: samples mixed (twin: transpose)."""
    x, y = digits()
    m = RowsNet(faulty)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


class RowTransformer(nn.Module):
    """Digit rows as 8 tokens of 8 pixels through a one-layer TransformerEncoder, mean-pooled (built, as in
    a notebook, before the cell that trains it: PyTorch's "batch_first was not True" warning is raised here)."""

    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        torch.manual_seed(72)
        self.embed = nn.Linear(8, 32)
        self.pos = nn.Parameter(0.02 * torch.randn(8, 32))
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=batch_first)
        self.layer = nn.TransformerEncoder(layer, 1)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.reshape(-1, 8, 8)) + self.pos  # (B, T, D), fed as is
        return self.head(self.layer(h).mean(1))


@fault(BATCH_MIXED, "transformer_without_batch_first", also=("torch_warning",), doctor=("batch_independence",))
def transformer_without_batch_first(faulty: bool) -> Setup:
    """a TransformerEncoder (batch_first=False) fed (B, T, D): attention runs across samples (twin: batch_first=True)."""
    x, y = digits()
    m = RowTransformer(batch_first=not faulty)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@recipe("batch_standardise_by_hand")
def batch_standardise_by_hand() -> Setup:
    """a hand-written normalisation over the batch, (h − h.mean(0)) / h.std(0), as BatchNorm does in train mode.
    Round 5 (h-ddata): this was the fault ``batch_stats_in_eval`` (twin: over the features of each sample); it does
    no harm in the run (it learns as its twin: 0.46 vs 0.42 of its start) and the held-out zoo writes the same on
    purpose, so it is a healthy recipe: the batch probe says it as a note (``batch_stats``), not ``batch_mixed``."""
    x, y = digits()

    class Norm(nn.Module):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return (h - h.mean(0, keepdim=True)) / (h.std(0, keepdim=True) + 1e-5)

    torch.manual_seed(73)
    m = nn.Sequential(nn.Linear(64, 64), Norm(), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))
