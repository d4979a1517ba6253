"""A fitted lens: one affine translator per residual row, read through the model's own final norm and
unembedding.

Rows follow the logit-lens view: row 0 is the first block's input (the embeddings), row ``b + 1`` the
residual after block ``b``. A lens holds a translator ``h ↦ A h + c`` for rows ``0 … L-1``; the last
block's output is read as it is (it *is* the final residual). ``logits(block, hidden)`` applies the
translator of the residual after ``block`` (``block=-1``: the embeddings), then the model's final norm
(and any projection before the head), then the unembedding — the formula of Belrose et al. (2023),
``logits = U · norm(h + W h + c)`` with ``A = I + W``.

>>> lens = nbdebug.fit_lens(model, tok, texts, kind="shortcut")       # doctest: +SKIP
>>> lens.logits(10, hidden)                                           # (…, V)  # doctest: +SKIP
>>> lens.save("smollm2-shortcut")                                     # doctest: +SKIP
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..adapters.transformers import ModelParts, find_parts, require_lens
from ..capture import ModelRef
from ..capture.state import loaded_weights

__all__ = ["KINDS", "FittedLens"]

#: what ``kind`` says: how the translators were made
KINDS = ("logit", "tuned", "shortcut", "jacobian")


class FittedLens:
    """Translators ``A (L, d, d)``, ``c (L, d)`` (row ``r`` = residual before block ``r``; the model's
    ``L`` blocks) and the model they read through (held weakly). ``quality``: per-row KL(final ‖ lens)
    in nats on held-out text (``{"lens": [...], "logit": [...], "tokens": n}``, empty when unknown);
    ``info``: how it was made (tokens, seconds, steps, vocabulary used in training)."""

    def __init__(self, kind: str, A: torch.Tensor, c: torch.Tensor, *, model: nn.Module | None = None,
                 parts: ModelParts | None = None, quality: dict[str, Any] | None = None,
                 info: dict[str, Any] | None = None, source: str = "") -> None:
        if kind not in KINDS:
            raise ValueError(f"lens kind {kind!r}: one of {', '.join(KINDS)}")
        if A.dim() != 3 or A.shape[1] != A.shape[2] or c.shape != A.shape[:2]:
            raise ValueError(f"translators: A is (L, d, d) and c (L, d); got {tuple(A.shape)} and {tuple(c.shape)}")
        self.kind = kind
        self.A = A.detach().float().cpu().clone().contiguous()
        self.c = c.detach().float().cpu().clone().contiguous()
        self.quality = dict(quality or {})
        self.info = dict(info or {})
        self.source = source
        #: a tuned lens started from least squares: that shortcut lens (fitted on the same pass), else None
        self.start: FittedLens | None = None
        self._model: ModelRef[nn.Module] | None = None
        self._parts: ModelParts | None = None
        if model is not None:
            self.attach(model, parts)

    @property
    def blocks(self) -> int:
        """The number of blocks of the model the lens is for (``logits`` takes ``-1 … blocks - 1``)."""
        return int(self.A.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.A.shape[1])

    @property
    def name(self) -> str:
        return self.source or f"{self.kind} lens"

    def attach(self, model: nn.Module, parts: ModelParts | None = None) -> FittedLens:
        """Read through ``model``'s final norm and unembedding (checked against the lens's shape)."""
        p = parts if parts is not None else find_parts(model)
        require_lens(p, model)
        if p.n_layers != self.blocks:
            raise ValueError(f"this {self.name} has {self.blocks} blocks; the model has {p.n_layers}: "
                             "fit or load a lens for this model")
        w = p.unembed_weight
        d = int(w.shape[1]) if w is not None and w.dim() == 2 else self.d_model
        if p.pre_unembed is None and d != self.d_model:
            raise ValueError(f"this {self.name} maps residuals of size {self.d_model}; the model's are {d}")
        self._model, self._parts = ModelRef(model), p
        return self

    @property
    def parts(self) -> ModelParts:
        if self._parts is None or self._model is None:
            raise RuntimeError("this lens is not attached to a model: nbdebug.load_lens(path, model) or lens.attach(model)")
        self._model.get()  # ModelGoneError once the model is deleted
        return self._parts

    def row(self, block: int) -> int:
        """The row of the residual after ``block`` (``-1``: the embeddings → row 0)."""
        b = int(block)
        if not -1 <= b < self.blocks:
            raise IndexError(f"block {b}: the lens covers blocks -1 (the embeddings) … {self.blocks - 1}")
        return b + 1

    def translate(self, block: int, hidden: torch.Tensor) -> torch.Tensor:
        """``A h + c`` for the residual after ``block`` (the last block's output: unchanged)."""
        r = self.row(block)
        if r == self.blocks:
            return hidden
        A = self.A[r].to(hidden.device)
        c = self.c[r].to(hidden.device)
        return (hidden.float() @ A.T + c).to(hidden.dtype)

    @torch.no_grad()
    def logits(self, block: int, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``(…, V)`` of ``hidden`` ``(…, d)``, the residual after ``block``: translator, the
        model's own final norm (and projection), unembedding (and softcap)."""
        p = self.parts
        x = p.normed(self.translate(block, hidden))
        mod = p.unembed_module
        with loaded_weights(mod) if mod is not None else _null():
            w = mod.weight if mod is not None else p.unembed_weight
            b = getattr(mod, "bias", None) if mod is not None else p.unembed_bias
            assert w is not None
            z = x.to(w.device).float() @ w.float().T
            if b is not None:
                z = z + b.float()
        if p.softcap:
            z = torch.tanh(z / p.softcap) * p.softcap
        return z

    def translators(self) -> list[Callable[[torch.Tensor], torch.Tensor] | None]:
        """One callable per lens row but the last (the :class:`~nbdebug.inspectors.logitlens.LogitLens`
        ``translators=`` argument; the logit lens gives ``[]``)."""
        if self.kind == "logit":
            return []
        return [lambda h, b=b: self.translate(b, h) for b in range(-1, self.blocks - 1)]

    # -- files -------------------------------------------------------------------------------------
    def save(self, path: str | pathlib.Path) -> pathlib.Path:
        """A folder in tuned-lens's format (``config.json`` + ``params.pt``: ``{i}.weight`` = ``A − I``,
        ``{i}.bias`` = ``c``), plus ``nbdebug.json`` (kind, quality, how it was made)."""
        out = pathlib.Path(path)
        out.mkdir(parents=True, exist_ok=True)
        eye = torch.eye(self.d_model)
        state = {}
        for i in range(self.blocks):
            state[f"{i}.weight"] = (self.A[i] - eye).clone()
            state[f"{i}.bias"] = self.c[i].clone()
        torch.save(state, out / "params.pt")
        config = {"base_model_name_or_path": self.info.get("model", ""), "d_model": self.d_model,
                  "num_hidden_layers": self.blocks, "bias": True, "base_model_revision": None,
                  "unembed_hash": None, "lens_type": "linear_tuned_lens"}
        (out / "config.json").write_text(json.dumps(config))
        (out / "nbdebug.json").write_text(json.dumps({"kind": self.kind, "quality": self.quality, "info": self.info}))
        return out

    def __repr__(self) -> str:
        q = self.quality.get("lens")
        mean = f", held-out KL {sum(q) / len(q):.2f} nats (mean over rows)" if q else ""
        return f"FittedLens({self.kind}, {self.blocks} blocks, d={self.d_model}{mean})"


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
