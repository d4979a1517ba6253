"""``nbdebug.ablate``, ``nbdebug.steer`` and ``nbdebug.steering_vector``: change what a model computes
while a ``with`` block runs (every forward and ``generate()`` step inside it), and nothing after.

Arguments after the model (and, for ``steering_vector``, its prompts) are keywords; a layer is named
one way everywhere: a module name (``"model.layers.10"``, a call name ``"relu#2"`` for ``ablate``), the
module itself, or an index into the model's blocks (``layer=10``).

Zero ablation sets the targeted units to 0. Mean ablation (``mode="mean"``) replaces them by their
mean over every axis but the unit's own (batch, positions, and the spatial axes of a conv channel):
over the ``mean_over=`` inputs when given (one pass of nbdebug's own at entry), else over the very
activation being replaced at each call (position-independent, as in TransformerLens' mean
ablation over a batch; for one-token ``generate()`` steps pass ``mean_over=``, or the "mean" is the
token itself). Steering adds ``alpha * vector`` to a layer's output (the residual stream after a
block) at every position, or at the absolute ``positions`` given (counted across ``generate()``
steps from the cache length).

>>> with nbdebug.ablate(model, heads={3: [5]}):                       # doctest: +SKIP
...     logits = model(ids).logits
>>> v = nbdebug.steering_vector(model, ["Love"], ["Hate"], layer="model.layers.10", tokenizer=tok)
>>> with nbdebug.steer(model, layer="model.layers.10", vector=v, alpha=4.0):
...     out = model.generate(ids, max_new_tokens=20)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..adapters.blockparts import patch_parts
from ..adapters.embedding import lm_call
from ..capture.state import execution_device
from ..runs.interventions import edit_activations
from ..runs.own import own_pass
from ..runs.points import CallCounter
from ..runs.run import run
from .metric import tokens_of
from .targets import Target, resolve

__all__ = ["Ablation", "ablate", "ablation_edits", "old_positional", "steer", "steering_vector"]

MODES = ("zero", "mean")


@dataclass
class Ablation:
    """What an :func:`ablate` block acts on: its targets, the mode, and the means used (``mean_over``:
    per target name, broadcastable to the activation)."""

    targets: list[Target]
    mode: str
    means: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.targets]


def _call_model(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, tuple):
        return model(*batch)
    return model(batch)


def _batches(mean_over: Any) -> list[Any]:
    return list(mean_over) if isinstance(mean_over, list) else [mean_over]


def _means(model: nn.Module, targets: Sequence[Target], mean_over: Any) -> dict[str, torch.Tensor]:
    """Each target's mean (float32, reduced axes kept as size 1) over the ``mean_over`` batches."""
    sums: list[torch.Tensor | None] = [None] * len(targets)
    counts = [0] * len(targets)
    calls = CallCounter(len(targets))

    def acc(i: int, t: Target) -> Callable[[torch.Tensor], None]:
        def fn(x: torch.Tensor) -> None:
            if not calls.this_one(i, t.call):
                return
            dims = t.mean_dims(x)
            s = x.detach().float().sum(dim=dims, keepdim=True)
            sums[i] = s if sums[i] is None else sums[i] + s.to(sums[i].device)
            counts[i] += x.numel() // max(s.numel(), 1)
        return fn

    edits = [(t.module, t.where, acc(i, t)) for i, t in enumerate(targets)]
    with own_pass(model), edit_activations(edits, root=model, on_call=calls.reset):
        for batch in _batches(mean_over):
            _call_model(model, batch)
    out = {}
    for t, s, n in zip(targets, sums, counts):
        if s is None:
            raise RuntimeError(f"mean_over: {t.name} did not run on the given inputs")
        out[t.name] = s / n
    return out


