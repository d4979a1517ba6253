"""Running a transformer's blocks from a cached state, per family: block ``l`` on positions ``p..T-1``
with the keys/values of positions ``< p`` taken from a recorded run (a causal model's earlier positions
cannot see a later change, so they need not be recomputed).

A :class:`BlockRunner` says how to call the model once so that its keys/values are recorded
(:meth:`~BlockRunner.record_call`: the model's own cache mechanism with a recording cache),
what every block was called with (:func:`bind_call`, from a forward pre-hook's ``args``/``kwargs``),
and how to call block ``j`` again for a suffix (:meth:`~BlockRunner.block_kwargs`): the recorded
arguments with the mask's query rows, the position embeddings and position ids cut to the suffix,
and a cache that prepends the recorded keys/values of the earlier positions (batch-expanded, never
stored). Hugging Face decoders (any family whose blocks take a ``Cache``) and TransformerLens
``HookedTransformer`` are known. No hooks here: capture records, this module only builds calls.

>>> runner = block_runner(model, pp)                      # doctest: +SKIP
>>> args, kwargs, cache = runner.record_call(ids)          # model(*args, **kwargs) records K/V in cache
>>> kv = runner.keys_values(cache)                         # per layer
>>> kw = runner.block_kwargs(call, layer=j, start=p, kv=kv, batch=B)
>>> h = block(h_suffix, **kw)                              # positions p..T-1 of B patched runs
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..capture.leaves import first_output
from .blockparts import PatchParts
from .embedding import lm_call, takes_logits_to_keep

__all__ = ["BlockCall", "BlockRunner", "bind_call", "block_runner"]

_KV_IMPLEMENTATIONS = ("sdpa", "eager")


@dataclass
class BlockCall:
    """One recorded call of a block: its hidden-state input's parameter name and every other argument
    by name (positional ones bound to their names)."""

    hidden: str
    arguments: dict[str, Any]


def bind_call(module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> BlockCall:
    """Name every argument of ``module(*args, **kwargs)`` (``**kwargs`` of the signature flattened)."""
    try:
        sig = inspect.signature(module.forward)
        bound = sig.bind(*args, **kwargs)
    except (TypeError, ValueError):
        if len(args) != 1:
            raise
        return BlockCall("hidden_states", dict(kwargs))
    names = list(bound.arguments)
    out: dict[str, Any] = {}
    for name in names[1:]:
        param = sig.parameters[name]
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            out.update(bound.arguments[name])
        elif param.kind is inspect.Parameter.VAR_POSITIONAL:
            if bound.arguments[name]:
                raise TypeError(f"{type(module).__name__} takes extra positional arguments; cannot rebind them by name")
        else:
            out[name] = bound.arguments[name]
    return BlockCall(names[0], out)


def _cut(value: Any, start: int, length: int) -> Any:
    """Position-indexed tensors cut to positions ``start..``: a tensor whose axis 1 (or only axis) is
    the sequence; tuples, lists and dicts recursively; anything else unchanged."""
    if isinstance(value, torch.Tensor):
        if value.ndim >= 2 and value.shape[1] == length:
            return value[:, start:]
        if value.ndim == 1 and value.shape[0] == length:
            return value[start:]
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_cut(v, start, length) for v in value)
    if isinstance(value, dict):
        return {k: _cut(v, start, length) for k, v in value.items()}
    return value


class BlockRunner:
    """How to record keys/values and call blocks on a suffix, for one model (see the module docstring).

    ``kv_reuse`` is False (with ``note`` saying why) when the model's attention cannot be run on a
    suffix from recorded keys/values; patches then recompute every position from the patched block on.
    """

    def __init__(self, model: nn.Module, pp: PatchParts) -> None:
        self.model = model
        self.pp = pp
        self.kv_reuse = pp.causal
        self.note = "" if pp.causal else "bidirectional attention: every position is recomputed"
        self.masks: dict[tuple[int, int, str], torch.Tensor] = {}  # causal masks of suffixes, made once

    # -- the recorded run --------------------------------------------------------------------------
    def record_call(self, ids: torch.Tensor, last_only: bool = False) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
        """``(args, kwargs, cache)``: ``model(*args, **kwargs)`` runs ``ids`` and leaves every layer's
        keys/values in ``cache`` (read them with :meth:`keys_values`); ``last_only``: the model may
        compute the last position's logits only."""
        raise NotImplementedError

    def keys_values(self, cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
        raise NotImplementedError

    def plain_call(self, ids: torch.Tensor, last_only: bool = False) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` of a forward of ``ids`` without any cache (``last_only``: see :meth:`record_call`)."""
        return lm_call(self.model, ids, last_only=last_only)

    def _last_only(self, last_only: bool) -> dict[str, Any]:
        """``logits_to_keep=1`` when asked for and the model's forward takes it (Hugging Face causal LMs)."""
        if not last_only:
            return {}
        return {"logits_to_keep": 1} if takes_logits_to_keep(self.model) else {}

    def caches(self, cache: Any) -> set[int]:
        """Ids of the objects in recorded block arguments that are (part of) ``cache``."""
        return {id(cache)}

    # -- calling a block again ---------------------------------------------------------------------
    def prefix(self, kv: list[tuple[torch.Tensor, torch.Tensor]], start: int) -> Any:
        raise NotImplementedError

    def block_kwargs(self, call: BlockCall, cache_ids: set[int], start: int, length: int, prefix: Any,
                     layer: int, batch: int) -> dict[str, Any]:
        """Arguments for block ``layer`` on positions ``start..length-1`` of ``batch`` runs (``prefix``:
        :meth:`prefix` of the recorded keys/values, ``None`` when ``start`` is 0)."""
        out: dict[str, Any] = {}
        device = next((v.device for v in call.arguments.values() if isinstance(v, torch.Tensor)), None)
        for name, value in call.arguments.items():
            if id(value) in cache_ids:
                out[name] = self._cache_arg(prefix, layer, batch) if start else None
            elif start and "mask" in name:
                out[name] = self._mask(value, start, length, device)
            elif name == "use_cache" and not start:
                out[name] = False
            elif start:
                out[name] = _cut(value, start, length)
            else:
                out[name] = value
        return out

    def _cache_arg(self, prefix: Any, layer: int, batch: int) -> Any:
        return prefix

    def _mask(self, mask: Any, start: int, length: int, device: torch.device | None) -> Any:
        if isinstance(mask, torch.Tensor) and mask.ndim == 4:
            return mask[..., start:, :]  # the suffix's query rows against every key
        if mask is None:  # SDPA's own causal flag served the whole prompt: a suffix needs the explicit mask
            key = (start, length, str(device))
            if key not in self.masks:
                rows = torch.ones(length - start, length, dtype=torch.bool, device=device)
                self.masks[key] = rows.tril(diagonal=start)[None, None]
            return self.masks[key]
        return mask

    def hidden_of(self, output: Any) -> torch.Tensor:
        """A block's output hidden state (its first output: :func:`~nbdebug.capture.leaves.first_output`)."""
        h = first_output(output)
        if h is None:
            raise TypeError(f"a block returned {type(output).__name__} without a tensor")
        return h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The model's logits for residual ``h`` after the last block (final norm, head, softcap)."""
        parts = self.pp.parts
        return parts.logits(parts.normed(h))

    def check_calls(self, calls: list[BlockCall], cache_ids: set[int]) -> None:
        """Turn ``kv_reuse`` off (with a note) when a recorded mask cannot be cut to a suffix."""
        impl = getattr(getattr(self.model, "config", None), "_attn_implementation", None)
        if impl is not None and impl not in _KV_IMPLEMENTATIONS:
            self.kv_reuse, self.note = False, f"attention implementation {impl!r}: every position is recomputed"
        for call in calls:
            for name, value in call.arguments.items():
                if "mask" in name and value is not None and not isinstance(value, torch.Tensor) and id(value) not in cache_ids:
                    self.kv_reuse = False
                    self.note = f"attention mask of type {type(value).__name__}: every position is recomputed"


class HFBlockRunner(BlockRunner):
    """Hugging Face decoders: the model's own cache argument with a recording ``DynamicCache``; a
    suffix's blocks get a cache that prepends the recorded keys/values (``(batch, kv_heads, T, d)``)."""

    def record_call(self, ids: torch.Tensor, last_only: bool = False) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
        recording, _ = _hf_caches()
        cache = recording(getattr(self.model, "config", None))
        params = inspect.signature(self.model.forward).parameters
        name = "cache" if "cache" in params else "past_key_values"
        return (), {"input_ids": ids, name: cache, "use_cache": True, **self._last_only(last_only)}, cache

    def keys_values(self, cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [cache.recorded[i] for i in sorted(cache.recorded)]

    def prefix(self, kv: list[tuple[torch.Tensor, torch.Tensor]], start: int) -> Any:
        _, prefix_cache = _hf_caches()
        return prefix_cache({i: (k[:, :, :start], v[:, :, :start]) for i, (k, v) in enumerate(kv)})


class HookedBlockRunner(BlockRunner):
    """TransformerLens: its own ``TransformerLensKeyValueCache`` records (keys before rotary, ``(batch,
    T, kv_heads, d)``); a suffix's block gets a frozen cache entry holding the earlier positions."""

    def record_call(self, ids: torch.Tensor, last_only: bool = False) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
        from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

        cfg = self.model.cfg
        cache = TransformerLensKeyValueCache.init_cache(cfg, cfg.device, 1)
        return (ids,), {"past_kv_cache": cache, "attention_mask": torch.ones_like(ids)}, cache

    def keys_values(self, cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(e.past_keys, e.past_values) for e in cache.entries]

    def caches(self, cache: Any) -> set[int]:
        return {id(cache), *(id(e) for e in cache.entries)}

    def prefix(self, kv: list[tuple[torch.Tensor, torch.Tensor]], start: int) -> Any:
        return [(k[:, :start], v[:, :start]) for k, v in kv]

    def _cache_arg(self, prefix: Any, layer: int, batch: int) -> Any:
        from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry

        k, v = prefix[layer]
        return TransformerLensKeyValueCacheEntry(k.expand(batch, *k.shape[1:]), v.expand(batch, *v.shape[1:]), frozen=True)

    def _mask(self, mask: Any, start: int, length: int, device: torch.device | None) -> Any:
        return None  # (batch, keys) padding mask of ones: TransformerLens masks causally with the cache offset

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        model = self.model
        z = model.unembed(model.ln_final(h)) if hasattr(model, "ln_final") else model.unembed(h)
        cap = self.pp.parts.softcap
        return torch.tanh(z / cap) * cap if cap else z


def block_runner(model: nn.Module, pp: PatchParts) -> BlockRunner:
    """The runner of ``model``'s family."""
    return HookedBlockRunner(model, pp) if pp.hooked else HFBlockRunner(model, pp)


_CLASSES: dict[str, Any] = {}


def _hf_caches() -> tuple[Any, Any]:
    """``(RecordingCache, PrefixCache)``, subclasses of transformers' ``DynamicCache`` made on first use."""
    if not _CLASSES:
        from transformers.cache_utils import DynamicCache

        class RecordingCache(DynamicCache):
            """The model's usual cache, also keeping what every layer's attention attended to."""

            def __init__(self, config: Any) -> None:
                super().__init__(config=config)
                self.recorded: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

            def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                       **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
                keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
                self.recorded[layer_idx] = (keys, values)
                return keys, values

        class PrefixCache(DynamicCache):
            """Every layer's recorded keys/values of the earlier positions, prepended (batch-expanded) to
            what the layer computes for the suffix; nothing is stored, so one object serves every pass."""

            def __init__(self, prefix: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
                super().__init__()
                self.prefix = prefix

            def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                       **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
                k, v = self.prefix[layer_idx]
                b = key_states.shape[0]
                k = k.to(key_states.device, key_states.dtype).expand(b, *k.shape[1:])
                v = v.to(value_states.device, value_states.dtype).expand(b, *v.shape[1:])
                return torch.cat([k, key_states], dim=-2), torch.cat([v, value_states], dim=-2)

            def get_seq_length(self, layer_idx: int = 0) -> int:
                return int(self.prefix[min(self.prefix)][0].shape[-2]) if self.prefix else 0

        _CLASSES["recording"], _CLASSES["prefix"] = RecordingCache, PrefixCache
    return _CLASSES["recording"], _CLASSES["prefix"]
