"""A recorded run of one prompt, the cached state patches start from: every block's input, what each
block was called with, every layer's keys/values, the activations of the site kinds asked for, and
the model's logits.

>>> run = record_state(model, pp, runner, ids, kinds=("attn",))      # doctest: +SKIP
>>> run.block_inputs[3].shape, run.taps["attn"][3].shape, len(run.kv)
(torch.Size([1, 9, 576]), torch.Size([1, 9, 576]), 30)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..adapters.blockparts import PatchParts
from ..adapters.blockrun import BlockCall, BlockRunner, bind_call
from ..adapters.outputs import logits_of
from ..capture.leaves import first_input
from ..runs.patchrun import record_run

__all__ = ["RunState", "record_state", "site_taps"]


@dataclass
class RunState:
    """One prompt's recorded run (tensors detached, batch 1). ``prefix(p)`` is the runner's cache of
    the keys/values of positions ``< p``, built once per ``p``."""

    ids: torch.Tensor
    logits: torch.Tensor
    block_inputs: list[torch.Tensor]
    calls: list[BlockCall]
    cache_ids: set[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    taps: dict[str, list[torch.Tensor]]
    runner: BlockRunner
    cache: Any = None
    prefixes: dict[int, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(self.ids.shape[1])

    def prefix(self, start: int) -> Any:
        """Keys/values of positions ``< start`` as the runner's suffix cache (None for 0)."""
        if not start:
            return None
        if start not in self.prefixes:
            self.prefixes[start] = self.runner.prefix(self.kv, start)
        return self.prefixes[start]

    def activation(self, kind: str, layer: int) -> torch.Tensor:
        """The recorded activation of a site kind at ``layer`` (``resid``: the block's input)."""
        if kind == "resid":
            return self.block_inputs[layer]
        return self.taps[kind][layer]

    def nbytes(self) -> int:
        tensors = [self.logits, *self.block_inputs, *(t for ts in self.taps.values() for t in ts),
                   *(t for kv in self.kv for t in kv)]
        return sum(t.numel() * t.element_size() for t in tensors)


def site_taps(pp: PatchParts, kinds: Iterable[str]) -> dict[str, list[tuple[nn.Module, str]]]:
    """The points to record for ``kinds`` (``resid`` comes with every run: the blocks' inputs)."""
    return {k: [(mod, pp.where(k)) for _, mod in pp.sites(k)] for k in kinds if k != "resid"}


def record_state(model: nn.Module, pp: PatchParts, runner: BlockRunner, ids: torch.Tensor,
                 kinds: Iterable[str] = (), last_only: bool = False) -> RunState:
    """Run ``ids`` once (nbdebug's own pass) and keep what patches start from (``last_only``: the
    logits of the last position may be all that is kept)."""
    args, kwargs, cache = runner.record_call(ids, last_only)
    blocks = [b for _, b in pp.parts.blocks]
    rec = record_run(model, (args, kwargs), blocks, site_taps(pp, kinds))
    calls = [bind_call(b, a, kw) for b, (a, kw) in zip(blocks, rec.block_args)]
    inputs = []
    for j, (a, kw) in enumerate(rec.block_args):
        x = first_input(a, kw)
        if x is None:
            raise RuntimeError(f"block {pp.parts.blocks[j][0]} was called without a hidden-state tensor")
        inputs.append(x.detach())
    logits = logits_of(rec.output)
    if logits is None:
        raise RuntimeError(f"no logits in the output of {type(model).__name__}")
    cache_ids = runner.caches(cache)
    runner.check_calls(calls, cache_ids)
    kv = runner.keys_values(cache)
    if runner.kv_reuse and len(kv) != len(blocks):
        runner.kv_reuse, runner.note = False, f"keys/values recorded for {len(kv)} of {len(blocks)} layers: every position is recomputed"
    return RunState(ids=ids, logits=logits.detach(), block_inputs=inputs, calls=calls, cache_ids=cache_ids,
                    kv=[(k.detach(), v.detach()) for k, v in kv], taps=rec.taps, runner=runner, cache=cache)
