"""Steering in the logit-lens view: the cell's input run again with :func:`nbdebug.steer` (``alpha ·
vector`` added to one block's output) and the lens of that run, next to the original one.

``--steer VAR`` names a vector from :func:`nbdebug.steering_vector` (a 1-D tensor of the hidden size;
the view offers every block, starting at the vector's ``layer`` attribute if it has one, else the
middle block) or a dict ``{layer name or index: vector}`` (the view offers those layers). Each request
is one forward of nbdebug's own (:func:`~nbdebug.runs.patchrun.own_pass`: the user's hooks set
aside, buffers and RNG as found) on the token ids the lens shows, under ``steer``, reading every
block's output; the lens of it uses the same final norm, unembedding and targets as the view's
(:func:`~nbdebug.sessions.lens.model_lens`). The model is held weakly: once it is deleted a
request answers with the ``ModelGoneError`` message (re-run the cell).

>>> s = SteerLens(model, ids, shown=9, vectors=v, make_lens=factory)      # doctest: +SKIP
>>> s.lens("model.layers.10", 4.0).columns([8])["top_ids"][-1, 0, 0]      # the steered next token
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..adapters.embedding import lm_call
from ..capture import ModelRef
from ..capture.state import execution_device
from ..inspectors.logitlens import LogitLens
from ..runs.interventions import read_activations
from ..runs.patchrun import own_pass
from ..workbench import steer

__all__ = ["SteerLens", "steer_vectors"]


def steer_vectors(value: Any, block_names: list[str]) -> tuple[dict[str, torch.Tensor], str]:
    """``({layer name: vector}, default layer)`` from ``--steer``'s value: one vector (every block
    offered; default its ``layer`` attribute, else the middle block) or a dict ``{name or index: vector}``."""
    def name_of(key: Any) -> str:
        if isinstance(key, int) and not isinstance(key, bool):
            if not -len(block_names) <= key < len(block_names):
                raise ValueError(f"--steer: layer {key} is outside the model's {len(block_names)} blocks")
            return block_names[key]
        if str(key) not in block_names:
            raise ValueError(f"--steer: {key!r} is not a block of the model (blocks: {block_names[0]} … {block_names[-1]})")
        return str(key)

    def vec(v: Any) -> torch.Tensor:
        t = torch.as_tensor(v).detach()
        if t.dim() != 1 and not (t.dim() == 2 and t.shape[0] == 1):
            raise ValueError(f"--steer: a steering vector is 1-D (the hidden size), got shape {tuple(t.shape)}")
        return t.flatten().float().cpu().clone()

    if isinstance(value, Mapping):
        if not value:
            raise ValueError("--steer: the dict of steering vectors is empty")
        out = {name_of(k): vec(v) for k, v in value.items()}
        return out, next(iter(out))
    if value is None or isinstance(value, str):
        raise ValueError("--steer VAR: VAR holds a vector from nbdebug.steering_vector(...) or {layer: vector}")
    v = vec(value)
    carried = getattr(value, "layer", None)
    default = name_of(carried) if carried is not None else block_names[len(block_names) // 2]
    return {n: v for n in block_names}, default


class SteerLens:
    """Steered runs of one token sequence ``ids`` ``(1, T)`` and their lenses (the last ``shown``
    positions, as the view shows them), the last few cached. ``make_lens(rows)`` builds a
    :class:`LogitLens` from rows of ``(shown, d)`` residuals (embeddings, then each block's output)."""

    def __init__(self, model: nn.Module, ids: torch.Tensor, *, shown: int, vectors: Any,
                 make_lens: Callable[[list[torch.Tensor]], LogitLens], block_names: list[str], keep: int = 4) -> None:
        self.model_ref: ModelRef[nn.Module] = ModelRef(model)
        self.ids = ids.detach().clone().cpu()
        self.shown = int(shown)
        self.block_names = list(block_names)
        self.vectors, self.default = steer_vectors(vectors, self.block_names)
        self.make_lens = make_lens
        self.keep = int(keep)
        self.cache: OrderedDict[tuple[str, float], LogitLens] = OrderedDict()
        self.runs = 0

    @property
    def layers(self) -> list[str]:
        """The layers the view offers."""
        return list(self.vectors)

    def residuals(self, layer: str, alpha: float) -> list[torch.Tensor]:
        """The steered run's residual stream: the first block's input, then every block's output ``(shown, d)``."""
        if layer not in self.vectors:
            raise ValueError(f"no steering vector for {layer!r} (offered: {', '.join(self.layers)})")
        model = self.model_ref.get()
        blocks = [model.get_submodule(n) for n in self.block_names]
        ids = self.ids.to(execution_device(model) or "cpu")
        points = [(blocks[0], "input")] + [(b, "output") for b in blocks]
        with own_pass(model), steer(model, layer=layer, vector=self.vectors[layer], alpha=float(alpha)), \
                read_activations(points) as seen:
            args, kwargs = lm_call(model, ids, last_only=False)
            model(*args, **kwargs)
        missing = [i for i, s in enumerate(seen) if not s]
        if missing:
            raise RuntimeError(f"the steered run did not reach rows {missing} of the lens")
        self.runs += 1
        return [s[0][0, -self.shown:].clone() for s in seen]

    def lens(self, layer: str, alpha: float) -> LogitLens:
        """The lens of the run steered at ``layer`` by ``alpha`` (cached: the last ``keep`` settings)."""
        key = (str(layer), round(float(alpha), 6))
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        lens = self.make_lens(self.residuals(key[0], key[1]))
        self.cache[key] = lens
        while len(self.cache) > self.keep:
            self.cache.popitem(last=False)
        return lens
