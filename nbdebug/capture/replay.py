"""Running the model once more for a language view: on the final sequence after ``generate()``, or
again on the shown call's inputs when a view recomputes something on demand.

Every such forward runs under ``torch.no_grad()`` on clones of the buffers
(:func:`~nbdebug.capture.state.preserve_buffers`), without a KV cache (``use_cache=False``; a cache
object the user passed is never touched), and with every module hook suspended but the calling
view's own (:func:`suspend_hooks`): the user's hooks (counters, loggers) and other views (the
thermometer's steps) never see a forward the cell did not run. The views say so.

>>> replay = Replay(call, batch_index=0)        # call: a ModelCall(model, watch_generate=True)
>>> if call.generated:                          # doctest: +SKIP
...     replay.run(model)                       # the view's hooks see the final sequence
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from .hooks import HookSet
from .inputs import ModelCall
from .state import _is_users, preserve_buffers
from .state import suspend_hooks as state_suspend_hooks

__all__ = ["Replay", "forward_again", "generation_note", "int_option", "suspend_hooks"]

_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


@contextmanager
def suspend_hooks(model: nn.Module, keep: Iterable[HookSet] = ()) -> Iterator[None]:
    """:func:`nbdebug.capture.state.suspend_hooks` that keeps the hooks of the ``keep`` hook sets
    (the view's own) running: the user's hooks and other nbdebug views' are set aside, library hooks
    (transformers, accelerate, torch weight norm...) stay; everything is put back in its original
    order afterwards (also on KeyboardInterrupt)."""
    ids = {h.id for hs in keep for h in hs._handles}
    if not ids:
        with state_suspend_hooks(model):
            yield
        return
    saved: list[tuple[dict[int, Any], dict[int, Any]]] = []
    try:
        for m in model.modules():
            for attr in _HOOK_DICTS:
                d = m.__dict__.get(attr)
                drop = [k for k, fn in (d or {}).items() if k not in ids and _is_users(fn)]
                if d is not None and drop:
                    saved.append((d, dict(d)))
                    for k in drop:
                        del d[k]
        yield
    finally:
        for d, before in saved:
            d.clear()
            d.update(before)


def int_option(value: Any, default: int) -> int:
    """An integer option where 0 is honoured (``None`` gives ``default``)."""
    return default if value is None else int(value)


def _no_cache(model: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    if getattr(model, "config", None) is None:
        return dict(kwargs)
    out = {k: v for k, v in kwargs.items() if k != "past_key_values"}
    out["use_cache"] = False
    return out


def forward_again(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], keep: Iterable[HookSet] = ()) -> Any:
    """``model(*args, **kwargs)`` under no_grad, on cloned buffers, without a KV cache, with only the
    ``keep`` hook sets' hooks running."""
    with torch.no_grad(), preserve_buffers(model), suspend_hooks(model, keep):
        return model(*args, **_no_cache(model, kwargs))


class Replay:
    """The inputs of the forward a language view shows, and running it (again).

    After :meth:`run`, ``args``/``kwargs`` are the final sequence's (one batch item, padding
    dropped), ``length``/``prompt`` its token counts and ``how`` where it came from; before, they
    are the first call's. ``running`` is True while a forward of ours runs.
    """

    def __init__(self, call: ModelCall, batch_index: int = 0) -> None:
        self._call = call
        self.batch_index = batch_index
        self.running = False
        self.replayed = False
        self.error = ""
        self.how = ""
        self.length = 0
        self.prompt = 0
        self._args: tuple[Any, ...] | None = None
        self._kwargs: dict[str, Any] | None = None

    @property
    def args(self) -> tuple[Any, ...]:
        return self._args if self._args is not None else (self._call.args or ())

    @property
    def kwargs(self) -> dict[str, Any]:
        return self._kwargs if self._kwargs is not None else (self._call.kwargs or {})

    def inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` to run the shown forward again (kept by reference, not copied)."""
        return self.args, self.kwargs

    def run(self, model: nn.Module, keep: Iterable[HookSet] = ()) -> None:
        """One forward on the final sequence of the generation the cell ran, with only the ``keep``
        hooks (the view's own) running. KeyboardInterrupt propagates; other errors become a note."""
        final = self._call.final_sequence()
        if final is None:
            return
        ids, n0, how = final
        b = min(self.batch_index, ids.shape[0] - 1)
        row = ids[b]
        mask = (self._call.kwargs or {}).get("attention_mask")
        real = torch.ones(row.shape[0], dtype=torch.bool, device=row.device)
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[1] == n0:
            real[:n0] = mask[min(b, mask.shape[0] - 1)].to(row.device) != 0
        prompt = int(real[:n0].sum())
        row = row[real]
        self._args, self._kwargs = (), {"input_ids": row[None]}
        self.how, self.length, self.prompt = how, int(row.shape[0]), prompt
        try:
            self.call(model, keep)
            self.replayed = True
        except Exception as exc:  # the cell itself succeeded: say what happened instead of raising
            self.error = f"{type(exc).__name__}: {exc}"

    def call(self, model: nn.Module, keep: Iterable[HookSet] = ()) -> Any:
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
