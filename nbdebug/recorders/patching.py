"""Recorder of the patching view: the cell's own forward is the clean run, ``--corrupt VAR`` the
corrupt prompt, and the view is the activation-patching grid (:func:`nbdebug.patch`) of the pair.

While the cell runs only the first top-level call's arguments are remembered (no other hook); the
clean token ids are read from them afterwards (batch item ``--seq-index``, padding removed), as the
logit-lens and attention views do. Options are checked before the cell runs (a bad one is a
``UsageError`` in the magic): ``corrupt`` (a variable: a prompt string with ``--tokenizer``, or token
ids), ``answer`` (required) and ``wrong`` (text with the tokenizer, an id, or ``#id``), ``patch_sites``
(the grid shown first). A clean prompt of another length than the corrupt one is a note in place of
the view (the cell's work is kept).

>>> with PatchingRecorder(model, corrupt=ids2, answer=" Paris", wrong=" Rome", tokenizer=tok) as rec:  # doctest: +SKIP
...     model(ids)
>>> rec.result()                  # the PatchGrid of the first sites (resid)
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..adapters.text import input_ids_of, resolve_option, token_option, valid_positions
from ..capture import ModelCall
from ..lens.resolve import resolve_one
from ..runs.replay import int_option
from ..sessions.patching import PatchSession
from ..views import Recorder
from ..workbench import PatchGrid
from ..workbench.metric import Metric, MetricError, token_labels, tokens_of
from ..workbench.sites import KINDS

__all__ = ["PatchingRecorder"]

_CORRUPT_HINT = ("give the corrupt prompt: --corrupt VAR, where VAR holds a string (with --tokenizer) or token ids "
                 "of the same length as the cell's input")


class PatchingRecorder(Recorder):
    """Remembers the cell's first forward; ``result()`` → :class:`~nbdebug.workbench.PatchGrid`,
    ``widget()`` → :class:`~nbdebug.widgets.patching.PatchingWidget`. Holds the model weakly."""

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        ns = options.get("user_ns")
        self.tokenizer = resolve_option(options.get("tokenizer"), ns, "tokenizer")
        corrupt = options.get("corrupt")
        if corrupt is None:
            raise ValueError(f"--view patching needs a corrupt prompt: {_CORRUPT_HINT}")
        if isinstance(corrupt, str) and ns is not None:
            if not corrupt.isidentifier() or corrupt not in ns:
                raise ValueError(f"--corrupt {corrupt}: no variable named {corrupt!r} in the notebook; {_CORRUPT_HINT}")
            corrupt = ns[corrupt]
        self.corrupt = tokens_of(corrupt, self.tokenizer, "--corrupt")  # MetricError (a ValueError) says what to pass
        self.answer = token_option(options.get("answer"), self.tokenizer)
        self.wrong = token_option(options.get("wrong"), self.tokenizer)
        if self.answer is None:
            raise ValueError("--view patching needs --answer TOKEN (the clean run's answer, e.g. --answer ' Paris' with "
                             "--tokenizer tok, or a token id like #3681); --wrong TOKEN makes the metric a logit difference")
        Metric.build(self.answer, self.wrong, self.tokenizer)  # a bad answer/wrong stops here, before the cell
        self.sites = options.get("patch_sites") or "resid"
        if self.sites not in KINDS:
            raise ValueError(f"--sites {self.sites}: one of {', '.join(KINDS)}")
        self.batch_index = int_option(options.get("seq_index"), 0)
        # the lens column's lens: what --lens names (the shown one of a compared pair), as the lens view reads it
        shown = str(options.get("lens")).split(",")[0] if isinstance(options.get("lens"), str) else options.get("lens")
        self.fitted_lens = resolve_one(shown, model, tokenizer=self.tokenizer, user_ns=ns)
        self.max_bytes = options.get("max_bytes")
        self._call = ModelCall(model, keep_output=False)
        self._session: PatchSession | None = None
        self._applies: str | None = None
        self._prepared = False
        self._widget: Any = None

    def __enter__(self) -> PatchingRecorder:
        self._call.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._call.__exit__(*exc)

    def clean_ids(self) -> Any:
        """The clean prompt: the first forward's token ids of item ``seq_index`` without padding ``(1, T)``."""
        ids = input_ids_of(self._call.args, self._call.kwargs)
        if ids is None:
            if not self._call.seen:
                raise ValueError("the cell did not call the model: run its forward on the clean prompt in the cell")
            raise ValueError("the model was not called with token ids (input_ids=... or the first argument)")
        b = min(self.batch_index, ids.shape[0] - 1)
        row = ids[b:b + 1]
        pos = valid_positions(self._call.kwargs, b, ids.shape[1])
        if pos is not None:
            row = row[:, pos.to(row.device)]
        return row.detach().clone().cpu()  # outside the cell's inference_mode: a normal tensor

    def _prepare(self) -> None:
        clean = self.clean_ids()
        if clean.shape[1] != self.corrupt.shape[1]:
            c, k = (token_labels(self.tokenizer, t[0].tolist()) for t in (clean, self.corrupt))
            raise MetricError(f"--corrupt has {self.corrupt.shape[1]} tokens, the cell's prompt {clean.shape[1]}: give "
                              "--corrupt a prompt of the same number of tokens (positions are patched one to one). "
                              f"Clean {c[:12]}, corrupt {k[:12]}")
        self._session = PatchSession(self.model, clean, self.corrupt, answer=self.answer, wrong=self.wrong,
                                     tokenizer=self.tokenizer, max_bytes=self.max_bytes, lens=self.fitted_lens)
        self._session.grid(self.sites)

    def applies(self) -> str | None:
        if not self._prepared:
            self._prepared = True
            try:
                self._prepare()
            except Exception as exc:
                text = str(exc).replace("\n", " ") or type(exc).__name__
                self._applies = text if isinstance(exc, ValueError) else f"{type(exc).__name__}: {text}"
        return self._applies

    @property
    def session(self) -> PatchSession:
        why = self.applies()
        if self._session is None:
            raise RuntimeError(why or "no patching session")
        return self._session

    def result(self) -> PatchGrid:
        return self.session.grid(self.sites)

    def widget(self) -> Any:
        if self._widget is None:
            from ..widgets.patching import PatchingWidget

            self._widget = PatchingWidget(self.session, sites=self.sites)
        return self._widget
