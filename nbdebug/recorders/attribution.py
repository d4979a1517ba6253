"""Recorder of the attribution view (``--view attribution``): "why A, not B?" for the input tokens of
the cell's forward.

While the cell runs it only remembers the model's first top-level call (``ModelCall``: no other hook).
Afterwards :func:`nbdebug.attribute` runs on that call's input ids (row ``--seq-index``, padding
dropped) with ``--answer``/``--wrong`` (text with ``--tokenizer``, an id or ``#id``) and
``--attr-method``; after ``generate()`` the prompt is the input, and the generated tokens are offered:
picking the k-th makes it the answer, attributed over the prompt and the k tokens generated before
it (those ids reused from the generation, one attribution per pick, not a generation per token).
Without ``--answer`` the view is a one-line note (so ``--view all`` never starts an attribution
nobody asked for). The widget asks for other methods and picks on demand (the model held weakly).

>>> with AttributionRecorder(model, tokenizer=tok, answer=" Paris", wrong=" Rome") as rec:  # doctest: +SKIP
...     model(**tok("The Eiffel Tower is in the city of", return_tensors="pt"))
>>> rec.result().scores
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..adapters.text import input_ids_of, resolve_option, token_option, valid_positions
from ..adapters.unhookable import refuse_unhookable
from ..attribution import Attribution
from ..attribution.methods import METHODS
from ..attribution.tokens import build_metric
from ..capture import ModelCall
from ..sessions.attribution import AttributionSession
from ..views import NotApplicableError, Recorder

__all__ = ["AttributionRecorder"]


class AttributionRecorder(Recorder):
    """Options read: ``answer`` (required: without it the view does not apply), ``wrong``, ``tokenizer``
    (object or name), ``attr_method`` (default ``grad_x_input``), ``ig_steps`` (64), ``fix_first``,
    ``seq_index``, ``max_bytes``. ``result()`` → :class:`~nbdebug.attribution.Attribution`."""

    def __init__(self, model: nn.Module, **options: Any) -> None:
        refuse_unhookable(model)
        super().__init__(model, **options)
        o = options
        self.tokenizer = resolve_option(o.get("tokenizer"), o.get("user_ns"), "tokenizer")
        self.answer = token_option(o.get("answer"), self.tokenizer)
        self.wrong = token_option(o.get("wrong"), self.tokenizer)
        if self.answer is None:
            if self.wrong is not None:
                raise ValueError("--wrong needs --answer: the attribution explains answer over wrong")
            raise NotApplicableError("say what to explain: --answer TOKEN (and --wrong TOKEN)")
        build_metric(self.answer, self.wrong, self.tokenizer)  # a bad token is an error before the cell runs
        self.method = str(o.get("attr_method") or "grad_x_input")
        if self.method not in METHODS:
            raise ValueError(f"--attr-method {self.method!r}: one of {', '.join(METHODS)}")
        self.steps = int(o.get("ig_steps") or 64)
        if self.steps < 1:
            raise ValueError(f"--steps takes a positive number (got {self.steps})")
        self.fix_first = bool(o.get("fix_first"))
        self.seq_index = int(o.get("seq_index") or 0)
        self.max_bytes = o.get("max_bytes")
        self._call = ModelCall(model, watch_generate=True, keep_output=False)
        self._session: AttributionSession | None = None
        self._result: Attribution | None = None
        self._why: str | None = None

    def __enter__(self) -> AttributionRecorder:
        self._call.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._call.__exit__(*exc)

    def _prompt(self) -> tuple[torch.Tensor | None, str | None]:
        """``(ids (1, T), why not)`` of the row shown."""
        call = self._call
        if not call.seen:
            return None, "the cell did not call the model"
        ids = input_ids_of(call.args, call.kwargs)
        if ids is None:
            return None, "the model was not called with token ids (input_ids=... or a (B, T) integer tensor)"
        if not 0 <= self.seq_index < ids.shape[0]:
            return None, f"--seq-index {self.seq_index}: the batch has {ids.shape[0]} rows"
        row = ids[self.seq_index]
        keep = valid_positions(call.kwargs, self.seq_index, int(row.shape[0]))
        if keep is not None:
            row = row[keep.to(row.device)]
        return row[None].detach().cpu(), None

    def _generated(self) -> list[int]:
        """The ids ``generate()`` (or a KV-cache decoding loop) appended to row ``--seq-index``."""
        final = self._call.final_sequence() if self._call.generated else None
        if final is None:
            return []
        seq, n0, _how = final
        if not 0 <= self.seq_index < seq.shape[0] or n0 <= 0:
            return []
        return [int(t) for t in seq[self.seq_index, n0:].tolist()]

    def applies(self) -> str | None:
        if self._result is None and self._why is None:
            ids, why = self._prompt()
            if why is not None:
                self._why = why
                return why
            assert ids is not None
            self._session = AttributionSession(self.model, ids, self.answer, self.wrong, self.tokenizer, self.steps,
                                               self.fix_first, self.max_bytes, generated=self._generated())
            self._result = self._session.get(self.method)
        return self._why

    def result(self) -> Attribution:
        why = self.applies()
        if why is not None:
            raise RuntimeError(f"attribution: {why}")
        assert self._result is not None
        return self._result

    def widget(self) -> Any:
        from ..widgets.attribution import AttributionWidget

        res = self.result()
        return AttributionWidget(res, self._session)