@contextmanager
def ablate(model: nn.Module, *, heads: Mapping[Any, Sequence[int]] | None = None, layers: Iterable[Any] | None = None,
           channels: Mapping[str, Sequence[int]] | None = None, neurons: Mapping[str, Sequence[int]] | None = None,
           mode: str = "zero", mean_over: Any = None) -> Iterator[Ablation]:
    """Ablate while the block runs: ``heads={layer: [head, ...]}`` (a layer index or its block /
    attention module name), ``layers=[layer]`` (the module call's whole output, whatever it returns: a
    tensor, a tuple, a ``ModelOutput``; a layer is a module name, the module, or a block index), ``channels={name: [c]}``,
    ``neurons={name: [i]}`` (see :mod:`nbdebug.workbench.targets` for the axes). ``mode``: ``"zero"`` or
    ``"mean"`` (see the module docstring; ``mean_over``: an input, a dict of keyword inputs, a tuple of
    positional inputs, or a list of those). Yields an :class:`Ablation`; every hook is removed on exit."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: 'zero' or 'mean'")
    names = None if layers is None else [n if isinstance(n, str) else _layer(model, n)[0] for n in layers]
    targets = resolve(model, heads=heads, layers=names, channels=channels, neurons=neurons)
    if not targets:
        raise ValueError("nothing to ablate: give heads=, layers=, channels= or neurons=")
    means = _means(model, targets, mean_over) if mode == "mean" and mean_over is not None else {}
    edits, calls = ablation_edits(targets, mode, means)
    with edit_activations(edits, root=model, on_call=calls.reset):
        yield Ablation(targets=targets, mode=mode, means=means)


def ablation_edits(targets: Sequence[Target], mode: str, means: Mapping[str, torch.Tensor] | None = None,
                   ) -> tuple[list[tuple[nn.Module, str, Callable[[torch.Tensor], torch.Tensor | None]]], CallCounter]:
    """The ``(module, where, fn)`` edits of an ablation, and the call counter to reset at each forward
    of the model (for call names such as ``relu#2``)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: 'zero' or 'mean'")
    means = means or {}
    calls = CallCounter(len(targets))

    def edit(i: int, t: Target) -> Callable[[torch.Tensor], torch.Tensor | None]:
        def fn(x: torch.Tensor) -> torch.Tensor | None:
            if not calls.this_one(i, t.call):
                return None
            mask = t.mask(x)
            if mode == "zero":
                return x.masked_fill(mask, 0)
            mean = means.get(t.name)
            if mean is None:
                mean = x.float().mean(dim=t.mean_dims(x), keepdim=True)
            return torch.where(mask, mean.to(x.device, x.dtype), x)
        return fn

    return [(t.module, t.where, edit(i, t)) for i, t in enumerate(targets)], calls


def _layer(model: nn.Module, layer: Any) -> tuple[str, nn.Module]:
    if isinstance(layer, int) and not isinstance(layer, bool):
        blocks = patch_parts(model).parts.blocks
        if not -len(blocks) <= layer < len(blocks):
            raise IndexError(f"layer {layer} is outside the model's {len(blocks)} blocks")
        return blocks[layer]
    if isinstance(layer, nn.Module):
        names = {id(m): n for n, m in model.named_modules()}
        return names.get(id(layer), type(layer).__name__), layer
    try:
        return str(layer), model.get_submodule(str(layer))
    except AttributeError:
        raise KeyError(f"no module named {layer!r} in {type(model).__name__}") from None


def _past_length(kwargs: Mapping[str, Any]) -> int:
    """How many positions came before this call (a generate() step): the cache's length."""
    for key in ("past_key_values", "cache", "past_kv_cache"):
        cache = kwargs.get(key)
        if cache is None:
            continue
        if hasattr(cache, "get_seq_length"):
            return int(cache.get_seq_length())
        entries = getattr(cache, "entries", None)
        if entries:
            return int(entries[0].past_keys.shape[1])
    pos = kwargs.get("cache_position")
    if isinstance(pos, torch.Tensor) and pos.numel():
        return int(pos.flatten()[0])
    return 0


def old_positional(fn: str, args: tuple[Any, ...], names: Sequence[str], given: dict[str, Any], depth: int) -> dict[str, Any]:
    """Positional arguments of the former signature mapped to their keywords, with a DeprecationWarning
    (``steer``, ``steering_vector``, ``attribute``: keywords after the model and inputs)."""
    if len(args) > len(names):
        raise TypeError(f"{fn}() takes at most {len(names)} positional arguments after the model")
    warnings.warn(f"{fn}: pass {', '.join(n + '=' for n in names[:len(args)])} as keywords (positional use is deprecated "
                  "and goes in the next release)", DeprecationWarning, stacklevel=depth)
    out = dict(given)
    for n, v in zip(names, args):
        if out.get(n) is not None:
            raise TypeError(f"{fn}() got {n} twice (positionally and by keyword)")
        out[n] = v
    return out


@contextmanager
def steer(model: nn.Module, *args: Any, layer: Any = None, vector: torch.Tensor | None = None, alpha: float = 4.0,
          positions: Sequence[int] | None = None) -> Iterator[None]:
    """Add ``alpha * vector`` to ``layer``'s output (a module name, a block index, or the module) while
    the block runs, at every position or at the absolute ``positions`` (see the module docstring).
    (``steer(model, layer, vector, alpha)`` positionally still works, with a DeprecationWarning.)"""
    if args:
        got = old_positional("steer", args, ("layer", "vector", "alpha", "positions"),
                              {"layer": layer, "vector": vector, "alpha": None if alpha == 4.0 else alpha, "positions": positions}, 4)
        layer, vector, positions = got["layer"], got["vector"], got["positions"]
        alpha = 4.0 if got["alpha"] is None else got["alpha"]
    if layer is None or vector is None:
        raise TypeError("steer(model, layer=..., vector=...): both are needed")
    name, module = _layer(model, layer)
    v = torch.as_tensor(vector).detach().flatten()
    wanted = None if positions is None else torch.as_tensor([int(p) for p in positions])
    state = {"offset": 0}

    def on_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        state["offset"] = _past_length(kwargs)

    def add(x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != v.numel():
            raise ValueError(f"steer: {name}'s output has {x.shape[-1]} features, the vector {v.numel()}")
        delta = (float(alpha) * v.float()).to(x.device, x.dtype)
        if wanted is None:
            return x + delta
        at = torch.arange(x.shape[-2]) + state["offset"]
        mask = torch.isin(at, wanted).to(x.device)[:, None]
        return x + mask.to(x.dtype) * delta

    with edit_activations([(module, "output", add)], root=model, on_call=on_call):
        yield


def steering_vector(model: nn.Module, *args: Any, positive: Sequence[Any] | None = None,
                    negative: Sequence[Any] | None = None, layer: Any = None, tokenizer: Any = None) -> torch.Tensor:
    """The mean of ``layer``'s output at the last token over the ``positive`` prompts minus the same over
    the ``negative`` ones (float32, ``(d,)``): the contrastive "mean difference" steering vector
    (activation addition, Turner et al. 2023, with a pair; Rimsky et al. 2024, averaged over pairs).
    The last token is where the prompt's meaning has been gathered in a causal model; each prompt runs
    alone (no padding), as nbdebug's own pass stopped right after the layer.

    ``steering_vector(model, positive, negative, layer=..., tokenizer=tok)``; the former
    ``steering_vector(model, tok, positive, negative, layer)`` still works, with a DeprecationWarning."""
    if args and not isinstance(args[0], (list, tuple)):  # the former order: tokenizer first
        got = old_positional("steering_vector", args, ("tokenizer", "positive", "negative", "layer"),
                              {"tokenizer": tokenizer, "positive": positive, "negative": negative, "layer": layer}, 3)
        tokenizer, positive, negative, layer = got["tokenizer"], got["positive"], got["negative"], got["layer"]
    elif args:
        if len(args) > 2:
            raise TypeError("steering_vector(model, positive, negative, layer=..., tokenizer=...): layer is a keyword")
        positive, negative = (*args, negative)[:2] if len(args) == 1 else args
    if not positive or not negative:
        raise ValueError("steering_vector needs at least one positive and one negative prompt")
    if layer is None:
        raise TypeError("steering_vector: say which layer= (a module name, the module, or a block index)")
    name, module = _layer(model, layer)

    def last(prompt: Any) -> torch.Tensor:
        ids = tokens_of(prompt, tokenizer, "prompt").to(execution_device(model) or "cpu")
        args, kwargs = lm_call(model, ids)
        got = run(model, *args, reads=[(module, "output")], stop=True, **kwargs).reads[0]
        if got is None:
            raise RuntimeError(f"steering_vector: {name} did not run on the prompt")
        return got[0, -1].float().cpu()

    pos = torch.stack([last(p) for p in positive]).mean(0)
    neg = torch.stack([last(p) for p in negative]).mean(0)
    return pos - neg
