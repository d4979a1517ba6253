"""What the attention and logit-lens recorders share: which call is shown, and the one extra forward
on the final sequence after ``generate()`` that both views take part in.

A subclass builds its own hooks (``_install``), its per-forward state (``_reset``: every attribute it
sets is what the shared forward replaces) and what it shows (``_prepare``: raises to say why the view
has nothing to show).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from torch import nn

from ..capture import HookSet, ModelCall
from ..runs.replay import Replay, ReplayMember, join, leave, replay_final
from ..views import Recorder

__all__ = ["LanguageRecorder"]


class LanguageRecorder(Recorder):
    """Base of the language views' recorders (the model is held weakly, as in :class:`Recorder`)."""

    def _setup(self, model: nn.Module, batch_index: int) -> None:
        """Call at the end of ``__init__`` once the options the subclass's ``_reset`` reads are set."""
        self._stack = ExitStack()
        self._hooks = HookSet()
        self._call = ModelCall(model, watch_generate=True, keep_output=False)
        self._replay = Replay(self._call, batch_index)
        before = set(vars(self))
        self._reset()
        self._state_keys = sorted(set(vars(self)) - before)  # what the shared forward replaces
        self._aside: dict[str, Any] = {}
        self._member = ReplayMember(self._replay, lambda: self._hooks, self._begin_replay, self._end_replay)
        self._applies: str | None = None
        self._prepared = False

    # -- subclass parts ------------------------------------------------------------------------------
    def _reset(self) -> None:
        raise NotImplementedError

    def _install(self, stack: ExitStack, model: nn.Module) -> None:
        """Enter ``self._call`` is done already; register the view's hooks (``self._hooks``) on ``stack``."""
        raise NotImplementedError

    def _prepare(self) -> None:
        """Compute what the view shows (cached by the subclass); raise with the reason it cannot."""
        raise NotImplementedError

    # -- context manager -----------------------------------------------------------------------------
    def __enter__(self) -> LanguageRecorder:
        try:
            model = self.model
            self._stack.enter_context(self._call)
            self._install(self._stack, model)
        except BaseException:
            self._stack.close()
            raise
        join(model, self._member)
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        try:
            if exc_type is None and self._call.generated:  # one forward on the final sequence, shared
                replay_final(self.model, self._member)    # by the language views, only their hooks
        finally:
            try:
                if self._model_ref.alive:
                    leave(self._model_ref.get(), self._member)
            finally:
                self._stack.close()

    # -- the shared forward on the final sequence: fresh state, the first call's back if it fails -----
    def _begin_replay(self) -> None:
        self._aside = {k: getattr(self, k) for k in self._state_keys}
        self._reset()

    def _end_replay(self, ok: bool) -> None:
        aside, self._aside = self._aside, {}
        if not ok:
            for k, v in aside.items():
                setattr(self, k, v)

    def applies(self) -> str | None:
        if not self._prepared:
            self._prepared = True
            try:
                self._prepare()
            except Exception as exc:
                self._applies = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return self._applies
