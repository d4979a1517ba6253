"""The patching view's clean/corrupt pair, kept for the view's clicks without keeping the model alive.

A :class:`~nbdebug.workbench.Workbench` holds the model (its blocks, its runner); a widget that is still
displayed after ``del model`` must not. :class:`PatchSession` keeps what does not reference the model
(the prompts, the metric's arguments, the recorded runs' tensors, the grids computed so far) and a
weak reference to the model; each request builds a Workbench around the model (about a millisecond),
hands it the recorded runs, and takes them back afterwards. A click therefore never recomputes the
clean or corrupt run: only the patched run's blocks from the patched one on.

>>> s = PatchSession(model, clean_ids, corrupt_ids, answer=" Paris", wrong=" Rome", tokenizer=tok)  # doctest: +SKIP
>>> g = s.grid("heads")                          # computed once, then cached
>>> s.cell("resid", "exact", row=3, col=5)["patched"][:2]
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..capture.budget import DEFAULT_MAX_BYTES
from ..capture.weak import ModelRef
from ..workbench import PatchGrid, Workbench
from ..workbench.exact import ExactEngine
from ..workbench.kept import KeptRuns
from ..workbench.metric import answer_entry, token_labels, top_tokens
from ..workbench.sites import KINDS
from .lens import lens_column, model_lens

__all__ = ["METHODS", "PatchSession"]

METHODS = ("exact", "attribution")


class PatchSession:
    """A clean/corrupt pair on a weakly held model and the metric (``answer``/``wrong``, see
    :func:`nbdebug.patch`); grids and single patched runs on request, the recorded runs reused.

    ``grid(sites, method)`` returns the cached :class:`~nbdebug.workbench.PatchGrid` (attribution
    grids are verified exactly on their top ``verify`` cells); ``cell(sites, method, row, col)`` runs
    that one patch exactly and returns its metric, effect and top-5 next tokens beside the clean and
    corrupt runs'. ``ModelGoneError`` (its message: re-run the cell) once the model is deleted.
    """

    def __init__(self, model: nn.Module, clean: torch.Tensor, corrupt: Any, *, answer: Any, wrong: Any = None,
                 tokenizer: Any = None, max_bytes: Any = None, verify: int = 10, lens: Any = None) -> None:
        self.model_ref: ModelRef[nn.Module] = ModelRef(model)
        self.clean, self.corrupt = clean, corrupt
        self.answer, self.wrong, self.tokenizer = answer, wrong, tokenizer
        self.max_bytes = max_bytes
        self.verify = int(verify)
        self.grids: dict[tuple[str, str], PatchGrid] = {}
        self.kept = KeptRuns()
        with self.bench() as wb:  # checks the pair (same length, metric) and records both runs
            self.tokens_clean = list(wb.tokens["clean"])
            self.tokens_corrupt = list(wb.tokens["corrupt"])
            self.metric_label = wb.metric.label
            self.metric_clean, self.metric_corrupt = wb.scale()
            self.top_clean = top_tokens(wb.state("clean").logits[0, -1], tokenizer)
            self.top_corrupt = top_tokens(wb.state("corrupt").logits[0, -1], tokenizer)
            self.answer_id = wb.metric.answer
            self.answer_clean = answer_entry(wb.state("clean").logits[0, -1], self.answer_id, tokenizer)
            self.answer_corrupt = answer_entry(wb.state("corrupt").logits[0, -1], self.answer_id, tokenizer)
        self.lens_runs: dict[str, list[dict[str, Any]]] = {}
        self.fitted_lens = lens  # None: the logit lens; else a FittedLens (what --lens names), as the lens view's

    @contextmanager
    def bench(self) -> Iterator[Workbench]:
        """A Workbench on the model with this session's recorded runs; they come back here at exit
        without anything that references the model."""
        with self.kept.bench(self.model_ref.get(), self.clean, self.corrupt, answer=self.answer, wrong=self.wrong,
                             tokenizer=self.tokenizer) as wb:
            yield wb

    def grid(self, sites: str = "resid", method: str = "exact") -> PatchGrid:
        """The grid of ``sites`` (resid, attn, mlp, heads) by ``method`` (exact, attribution), computed once."""
        if sites not in KINDS:
            raise ValueError(f"sites={sites!r}: one of {', '.join(KINDS)}")
        if method not in METHODS:
            raise ValueError(f"method={method!r}: one of {', '.join(METHODS)}")
        key = (sites, method)
        if key not in self.grids:
            with self.bench() as wb:
                verify = self.verify if method == "attribution" else 0
                self.grids[key] = wb.grid(sites, method=method, verify=verify, max_bytes=self.max_bytes)
        return self.grids[key]

    def lens(self, residual: Any) -> list[dict[str, Any]]:
        """The logit-lens column of a run's last-position residual stream ``(L + 1, d)`` (entering each
        block, then after the last): per row its top-1 token and p(answer) (see
        :func:`~nbdebug.sessions.lens.lens_column`), through the model's own final norm and unembedding."""
        rows = [torch.as_tensor(r).reshape(1, -1) for r in residual]
        targets = torch.tensor([-1 if self.answer_id is None else int(self.answer_id)])
        model = self.model_ref.get()
        return lens_column(model_lens(model, rows, targets=targets, k=1,
                                      decode=lambda ids: token_labels(self.tokenizer, ids), lens=self.fitted_lens))

    def lens_of(self, which: str) -> list[dict[str, Any]]:
        """The lens column of the recorded ``"clean"`` or ``"corrupt"`` run (its last block run again,
        traced, for the residual after it; computed once)."""
        if which not in self.lens_runs:
            with self.bench() as wb:
                state = wb.state(which)
                eng = ExactEngine(wb.pp, wb.runner, wb.metric, state, state, DEFAULT_MAX_BYTES)
                traced = eng.run_edited(wb.pp.n_layers - 1, [])
            self.lens_runs[which] = self.lens(traced.residual[0].float())
        return self.lens_runs[which]

    def cell(self, sites: str, method: str, row: int, col: int, k: int = 5) -> dict[str, Any]:
        """One cell of the ``(sites, method)`` grid run exactly: ``{row, col, site, positions, metric,
        effect, patched, clean, corrupt, answer, lens}`` (``patched``/``clean``/``corrupt``: top-``k`` next
        tokens ``{id, token, p}``; ``answer``: the answer token's ``{id, token, p, rank}`` in each run; ``lens``: ``{patched, clean, corrupt}`` logit-lens columns, see :meth:`lens`)."""
        grid = self.grid(sites, method)
        if not (0 <= row < grid.shape[0] and 0 <= col < grid.shape[1]):
            raise IndexError(f"no cell [{row}, {col}] in a {grid.shape[0]} x {grid.shape[1]} grid")
        lens = {"clean": self.lens_of("clean"), "corrupt": self.lens_of("corrupt")}
        if bool(grid.identical[row, col]):
            return {"row": row, "col": col, "site": grid.rows[row], "positions": list(grid.positions[col]),
                    "identical": True, "metric": self.metric_corrupt, "effect": float("nan"),
                    "patched": self.top_corrupt, "clean": self.top_clean, "corrupt": self.top_corrupt,
                    "answer": {"clean": self.answer_clean, "corrupt": self.answer_corrupt, "patched": self.answer_corrupt},
                    "lens": {**lens, "patched": lens["corrupt"]}}
        with self.bench() as wb:
            run = wb.cell(grid, row, col)
        return {"row": row, "col": col, "site": run.site, "positions": list(run.positions), "identical": False,
                "metric": run.metric, "effect": run.effect, "patched": top_tokens(run.logits, self.tokenizer, k),
                "clean": self.top_clean[:k], "corrupt": self.top_corrupt[:k],
                "answer": {"clean": self.answer_clean, "corrupt": self.answer_corrupt,
                           "patched": answer_entry(run.logits, self.answer_id, self.tokenizer)},
                "lens": {**lens, "patched": self.lens(run.residual)}}
