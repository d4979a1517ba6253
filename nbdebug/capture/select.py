"""Which modules to capture: one filter type, resolved once against ``named_modules()``.

A filter is ``None`` (every leaf module), a string (exact name, glob like ``"layer1.*"`` or
``"re:..."`` for a regular expression), a list of names/patterns, a predicate on the qualified
name, or a module type / tuple of types.

>>> m = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
>>> [n for n, _ in select_modules(m, None)]
['0', '1']
>>> [n for n, _ in select_modules(m, nn.ReLU)]
['1']
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Callable, Sequence
from typing import Union

import torch
from torch import nn
from torch.nn.utils.parametrize import is_parametrized

__all__ = ["LayerFilter", "LayerNotFoundError", "model_modules", "select_modules", "unwrap_compiled"]

LayerFilter = Union[None, str, Sequence[str], Callable[[str], bool], type, tuple[type, ...]]  # noqa: UP007 (runtime alias on 3.10)


class LayerNotFoundError(KeyError):
    """A requested layer name does not exist; the message lists close matches."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0]) if self.args else ""


def _is_leaf(m: nn.Module) -> bool:
    """No children, or only the ``parametrizations`` of a parametrized module (weight_norm...): the
    module's own output is the activation; its parametrizations compute weights, not activations."""
    return all(name == "parametrizations" and is_parametrized(m) for name, _ in m.named_children())


def model_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``named_modules()`` without the root and without parametrization internals
    (``conv1.parametrizations.weight.0``) and without TorchScript subtrees (a ``ScriptModule`` refuses
    Python hooks; its calls are the graph's, not ours to see): the modules whose calls are activations."""
    out: list[tuple[str, nn.Module]] = []
    opaque: list[str] = []
    for n, m in model.named_modules():
        if not n or ".parametrizations." in f".{n}." or any(n.startswith(p + ".") for p in opaque):
            continue
        if isinstance(m, torch.jit.ScriptModule):
            opaque.append(n)
            continue
        out.append((n, m))
    return out


def _pattern_matcher(pat: str) -> Callable[[str], bool] | None:
    if pat.startswith("re:"):
        rx = re.compile(pat[3:])
        return lambda n: rx.fullmatch(n) is not None
    if any(ch in pat for ch in "*?["):
        return lambda n: fnmatch.fnmatchcase(n, pat)
    return None


def unwrap_compiled(model: nn.Module) -> nn.Module:
    """The user's module inside a ``torch.compile`` wrapper (``OptimizedModule._orig_mod``), else
    ``model``: layer names are the same with and without compiling (``conv1``, not ``_orig_mod.conv1``)."""
    inner = getattr(model, "_orig_mod", None)
    if isinstance(inner, nn.Module) and type(model).__name__ == "OptimizedModule":
        return inner
    return model


def select_modules(
    model: nn.Module, layers: LayerFilter = None, *, leaves_only: bool | None = None
) -> list[tuple[str, nn.Module]]:
    """Resolve ``layers`` to ``[(qualified_name, module)]`` in registration order.

    ``None`` selects leaf modules (or the model itself when it has no children). Exact names may
    name any module, leaf or not; patterns, predicates and types match leaves unless
    ``leaves_only=False``.
    """
    model = unwrap_compiled(model)
    named = model_modules(model)
    if not named:
        return [("", model)]
    leaf_default = True if leaves_only is None else leaves_only

    def pool() -> list[tuple[str, nn.Module]]:
        return [(n, m) for n, m in named if _is_leaf(m)] if leaf_default else named

    if layers is None:
        return pool()
    if isinstance(layers, type) or (
        isinstance(layers, tuple) and layers and all(isinstance(t, type) for t in layers)
    ):
        types = layers
        # Types match any module (a type names what it wants: 'every BasicBlock' is a fair ask).
        chosen = [(n, m) for n, m in named if isinstance(m, types)]  # type: ignore[arg-type]
        if not chosen:
            raise LayerNotFoundError(f"no module of type {types!r} in {type(model).__name__}")
        return chosen
    if callable(layers) and not isinstance(layers, str):
        return [(n, m) for n, m in pool() if layers(n)]  # type: ignore[operator]

    patterns = [layers] if isinstance(layers, str) else list(layers)  # type: ignore[arg-type]
    names = dict(named)
    chosen_names: list[str] = []
    for pat in patterns:
        matcher = _pattern_matcher(pat)
        if matcher is None:
            if pat not in names:
                close = difflib.get_close_matches(pat, list(names), n=5, cutoff=0.5)
                hint = f" Did you mean: {', '.join(close)}?" if close else ""
                raise LayerNotFoundError(
                    f"no layer named {pat!r} in {type(model).__name__}.{hint} "
                    "Names are qualified like 'layer1.0.conv1'; list them with "
                    "[n for n, _ in model.named_modules()]."
                )
            hits = [pat]
        else:
            # A pattern on a container ('layer1.*') reaches leaves under it; exact names any module.
            hits = [n for n, m in named if matcher(n) and (not leaf_default or _is_leaf(m))]
            if not hits:
                raise LayerNotFoundError(f"pattern {pat!r} matches no {'leaf ' if leaf_default else ''}module")
        for n in hits:
            if n not in chosen_names:
                chosen_names.append(n)
    order = {n: i for i, (n, _) in enumerate(named)}
    return [(n, names[n]) for n in sorted(chosen_names, key=order.__getitem__)]
