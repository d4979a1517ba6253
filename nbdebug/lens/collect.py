"""The text a lens is fitted on, and the residual stream of one forward over it.

``token_sequences`` turns text (a string, a list of strings, or token ids) into sequences of
``seq_len`` ids; ``residual_batches`` runs the model once per batch of sequences as nbdebug's own pass
(:func:`~nbdebug.runs.own.own_pass`: no grad, buffers and RNG as found, the user's hooks set
aside, eval mode for the pass and the mode restored) and yields every row of the residual stream
(the first block's input, then each block's output) for the positions kept: the first position of each
sequence is left out (its residual norm is tens of times the others': an attention sink that no
affine map of the rest describes, and that would dominate a least-squares fit).

>>> for rows in residual_batches(model, parts, seqs):    # rows: (L + 1, n, d) float32 on the CPU  # doctest: +SKIP
...     ...
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..adapters.embedding import lm_call
from ..adapters.transformers import ModelParts
from ..capture.state import execution_device
from ..runs.interventions import read_activations
from ..runs.patchrun import own_pass

__all__ = ["eval_mode", "residual_batches", "token_sequences"]


def token_sequences(texts: Any, tokenizer: Any, *, seq_len: int, max_tokens: int) -> torch.Tensor:
    """``(n, seq_len)`` token ids: the texts tokenized one after the other (joined by the EOS token
    when the tokenizer has one), cut into sequences, at most ``max_tokens`` ids in all."""
    if isinstance(texts, torch.Tensor):
        ids = texts.detach().flatten().long().cpu()
    else:
        if isinstance(texts, str):
            texts = [texts]
        if tokenizer is None:
            raise ValueError("fit_lens: texts need a tokenizer (or pass token ids as a tensor)")
        sep = getattr(tokenizer, "eos_token_id", None)
        out: list[int] = []
        for t in texts:
            out += list(tokenizer.encode(str(t), add_special_tokens=False))
            if sep is not None:
                out.append(int(sep))
            if len(out) >= max_tokens:
                break
        ids = torch.tensor(out, dtype=torch.long)
    n = min(len(ids), max_tokens) // seq_len
    if n == 0:
        raise ValueError(f"fit_lens: the text gives {len(ids)} tokens, fewer than one sequence of {seq_len}: "
                         "pass more text or a smaller seq_len")
    return ids[: n * seq_len].view(n, seq_len)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Every module in eval mode for the block, each put back as it was (dropout off while fitting)."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        yield
    finally:
        for m, t in modes:
            m.training = t


def residual_batches(model: nn.Module, parts: ModelParts, seqs: torch.Tensor, *, batch: int = 1,
                     skip_first: bool = True) -> Iterator[torch.Tensor]:
    """For each batch of sequences: ``(L + 1, n, d)`` float32 CPU residuals (rows as the lens view's)."""
    blocks = [m for _, m in parts.blocks]
    points = [(blocks[0], "input")] + [(b, "output") for b in blocks]
    dev = execution_device(model) or torch.device("cpu")
    start = 1 if skip_first else 0
    for i in range(0, seqs.shape[0], batch):
        ids = seqs[i:i + batch].to(dev)
        args, kwargs = lm_call(model, ids, last_only=True)  # the residuals only: no logits but the last position's
        with own_pass(model), eval_mode(model), read_activations(points) as seen:
            model(*args, **kwargs)
        missing = [j for j, s in enumerate(seen) if not s]
        if missing:
            raise RuntimeError(f"fit_lens: the forward did not reach rows {missing} of the residual stream")
        rows = [s[0][:, start:].reshape(-1, s[0].shape[-1]).float().cpu() for s in seen]
        yield torch.stack(rows)


def split_holdout(seqs: torch.Tensor, holdout: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fit, held out)``: the last sequences (about ``holdout`` tokens) kept apart for the quality strip."""
    if holdout <= 0 or seqs.shape[0] < 2:
        return seqs, seqs[:0]
    n = max(1, min(seqs.shape[0] // 2, -(-holdout // seqs.shape[1])))
    return seqs[:-n], seqs[-n:]


def sample_rows(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """``k`` distinct indices of ``range(n)`` (all of them when ``k >= n``), sorted."""
    if k >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=gen)[:k].sort().values


def as_list(x: Sequence[float] | torch.Tensor) -> list[float]:
    return [round(float(v), 5) for v in x]
