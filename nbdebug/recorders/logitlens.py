"""Recorder of the logit-lens view: the residual stream at every block boundary of one forward.

While the cell runs, hooks keep the input of the first block (embeddings, already scaled where the
model scales them) and every block's output for the first top-level call. Afterwards the lens is
computed with the model's own final norm and unembedding: the last position's column at once (what
the view shows first), the rest when the view asks or when ``result()`` is called.

>>> with LogitLensRecorder(model, tokenizer=tok, target_token=" Paris") as rec:   # doctest: +SKIP
...     model(**tok("The capital of France is", return_tensors="pt"))
>>> rec.result().top1()[-1]
' Paris'
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import numpy as np
import torch
from torch import nn

from ..adapters.text import (
    decoder_for,
    input_ids_of,
    resolve_option,
    token_strings,
    valid_positions,
)
from ..adapters.transformers import find_parts, require_lens
from ..capture import HookSet, ModelCall
from ..inspectors.logitlens import LensResult, LogitLens
from ..views import Recorder

__all__ = ["LogitLensRecorder", "resolve_target"]


def resolve_target(target: Any, tokenizer: Any) -> tuple[int | None, str]:
    """Token id (and a label) for ``--target-token``: an id, ``"#id"``, or text encoding to one token."""
    if target is None or target == "":
        return None, ""
    if isinstance(target, (int, np.integer)):
        return int(target), f"#{int(target)}"
    text = str(target)
    if text.startswith("#") and text[1:].isdigit():
        return int(text[1:]), text
    if tokenizer is None:
        if text.isdigit():
            return int(text), f"#{text}"
        raise ValueError(f"--target-token {text!r} needs --tokenizer (or pass a token id)")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise ValueError(f"--target-token {text!r} encodes to no token")
    label = repr(text) if len(ids) == 1 else f"{text!r} (first of {len(ids)} tokens)"
    return int(ids[0]), label


def _hidden_of(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def _logits_of(output: Any) -> torch.Tensor | None:
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, torch.Tensor) and output.dim() == 3:
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor) and output[0].dim() == 3:
        return output[0]
    return None


class LogitLensRecorder(Recorder):
    """Captures residual streams while entered; ``result()`` → :class:`LensResult`.

    Options: ``tokenizer`` (object or name), ``tokens``, ``target_token`` (text, id or ``#id``;
    default: each position's next input token, and the model's own prediction at the last),
    ``lens_topk`` (default 10), ``seq_index``, ``final_norm``/``unembed`` (explicit parts),
    ``translators`` (tuned lens: one callable per layer, e.g. ``lambda h, i=i: tl.transform_hidden(h, i)``).
    """

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        ns = options.get("user_ns")
        self.tokenizer = resolve_option(options.get("tokenizer"), ns, "tokenizer")
        self.tokens = resolve_option(options.get("tokens"), ns, "tokens")
        self.k = int(options.get("lens_topk") or 10)
        self.batch_index = int(options.get("seq_index") or 0)
        self.parts = find_parts(model, final_norm=options.get("final_norm"), unembed=options.get("unembed"))
        require_lens(self.parts, model)
        self.target_id, self.target_label = resolve_target(options.get("target_token"), self.tokenizer)
        self._call = ModelCall(model)
        self._stack = ExitStack()
        self._resid: list[torch.Tensor | None] = [None] * (self.parts.n_layers + 1)
        self._finished = False
        self._lens: LogitLens | None = None
        self._result: LensResult | None = None
        self._widget: Any = None
        self.check = ""
        self.notes: list[str] = []

    # -- capture ---------------------------------------------------------------------------------
    def _keep(self, i: int, h: torch.Tensor | None) -> None:
        if h is None or self._finished or self._call.calls != 1 or self._resid[i] is not None:
            return
        h = h.detach()
        b = min(self.batch_index, h.shape[0] - 1) if h.dim() == 3 else 0
        self._resid[i] = (h[b] if h.dim() == 3 else h).clone()

    def _pre0(self, _m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        h = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("hidden_states")
        self._keep(0, h if isinstance(h, torch.Tensor) else None)

    def _post(self, i: int) -> Any:
        return lambda _m, _a, out: self._keep(i + 1, _hidden_of(out))

    def _done(self, *_: Any) -> None:
        if self._call.calls >= 1:
            self._finished = True

    def __enter__(self) -> LogitLensRecorder:
        try:
            self._stack.enter_context(self._call)
            hooks = self._stack.enter_context(HookSet())
            hooks.forward_pre(self.parts.blocks[0][1], self._pre0, with_kwargs=True)
            for i, (_n, block) in enumerate(self.parts.blocks):
                hooks.forward(block, self._post(i))
            hooks.forward(self.model, self._done)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    # -- lens --------------------------------------------------------------------------------------
    def lens(self) -> LogitLens:
        """The lens engine with the last position's column already computed."""
        if self._lens is not None:
            return self._lens
        missing = [i for i, r in enumerate(self._resid) if r is None]
        if len(missing) == len(self._resid):
            raise RuntimeError("the cell did not run the model: nothing to show")
        if missing:
            raise RuntimeError(f"residual stream missing at rows {missing} (blocks not called?)")
        resid = torch.stack([r for r in self._resid if r is not None])  # (R, T, d)
        self._resid = []
        T = resid.shape[1]
        ids_all = input_ids_of(self._call.args, self._call.kwargs)
        row = ids_all[min(self.batch_index, ids_all.shape[0] - 1)] if ids_all is not None else None
        pos = valid_positions(self._call.kwargs, self.batch_index, T)
        if pos is not None:
            resid = resid.index_select(1, pos.to(resid.device))
            row = row[pos.to(row.device)] if row is not None else None
            self.notes.append(f"padding removed: {len(pos)} real tokens of item {self.batch_index}")
        T = resid.shape[1]
        toks = token_strings(row, tokens=self.tokens, tokenizer=self.tokenizer, model=self.model, length=T)
        targets = torch.full((T,), -1, dtype=torch.long)
        label = self.target_label
        if self.target_id is not None:
            targets[:] = self.target_id
        elif row is not None:
            targets[:-1] = row[1:].cpu()
            label = "next input token (last position: the model's own prediction)"
        p = self.parts
        names = ["embed"] + [f"{n}" for n, _ in p.blocks]
        assert p.unembed_weight is not None
        lens = LogitLens(
            resid, p.normed, p.unembed_weight.detach(), None if p.unembed_bias is None else p.unembed_bias.detach(),
            k=self.k, targets=targets, softcap=p.softcap, row_names=names, tokens=toks,
            decode=decoder_for(self.tokenizer, self.model), target_label=label,
            translators=self.options.get("translators"),
        )
        if lens.translators:
            self.notes.append("tuned lens: the given translators are applied before the final norm")
        if self.target_id is None and row is not None:
            top, _ = lens.cell(lens.R - 1, T - 1, k=1)
            targets[-1] = int(top[0])
        lens.columns([T - 1])
        self._check(lens, pos)
        self._lens = lens
        return lens

    def _check(self, lens: LogitLens, pos: torch.Tensor | None) -> None:
        """Compare the final row with the logits the model returned (last position)."""
        logits = _logits_of(self._call.output)
        if logits is None or logits.shape[-1] != lens.weight.shape[0]:
            return
        b = min(self.batch_index, logits.shape[0] - 1)
        t = int(pos[-1]) if pos is not None else logits.shape[1] - 1
        if t >= logits.shape[1]:
            return
        ref = torch.softmax(logits[b, t].detach().float(), -1)
        ids = lens.table["top_ids"][-1, -1]
        ours = lens.table["top_probs"][-1, -1]
        diff = float(np.abs(ref[torch.as_tensor(ids)].cpu().numpy() - ours).max())
        same = int(ref.argmax()) == int(ids[0])
        self.check = f"final row vs model logits: top-1 {'matches' if same else 'DIFFERS'}, max |Δp| = {diff:.1e}"

    def result(self) -> LensResult:
        if self._result is None:
            res = self.lens().result()
            res.check = self.check
            res.notes = list(self.parts.notes) + self.notes
            if self._call.calls > 1:
                res.notes.append(f"the cell ran the model {self._call.calls} times; the first call is shown")
            self._result = res
        return self._result

    def widget(self) -> Any:
        if self._widget is None:
            from ..widgets.logitlens import LogitLensWidget

            self._widget = LogitLensWidget(self.lens(), check=self.check, notes=list(self.parts.notes) + self.notes)
        return self._widget
