"""Running the model once more for a language view: on the final sequence after ``generate()``, or
again on the shown call's inputs when a view recomputes something on demand.

Every such forward is nbdebug's own pass (:func:`~nbdebug.runs.own.own_pass`: no grad, clones of the
buffers), without a KV cache (``use_cache=False``; a cache object the user passed is never touched),
and with every module hook suspended but the language views' own (``keep=``): the user's hooks
(counters, loggers) and other views (the thermometer's steps) never see a forward the cell did not
run. The views say so.

The forward on the final sequence is shared: every language view on the model joins (:func:`join`) while
its block runs, and the first one to exit runs ONE forward for all of them (:func:`replay_final`)
with all their hooks kept. Each view sets its first-call state aside first and gets it back if that
forward fails (the view then shows the first call and says why).

>>> member = ReplayMember(Replay(call), hooks=lambda: my_hooks, begin=set_aside, end=keep_or_restore)
>>> join(model, member)                        # in __enter__ (call: ModelCall(model, watch_generate=True))
>>> replay_final(model, member)                # doctest: +SKIP  (in __exit__, once the cell ran generate())
>>> leave(model, member)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..capture.hooks import HookSet
from ..capture.inputs import ModelCall, without_cache
from .own import own_pass

__all__ = ["Replay", "ReplayMember", "forward_again", "generation_note", "int_option", "join", "leave", "nothing_shown", "replay_final"]


def int_option(value: Any, default: int) -> int:
    """An integer option where 0 is honoured (``None`` gives ``default``)."""
    return default if value is None else int(value)


def _no_cache(model: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    if getattr(model, "config", None) is None:
        return dict(kwargs)
    out = without_cache(kwargs)
    out["use_cache"] = False
    return out


def forward_again(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], keep: Iterable[HookSet] = ()) -> Any:
    """``model(*args, **kwargs)`` under no_grad, on cloned buffers, without a KV cache, with only the
    ``keep`` hook sets' hooks running (besides library hooks)."""
    with own_pass(model, keep=keep):
        return model(*args, **_no_cache(model, kwargs))


