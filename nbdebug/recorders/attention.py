"""Recorder of the attention view: attention probabilities of every layer and head of one forward.

Hugging Face models running fused SDPA return no weights, so the model is switched to eager
attention while the cell runs and switched back afterwards (the view says which path ran). Only the
first top-level call of the cell is captured (for ``generate``: the prompt's forward).

>>> with AttentionRecorder(model, tokenizer=tok) as rec:     # doctest: +SKIP
...     model(**tok("The capital of France is", return_tensors="pt"))
>>> rec.result().summary
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from ..adapters.text import input_ids_of, resolve_option, token_strings, valid_positions
from ..adapters.transformers import ModelParts, eager_attention, find_parts
from ..capture import HookSet, ModelCall
from ..inspectors.attention import AttentionAccumulator, AttentionResult
from ..views import Recorder

__all__ = ["AttentionRecorder"]


def _weights_of(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.dim() == 4 else None  # TransformerLens hook_pattern
    if isinstance(output, (tuple, list)) and len(output) > 1:
        w = output[1]
        if isinstance(w, torch.Tensor) and w.dim() == 4 and w.shape[-1] == w.shape[-2]:
            return w
    return None


class AttentionRecorder(Recorder):
    """Captures per-head attention while entered; ``result()`` → :class:`AttentionResult`.

    Options (magic flags or keywords): ``tokens`` (list of strings, or the name of one),
    ``tokenizer`` (object or name), ``seq_index`` (batch item shown, default 0), ``user_ns``.
    """

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        ns = options.get("user_ns")
        self.tokens = resolve_option(options.get("tokens"), ns, "tokens")
        self.tokenizer = resolve_option(options.get("tokenizer"), ns, "tokenizer")
        self.batch_index = int(options.get("seq_index") or 0)
        self.parts: ModelParts = find_parts(model)
        self.path = ""
        self._stack = ExitStack()
        self._call = ModelCall(model)
        self._acc: AttentionAccumulator | None = None
        self._finished = False
        self._ids: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._missing: list[str] = []
        self._result: AttentionResult | None = None
        self._widget: Any = None

    # -- capture ---------------------------------------------------------------------------------
    def _on_attention(self, index: int) -> Any:
        def hook(_m: nn.Module, _args: Any, output: Any) -> None:
            if self._finished or self._call.calls != 1:
                return
            w = _weights_of(output)
            if w is None:
                self._missing.append(self.parts.attentions[index][0])
                return
            if self._acc is None:
                ids = input_ids_of(self._call.args, self._call.kwargs)
                pos = valid_positions(self._call.kwargs, self.batch_index, w.shape[-1])
                self._acc = AttentionAccumulator(len(self.parts.attentions), batch_index=self.batch_index, positions=pos)
                self._ids = ids
                self._positions = pos
            self._acc.add(w)

        return hook

    def _done(self, *_: Any) -> None:
        if self._call.calls >= 1:
            self._finished = True

    def __enter__(self) -> AttentionRecorder:
        try:
            self.path = self._stack.enter_context(eager_attention(self.model))
            self._stack.enter_context(self._call)
            hooks = self._stack.enter_context(HookSet())
            for i, (_name, mod) in enumerate(self.parts.attentions):
                hooks.forward(mod, self._on_attention(i))
            hooks.forward(self.model, self._done)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    # -- results ---------------------------------------------------------------------------------
    def result(self) -> AttentionResult:
        if self._result is not None:
            return self._result
        if self._acc is None:
            if self._missing:
                raise RuntimeError(
                    f"{self._missing[0]} returned no attention weights (path: {self.path}); load the model "
                    "with attn_implementation='eager'"
                )
            raise RuntimeError("the cell did not run the model: nothing to show")
        ids = self._ids
        row = None
        if ids is not None:
            row = ids[min(self.batch_index, ids.shape[0] - 1)]
            if self._positions is not None:
                row = row[self._positions.to(row.device)]
        toks = token_strings(row, tokens=self.tokens, tokenizer=self.tokenizer, model=self.model)
        res = self._acc.result(toks, [n for n, _ in self.parts.attentions], self.path)
        if self._call.calls > 1:
            res.notes.append(f"the cell ran the model {self._call.calls} times; the first call is shown")
        if self._positions is not None:
            res.notes.append(f"padding removed: {len(self._positions)} real tokens of item {self.batch_index}")
        if any(m.training for m in self.model.modules() if "drop" in type(m).__name__.lower()):
            res.notes.append("model in training mode: attention dropout was applied to these weights")
        self._acc = None
        self._result = res
        return res

    def widget(self) -> Any:
        if self._widget is None:
            from ..widgets.attention import AttentionWidget

            self._widget = AttentionWidget(self.result())
        return self._widget
