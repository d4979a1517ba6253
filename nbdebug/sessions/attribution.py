"""The token-attribution view's clicks: another method, IG steps, a fixed first token or another
generated token as the answer, each computed once by :func:`nbdebug.attribute` on the prompt, the
model held weakly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..attribution import Attribution, attribute
from ..attribution.methods import METHODS
from ..capture import ModelRef

__all__ = ["AttributionSession"]


class AttributionSession:
    """What the view's method switch re-runs: the prompt, answer/wrong and options, the model held
    weakly; each ``(method, steps, fix_first, pick)`` computed once.

    ``generated``: the ids ``generate()`` appended to the prompt (empty without a generation); pick
    ``k`` attributes ``generated[k]`` over ``ids`` followed by ``generated[:k]`` (the prefix the
    generation itself ran on); pick ``None`` is ``answer`` over ``ids``."""

    def __init__(self, model: nn.Module, ids: torch.Tensor, answer: Any, wrong: Any, tokenizer: Any,
                 steps: int, fix_first: bool, max_bytes: Any, generated: list[int] | None = None) -> None:
        self.model_ref: ModelRef[nn.Module] = ModelRef(model)
        self.ids, self.answer, self.wrong, self.tokenizer = ids, answer, wrong, tokenizer
        self.steps, self.fix_first, self.max_bytes = steps, fix_first, max_bytes
        self.generated: list[int] = list(generated or [])
        self.results: dict[tuple[str, int, bool, int | None], Attribution] = {}

    def prefix(self, pick: int | None) -> tuple[torch.Tensor, Any]:
        """``(ids (1, T), answer)`` of ``pick``: the prompt and ``answer``, or the prefix before the
        ``pick``-th generated token and that token's id."""
        if pick is None:
            return self.ids, self.answer
        if not 0 <= pick < len(self.generated):
            raise ValueError(f"pick {pick}: the generation has {len(self.generated)} new tokens")
        before = torch.tensor([self.generated[:pick]], dtype=self.ids.dtype)
        return torch.cat([self.ids, before], 1), self.generated[pick]

    def get(self, method: str, steps: int | None = None, fix_first: bool | None = None,
            pick: int | None = None) -> Attribution:
        """The attribution by ``method`` (``steps``/``fix_first`` default to the view's options) of
        ``pick`` (None: ``answer`` over the prompt; k: the k-th generated token over its prefix)."""
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; one of {METHODS}")
        key = (method, int(steps or self.steps), self.fix_first if fix_first is None else bool(fix_first),
               None if pick is None else int(pick))
        if key not in self.results:
            ids, answer = self.prefix(key[3])
            self.results[key] = attribute(self.model_ref.get(), ids, answer=answer, wrong=self.wrong,
                                          tokenizer=self.tokenizer, method=method, steps=key[1],
                                          fix_first=key[2], max_bytes=self.max_bytes)
        return self.results[key]
