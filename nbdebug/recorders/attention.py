"""Recorder of the attention view: per-head summaries of every layer, one head's matrix on demand.

Hugging Face models keep their fused attention (SDPA...): a pass-through attention function
(:mod:`nbdebug.runs.attention_probe`) sees each layer's queries and keys. They are kept for one
sequence within ``max_bytes`` (float32, else float16); summaries and thumbnails are computed from
them in bounded chunks, and a head's matrix is recomputed when the view asks. Layers that do not fit
are summarised during the forward and recomputed by running the model again when asked (the model is
held weakly). Other models (TransformerLens, attention outside the AttentionInterface) are switched
to eager attention and their probabilities read by hooks, kept only if they fit in ``max_bytes``.

For ``model.generate(...)`` (or a KV-cache decoding loop) the view covers the final sequence: one
extra forward on it after the cell, under ``no_grad``, on clones of the buffers, shared with the
logit lens when both views run (:func:`~nbdebug.runs.replay.replay_final`); if it fails, the
first call is shown with a note. Otherwise the first top-level call of the cell is shown.

>>> with AttentionRecorder(model, tokenizer=tok) as rec:     # doctest: +SKIP
...     model(**tok("The capital of France is", return_tensors="pt"))
>>> rec.result().finding          # the heads unusual for this model (inspectors/attention_findings.py)
'30 of 270 heads stand out: L16H0 attends to the previous token (86%; typical head here: 27%); ...'
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from ..adapters.text import (
    input_ids_of,
    resolve_option,
    token_option,
    token_strings,
    valid_positions,
)
from ..adapters.transformers import ModelParts, eager_attention, find_parts
from ..adapters.unhookable import refuse_unhookable
from ..capture import HookSet, ModelRef, parse_bytes
from ..capture.budget import format_bytes
from ..inspectors.attention import AttentionAccumulator, AttentionResult, build_result
from ..inspectors.attention_qk import (
    CHUNK_BYTES,
    AttentionDetail,
    KeyRanges,
    LayerQK,
    key_ranges,
    summarize_qk,
)
from ..runs.attention_probe import QKCall, probe_attention, probe_supported
from ..runs.replay import (
    Replay,
    forward_again,
    generation_note,
    int_option,
    nothing_shown,
)
from ..sessions.ablation import AblationSession, ablation_problem
from ._language import LanguageRecorder

__all__ = ["AttentionRecorder"]


def _weights_of(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.dim() == 4 else None  # TransformerLens hook_pattern
    if isinstance(output, (tuple, list)) and len(output) > 1:
        w = output[1]
        if isinstance(w, torch.Tensor) and w.dim() == 4 and w.shape[-1] == w.shape[-2]:
            return w
    return None


def _half_copy(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t / s)`` as float16 and ``s``, a power of two ≥ 1 chosen on the device (no host read) so that
    no finite value overflows float16 (|x| ≤ 2¹⁴ after scaling); dividing by a power of two is exact."""
    amax = t.detach().abs().amax().float()
    amax = torch.where(torch.isfinite(amax), amax, torch.ones_like(amax))
    s = torch.exp2(torch.ceil(torch.log2(amax.clamp_min(1.0) / 2**14))).clamp_min(1.0)
    return (t / s).to(torch.float16), s


