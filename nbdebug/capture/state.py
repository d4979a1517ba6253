"""Leaving the model exactly as we found it.

:func:`preserve_buffers` wraps any forward pass nbdebug runs itself (BatchNorm running statistics
and every other buffer are restored bit for bit afterwards). :func:`fingerprint` is what tests
compare before and after a capture.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from .hooks import hook_count

__all__ = ["fingerprint", "preserve_buffers", "preserve_modes"]


@contextmanager
def preserve_buffers(model: nn.Module) -> Iterator[None]:
    """Run nbdebug's own forward passes without changing any buffer (e.g. BN running stats)."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, copy in saved:
                buf.copy_(copy)


@contextmanager
def preserve_modes(model: nn.Module) -> Iterator[None]:
    """Restore every submodule's ``training`` flag afterwards (for code that must switch it)."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for m, flag in modes:
            m.training = flag


def fingerprint(model: nn.Module) -> dict[str, Any]:
    """Everything a capture must not change, as comparable plain data (tensors cloned)."""
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "grads": {
            n: (None if p.grad is None else p.grad.detach().clone())
            for n, p in model.named_parameters()
        },
        "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
        "training": {n: m.training for n, m in model.named_modules()},
        "attrs": {n: sorted(vars(m)) for n, m in model.named_modules()},
        "hooks": hook_count(model),
    }


def same_fingerprint(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Differences between two fingerprints, as readable strings (empty list: identical)."""
    diffs: list[str] = []
    for key in ("requires_grad", "training", "attrs"):
        if a[key] != b[key]:
            diffs.append(key)
    if a["hooks"] != b["hooks"]:
        diffs.append(f"hooks {a['hooks']} -> {b['hooks']}")
    for key in ("params", "grads", "buffers"):
        if a[key].keys() != b[key].keys():
            diffs.append(f"{key} names")
            continue
        for name, x in a[key].items():
            y = b[key][name]
            if (x is None) != (y is None):
                diffs.append(f"{key}[{name}] None-ness")
            elif x is not None and not (x.shape == y.shape and torch.equal(x.nan_to_num(), y.nan_to_num()) and torch.equal(x.isnan(), y.isnan())):
                diffs.append(f"{key}[{name}] values")
    return diffs
