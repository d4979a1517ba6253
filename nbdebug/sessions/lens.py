"""The logit lens on a model's own final norm and unembedding, held weakly: what the lens view, its
steering panel and the patching view's lens column share (one lens implementation,
:class:`~nbdebug.inspectors.logitlens.LogitLens`).

>>> lens = model_lens(model, [h0, h1, h2], targets=torch.tensor([3]))   # rows of (T, d)  # doctest: +SKIP
>>> lens_column(lens)[-1]          # the final row at the last position
{'row': 'model.layers.1', 'token': ' Paris', 'id': 3681, 'p': 0.61, 'p_answer': 0.61}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, TypedDict

import numpy as np
import torch
from torch import nn

from ..adapters.text import decoder_for
from ..adapters.transformers import ModelParts, find_parts, require_lens
from ..capture import ModelRef
from ..capture.state import execution_device, loaded_weights
from ..inspectors.logitlens import LogitLens
from ..lens.resolve import resolve_one

__all__ = ["LensEntry", "head_device", "lens_column", "lens_translators", "model_lens", "weak_parts"]


class LensEntry(TypedDict):
    """One row of a lens column (THE format: the patching view's three runs, the attention view's
    ablation; ``js/src/lib/lenscolumn.ts`` draws it): the row's name, its top-1 token (``id``, ``token``,
    probability ``p``) and the target's probability ``p_answer`` (-1: no target)."""

    row: str
    id: int
    token: str
    p: float
    p_answer: float


def lens_translators(lens: Any, model: nn.Module, **resolve: Any) -> list[Callable[[torch.Tensor], torch.Tensor] | None]:
    """The :class:`LogitLens` ``translators=`` of what ``--lens`` names (``[]`` for the logit lens):
    one value resolved as the lens view resolves it (:func:`~nbdebug.lens.resolve_one`; ``resolve``:
    ``tokenizer=``, ``user_ns=``, ``notes=``)."""
    fitted = resolve_one(lens, model, **resolve)
    return fitted.translators() if fitted is not None else []


def model_lens(model: nn.Module, residuals: Sequence[torch.Tensor], *, targets: torch.Tensor | None = None, k: int = 5,
               tokenizer: Any = None, tokens: Sequence[str] | None = None, parts: ModelParts | None = None,
               decode: Callable[[list[int]], list[str]] | None = None, lens: Any = None, **options: Any) -> LogitLens:
    """A :class:`LogitLens` over ``residuals`` (rows of ``(T, d)``: the embeddings, then each block's
    output) read through ``model``'s own final norm and unembedding, both held weakly (``options``:
    the other :class:`LogitLens` arguments, e.g. ``target_label``). ``lens``: what ``--lens`` names
    (``None``/``"logit"``: the logit lens; ``"tuned"``, ``"shortcut"``, a folder or a
    :class:`~nbdebug.lens.FittedLens`: :func:`lens_translators`), the same lens as the lens view's."""
    p = parts if parts is not None else find_parts(model)
    require_lens(p, model)
    if lens is not None:
        options["translators"] = lens_translators(lens, model)
    normed, weight, bias, loaded, _ = weak_parts(p)
    rows = list(residuals)
    return LogitLens(rows, normed, weight, bias if p.unembed_bias is not None else None, k=k, targets=targets,
                     softcap=p.softcap, row_names=["embed"] + [n for n, _ in p.blocks], tokens=tokens,
                     decode=decode or decoder_for(tokenizer, model), device=head_device(p, rows), loaded=loaded,
                     **options)


def lens_column(lens: LogitLens, position: int = -1) -> list[LensEntry]:
    """One position's lens, row by row: ``{row, id, token, p, p_answer}`` (the top-1 token, its
    probability, and the probability of that position's target: -1 without one)."""
    pos = position % lens.T
    c = lens.columns([pos])
    ids = [int(i) for i in c["top_ids"][:, 0, 0]]
    lens.learn(ids)
    return [{"row": lens.row_names[r], "id": ids[r], "token": lens.vocab.get(ids[r], f"#{ids[r]}"),
             "p": float(c["top_probs"][r, 0, 0]), "p_answer": float(np.nan_to_num(c["target_prob"][r, 0], nan=-1.0))}
            for r in range(lens.R)]


def weak_parts(parts: ModelParts) -> tuple[Any, Any, Any, Any, list[str]]:
    """``(normed_fn, weight_fn, bias_fn, loaded, notes)`` holding the model's modules and parameters weakly.

    When the unembedding is a module's own ``weight`` (``lm_head``), it is read through the module
    at each request (accelerate's offload replaces the parameter objects at every forward) inside
    ``loaded()`` (:func:`~nbdebug.capture.state.loaded_weights`: accelerate's hook loads them, then
    puts them back on ``meta``). The final norm is called as a module, so its hook loads its own."""
    notes: list[str] = []

    def weak(obj: Any) -> Any:
        if obj is None:
            return None
        if isinstance(obj, (nn.Module, nn.Parameter)):
            return ModelRef(obj).get
        if isinstance(obj, torch.Tensor):
            base = obj._base if obj._base is not None and isinstance(obj._base, nn.Parameter) else None
            if base is not None and obj.dim() == 2 and obj.shape == base.T.shape:  # e.g. TransformerLens W_U.T
                ref = ModelRef(base)
                return lambda: ref.get().T
            notes.append("the unembedding is not a parameter of the model: a reference to it is kept")
            return lambda: obj
        return lambda: obj  # a function given as final_norm=: kept as given

    norm, pre = weak(parts.final_norm), weak(parts.pre_unembed)

    def normed(h: torch.Tensor) -> torch.Tensor:
        if norm is not None:
            h = norm()(h)
        if pre is not None:
            h = pre()(h)
        return h

    if parts.unembed_module is not None:  # find_parts sets it only when the unembedding is its .weight
        head = ModelRef(parts.unembed_module)

        def head_bias() -> torch.Tensor | None:
            b = getattr(head.get(), "bias", None)
            return None if b is None else b.detach()

        return normed, lambda: head.get().weight.detach(), head_bias, lambda: loaded_weights(head.get()), notes

    weight, bias = weak(parts.unembed_weight), weak(parts.unembed_bias)

    def weight_fn() -> torch.Tensor:
        return weight().detach()

    def bias_fn() -> torch.Tensor | None:
        return None if bias is None else bias().detach()

    return normed, weight_fn, bias_fn, nullcontext, notes


def head_device(parts: ModelParts, resid: list[torch.Tensor]) -> torch.device:
    """Where the lens gathers the residuals: where the final norm runs (else the head, else the last block)."""
    for mod in (parts.final_norm, parts.unembed_module):
        dev = execution_device(mod) if isinstance(mod, nn.Module) else None
        if dev is not None:
            return dev
    return resid[-1].device