class AttentionRecorder(LanguageRecorder):
    """Captures per-head attention while entered; ``result()`` → :class:`AttentionResult`.

    Options (magic flags or keywords): ``tokens`` (list of strings, or the name of one),
    ``tokenizer`` (object or name), ``seq_index`` (batch item shown, default 0), ``max_bytes``
    (what the view keeps: queries/keys or matrices; ``64MB`` or an int), ``user_ns``.
    Holds the model weakly (``self.model`` raises ``ModelGoneError`` once it is gone).
    """

    def __init__(self, model: nn.Module, **options: Any) -> None:
        refuse_unhookable(model)  # TorchScript, torch.export: hooks cannot see its layers (one line instead)
        super().__init__(model, **options)
        ns = options.get("user_ns")
        self.tokens = resolve_option(options.get("tokens"), ns, "tokens")
        self.tokenizer = resolve_option(options.get("tokenizer"), ns, "tokenizer")
        self.batch_index = int_option(options.get("seq_index"), 0)
        self.max_bytes = parse_bytes(options.get("max_bytes"))
        self.parts: ModelParts = find_parts(model)
        self.why_no_probe = probe_supported(model, [m for _, m in self.parts.attentions])
        self.path = ""
        self._index = {id(m): i for i, (_n, m) in enumerate(self.parts.attentions)}
        self._result: AttentionResult | None = None
        self._widget: Any = None
        self._setup(model, self.batch_index)

    def _reset(self) -> None:
        L = len(self.parts.attentions)
        self._acc: AttentionAccumulator | None = None
        self._kept: list[LayerQK | None] = [None] * L
        self._stats: list[dict[str, Any] | None] = [None] * L
        self._seen = 0
        self._kept_bytes = 0
        self._half = False
        self._masks: dict[int, tuple[torch.Tensor | None, KeyRanges | str]] = {}
        self._ids: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._positions_dev: torch.Tensor | None = None
        self._missing: list[str] = []
        self._problem = ""
        self._capturing = False
        self._mask_kwargs: dict[str, Any] = {}
        self._completed = False  # the shown forward returned

    # -- capture: which call is shown -------------------------------------------------------------
    def _top_pre(self, *_: Any) -> None:
        self._capturing = self._replay.running or (self._call.calls == 1 and self._call.in_generate == 0)
        if self._capturing:
            args, kwargs = (self._replay.args, self._replay.kwargs) if self._replay.running else (self._call.args, self._call.kwargs)
            self._ids = input_ids_of(args, kwargs)
            self._mask_kwargs = kwargs

    def _top_post(self, *_: Any) -> None:
        if self._capturing:
            self._completed = True
        self._capturing = False

    def _chunk_bytes(self) -> int:
        return max(2**20, min(CHUNK_BYTES, self.max_bytes // 4))

    # -- probe path: queries/keys of each layer ---------------------------------------------------
    def _on_qk(self, qk: QKCall) -> None:
        i = self._index.get(id(qk.module))
        if not self._capturing or i is None or self._stats[i] is not None or self._kept[i] is not None:
            return
        b = min(self.batch_index, qk.query.shape[0] - 1)
        q, k = qk.query[b].detach(), qk.key[b].detach()
        if q.shape[1] != k.shape[1]:
            self._problem = f"{self.parts.attentions[i][0]}: {q.shape[1]} queries against {k.shape[1]} keys (a KV-cache step)"
            return
        if self._seen == 0:
            self._positions = valid_positions(self._mask_kwargs, self.batch_index, q.shape[1])
        self._seen += 1
        if self._positions is not None:
            if self._positions_dev is None or self._positions_dev.device != q.device:
                self._positions_dev = self._positions.to(q.device)  # once, not per layer
            q, k = q.index_select(1, self._positions_dev), k.index_select(1, self._positions_dev)
        T = q.shape[1]
        key = id(qk.mask)
        if key not in self._masks:
            self._masks[key] = (qk.mask, key_ranges(qk.mask, qk.is_causal, T, b, self._positions))
        ranges = self._masks[key][1]
        if isinstance(ranges, str):
            self._problem = f"{self.parts.attentions[i][0]}: {ranges}"
            return
        L = len(self.parts.attentions)
        per = (q.numel() + k.numel()) * 4 + ranges.nbytes
        budget = max(0, self.max_bytes * 3 // 4 - L * q.shape[0] * (T * 4 + 64 * 64))
        if self._seen == 1 and q.dtype == torch.float32 and L * per > budget:
            self._half = True  # float32 queries/keys of every layer would not fit: keep float16
        half = self._half and q.dtype == torch.float32
        size = (q.numel() + k.numel()) * (2 if half else q.element_size()) + ranges.nbytes
        x = LayerQK(q, k, ranges, qk.scaling, qk.softcap)
        if self._kept_bytes + size <= budget:
            if half:  # float16 copies scaled on the device: no overflow, no host read per layer
                (x.q, sq), (x.k, sk) = _half_copy(q), _half_copy(k)
                x.scale = sq * sk
            else:
                x.q, x.k = q.clone(), k.clone()
            self._kept[i] = x
            self._kept_bytes += size
        else:  # over budget: summarise now (kept on the device until result()), recompute on demand
            self._stats[i] = summarize_qk(x, chunk_bytes=self._chunk_bytes())

    # -- hooks path: probabilities returned by eager attention ------------------------------------
    def _on_attention(self, index: int) -> Any:
        def hook(_m: nn.Module, _args: Any, output: Any) -> None:
            if not self._capturing:
                return
            w = _weights_of(output)
            if w is None:
                self._missing.append(self.parts.attentions[index][0])
                return
            if self._acc is None:
                kw = self._mask_kwargs
                self._positions = valid_positions(kw, self.batch_index, w.shape[-1])
                self._acc = AttentionAccumulator(len(self.parts.attentions), batch_index=self.batch_index,
                                                 positions=self._positions, max_bytes=self.max_bytes)
            self._acc.add(w)

        return hook

    def _install(self, stack: ExitStack, model: nn.Module) -> None:
        hooks = self._hooks = stack.enter_context(HookSet())
        hooks.forward_pre(model, self._top_pre)
        if self.why_no_probe is None:
            self.path = stack.enter_context(
                probe_attention(model, {m: self._on_qk for _n, m in self.parts.attentions}))
        else:
            self.path = stack.enter_context(eager_attention(model))
            for i, (_name, mod) in enumerate(self.parts.attentions):
                hooks.forward(mod, self._on_attention(i))
        hooks.forward(model, self._top_post)

    # -- results ---------------------------------------------------------------------------------
    def _prepare(self) -> None:
        self.result()

    def result(self) -> AttentionResult:
        if self._result is not None:
            return self._result
        self._masks = {}
        row_ids = self._ids[min(self.batch_index, self._ids.shape[0] - 1)] if self._ids is not None else None
        if row_ids is not None and self._positions is not None:
            row_ids = row_ids[self._positions.to(row_ids.device)]
        names = [n for n, _ in self.parts.attentions]
        if self.why_no_probe is None:
            if self._problem:
                raise RuntimeError(f"attention cannot be shown: {self._problem}")
            if self._seen == 0:
                raise RuntimeError(nothing_shown(self._replay))
            if self._seen < len(names):
                raised = "" if self._completed else "the model raised (or was interrupted) during its forward: "
                raise RuntimeError(f"{raised}attention seen in {self._seen} of {len(names)} layers")
            ck = self._chunk_bytes()
            layers = [_to_host(s if s is not None else summarize_qk(x, chunk_bytes=ck))  # type: ignore[arg-type]
                      for s, x in zip(self._stats, self._kept, strict=True)]
            T = int(layers[0]["col_mass"].shape[-1])
            toks = self._tokens(row_ids, T)
            dropped = [i for i, x in enumerate(self._kept) if x is None]
            rerun = _make_rerun(self.model, [m for _n, m in self.parts.attentions], self._replay, self.batch_index,
                                self._positions, cache_bytes=self.max_bytes - self._kept_bytes)
            detail = AttentionDetail(list(self._kept), rerun=rerun if dropped else None, chunk_bytes=ck)
            res = build_result(layers, toks, names, self.path, detail=detail)
            kept = len(names) - len(dropped)
            dt = next((x.q.dtype for x in self._kept if x is not None), None)
            res.notes.append(
                f"kept queries/keys of {kept} of {len(names)} layers ({format_bytes(self._kept_bytes)}"
                + (f", {str(dt).replace('torch.', '')}" if dt is not None else "")
                + f"; --max-bytes {format_bytes(self.max_bytes)}), not the {len(names)}×{res.shape[1]}×{T}×{T} "
                "probabilities: a clicked head is recomputed from them"
                + (f"; layers {_span(dropped)} did not fit: summarised during the forward, their heads recomputed "
                   "by running the model again up to that layer (the last one kept while it fits)" if dropped else ""))
        else:
            if self._acc is None:
                if self._missing:
                    raise RuntimeError(f"{self._missing[0]} returned no attention weights (path: {self.path}); load the "
                                       "model with attn_implementation='eager'")
                raise RuntimeError(nothing_shown(self._replay))
            T = self._acc.layers[0]["col_mass"].shape[-1] if self._acc.layers else 0
            res = self._acc.result(self._tokens(row_ids, T), names, self.path)
            res.notes.append(f"probabilities from eager attention ({self.why_no_probe})")
        note = generation_note(self._call, self._replay, "attention")
        if note:
            res.notes.insert(0, note)
        res.generated = self._replay.generated_flags(res.shape[2])
        if self._positions is not None:
            res.notes.append(f"padding removed: {len(self._positions)} real tokens of item {self.batch_index}")
        if any(m.training for m in self.model.modules() if "drop" in type(m).__name__.lower()):
            res.notes.append("model in training mode: attention dropout is not reflected in these weights")
        self._acc = None
        self._kept = []
        self._result = res
        return res

    def _tokens(self, row_ids: torch.Tensor | None, T: int) -> list[str]:
        toks = token_strings(row_ids, tokens=self.tokens, tokenizer=self.tokenizer, model=self.model, length=T)
        if len(toks) < T and row_ids is not None and self.tokens is not None:  # generated tokens after the given ones
            toks = toks + token_strings(row_ids[len(toks):], tokenizer=self.tokenizer, model=self.model)
        return toks

    def widget(self) -> Any:
        if self._widget is None:
            from ..widgets.attention import AttentionWidget

            res = self.result()
            session, note = self._ablation()
            self._widget = AttentionWidget(res, ablation=session, ablate_note=note)
        return self._widget

    def _ablation(self) -> tuple[AblationSession | None, str]:
        """The shown prompt's :class:`AblationSession` (a clicked head → ablate), or why there is none."""
        model = self.model
        note = ablation_problem(model)
        if note:
            return None, note
        if self._ids is None:
            return None, "ablation needs the input token ids of the shown call (none were seen)"
        row = self._ids[min(self.batch_index, self._ids.shape[0] - 1)]
        if self._positions is not None:
            row = row[self._positions.to(row.device)]
        try:
            answer = token_option(self.options.get("answer"), self.tokenizer)
            wrong = token_option(self.options.get("wrong"), self.tokenizer)
            return AblationSession(model, row, answer=answer, wrong=wrong, tokenizer=self.tokenizer), ""
        except ValueError as e:
            return None, f"ablation: {e}"


def _to_host(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in stats.items()}


def _span(idx: list[int]) -> str:
    return f"{idx[0]}–{idx[-1]}" if len(idx) > 1 and idx == list(range(idx[0], idx[-1] + 1)) else ", ".join(map(str, idx))


class _Stop(Exception):
    """Raised from the probe once the wanted layer was seen: the rest of the forward is skipped."""


def _make_rerun(model: nn.Module, modules: list[nn.Module], replay: Replay, item: int,
                positions: torch.Tensor | None, cache_bytes: int = 0) -> Any:
    """``rerun(layer) -> LayerQK``: that layer's queries/keys by running the model again on the shown
    inputs, up to that layer only (the forward stops there). The last re-run layer is kept while its
    queries/keys fit in ``cache_bytes`` (clicking through its heads runs the model once). Holds the
    model and its modules weakly (``ModelGoneError`` once deleted)."""
    model_ref = ModelRef(model)
    refs = [ModelRef(m) for m in modules]
    args, kwargs = replay.inputs()
    last: dict[int, LayerQK] = {}

    def rerun(layer: int) -> LayerQK:
        if layer in last:
            return last[layer]
        got: dict[str, LayerQK] = {}

        def grab(qk: QKCall) -> None:
            b = min(item, qk.query.shape[0] - 1)
            q, k = qk.query[b].detach(), qk.key[b].detach()
            if positions is not None:
                q, k = q.index_select(1, positions.to(q.device)), k.index_select(1, positions.to(k.device))
            ranges = key_ranges(qk.mask, qk.is_causal, q.shape[1], b, positions)
            if isinstance(ranges, str):
                raise RuntimeError(ranges)
            got["x"] = LayerQK(q.clone(), k.clone(), ranges, qk.scaling, qk.softcap)
            raise _Stop  # later layers, the norm and the head are not needed

        m = model_ref.get()
        with probe_attention(m, {refs[layer].get(): grab}):
            try:
                forward_again(m, args, kwargs)
            except _Stop:
                pass
        if "x" not in got:
            raise RuntimeError(f"layer {layer} was not called when the model ran again")
        last.clear()
        if got["x"].nbytes <= cache_bytes:
            last[layer] = got["x"]
        return got["x"]

    return rerun
