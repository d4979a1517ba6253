"""Tiny models for the real-use matrix (tens of KB, random init, seeded, nothing downloaded).

``TinyCNN`` has BatchNorm (train mode by default), ReLU and one *shared* ``relu`` module called
twice per forward, so every view must name its calls ``relu`` and ``relu#2``. Optional variants:
part of the forward under ``torch.utils.checkpoint`` (``ckpt=True/False`` = ``use_reentrant``),
integer/bool outputs (``int_outputs=True``: a ``mask`` module with a bool output that is all
False, and an ``argmax`` module whose int64 prediction the model returns next to its logits).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

#: input of the CNN views: a batch of two 3×8×8 images
IMAGE_SHAPE = (2, 3, 8, 8)
N_CLASSES = 5
#: every leaf module call of TinyCNN in one forward, in the order they complete
CNN_ROWS = ["conv1", "bn", "relu", "conv2", "relu#2", "pool", "flat", "drop", "fc"]
#: the rows with a spatial (B×C×H×W) output
CNN_SPATIAL = ["conv1", "bn", "relu", "conv2", "relu#2"]
#: prompt length and number of generated tokens of the language cells
PROMPT_LEN = 7
NEW_TOKENS = 6
VOCAB = 64


class Gt(nn.Module):
    """``x > threshold`` as a module (a bool output)."""

    def __init__(self, threshold: float) -> None:
        super().__init__()
        self.threshold = threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x > self.threshold


class Argmax(nn.Module):
    """Index of the largest class score (an int64 output)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.argmax(dim=1)


class TinyCNN(nn.Module):
    """conv1 → bn → relu → conv2 → relu (the same module again) → pool → flat → fc."""

    def __init__(self, ckpt: bool | None = None, int_outputs: bool = False, interrupt: bool = False, dropout: bool = False,
                 inplace: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=inplace)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flat = nn.Flatten()
        self.fc = nn.Linear(6, N_CLASSES)
        self.drop = nn.Dropout(0.5) if dropout else nn.Identity()
        self.ckpt = ckpt
        self.int_outputs = int_outputs
        self.interrupt = interrupt  # the user's own code stops the forward right after conv2
        if int_outputs:
            self.mask = Gt(1e3)  # outliers to clip: none in practice, so the bool output is all False
            self.argmax = Argmax()

    def _stage2(self, h: torch.Tensor) -> torch.Tensor:
        h = self.conv2(h)
        if self.interrupt:
            raise KeyboardInterrupt("raised inside the model's forward")
        return self.relu(h)

    def forward(self, x: torch.Tensor) -> Any:
        h = self.relu(self.bn(self.conv1(x)))
        if self.ckpt is None:
            h = self._stage2(h)
        else:
            h = checkpoint(self._stage2, h, use_reentrant=self.ckpt)
        if self.int_outputs:
            h = h.masked_fill(self.mask(h), 0.0)
        logits = self.fc(self.drop(self.flat(self.pool(h))))
        if self.int_outputs:
            return logits, self.argmax(logits)
        return logits


def tiny_cnn(**kw: Any) -> TinyCNN:
    torch.manual_seed(0)
    return TinyCNN(**kw).train()


def image(hw: tuple[int, int] = IMAGE_SHAPE[2:]) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(*IMAGE_SHAPE[:2], *hw, generator=g)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def shape_error_cnn() -> nn.Module:
    """The beginner's error of issue 9 item 11: ``head`` expects 512 features, ``flat`` gives 800."""
    from collections import OrderedDict

    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(conv=nn.Conv2d(3, 8, 3), relu=nn.ReLU(), flat=nn.Flatten(), head=nn.Linear(512, 10)))


def tiny_lm(family: str) -> nn.Module:
    """A 2-layer, 2-head, d=16 random GPT-2 or Llama (nbdebug.adapters.offline.tiny_lm), eval mode."""
    from nbdebug.adapters.offline import tiny_lm as build

    logging.getLogger("transformers").setLevel(logging.ERROR)
    return build(family, vocab=VOCAB)


def prompt() -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    return torch.randint(1, VOCAB, (1, PROMPT_LEN), generator=g)
