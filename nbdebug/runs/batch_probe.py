"""Does a sample's output depend on the other samples of its batch? One probe, run once after a training cell.

The model's last call is run twice more as nbdebug's own passes (:func:`~nbdebug.runs.own.own_pass`: no
grad, buffers cloned, RNG forked, the user's hooks set aside) in eval mode (BatchNorm on its running
statistics, dropout off: the modes are put back afterwards; so are attributes a forward rebinds): on the whole batch and on its first half.
Every tensor argument whose first dimension is the batch (the output's first dimension, also the first
tensor argument's) is cut to its first half. A model whose samples are independent gives the first
half the same outputs both times (up to float rounding: ≤ 1e-6 of the output's scale on the zoo's
healthy runs); a reshape that interleaves samples, a transformer layer fed (B, T, D) while it expects
(T, B, D), a normalisation over the batch at eval change them by tens of percent.

>>> batch_probe(model, ((x,), {}))                        # doctest: +SKIP
{'batch': 64, 'half': 32, 'change': 0.93}
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from ..adapters.outputs import logits_of
from ..capture.state import offloaded, preserve_modes
from .own import own_pass

__all__ = ["MIN_BATCH", "attributes_kept", "batch_of", "batch_probe", "batch_rest", "plain"]

#: fewest samples for the probe (each half needs ≥ 2: a statistic over one sample is no batch)
MIN_BATCH = 4


def _output(out: Any) -> torch.Tensor | None:
    t = logits_of(out)
    return t if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 1 else None


@contextmanager
def attributes_kept(model: nn.Module) -> Iterator[None]:
    """Every module's attributes as bound before the block, put back after it: a forward that stashes what it
    saw (``self.last_attn = a``) keeps the user's last call's, not the probe's (an attribute the block added
    is removed). In-place changes of a kept object (``self.seen.append(x)``) are not undone."""
    saved = [(m, dict(m.__dict__)) for m in model.modules()]
    try:
        yield
    finally:
        for m, before in saved:
            d = m.__dict__
            for k in [k for k in d if k not in before]:
                del d[k]
            for k, v in before.items():
                if d.get(k, _MISSING) is not v:
                    d[k] = v


_MISSING = object()


def _differ(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do two outputs of the same samples differ beyond float rounding (one host read)?"""
    a, b = a.detach().float(), b.detach().float()
    return bool(((a - b).abs().max() > 1e-5 * a.abs().max().clamp_min(1e-30)).item())


def plain(model: nn.Module) -> bool:
    """A model the probe may run again cheaply on this process alone: not wrapped for several processes (DDP,
    FSDP: a forward can need the other ranks), not compiled (half a batch would recompile), no weights
    offloaded or on the meta device (accelerate would load them again). ``module.compile()`` compiles in place
    (the type stays, torch sets ``_compiled_call_impl``): compiled too."""
    wrapped = ("DistributedDataParallel", "FullyShardedDataParallel", "OptimizedModule")
    if any(type(m).__name__ in wrapped or getattr(m, "_compiled_call_impl", None) is not None for m in model.modules()):
        return False
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    return not any(offloaded(m) for m in model.modules()) and not any(p.is_meta for p in model.parameters())


def batch_probe(model: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]]) -> dict[str, Any] | None:
    """``{"batch": B, "half": B // 2, "change": max |Δ output| / max |output|}`` over the first half of
    the batch between the whole batch and the half alone (see the module docstring); None when the
    call cannot be probed (a distributed, compiled or offloaded model; no tensor input with a batch of
    ≥ :data:`MIN_BATCH`; an output of another batch size; a non-finite output; the model raising on
    half a batch; or, when the half changed, the whole batch not giving itself back on a second pass:
    a forward that draws noise in eval mode, where mixing cannot be told from the noise). After a cell the
    recorder runs :func:`~nbdebug.runs.output_probe.probes_after_cell` instead: its whole-batch pass serves
    the output probe too."""
    if not plain(model) or batch_of(inputs) is None:
        return None
    args, kwargs = inputs
    try:
        with own_pass(model), preserve_modes(model), attributes_kept(model):
            model.eval()
            return batch_rest(model, inputs, model(*args, **kwargs))
    except Exception:  # a model that cannot be run again here: no probe
        return None


def batch_of(inputs: tuple[tuple[Any, ...], dict[str, Any]]) -> int | None:
    """The batch size of a call (the first tensor argument's first dimension), None below :data:`MIN_BATCH`."""
    leaves = [t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor) and t.dim() >= 1]
    return int(leaves[0].shape[0]) if leaves and leaves[0].shape[0] >= MIN_BATCH else None


def batch_rest(model: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]], raw: Any) -> dict[str, Any] | None:
    """The batch probe given ``raw``, the whole batch's output of an own pass in eval mode: the half batch (and,
    when it changed, the whole batch again and fed twice over). Call it inside that own pass (the caller's
    ``own_pass``, ``preserve_modes``, ``attributes_kept`` and ``eval()``); None as :func:`batch_probe`."""
    b = batch_of(inputs)
    full = _output(raw)
    if b is None or full is None or full.shape[0] != b:
        return None
    args, kwargs = inputs
    half = b // 2

    def cut(t: Any) -> Any:
        return t[:half] if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == b else t

    def twice(t: Any) -> Any:  # every sample of the batch fed twice over
        return torch.cat([t, t]) if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == b else t

    dup: float | None = None
    try:
        h_args, h_kwargs = tree_map(cut, (tuple(args), dict(kwargs)))
        part = _output(model(*h_args, **h_kwargs))
        if part is not None and part.shape == full[:half].shape and _differ(full[:half], part):
            # a change: first ask whether the whole batch gives itself back (a forward that draws noise
            # in eval, a VAE's reparameterisation, cannot tell mixing from noise: no probe)
            again = _output(model(*args, **kwargs))
            if again is None or again.shape != full.shape or _differ(full, again):
                return None
            dup = _duplicated(model, full, tree_map(twice, (tuple(args), dict(kwargs))))
    except Exception:  # a model that cannot run on half its batch (a fixed batch size, a stateful buffer): no probe
        return None
    if part is None or part.shape != full[:half].shape:
        return None
    change = _change(full[:half], part)
    if change is None:
        return None
    out: dict[str, Any] = {"batch": b, "half": half, "change": change}
    if dup is not None:
        # the whole batch fed twice over: statistics over the batch (mean, std) barely move, a reshape or a sum over the
        # batch does; a seq-first layer (batch_first=False) fed the batch first is named whatever this says
        out["duplicated"] = dup
        out["seq_first"] = any(isinstance(m, (nn.MultiheadAttention, nn.RNNBase)) and not m.batch_first for m in model.modules())
    return out


def _duplicated(model: nn.Module, full: torch.Tensor, inputs: tuple[tuple[Any, ...], dict[str, Any]]) -> float | None:
    """The change of the batch's outputs when every sample is fed twice over (None: the model cannot run on it)."""
    try:
        both = _output(model(*inputs[0], **inputs[1]))
    except Exception:  # a fixed batch size: the probe stands without this
        return None
    b = full.shape[0]
    return _change(full, both[:b]) if both is not None and both.shape[0] == 2 * b else None


def _change(full: torch.Tensor, part: torch.Tensor) -> float | None:
    """max |Δ| / max |full| of two outputs of the same samples (None: not finite, or a zero output)."""
    a, c = full.detach().float(), part.detach().float()
    scale = float(a.abs().max())
    if not (math.isfinite(scale) and bool(torch.isfinite(c).all())) or scale == 0:
        return None
    return float((a - c).abs().max()) / scale
