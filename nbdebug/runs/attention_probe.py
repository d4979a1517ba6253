"""Seeing each attention layer's queries and keys while the model keeps its fused SDPA kernel.

Hugging Face models dispatch attention through ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``
(transformers ≥ 4.48). :func:`probe_attention` registers a pass-through implementation
(``nbdebug_probe_<previous>``) that calls the previous one (SDPA, eager, flash...) for the outputs
and hands ``(module, query, key, mask, scaling, softcap)`` to a callback: the model's outputs stay
bit-identical and no ``T × T`` probability tensor is materialised unless the callback builds one.
The previous implementation is restored on exit (every sub-config's own, also on exceptions and
KeyboardInterrupt), and the probe leaves transformers' global attention/mask registries as they were
once the last probe using it exits.

>>> with probe_attention(model, {attn_module: on_qk}) as path:   # doctest: +SKIP
...     model(ids)
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..adapters.transformers import restore_attn_implementation

__all__ = ["QKCall", "probe_attention", "probe_supported"]

PREFIX = "nbdebug_probe_"


@dataclass
class QKCall:
    """What one attention layer saw: ``query (B, H, Tq, dh)``, ``key (B, Hkv, Tk, dh)``, the mask the
    model passed (``None``: causal when ``is_causal``; bool ``True`` = attend, or additive float),
    the logit ``scaling`` and the ``softcap`` (Gemma 2)."""

    module: nn.Module
    query: torch.Tensor
    key: torch.Tensor
    mask: torch.Tensor | None
    scaling: float
    softcap: float | None
    is_causal: bool


# module -> callback, for the modules being probed right now (weak: nothing here keeps a model alive)
_ACTIVE: weakref.WeakKeyDictionary[nn.Module, Callable[[QKCall], None]] = weakref.WeakKeyDictionary()


def _previous_function(previous: str, module: nn.Module) -> Callable[..., Any]:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if previous == "eager":
        fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        if fn is None:
            raise RuntimeError(f"{type(module).__name__}: no eager_attention_forward in {type(module).__module__}")
        return fn
    return ALL_ATTENTION_FUNCTIONS[previous]


def _make_probe(previous: str) -> Callable[..., Any]:
    def probe(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> Any:
        out = _previous_function(previous, module)(module, query, key, value, attention_mask, *args, **kwargs)
        cb = _ACTIVE.get(module)
        if cb is not None:
            scaling = kwargs.get("scaling")
            is_causal = kwargs.get("is_causal")
            cb(QKCall(
                module=module, query=query, key=key, mask=attention_mask,
                scaling=float(scaling) if scaling is not None else query.shape[-1] ** -0.5,
                softcap=kwargs.get("softcap"),
                is_causal=bool(getattr(module, "is_causal", True) if is_causal is None else is_causal),
            ))
        return out

    probe.__name__ = f"{PREFIX}{previous}"
    return probe


# probe name -> [active probes, (registry, value) pairs we added to transformers' global mappings]
_REGISTERED: dict[str, tuple[int, list[tuple[dict[str, Any], Any]]]] = {}
_LOCK = threading.Lock()


def _register(previous: str) -> str:
    """Register ``nbdebug_probe_<previous>`` (and its mask function) while at least one probe uses it."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    name = PREFIX + previous
    with _LOCK:
        n, added = _REGISTERED.get(name, (0, []))
        if n == 0:
            added = []
            if name not in ALL_ATTENTION_FUNCTIONS:
                AttentionInterface.register(name, _make_probe(previous))
                added.append((AttentionInterface._global_mapping, AttentionInterface._global_mapping[name]))
            masks = AttentionMaskInterface._global_mapping
            if name not in ALL_MASK_ATTENTION_FUNCTIONS and previous in masks:
                AttentionMaskInterface.register(name, masks[previous])
                added.append((masks, masks[name]))
        _REGISTERED[name] = (n + 1, added)
    return name


def _unregister(name: str) -> None:
    """The last probe using ``name`` exited: take out what :func:`_register` put in (if still ours)."""
    with _LOCK:
        n, added = _REGISTERED.pop(name, (0, []))
        if n > 1:
            _REGISTERED[name] = (n - 1, added)
            return
        for mapping, value in added:
            if mapping.get(name) is value:
                del mapping[name]


def probe_supported(model: nn.Module, modules: list[nn.Module]) -> str | None:
    """None when :func:`probe_attention` can run on ``model``, else why not (one line)."""
    cfg = getattr(model, "config", None)
    previous = getattr(cfg, "_attn_implementation", None)
    if previous is None or not hasattr(model, "set_attn_implementation"):
        return "not a Hugging Face model with a switchable attention implementation"
    if previous.startswith(PREFIX):
        return "another nbdebug view is probing this model's attention already"
    try:
        import transformers.masking_utils  # noqa: F401
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:
        return "transformers has no AttentionInterface (needs ≥ 4.48)"
    if previous != "eager" and previous not in ALL_ATTENTION_FUNCTIONS:
        return f"attention implementation {previous!r} is not in transformers' AttentionInterface"
    for m in modules:
        mod = sys.modules.get(type(m).__module__)
        if mod is None or not hasattr(mod, "ALL_ATTENTION_FUNCTIONS"):
            return f"{type(m).__name__} does not dispatch through transformers' AttentionInterface"
    can = getattr(model, "_can_set_attn_implementation", None)
    if callable(can) and not can():
        return f"{type(model).__name__} cannot switch its attention implementation"
    return None


@contextmanager
def probe_attention(model: nn.Module, callbacks: dict[nn.Module, Callable[[QKCall], None]]) -> Iterator[str]:
    """Route ``model``'s attention through a pass-through probe calling ``callbacks[module]`` per layer.

    Yields the path description (``"sdpa + query/key probe"``). Check :func:`probe_supported` first.
    The model's implementation (and every sub-config's) is restored on exit, also on
    KeyboardInterrupt; callbacks are dropped even if restoring fails.
    """
    previous: str = model.config._attn_implementation  # type: ignore[union-attr]
    name = _register(previous)
    try:
        for m, cb in callbacks.items():
            _ACTIVE[m] = cb
        with restore_attn_implementation(model):
            model.set_attn_implementation(name)  # type: ignore[operator]
            yield f"{previous} + query/key probe"
    finally:
        try:
            for m in callbacks:
                _ACTIVE.pop(m, None)
        finally:
            _unregister(name)