class Replay:
    """The inputs of the forward a language view shows, and running it (again).

    After a successful :func:`replay_final`, ``args``/``kwargs`` are the final sequence's (one batch
    item, padding dropped), ``length``/``prompt`` its token counts and ``how`` where it came from;
    otherwise they are the first call's (``error`` says why the final forward failed). ``running``
    is True while a forward of ours runs.
    """

    def __init__(self, call: ModelCall, batch_index: int = 0) -> None:
        self._call = call
        self.batch_index = batch_index
        self.running = False
        self.attempted = False
        self.replayed = False
        self.error = ""
        self.how = ""
        self.length = 0
        self.prompt = 0
        self._args: tuple[Any, ...] | None = None
        self._kwargs: dict[str, Any] | None = None

    @property
    def call(self) -> ModelCall:
        return self._call

    @property
    def args(self) -> tuple[Any, ...]:
        return self._args if self._args is not None else (self._call.args or ())

    @property
    def kwargs(self) -> dict[str, Any]:
        return self._kwargs if self._kwargs is not None else (self._call.kwargs or {})

    def inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` to run the shown forward again (kept by reference, not copied)."""
        return self.args, self.kwargs

    def final_inputs(self) -> tuple[torch.Tensor, str, int] | None:
        """``(ids (1, T), how, prompt tokens)`` of the final sequence of the generation the cell ran
        (batch item ``batch_index``, padding dropped), or None when it ran none."""
        final = self._call.final_sequence()
        if final is None:
            return None
        ids, n0, how = final
        b = min(self.batch_index, ids.shape[0] - 1)
        row = ids[b]
        mask = (self._call.kwargs or {}).get("attention_mask")
        real = torch.ones(row.shape[0], dtype=torch.bool, device=row.device)
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[1] == n0:
            real[:n0] = mask[min(b, mask.shape[0] - 1)].to(row.device) != 0
        prompt = int(real[:n0].sum())
        return row[real][None], how, prompt

    def _use(self, ids: torch.Tensor, how: str, prompt: int) -> None:
        self._args, self._kwargs = (), {"input_ids": ids}
        self.how, self.length, self.prompt = how, int(ids.shape[1]), prompt

    def _done(self, error: str) -> None:
        self.running = False
        self.replayed = not error
        self.error = error
        if error:  # the first call stays the shown one
            self._args = self._kwargs = None
            self.how, self.length, self.prompt = "", 0, 0

    def call_model(self, model: nn.Module, keep: Iterable[HookSet] = ()) -> Any:
        """Run ``model`` on the shown inputs (see :func:`forward_again`)."""
        self.running = True
        try:
            return forward_again(model, self.args, self.kwargs, keep)
        finally:
            self.running = False

    def generated_flags(self, T: int) -> list[bool]:
        """Per shown position: True for tokens produced by the generation (empty: no generation shown)."""
        if not self.replayed:
            return []
        return [i >= self.prompt for i in range(T)]


@dataclass(eq=False)
class ReplayMember:
    """A language view taking part in the shared forward on the final sequence.

    ``hooks()`` gives the view's hook set (kept running), ``begin()`` sets the view's first-call state
    aside and starts fresh, ``end(ok)`` keeps the fresh state (``ok``) or puts the first call's back.
    """

    replay: Replay
    hooks: Callable[[], HookSet]
    begin: Callable[[], None]
    end: Callable[[bool], None]


# model -> the language views whose blocks are running on it (weak: nothing here keeps a model alive)
_GROUPS: weakref.WeakKeyDictionary[nn.Module, list[ReplayMember]] = weakref.WeakKeyDictionary()


def join(model: nn.Module, member: ReplayMember) -> None:
    """Register a view (in its ``__enter__``) so that one forward on the final sequence serves all."""
    _GROUPS.setdefault(model, []).append(member)


def leave(model: nn.Module, member: ReplayMember) -> None:
    """Unregister a view (in its ``__exit__``, also on exceptions)."""
    group = _GROUPS.get(model)
    if group is not None:
        group[:] = [m for m in group if m is not member]
        if not group:
            _GROUPS.pop(model, None)


def replay_final(model: nn.Module, member: ReplayMember) -> None:
    """One forward on the final sequence of the generation the cell ran, for ``member`` and every
    other joined view on ``model`` that has not had it yet and shows the same sequence; only their
    hooks run. Nothing happens when it ran already for ``member`` or the cell generated nothing.
    KeyboardInterrupt propagates (every view gets its first-call state back); other errors become
    ``replay.error``."""
    if member.replay.attempted:
        return
    mine = member.replay.final_inputs()
    member.replay.attempted = True
    if mine is None:
        return
    ids, how, prompt = mine
    group = [member]
    for other in _GROUPS.get(model, []):
        if other is member or other.replay.attempted or not other.replay.call.generated:
            continue
        theirs = other.replay.final_inputs()
        if theirs is not None and theirs[2] == prompt and theirs[0].shape == ids.shape and torch.equal(theirs[0], ids):
            other.replay.attempted = True
            group.append(other)
    error = "interrupted"
    begun: list[ReplayMember] = []
    try:
        for m in group:
            m.replay._use(ids, how, prompt)
            m.begin()
            begun.append(m)
            m.replay.running = True
        try:
            forward_again(model, (), {"input_ids": ids}, [m.hooks() for m in group])
            error = ""
        except Exception as exc:  # the cell itself succeeded: say what happened instead of raising
            error = f"{type(exc).__name__}: {exc}"
    finally:
        for m in group:
            m.replay._done(error)
        for m in begun:
            m.end(not error)


def nothing_shown(replay: Replay) -> str:
    """The reason a language view has no forward to show."""
    if replay.error:
        return f"the cell generated tokens, but the forward on the final sequence failed ({replay.error}): nothing to show"
    return "the cell did not run the model: nothing to show"


def generation_note(call: ModelCall, replay: Replay, view: str) -> str:
    """One line saying which forward the view shows."""
    if replay.replayed:
        gen = replay.length - replay.prompt
        after = ("generate()" if replay.how.startswith("the sequence generate")
                 else "the decoding loop, on the tokens it fed to the model (the last sampled token never entered it)")
        return (f"{view} of the final {replay.length}-token sequence ({replay.prompt} prompt + {gen} generated), "
                f"recomputed in one forward after {after} (your own hooks were not called again)")
    if replay.error:
        return f"the cell generated tokens, but the forward on the final sequence failed ({replay.error}); the first call is shown"
    if call.calls > 1:
        return f"the cell ran the model {call.calls} times; the first call is shown"
    return ""
