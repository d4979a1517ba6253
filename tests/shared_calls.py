"""One computation for the tests that make the same nbdebug call on the same model: ``once(fn, model,
...)`` runs ``fn`` the first time and hands every later identical call a deep copy of that result (a
test may not change what another reads). Calls are compared after binding them to ``fn``'s signature
with its defaults applied, so ``steps=64`` written out and left to its default are the same call; a
call that does not bind raises as the real function would. Arguments that only change how a call is
shown (``progress``) are left out of the comparison. The cache lives in this module, once per pytest
worker: README's "Test what you see" block (tests/models/test_readme_code.py), the heads grid of
tests/models/test_workbench_smollm2.py and the integrated gradients of
tests/unit/test_token_attribution_smollm2.py make the same calls on the session's SmolLM2 (measured
on the shared machine, one thread: the heads grid ~7 CPU-s, IG 64 steps ~10 CPU-s, each done once).

Keys hold the model and tokenizer by ``id``: only objects alive for the whole session (the
``smollm2`` session fixture) may be passed."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["calls_made", "once"]

_RESULTS: dict[tuple[Any, ...], Any] = {}
_IGNORED = ("progress",)
_MADE: list[str] = []  # "<function> computed" / "<function> shared", in order (for tests of this module)


def _key_part(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_key_part(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _key_part(v)) for k, v in value.items())))
    return ("id", id(value))


def key_of(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    items = tuple((k, _key_part(v)) for k, v in bound.arguments.items() if k not in _IGNORED)
    return (fn.__module__, fn.__qualname__, items)


def once(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, computed once per worker for identical calls (see the module docstring)."""
    key = key_of(fn, *args, **kwargs)
    if key not in _RESULTS:
        _RESULTS[key] = fn(*args, **kwargs)
        _MADE.append(f"{fn.__qualname__} computed")
    else:
        _MADE.append(f"{fn.__qualname__} shared")
    return copy.deepcopy(_RESULTS[key])


def calls_made() -> list[str]:
    return list(_MADE)
