"""Remembering how the user called the model, so a view can run it again (Grad-CAM, logit lens).

>>> with ModelCall(model) as call:     # doctest: +SKIP
...     model(x)
>>> call.args, call.kwargs, call.output   # the first top-level call inside the block

With ``watch_generate=True`` it also recognises ``model.generate(...)`` (the language views then
recompute their view on the final sequence): the class that defines ``generate`` (for Hugging Face
models that is ``GenerationMixin``, shared by every HF model in the process) has its ``generate``
wrapped while the block runs. The wrapper calls the original for every model and records what it
returned only for the watched model; the original is put back when the last watcher exits. KV-cache
steps of a hand-written decoding loop are recognised from the calls themselves (``past_key_values``
holding earlier tokens).
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch
from torch import nn

from .hooks import HookSet
from .weak import ModelRef

__all__ = ["CACHE_KWARGS", "ModelCall", "is_cache_kwarg", "without_cache"]

# class -> (original generate, number of active watchers); one wrapper per class however many watch
_PATCHED: dict[type, tuple[Any, int]] = {}
_PATCH_LOCK = threading.Lock()
_WATCHERS: weakref.WeakSet[ModelCall] = weakref.WeakSet()


def _generate_owner(model: nn.Module) -> type | None:
    for klass in type(model).__mro__:
        if "generate" in vars(klass):
            return klass
    return None


def _wrap_generate(original: Any) -> Any:
    @functools.wraps(original)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        mine = [w for w in list(_WATCHERS) if w._ref.alive and w._ref.get() is self]
        for w in mine:
            w.in_generate += 1
        try:
            out = original(self, *args, **kwargs)
        finally:
            for w in mine:
                w.in_generate -= 1
        for w in mine:
            w._record_generate(out)
        return out

    generate._nbdebug_original = original  # type: ignore[attr-defined]
    return generate


#: keywords a KV cache is passed under: ``past_key_values``, and ``cache`` since transformers 5.24
#: (``generate()`` passes that one; the old name is still accepted with a deprecation warning)
CACHE_KWARGS = ("past_key_values", "cache")


def _is_kv_cache(value: Any) -> bool:
    """A transformers ``Cache`` (anything with ``get_seq_length``) or the legacy tuple of per-layer tuples."""
    return callable(getattr(value, "get_seq_length", None)) or (
        isinstance(value, (tuple, list)) and bool(value) and isinstance(value[0], (tuple, list)))


def is_cache_kwarg(key: str, value: Any) -> bool:
    """``key=value`` passes a KV cache: ``past_key_values`` always (as before), ``cache`` only when the
    value is one (a model of the user's may take a ``cache`` argument of its own)."""
    return key == "past_key_values" or (key == "cache" and _is_kv_cache(value))


def without_cache(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the KV cache (see :func:`is_cache_kwarg`)."""
    return {k: v for k, v in kwargs.items() if not is_cache_kwarg(k, v)}


def _cache_length(kwargs: dict[str, Any]) -> int:
    cache = next((kwargs[k] for k in CACHE_KWARGS if kwargs.get(k) is not None and is_cache_kwarg(k, kwargs[k])), None)
    if cache is None:
        return 0
    get = getattr(cache, "get_seq_length", None)
    try:
        if callable(get):
            return int(get())
        if isinstance(cache, (tuple, list)) and cache and isinstance(cache[0], (tuple, list)):
            return int(cache[0][0].shape[-2])
    except Exception:
        return 0
    return 0


class ModelCall:
    """Records the first call of ``model`` (args, kwargs, grad mode; its output with ``keep_output``)
    while entered.

    References are kept, not copies: views re-run the model on exactly what the user passed. A KV
    cache passed as ``past_key_values`` (or ``cache``, transformers ≥ 5.24) is not kept (it grows with every step of a generation; the
    views' own forwards run without one). ``keep_output=False`` keeps no output either.
    ``calls`` counts every top-level call, so views can say "the cell ran the model 3 times; the
    first call is shown". The model itself is held weakly (``model`` raises
    :class:`~nbdebug.capture.weak.ModelGoneError` once it is deleted).

    With ``watch_generate``: ``sequences`` is what ``generate()`` returned (a ``(B, T)`` id tensor),
    ``generated_from`` the prompt length, and ``cached_steps`` counts calls that fed new tokens on top
    of a KV cache (a hand-written decoding loop); :meth:`final_sequence` combines them.
    """

    def __init__(self, model: nn.Module, *, watch_generate: bool = False, keep_output: bool = True) -> None:
        self._ref: ModelRef[nn.Module] = ModelRef(model)
        self.keep_output = keep_output
        self.args: tuple[Any, ...] | None = None
        self.kwargs: dict[str, Any] | None = None
        self.output: Any = None
        self.grad_enabled: bool | None = None
        self.calls = 0
        self.watch_generate = watch_generate
        self.in_generate = 0
        self.generate_calls = 0
        self.sequences: torch.Tensor | None = None
        self.cached_steps = 0
        self._fed: list[torch.Tensor] = []  # ids of the first call and of KV-cache steps only
        self._loop = True  # every call after the first fed new tokens on top of a cache
        self._hooks = HookSet()
        self._patched: type | None = None

    @property
    def model(self) -> nn.Module:
        return self._ref.get()

    @property
    def seen(self) -> bool:
        return self.args is not None

    def _pre(self, _m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls += 1
        if self.args is None:
            self.args = args
            self.kwargs = without_cache(kwargs)
            self.grad_enabled = torch.is_grad_enabled()
        if self.watch_generate and self.in_generate == 0:
            from ..adapters.text import input_ids_of

            ids = input_ids_of(args, kwargs)
            if self.calls == 1:
                self._fed = [ids.detach()] if ids is not None else []
                self._loop = ids is not None
            elif self._loop and ids is not None and _cache_length(kwargs) > 0:
                self.cached_steps += 1
                self._fed.append(ids.detach())
            else:  # a plain loop of full forwards (training, evaluation): nothing more to keep
                self._loop, self._fed = False, []

    def _post(self, _m: nn.Module, _args: Any, _kwargs: Any, output: Any) -> None:
        if self.keep_output and self.output is None and self.calls == 1:
            self.output = output

    def _record_generate(self, out: Any) -> None:
        seq = out if isinstance(out, torch.Tensor) else getattr(out, "sequences", None)
        if isinstance(seq, torch.Tensor) and seq.dim() == 2:
            self.generate_calls += 1
            if self.sequences is None:
                self.sequences = seq.detach()

    @property
    def generated(self) -> bool:
        """Whether the block ran ``generate()`` or a KV-cache decoding loop on the model."""
        return self.sequences is not None or (self._loop and self.cached_steps > 0)

    def final_sequence(self) -> tuple[torch.Tensor, int, str] | None:
        """``(ids (B, T), prompt length, how)`` of the final sequence of a generation, or None."""
        from ..adapters.text import input_ids_of

        prompt = input_ids_of(self.args, self.kwargs)
        if self.sequences is not None:
            n0 = prompt.shape[1] if prompt is not None and prompt.shape[1] <= self.sequences.shape[1] else 0
            return self.sequences, n0, "the sequence generate() returned"
        if self.generated and all(f.shape[0] == self._fed[0].shape[0] for f in self._fed):
            return torch.cat(self._fed, 1), self._fed[0].shape[1], "the tokens the decoding loop fed to the model"
        return None

    def __enter__(self) -> ModelCall:
        model = self.model
        self._hooks.forward_pre(model, self._pre, with_kwargs=True)
        self._hooks.forward(model, self._post, with_kwargs=True)
        if self.watch_generate:
            owner = _generate_owner(model)
            if owner is not None:
                with _PATCH_LOCK:
                    original, n = _PATCHED.get(owner, (vars(owner)["generate"], 0))
                    if n == 0:
                        owner.generate = _wrap_generate(original)  # type: ignore[attr-defined]
                    _PATCHED[owner] = (original, n + 1)
                    self._patched = owner
                    _WATCHERS.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._hooks.remove()
        finally:
            with _PATCH_LOCK:
                _WATCHERS.discard(self)
                owner, self._patched = self._patched, None
                if owner is not None:
                    original, n = _PATCHED[owner]
                    if n <= 1:
                        owner.generate = original  # type: ignore[attr-defined]
                        del _PATCHED[owner]
                    else:
                        _PATCHED[owner] = (original, n - 1)
