"""Leaving the model exactly as we found it.

:func:`preserve_buffers` wraps any forward pass nbdebug runs itself: it runs on clones of the
buffers (BatchNorm running statistics and every other buffer stay untouched, version counters
included, so a graph the user still holds can be backpropagated). :func:`fingerprint` is what tests
compare before and after a capture.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from .hooks import hook_count

__all__ = ["fingerprint", "preserve_buffers", "preserve_modes", "suspend_hooks", "user_hook_count"]

#: the per-module hook tables a forward/backward pass consults
_HOOK_TABLES = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


def user_hook_count(model: nn.Module) -> int:
    """Forward/backward hooks on ``model`` and its submodules (the ones :func:`suspend_hooks` sets aside)."""
    return sum(len(getattr(m, "_forward_hooks", {})) + len(getattr(m, "_forward_pre_hooks", {}))
               + len(getattr(m, "_backward_hooks", {})) + len(getattr(m, "_backward_pre_hooks", {}))
               for m in model.modules())


@contextmanager
def suspend_hooks(model: nn.Module) -> Iterator[None]:
    """Set the user's module hooks aside for nbdebug's own passes, and put the same tables back.

    A re-run of nbdebug's must not call the user's hooks again (a hook that records activations
    would see extra calls the cell never made). Inside the block every module has empty hook
    tables (hooks nbdebug registers there are dropped with them); afterwards the original table
    objects are back, so the user's handles still remove their hooks. Global module hooks
    (``register_module_forward_hook``) are left alone.
    """
    saved: list[tuple[nn.Module, str, Any]] = []
    try:
        for m in model.modules():
            for attr in _HOOK_TABLES:
                table = m.__dict__.get(attr)
                if table is not None and len(table):
                    saved.append((m, attr, table))
                    m.__dict__[attr] = type(table)()
        yield
    finally:
        for m, attr, table in saved:
            m.__dict__[attr] = table



def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter, or None for inference tensors (they have none)."""
    try:
        return int(t._version)
    except RuntimeError:
        return None


@contextmanager
def preserve_buffers(model: nn.Module) -> Iterator[None]:
    """Run nbdebug's own forward passes on clones of every buffer, so the originals are never touched.

    Inside the block each module's buffers (BatchNorm running statistics, ``num_batches_tracked``,
    caches...) are swapped for clones (a buffer shared by several modules gets one shared clone);
    afterwards the original tensor objects are put back. Nothing is copied back into them, so their
    version counters do not move and an autograd graph the user still holds (BatchNorm in training
    mode saves its running statistics for backward) stays valid. A forward that mutates a buffer
    through a reference of its own (not through the module) is caught as a safety net: that buffer
    is restored bit for bit from a copy (which does bump its version, unavoidably).
    """
    owners: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    clones: dict[int, torch.Tensor] = {}
    for m in model.modules():
        for name, buf in m._buffers.items():
            if buf is None:
                continue
            if id(buf) not in clones:
                with torch.inference_mode(buf.is_inference()):
                    clones[id(buf)] = buf.detach().clone()
            owners.append((m._buffers, name, buf))
    originals = {id(b): b for _, _, b in owners}
    versions = {key: _version(b) for key, b in originals.items()}
    pristine = {key: c.clone() for key, c in clones.items()}  # the safety net's copy (buffers are small)
    try:
        for table, name, buf in owners:
            table[name] = clones[id(buf)]
        yield
    finally:
        for table, name, buf in owners:
            table[name] = buf
        with torch.no_grad():
            for key, buf in originals.items():
                if versions[key] is None:  # inference tensor: compare values instead
                    if not torch.equal(buf, pristine[key]):
                        with torch.inference_mode():
                            buf.copy_(pristine[key])
                elif _version(buf) != versions[key]:  # mutated behind the module's back
                    buf.copy_(pristine[key])


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
