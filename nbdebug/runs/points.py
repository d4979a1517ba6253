"""Where nbdebug reads or changes a value during its own forwards: a :class:`Point` (a module, its
input or output, which call), the count of a module's calls within one forward of the model
(:class:`CallCounter`), and :class:`Stopped` (a forward cut short once everything asked for was read).

The activation at a point is read and replaced by :mod:`nbdebug.capture.leaves` (``first_input`` /
``first_output``: a tensor, a tuple's first element, a ``ModelOutput``'s first field).

>>> Point.of((model.h[3].attn, "output"))          # doctest: +SKIP
Point(module=..., where='output', call=None)
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import nn

__all__ = ["WHERE", "CallCounter", "Point", "Stopped"]

WHERE = ("input", "output")


class Point(NamedTuple):
    """A module's first input or first output; ``call``: which call within one forward of the model
    (0-based; None: every call)."""

    module: nn.Module
    where: str = "output"
    call: int | None = None

    @classmethod
    def of(cls, value: Any) -> Point:
        """A point from a :class:`Point`, a module (its output), ``(module, where)`` or ``(module, where, call)``."""
        if isinstance(value, Point):
            p = value
        elif isinstance(value, nn.Module):
            p = cls(value)
        else:
            p = cls(*value)
        if p.where not in WHERE:
            raise ValueError(f"where={p.where!r}: 'input' or 'output'")
        return p


class CallCounter:
    """Per slot, how many times its module ran since the last :meth:`reset` (at each forward of the
    model), so that call ``k`` of a module that runs several times (``relu#2``) is told apart."""

    def __init__(self, n: int) -> None:
        self.counts = [0] * n

    def reset(self, *_: Any) -> None:
        """Start counting again (a new forward of the model; usable as a root pre-hook's callback)."""
        self.counts = [0] * len(self.counts)

    def next(self, i: int) -> int:
        """The 0-based index of the call of slot ``i`` now running (and count it)."""
        k = self.counts[i]
        self.counts[i] += 1
        return k

    def this_one(self, i: int, call: int | None) -> bool:
        """Count a call of slot ``i``; whether it is call ``call`` (always, for None)."""
        k = self.next(i)
        return call is None or k == call


class Stopped(Exception):
    """Raised inside a forward once every point asked for was read (the rest of the model does not
    run); caught by the run that asked for the stop."""
