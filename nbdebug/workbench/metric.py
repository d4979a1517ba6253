"""What a patch is measured by: ``logit[answer] - logit[wrong]`` at the last position, the answer's
log-probability when there is no ``wrong``, or the user's ``metric(logits) -> (B,)``; and the
tokens of the two prompts.

The convention of ``answer=``/``wrong=`` for the public API, written here once (issue 28): ``answer``
and ``wrong`` → ``logit[answer] − logit[wrong]`` at the last position; ``answer`` alone →
``log p(answer)``; ``metric=`` → the user's callable. :func:`nbdebug.patch`, :func:`nbdebug.attribute`
(token attribution), the views' clicks (the attention view's head ablation, the patching view, the
attribution view's ``--answer``/``--wrong``) all build this :class:`Metric` (:meth:`Metric.build`);
``answer``/``wrong`` are keyword arguments after the model and the inputs everywhere.

>>> m = Metric.build(answer=" Paris", wrong=" Rome", tokenizer=tok)      # doctest: +SKIP
>>> m(logits)                    # logits (B, T, V) or (B, V) at the last position -> (B,) float32
>>> m.label
"logit[' Paris'] - logit[' Rome']"
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["Metric", "MetricError", "answer_entry", "token_labels", "token_of", "tokens_of", "top_k", "top_tokens"]


class MetricError(ValueError):
    """The answer, the prompts or the metric cannot be used as given; the message says what to pass."""


def token_labels(tokenizer: Any, ids: list[int]) -> list[str]:
    """One readable label per token id (``tokenizer.decode([i])``; the id itself without a tokenizer)."""
    if tokenizer is None:
        return [str(i) for i in ids]
    return [tokenizer.decode([i]) for i in ids]


def top_k(logits: torch.Tensor | np.ndarray, k: int = 5) -> tuple[list[int], list[float]]:
    """THE top-``k`` of a next-token distribution: ``(ids, probabilities)`` of last-position ``logits``
    ``(V,)``, softmax in float64 on the host copy (every top-token list of the workbench, the patching
    and ablation clicks goes through it)."""
    z = torch.as_tensor(logits).detach().double().reshape(-1)
    p = torch.softmax(z, -1)
    v, i = p.topk(min(k, p.numel()))
    return [int(a) for a in i], [float(b) for b in v]


def top_tokens(logits: torch.Tensor | np.ndarray, tokenizer: Any, k: int = 5) -> list[dict[str, Any]]:
    """The ``k`` most likely next tokens of last-position ``logits`` ``(V,)``: ``{id, token, p}`` each."""
    ids, ps = top_k(logits, k)
    return [{"id": a, "token": t, "p": b} for a, t, b in zip(ids, token_labels(tokenizer, ids), ps)]


def answer_entry(logits: torch.Tensor | np.ndarray, answer: int | None, tokenizer: Any) -> dict[str, Any] | None:
    """The answer token's ``{id, token, p, rank}`` (rank 1 = the most likely) in last-position ``logits``,
    shown under every top-5 whether or not it is in it; None without an answer id."""
    if answer is None:
        return None
    z = torch.as_tensor(logits).detach().double().reshape(-1)
    p = torch.softmax(z, -1)
    rank = int((z > z[int(answer)]).sum()) + 1
    return {"id": int(answer), "token": token_labels(tokenizer, [int(answer)])[0], "p": float(p[int(answer)]), "rank": rank}


def token_of(value: int | str | torch.Tensor, tokenizer: Any, what: str) -> int:
    """A token id from an id or a string that the tokenizer encodes as exactly one token."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise MetricError(f"{what}: a tensor of {value.numel()} ids; give one token id")
        return int(value.item())
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise MetricError(f"{what}={value!r}: a string (with tokenizer=) or a token id")
    if tokenizer is None:
        raise MetricError(f"{what}={value!r} is a string: pass tokenizer= to encode it, or give its token id")
    ids = list(tokenizer.encode(value, add_special_tokens=False))
    if len(ids) != 1:
        pieces = token_labels(tokenizer, ids)
        raise MetricError(f"{what}={value!r} is {len(ids)} tokens {pieces} (ids {ids}); the metric needs ONE token: "
                          f"pass one of these ids, or a string that is a single token (often with a leading space)")
    return int(ids[0])


def tokens_of(value: Any, tokenizer: Any, what: str) -> torch.Tensor:
    """A prompt as ``(1, T)`` token ids: a string (with the tokenizer), ids ``(T,)``/``(1, T)``, a list of
    ids, or a tokenizer's output (``input_ids``)."""
    if isinstance(value, str):
        if tokenizer is None:
            raise MetricError(f"{what} is a string: pass tokenizer= to encode it, or give token ids")
        value = tokenizer(value, return_tensors="pt")["input_ids"]
    elif hasattr(value, "keys") and "input_ids" in value:
        mask = value.get("attention_mask")
        if mask is not None and not bool(torch.as_tensor(mask).all()):
            raise MetricError(f"{what} has padding (attention_mask with zeros); give one unpadded prompt")
        value = value["input_ids"]
    ids = torch.as_tensor(value)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise MetricError(f"{what}: one prompt of token ids, shape (T,) or (1, T); got {tuple(ids.shape)} {ids.dtype}")
    return ids.long()


@dataclass
class Metric:
    """One number per run from its logits; higher means "more like the clean run's answer"."""

    answer: int | None = None
    wrong: int | None = None
    fn: Callable[[torch.Tensor], torch.Tensor] | None = None
    label: str = ""
    prob: bool = False  # the answer's probability instead of its log-probability (no ``wrong``)

    @classmethod
    def build(cls, answer: Any = None, wrong: Any = None, tokenizer: Any = None,
              metric: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Metric:
        """From ``metric=`` (a callable on ``(B, T, V)`` logits returning ``(B,)``), or ``answer`` and
        optionally ``wrong`` (strings with ``tokenizer``, or token ids)."""
        if metric is not None:
            if not callable(metric):
                raise MetricError("metric= must be a callable: logits (B, T, V) -> (B,)")
            return cls(fn=metric, label=getattr(metric, "__name__", "metric"))
        if answer is None:
            raise MetricError("say what to measure: answer= (and wrong=), or metric=callable(logits) -> (B,)")
        a = token_of(answer, tokenizer, "answer")
        names = token_labels(tokenizer, [a])
        if wrong is None:
            return cls(answer=a, label=f"log p({names[0]!r})")
        w = token_of(wrong, tokenizer, "wrong")
        if w == a:
            raise MetricError(f"answer and wrong are the same token ({a}): the difference would always be 0")
        return cls(answer=a, wrong=w, label=f"logit[{names[0]!r}] - logit[{token_labels(tokenizer, [w])[0]!r}]")

    @property
    def needs_all_positions(self) -> bool:
        """Whether the metric reads every position's logits (a user callable) or only the last one."""
        return self.fn is not None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """``(B,)`` float32 from ``(B, T, V)`` logits (or ``(B, V)``: the last position's)."""
        if self.fn is not None:
            out = torch.as_tensor(self.fn(logits))
            if out.ndim != 1 or out.shape[0] != logits.shape[0]:
                raise MetricError(f"metric returned shape {tuple(out.shape)}; it must return one value per run: "
                                  f"({logits.shape[0]},)")
            return out.float()
        last = (logits[:, -1] if logits.ndim == 3 else logits).float()
        if self.answer is None:
            raise MetricError("no answer token to measure")
        if self.wrong is None:
            return (torch.softmax if self.prob else torch.log_softmax)(last, dim=-1)[:, self.answer]
        return last[:, self.answer] - last[:, self.wrong]
