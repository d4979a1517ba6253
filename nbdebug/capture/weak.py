"""Holding the user's model weakly: after ``del model`` nothing of ours keeps it (or its GPU memory) alive.

Widgets and results that need the model later (Grad-CAM of another layer, a logit-lens cell on
hover) keep a :class:`ModelRef`; ``get()`` raises :class:`ModelGoneError` with a message a view can
show as is.

>>> import torch
>>> m = torch.nn.Linear(2, 2); ref = ModelRef(m)
>>> ref.get() is m
True
>>> del m; import gc; _ = gc.collect(); ref.alive
False
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["MODEL_GONE", "ModelGoneError", "ModelRef", "weak_method"]

T = TypeVar("T")

#: what an on-demand fetch answers once the model has been deleted
MODEL_GONE = "the model was deleted (or garbage-collected) after the cell ran; re-run the cell to inspect it again"


class ModelGoneError(RuntimeError):
    """The model behind a view no longer exists."""

    def __init__(self, message: str = MODEL_GONE) -> None:
        super().__init__(message)


class ModelRef(Generic[T]):
    """A weak reference to a model (or any object) that raises :class:`ModelGoneError` when dead."""

    __slots__ = ("__weakref__", "_ref")

    def __init__(self, obj: T) -> None:
        self._ref: weakref.ref[T] = weakref.ref(obj)

    def get(self) -> T:
        obj = self._ref()
        if obj is None:
            raise ModelGoneError()
        return obj

    @property
    def alive(self) -> bool:
        return self._ref() is not None

    def __repr__(self) -> str:
        obj = self._ref()
        return f"ModelRef({type(obj).__name__ if obj is not None else 'dead'})"


def weak_method(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A callable that holds a bound method's object weakly (plain functions are returned as they are)."""
    if not hasattr(fn, "__self__"):
        return fn
    ref = weakref.WeakMethod(fn)  # type: ignore[arg-type]

    def call(*args: Any, **kwargs: Any) -> Any:
        m = ref()
        if m is None:
            raise ModelGoneError()
        return m(*args, **kwargs)

    return call
