"""nbdebug's hooks run eagerly, never traced by TorchDynamo, without nbdebug ever importing
``torch._dynamo`` (~2.5 CPU-s: an inference cell, a notebook that never compiles nor steps an
optimizer, does not pay it).

``torch.compiler.disable`` imports TorchDynamo, so nothing is disabled up front:

- :func:`eager` (a hook or callback) is ``torch.compiler.disable(fn)`` when ``torch._dynamo`` is
  imported already, else ``fn`` behind a small callable whose class's ``__call__`` is plain Python;
- :func:`eager_method` (a method, in its class body) is disabled when ``torch._dynamo`` is imported
  already, else plain;
- and right after ``torch._dynamo`` is imported (by a ``torch.compile`` in the cell, the first
  optimizer step, ...), before TorchDynamo can trace anything, every such method, that ``__call__``
  included, is swapped for its ``torch.compiler.disable``d version on its class
  (:func:`after_dynamo`: one import hook, which steps out of ``sys.meta_path`` once it has served).
  Hooks registered before the import are disabled from then on, the live ones included.

Before the import a hook costs one plain Python call more (~0.3 µs; a disabled wrapper ~1 µs, which
a hook registered before the import and called after it pays on top).
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any, TypeVar

import torch

__all__ = ["after_dynamo", "eager", "eager_method", "status"]

F = TypeVar("F", bound=Callable[..., Any])

_DYNAMO = "torch._dynamo"
_lock = threading.RLock()
_then: list[Callable[[], None]] = []  # run once torch._dynamo is imported, in order
_watch: _AfterImport | None = None
_failed: list[str] = []  # methods left plain: why (a torch without torch.compiler.disable)


def status() -> str:
    """One line: whether nbdebug's hooks are disabled for TorchDynamo, or why not."""
    if _failed:
        return "some hooks traced by TorchDynamo: " + "; ".join(_failed)
    return "disabled for TorchDynamo" if _DYNAMO in sys.modules else "plain (torch._dynamo not imported)"


def after_dynamo(then: Callable[[], None]) -> None:
    """Run ``then()`` now when ``torch._dynamo`` is imported, else right after it is (once). ``then``
    never raises: it runs inside that import."""
    global _watch
    with _lock:
        if _DYNAMO not in sys.modules:
            if then not in _then:
                _then.append(then)
            if _watch is None:
                _watch = _AfterImport(_DYNAMO, _run)
                sys.meta_path.insert(0, _watch)
            return
    then()  # (imported, or being imported by another thread: ``then`` imports it, which waits)


def eager(fn: F) -> F:
    """``fn`` (a hook, a callback; called with positional arguments only, as torch calls hooks) run
    eagerly, never traced by TorchDynamo (recursive: nor what it calls)."""
    if _DYNAMO in sys.modules:
        return torch.compiler.disable(fn)  # type: ignore[return-value]
    return _Eager(fn)  # type: ignore[return-value]


def eager_method(fn: F) -> F:
    """Decorate a method in a class body: run eagerly, never traced by TorchDynamo (as :func:`eager`).
    Called through the class at each call (``obj.method()``, an object as a hook): a bound method
    taken before ``torch._dynamo`` is imported stays plain, so a hook is registered as ``eager(obj.method)``."""
    return _Method(fn)  # type: ignore[return-value]


class _Method:
    """Stands in for the method during the class's creation only: puts the plain function there and
    has it disabled once TorchDynamo is imported."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __set_name__(self, owner: type, name: str) -> None:
        setattr(owner, name, self.fn)
        after_dynamo(partial(_disable, owner, name))


def _disable(owner: type, name: str) -> None:
    """``owner.name`` swapped for its ``torch.compiler.disable``d version (once)."""
    fn = owner.__dict__[name]
    if getattr(fn, "_torchdynamo_disable", False):
        return
    try:
        setattr(owner, name, torch.compiler.disable(fn))
    except Exception as e:  # never raised into the user's import of torch._dynamo: traced, same values
        _failed.append(f"{owner.__qualname__}.{name} ({type(e).__name__}: {e})")


def _run() -> None:
    """``torch._dynamo`` was just imported: every waiting callback, in order."""
    global _watch
    with _lock:
        todo = _then[:]
        _then.clear()
        _watch = None
    for then in todo:
        then()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then`` right after module ``name`` is imported, once: wraps that one import's loader
    (found by the finders after this one), then steps out of ``sys.meta_path``."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> Any:
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenLoader(spec.loader, self)
                return spec
        return None


class _ThenLoader(importlib.abc.Loader):
    """A module's own loader, then the watch's callback once the module has run (errors in it are its
    own; the watch goes back into ``sys.meta_path`` for the next attempt)."""

    def __init__(self, loader: Any, watch: _AfterImport) -> None:
        self.loader, self.watch = loader, watch

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self.loader.exec_module(module)
        except BaseException:  # that import failed: watch the next attempt
            sys.meta_path.insert(0, self.watch)
            raise
        self.watch.then()

    def __getattr__(self, name: str) -> Any:  # get_code, get_resource_reader, ...: the real loader's
        return getattr(self.loader, name)


# (last: its class body registers with the import hook above)
class _Eager:
    """``fn`` as a hook; this class's ``__call__`` is disabled once TorchDynamo is imported."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    @eager_method
    def __call__(self, *args: Any) -> Any:  # positional only, as torch calls hooks (~0.2 µs less than with **kwargs)
        return self.fn(*args)

    def __repr__(self) -> str:
        return f"eager({self.fn!r})"
