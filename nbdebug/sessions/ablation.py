"""One prompt's ablation clicks on a weakly held model: what a view shows when a head (a layer, a
channel) is switched off.

A view (the attention view's heads; later the feature-map channels and the thermometer rows) keeps an
:class:`AblationSession` instead of the model: the prompt's token ids, the metric's arguments and the
recorded clean run (the cached state a :class:`~nbdebug.workbench.Workbench` starts from), and a
:class:`~nbdebug.capture.weak.ModelRef`. Each click builds a Workbench around the model (about a
millisecond), hands it the recorded run and calls :meth:`Workbench.ablated`: only the blocks from the
first ablated one on run again. Once the model is deleted, :meth:`AblationSession.ablate` raises
``ModelGoneError`` (its message: re-run the cell).

The lens diff reads each block's input at the last position (the run's residual stream) through the
model's final norm and unembedding with the logit-lens view's own statistics
(:func:`nbdebug.inspectors.logitlens.lens_stats`); the last row is the model's output.

>>> s = AblationSession(model, ids, answer=" Paris", wrong=" Rome", tokenizer=tok)  # doctest: +SKIP
>>> s.ablate(heads={3: [5]}, mode="zero")["delta"]                                   # doctest: +SKIP
-1.27
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
from torch import nn

from ..adapters.blockparts import patch_parts
from ..adapters.transformers import AdapterError, find_parts
from ..capture.state import loaded_weights
from ..capture.weak import ModelRef
from ..inspectors.attention import display_token
from ..inspectors.logitlens import lens_stats
from ..workbench import Workbench
from ..workbench.interventions import MODES
from ..workbench.kept import KeptRuns
from ..workbench.metric import Metric, token_labels, top_tokens
from .ablation_io import AblationRequest, Answered, ablation_answer, ranked
from .lens import LensEntry

__all__ = ["AblationSession", "ablation_problem"]


def ablation_problem(model: nn.Module) -> str:
    """Why clicks cannot ablate in ``model``, as one neutral line the view shows in place of the
    ablate buttons (never another view's error: an encoder is not told about patching), or ``""``
    when they can."""
    name = type(model).__name__
    try:
        parts = find_parts(model)
        if parts.encoder:
            return (f"Heads are not ablated in this view: {name} is an encoder, with no next-token output "
                    "to measure a head's effect on.")
        patch_parts(model, parts)
    except AdapterError:
        return f"Heads are not ablated in this view: no next-token output of {name} was found to measure a head's effect on."
    except Exception as e:
        return f"Heads are not ablated in this view: {name} is not a model nbdebug can re-run by parts ({type(e).__name__})."
    return ""


class AblationSession:
    """A prompt (``ids``: token ids ``(T,)`` or ``(1, T)``) on a weakly held ``model``, and the metric:
    ``logit[answer] − logit[wrong]`` (``answer``/``wrong`` as :func:`nbdebug.patch` takes them), the
    answer's log-probability (no ``wrong``), or the probability of the clean run's top-1 next token
    (no ``answer``). The clean run is recorded at the first :meth:`ablate` and reused afterwards."""

    def __init__(self, model: nn.Module, ids: Any, *, answer: Any = None, wrong: Any = None,
                 tokenizer: Any = None) -> None:
        self.model_ref: ModelRef[nn.Module] = ModelRef(model)
        self.ids = torch.as_tensor(ids).detach().reshape(1, -1).long().cpu()
        self.answer, self.wrong, self.tokenizer = answer, wrong, tokenizer
        self.kept = KeptRuns()
        self.clean: dict[str, Any] | None = None
        if answer is not None:
            Metric.build(answer, wrong, tokenizer)  # a bad answer/wrong is an error now, not at the first click

    @contextmanager
    def bench(self) -> Iterator[Workbench]:
        """A Workbench on the model with this session's recorded run; it comes back here at exit
        without anything that references the model."""
        with self.kept.bench(self.model_ref.get(), self.ids, None, answer=self.answer, wrong=self.wrong,
                             tokenizer=self.tokenizer) as wb:
            yield wb

    def _clean(self, wb: Workbench) -> dict[str, Any]:
        """The clean run's metric, top-5, lens target and lens rows (computed once)."""
        if self.clean is None:
            state = wb.state("clean")
            logits = state.logits[0, -1]
            target = wb.metric.answer if wb.metric.answer is not None else int(logits.argmax())
            resid = torch.stack([x[0, -1] for x in state.block_inputs])
            self.clean = {"metric": wb.metric_of("clean"), "label": wb.metric.label, "target": int(target),
                          "top": top_tokens(logits, self.tokenizer), "resid": resid,
                          "lens": _lens_rows(wb, resid, logits, int(target))}
        return self.clean

    def ablate(self, *, heads: Mapping[Any, Sequence[int]] | None = None, layers: Sequence[str] | None = None,
               channels: Mapping[str, Sequence[int]] | None = None, mode: str = "zero", k: int = 5) -> dict[str, Any]:
        """The prompt run again with the ablation (the arguments of :func:`nbdebug.ablate`), from the first
        ablated block on: ``{site, mode, metric_label, metric_clean, metric, delta, clean, ablated, lens,
        seconds}`` (``clean``/``ablated``: top-``k`` next tokens ``{id, token, p}``; ``lens``: per row
        (``rows``: ``embed``/block names, then ``output``) the clean and ablated top-1 token (``*_top``, its
        id ``*_ids`` and probability ``*_top_p``) and the lens target's probability (``*_p``), ``target``
        the answer or the clean top-1 token)."""
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: one of {', '.join(MODES)}")
        t0 = time.perf_counter()
        with self.bench() as wb:
            clean = self._clean(wb)
            run = wb.ablated("clean", heads=heads, layers=layers, channels=channels, mode=mode)
            lens = self._ablated_lens(wb, torch.from_numpy(run.residual[:-1]), torch.from_numpy(run.logits))
            names = ["embed"] + [n for n, _ in wb.pp.parts.blocks[:-1]] + ["output"]
        return {
            "site": run.site, "mode": mode, "metric_label": clean["label"], "metric_clean": clean["metric"],
            "metric": run.metric, "delta": run.metric - clean["metric"],
            "clean": clean["top"][:k], "ablated": top_tokens(run.logits, self.tokenizer, k),
            "lens": {"rows": names, "target": token_labels(self.tokenizer, [clean["target"]])[0],
                     "clean_top": clean["lens"]["top"], "clean_p": clean["lens"]["p"],
                     "ablated_top": lens["top"], "ablated_p": lens["p"],
                     "clean_ids": clean["lens"]["ids"], "clean_top_p": clean["lens"]["top_p"],
                     "ablated_ids": lens["ids"], "ablated_top_p": lens["top_p"]},
            "seconds": time.perf_counter() - t0,
        }

    def respond(self, request: AblationRequest) -> Answered:
        """A view's ablation request (kind ``heads``: a block index and its heads per target) as
        :meth:`ablate` answers it, in the one answer shape (:mod:`nbdebug.sessions.ablation_io`), tokens
        made readable (:func:`~nbdebug.inspectors.attention.display_token`); the lens diff is two lens
        columns (:class:`~nbdebug.sessions.lens.LensEntry`), ``clean`` and ``ablated``, about ``metric.of``."""
        t0 = time.perf_counter()
        out = self.ablate(heads={int(t["layer"]): list(t["units"]) for t in request["targets"]}, mode=request["mode"])
        assert self.clean is not None
        lens = out["lens"]
        of = {"id": self.clean["target"], "label": display_token(lens["target"])}
        metric = {"label": out["metric_label"], "kind": "metric", "clean": out["metric_clean"], "ablated": out["metric"],
                  "delta": out["delta"], "of": of}
        top = {k: ranked(out[k], lambda e: display_token(e["token"])) for k in ("clean", "ablated")}
        column = {run: [LensEntry(row=row, id=i, token=display_token(t), p=q, p_answer=pa) for row, i, t, q, pa in
                        zip(lens["rows"], lens[f"{run}_ids"], lens[f"{run}_top"], lens[f"{run}_top_p"], lens[f"{run}_p"])]
                  for run in ("clean", "ablated")}
        return ablation_answer(request, metric, top=top, t0=t0, lens=column), {}  # type: ignore[arg-type]

    def _ablated_lens(self, wb: Workbench, resid: torch.Tensor, logits: torch.Tensor) -> dict[str, list[Any]]:
        """The ablated run's lens rows; the rows up to the first ablated block are the clean run's
        (the same residual: not read through the unembedding again)."""
        assert self.clean is not None
        same = 0
        clean_resid = self.clean["resid"]
        while same < len(resid) and torch.equal(resid[same].to(clean_resid.dtype), clean_resid[same].cpu()):
            same += 1
        rest = _lens_rows(wb, resid[same:], logits, self.clean["target"])
        return {k: self.clean["lens"][k][:same] + rest[k] for k in ("top", "p", "ids", "top_p")}


@torch.no_grad()
def _lens_rows(wb: Workbench, resid: torch.Tensor, logits: torch.Tensor, target: int) -> dict[str, list[Any]]:
    """Per row the top-1 token (``top``, its id ``ids``, its probability ``top_p``) and ``target``'s probability ``p``: ``resid (L, d)`` (each block's input at the
    last position) through the final norm and unembedding (the logit lens), then the output ``logits (V,)``."""
    parts = wb.pp.parts
    mod = parts.unembed_module
    top: list[int] = []
    p: list[float] = []
    top_p: list[float] = []
    if len(resid):
        with loaded_weights(mod) if mod is not None else nullcontext():
            weight = mod.weight if mod is not None else parts.unembed_weight
            bias = getattr(mod, "bias", None) if mod is not None else parts.unembed_bias
            normed = parts.normed(resid.to(weight.device, weight.dtype))[:, None, :]
            st = lens_stats(normed, weight.detach(), None if bias is None else bias.detach(), k=1,
                            targets=torch.tensor([target], device=weight.device), softcap=parts.softcap)
        top = [int(i) for i in st["top_ids"][:, 0, 0].tolist()]
        p = [float(v) for v in st["target_prob"][:, 0].tolist()]
        top_p = [float(v) for v in st["top_probs"][:, 0, 0].tolist()]
    z = torch.as_tensor(logits).detach().cpu().double().reshape(-1)  # float64 on the CPU only
    probs = torch.softmax(z, -1)
    top.append(int(probs.argmax()))
    p.append(float(probs[target]))
    top_p.append(float(probs.max()))
    labels = token_labels(wb.tokenizer, top)
    return {"top": labels, "p": [float(np.float32(x)) for x in p], "ids": top, "top_p": [float(np.float32(x)) for x in top_p]}
