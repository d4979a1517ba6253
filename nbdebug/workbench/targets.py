"""What an ablation or a steering vector acts on: module calls and the units of their activation.

Names are nbdebug's call names (``relu``, ``relu#2`` for a module's second call within a forward).
Units: a head (its slice of the attention output projection's input, or TransformerLens'
``hook_z``), a channel (axis 1 of an ``(N, C, ...)`` conv-style output: 4-D and more, or a 3-D
output of a 1-D conv/norm/pool; the last axis otherwise), a neuron (the last axis of the module's
output; for a transformer's MLP module given by name, its hidden neurons: the input of its output
projection), or the whole activation (``layers=``).

>>> targets = resolve(model, heads={3: [5]}, layers=["fc"], channels={"conv1": [0, 2]})   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..adapters.blockparts import PatchParts, patch_parts
from ..adapters.transformers import AdapterError
from ..capture.names import split_call_name

__all__ = ["Target", "resolve"]

_CHANNEL_1D = (nn.Conv1d, nn.ConvTranspose1d, nn.BatchNorm1d, nn.InstanceNorm1d, nn.MaxPool1d, nn.AvgPool1d,
               nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d)


@dataclass
class Target:
    """One module call's activation (``where``: its ``"input"`` or ``"output"``; ``call``: which call
    within a forward, None for every call) and the units of it to act on (``units`` None: all)."""

    name: str
    module: nn.Module
    where: str
    call: int | None
    unit: str  # "all" | "channel" | "neuron" | "head" | "head_z"
    units: list[int] | None = None
    head_dim: int = 0

    def unit_axis(self, x: torch.Tensor) -> int:
        """The axis that indexes units (kept by a mean over the others)."""
        if self.unit == "head_z":
            return x.ndim - 2
        if self.unit in ("channel", "all") and _channel_first(self.module, x):
            return 1
        return x.ndim - 1

    def mask(self, x: torch.Tensor) -> torch.Tensor:
        """Bool, broadcastable to ``x``: True on the units acted on."""
        axis = self.unit_axis(x)
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        if self.units is None:
            return torch.ones(shape, dtype=torch.bool, device=x.device)
        m = torch.zeros(x.shape[axis], dtype=torch.bool, device=x.device)
        for u in self.units:
            if self.unit == "head":
                m[u * self.head_dim:(u + 1) * self.head_dim] = True
            else:
                m[u] = True
        return m.reshape(shape)

    def mean_dims(self, x: torch.Tensor) -> tuple[int, ...]:
        """Axes a mean ablation averages over: every axis but the unit axis (and a head's own ``d``)."""
        keep = {self.unit_axis(x)}
        if self.unit == "head_z":
            keep.add(x.ndim - 1)
        return tuple(i for i in range(x.ndim) if i not in keep)


def _channel_first(module: nn.Module, x: torch.Tensor) -> bool:
    return x.ndim >= 4 or (x.ndim == 3 and isinstance(module, _CHANNEL_1D))


def _module(model: nn.Module, name: str) -> tuple[nn.Module, int | None]:
    base, k = split_call_name(name)
    try:
        mod = model.get_submodule(base) if base else model
    except AttributeError:
        close = [n for n, _ in model.named_modules() if n and (base.split(".")[-1] in n)][:5]
        raise KeyError(f"no module named {base!r} in {type(model).__name__}"
                       + (f"; close: {', '.join(close)}" if close else "")) from None
    return mod, (k if "#" in name else None)


def _layer_of(pp: PatchParts, key: Any) -> int:
    if isinstance(key, int) and not isinstance(key, bool):
        if not 0 <= key < pp.n_layers:
            raise KeyError(f"layer {key} is outside the model's {pp.n_layers} layers")
        return key
    names = [pp.parts.blocks, pp.parts.attentions, pp.heads or [], pp.attn_out or []]
    for group in names:
        for layer, (n, _) in enumerate(group):
            if n == key:
                return layer
    raise KeyError(f"heads={{{key!r}: ...}}: give a layer index, or a block / attention module name "
                   f"(e.g. {pp.parts.blocks[0][0]!r})")


def _units(values: Iterable[int], n: int | None, what: str) -> list[int]:
    out = [int(v) for v in ([values] if isinstance(values, int) else values)]
    if n is not None:
        bad = [v for v in out if not 0 <= v < n]
        if bad:
            raise IndexError(f"{what}: {bad} outside 0..{n - 1}")
    return out


def resolve(model: nn.Module, *, heads: Mapping[Any, Sequence[int]] | None = None, layers: Iterable[str] | None = None,
            channels: Mapping[str, Sequence[int]] | None = None, neurons: Mapping[str, Sequence[int]] | None = None,
            pp: PatchParts | None = None) -> list[Target]:
    """The targets named by the ablation arguments (see the module docstring); unknown names and units
    out of range are errors naming what exists."""
    out: list[Target] = []
    if heads:
        pp = pp or patch_parts(model)
        sites = pp.sites("heads")
        for key, hs in heads.items():
            layer = _layer_of(pp, key)
            name, mod = sites[layer]
            unit = "head_z" if pp.heads_at == "output" else "head"
            out.append(Target(name, mod, pp.heads_at, None, unit, _units(hs, pp.n_heads, f"heads of layer {layer}"),
                              pp.head_dim))
    for name in layers or ():
        mod, k = _module(model, name)
        out.append(Target(name, mod, "output", k, "all"))
    for name, cs in (channels or {}).items():
        mod, k = _module(model, name)
        out.append(Target(name, mod, "output", k, "channel", _units(cs, None, f"channels of {name}")))
    for name, ns in (neurons or {}).items():
        mod, k = _module(model, name)
        proj = _mlp_projection(model, split_call_name(name)[0], pp)
        if proj is not None:
            pname, pmod, where = proj
            out.append(Target(pname, pmod, where, k, "neuron", _units(ns, None, f"neurons of {name}")))
        else:
            out.append(Target(name, mod, "output", k, "neuron", _units(ns, None, f"neurons of {name}")))
    return out


def _mlp_projection(model: nn.Module, name: str, pp: PatchParts | None) -> tuple[str, nn.Module, str] | None:
    """The MLP's output projection (or TransformerLens' ``hook_post``) when ``name`` is a transformer
    block's MLP module: its hidden neurons."""
    try:
        pp = pp or patch_parts(model)
        projs = pp.neurons
    except (AdapterError, ValueError, LookupError):
        return None
    for pname, pmod in projs or ():
        if pname.rsplit(".", 1)[0] == name:
            return pname, pmod, pp.where("neurons")
    return None
