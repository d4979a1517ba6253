"""Recorder of the logit-lens view: the residual stream at every block boundary of one forward.

While the cell runs, hooks keep the input of the first block (embeddings, already scaled where the
model scales them) and every block's output for the first top-level call (after ``generate()``:
of one extra forward on the final sequence, shared with the attention view), within ``max_bytes`` (the last positions that fit). Afterwards the lens is
computed with the model's own final norm and unembedding: the last position's column at once (what
the view shows first), the rest when the view asks or when ``result()`` is called. The lens holds
the model's final norm, projection and unembedding weakly: once the model is deleted, a column or
cell not computed yet answers with the ``ModelGoneError`` message.

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

from ..adapters.outputs import logits_of
from ..adapters.text import (
    decoder_for,
    input_ids_of,
    resolve_option,
    token_strings,
    valid_positions,
)
from ..adapters.transformers import find_parts, require_lens
from ..adapters.unhookable import refuse_unhookable
from ..capture import HookSet, parse_bytes
from ..capture.budget import format_bytes
from ..capture.state import offloaded
from ..inspectors.attention import display_token
from ..inspectors.logitlens import LensResult, LogitLens
from ..lens import resolve_lens
from ..runs.replay import (
    generation_note,
    int_option,
    nothing_shown,
)
from ..sessions.lens import head_device, weak_parts
from ..sessions.steer import SteerLens, steer_vectors
from ._language import LanguageRecorder

__all__ = ["LogitLensRecorder", "head_device", "resolve_target", "weak_parts"]


def resolve_target(target: Any, tokenizer: Any) -> tuple[int | None, str]:
    """Token id (and a label) for ``--target-token``: an id, ``"#id"``, or text encoding to one token."""
    if target is None or target == "":
        return None, ""
    text = str(target)
    tid = int(target) if isinstance(target, (int, np.integer)) else int(text[1:]) if text.startswith("#") and text[1:].isdigit() else None
    if tid is None and tokenizer is None and text.isdigit():
        tid = int(text)
    if tid is not None:
        try:  # the token's text next to its id when the tokenizer can say it
            return tid, f"'{display_token(tokenizer.decode([tid]))}' (#{tid})" if tokenizer is not None else f"#{tid}"
        except Exception:
            return tid, f"#{tid}"
    if tokenizer is None:
        raise ValueError(f"--target-token {text!r} needs --tokenizer (or pass a token id)")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise ValueError(f"--target-token {text!r} encodes to no token")
    # one spelling of a token with a leading space across the views: '␣Paris' (display_token)
    shown = f"'{display_token(text)}'"
    label = shown if len(ids) == 1 else f"{shown} (first of {len(ids)} tokens)"
    return int(ids[0]), label


def _hidden_of(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


class LogitLensRecorder(LanguageRecorder):
    """Captures residual streams while entered; ``result()`` → :class:`LensResult`.

    Options: ``tokenizer`` (object or name), ``tokens``, ``answer`` or its alias ``target_token`` (text, id or ``#id``;
    default: each position's next input token, and the model's own prediction at the last),
    ``lens_topk`` (default 10), ``seq_index``, ``max_bytes`` (residuals kept: the last positions that
    fit), ``final_norm``/``unembed`` (explicit parts), ``steer`` (a steering vector or ``{layer: vector}``, or
    the name of a notebook variable holding one: the view's steering panel, :mod:`nbdebug.sessions.steer`), ``translators`` (tuned lens: one callable per
    layer, e.g. ``lambda h, i=i: tl.transform_hidden(h, i)``), ``lens`` (``logit``, ``tuned``, ``shortcut``, a
    folder, a :class:`~nbdebug.lens.FittedLens` or the name of a variable holding one; two comma-separated:
    shown, compared; :func:`~nbdebug.lens.resolve_lens`). Holds the model weakly.
    """

    def __init__(self, model: nn.Module, **options: Any) -> None:
        refuse_unhookable(model)  # TorchScript, torch.export: hooks cannot see its layers (one line instead)
        super().__init__(model, **options)
        ns = options.get("user_ns")
        self.tokenizer = resolve_option(options.get("tokenizer"), ns, "tokenizer")
        self.tokens = resolve_option(options.get("tokens"), ns, "tokens")
        self.k = int_option(options.get("lens_topk"), 10)
        if self.k < 1:
            raise ValueError(f"--lens-topk {self.k}: must be at least 1")
        self.batch_index = int_option(options.get("seq_index"), 0)
        self.max_bytes = parse_bytes(options.get("max_bytes"))
        self.parts = find_parts(model, final_norm=options.get("final_norm"), unembed=options.get("unembed"))
        require_lens(self.parts, model)
        target = options.get("target_token")  # --target-token: the lens's older name of --answer (an alias)
        self.target_id, self.target_label = resolve_target(options.get("answer") if target is None else target, self.tokenizer)
        self.steer_value = resolve_option(options.get("steer"), ns, "steer")
        if self.steer_value is not None:  # a bad --steer stops here, before the cell
            steer_vectors(self.steer_value, [n for n, _ in self.parts.blocks])
        self.steering: SteerLens | None = None
        self._lens: LogitLens | None = None
        self._result: LensResult | None = None
        self._widget: Any = None
        self.check = ""
        self.notes: list[str] = []
        self.fitted, self.compared, self.compare = resolve_lens(options.get("lens"), model, tokenizer=self.tokenizer,
                                                                user_ns=ns, notes=self.notes)
        self.other: LogitLens | None = None
        self._setup(model, self.batch_index)

    def _reset(self) -> None:
        self._resid: list[torch.Tensor | None] = [None] * (self.parts.n_layers + 1)
        self._capturing = False
        self._seen = False
        self._offset = 0
        self._full_T = 0
        self._last_logits: torch.Tensor | None = None
        self._ids: torch.Tensor | None = None
        self._kwargs: dict[str, Any] = {}

    # -- capture ---------------------------------------------------------------------------------
    def _top_pre(self, *_: Any) -> None:
        self._capturing = not self._seen and (self._replay.running or (self._call.calls == 1 and self._call.in_generate == 0))
        if self._capturing:
            args, kwargs = self._replay.inputs()
            self._ids, self._kwargs = input_ids_of(args, kwargs), kwargs

    def _keep(self, i: int, h: torch.Tensor | None) -> None:
        if h is None or not self._capturing or self._resid[i] is not None:
            return
        h = h.detach()
        b = min(self.batch_index, h.shape[0] - 1) if h.dim() == 3 else 0
        h = h[b] if h.dim() == 3 else h
        if i == 0:  # the budget: the last positions whose residuals (every row) fit in max_bytes
            T, d = h.shape
            per = len(self._resid) * d * h.element_size()
            n = max(1, min(T, self.max_bytes // max(per, 1)))
            self._full_T, self._offset = T, T - n
        self._resid[i] = h[self._offset:].clone()

    def _pre0(self, _m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        h = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("hidden_states")
        self._keep(0, h if isinstance(h, torch.Tensor) else None)

    def _post(self, i: int) -> Any:
        return lambda _m, _a, out: self._keep(i + 1, _hidden_of(out))

    def _top_post(self, _m: nn.Module, _args: Any, output: Any) -> None:
        if self._capturing:
            logits = logits_of(output, ndim=3)
            if logits is not None:
                b = min(self.batch_index, logits.shape[0] - 1)
                self._last_logits = logits[b].detach()[-1].float().clone()  # (V,): the check of the final row
            self._seen = True
        self._capturing = False

    def _install(self, stack: ExitStack, model: nn.Module) -> None:
        hooks = self._hooks = stack.enter_context(HookSet())
        hooks.forward_pre(model, self._top_pre)
        hooks.forward_pre(self.parts.blocks[0][1], self._pre0, with_kwargs=True)
        for i, (_n, block) in enumerate(self.parts.blocks):
            hooks.forward(block, self._post(i))
        hooks.forward(model, self._top_post)

    # -- lens --------------------------------------------------------------------------------------
    def _prepare(self) -> None:
        self.lens()

    def lens(self) -> LogitLens:
        """The lens engine with the last position's column already computed."""
        if self._lens is not None:
            return self._lens
        missing = [i for i, r in enumerate(self._resid) if r is None]
        if len(missing) == len(self._resid):
            raise RuntimeError(nothing_shown(self._replay))
        if missing and not self._seen:  # the forward never returned: the cell raised inside the model
            raise RuntimeError(f"the model raised (or was interrupted) during its forward, after {len(self._resid) - len(missing) - 1} "
                               f"of {len(self._resid) - 1} blocks: no complete residual stream to show")
        if missing:
            raise RuntimeError(f"residual stream missing at rows {missing} (blocks not called?)")
        resid = [r for r in self._resid if r is not None]  # R × (T, d), each where its block ran
        self._resid = []
        off = self._offset
        ids_all = self._ids
        row = ids_all[min(self.batch_index, ids_all.shape[0] - 1)] if ids_all is not None else None
        pos = valid_positions(self._kwargs, self.batch_index, self._full_T)
        if off:
            self.notes.append(f"kept the residual stream of the last {self._full_T - off} of {self._full_T} positions "
                              f"(--max-bytes {format_bytes(self.max_bytes)})")
            row = row[off:] if row is not None else None
            pos = pos[pos >= off] - off if pos is not None else None
        if pos is not None:
            resid = [r.index_select(0, pos.to(r.device)) for r in resid]
            row = row[pos.to(row.device)] if row is not None else None
            self.notes.append(f"padding removed: {len(pos)} real tokens of item {self.batch_index}")
        T = resid[0].shape[0]
        toks = token_strings(row, tokens=None if off else self.tokens, tokenizer=self.tokenizer, model=self.model, length=T)
        if len(toks) < T and row is not None:  # tokens given for the prompt; generated ones after them
            toks = toks + token_strings(row[len(toks):], tokenizer=self.tokenizer, model=self.model)
        targets = torch.full((T,), -1, dtype=torch.long)
        label = self.target_label
        if self.target_id is not None:
            targets[:] = self.target_id
        elif row is not None:
            targets[:-1] = row[1:].cpu()
            label = "next input token (last position: the model's own prediction)"
        p = self.parts
        names = ["embed"] + [f"{n}" for n, _ in p.blocks]
        normed, weight, bias, loaded, notes = weak_parts(p)
        self.notes += notes
        if p.unembed_module is not None and offloaded(p.unembed_module):
            name = next((n for n, m in self.model.named_modules() if m is p.unembed_module), "the unembedding")
            where = getattr(self.model, "hf_device_map", {}).get(name, "")
            self.notes.append(f"`{name}` is offloaded by accelerate{f' ({where})' if where else ''}: its weights are loaded "
                              "for each request of this view (as for a forward) and put back")
        gen = self._replay.generated_flags(self._replay.length)
        if gen:
            keep = torch.arange(len(gen))[off:]
            if pos is not None:
                keep = keep[pos]
            gen = [gen[int(i)] for i in keep]
        same = dict(k=self.k, targets=targets, softcap=p.softcap, row_names=names, tokens=toks,
                    decode=decoder_for(self.tokenizer, self.model), target_label=label,
                    translators=self.fitted.translators() if self.fitted is not None else self.options.get("translators"),
                    generated=gen,
                    device=head_device(p, resid), loaded=loaded)
        head = (normed, weight, bias if p.unembed_bias is not None else None)
        lens = LogitLens(resid, *head, **same)  # type: ignore[arg-type]
        if self.steer_value is not None and ids_all is not None:  # the same lens over a steered run
            full = ids_all[min(self.batch_index, ids_all.shape[0] - 1)]
            kept = valid_positions(self._kwargs, self.batch_index, self._full_T)
            full = full[kept.to(full.device)] if kept is not None else full
            if kept is not None:
                self.notes.append("steering re-runs this item's tokens alone, without its padding and attention mask "
                                  "(α 0 shows the cell's own run)")
            self.steering = SteerLens(self.model, full[None], shown=T, vectors=self.steer_value,
                                      make_lens=lambda rows: LogitLens(rows, *head, **same),  # type: ignore[arg-type]
                                      block_names=[n for n, _ in p.blocks])
        if self.compare:  # the same residuals through the compared lens (None: the logit lens)
            other = dict(same, translators=self.compared.translators() if self.compared is not None else None)
            self.other = LogitLens(resid, *head, **other)  # type: ignore[arg-type]
        if lens.translators and self.fitted is None:
            self.notes.append("tuned lens: the given translators are applied before the final norm")
        with lens.loaded():  # an offloaded head is loaded once for both
            if self.target_id is None and row is not None:
                top, _ = lens.cell(lens.R - 1, T - 1, k=1)
                targets[-1] = int(top[0])
            lens.columns([T - 1])
        self._check(lens)
        self._lens = lens
        return lens

    def _check(self, lens: LogitLens) -> None:
        """Compare the final row with the logits the model returned (last position)."""
        logits = self._last_logits
        if logits is None or logits.shape[-1] != lens.vocab_size:
            return
        ref = torch.softmax(logits, -1)
        ids = lens.table["top_ids"][-1, -1]
        ours = lens.table["top_probs"][-1, -1]
        diff = float(np.abs(ref[torch.as_tensor(ids)].cpu().numpy() - ours).max())
        same = int(ref.argmax()) == int(ids[0])
        self.check = f"final row vs model logits: top-1 {'matches' if same else 'DIFFERS'}, max |Δp| = {diff:.1e}"

    def _notes(self) -> list[str]:
        note = generation_note(self._call, self._replay, "logit lens")
        return ([note] if note else []) + list(self.parts.notes) + self.notes

    def result(self) -> LensResult:
        if self._result is None:
            res = self.lens().result()
            res.check = self.check
            res.notes = self._notes()
            self._result = res
        return self._result

    def widget(self) -> Any:
        if self._widget is None:
            from ..widgets.logitlens import LogitLensWidget

            self._widget = LogitLensWidget(self.lens(), check=self.check, notes=self._notes(), steering=self.steering,
                                           other=self.other, fitted=(self.fitted, self.compared))
        return self._widget
