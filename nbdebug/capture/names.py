"""One name for one module call, in every view.

Within a step (one call of the model's top-level ``forward``), the first call of a module is its
qualified name, later calls get ``#2``, ``#3`` …: a ReLU module called twice gives rows ``relu`` and
``relu#2``. Rows, ``--layer`` options, Python results, widget selectors and linked selections all
use these names.

>>> call_name("relu", 0), call_name("relu", 1)
('relu', 'relu#2')
>>> split_call_name("relu#2"), split_call_name("relu")
(('relu', 1), ('relu', 0))
"""

from __future__ import annotations

__all__ = ["call_name", "split_call_name"]


def call_name(module: str, k: int) -> str:
    """Name of the ``k``-th (0-based) call of ``module`` within a step."""
    return module if k == 0 else f"{module}#{k + 1}"


def split_call_name(name: str) -> tuple[str, int]:
    """``"relu#2"`` → ``("relu", 1)`` (0-based call index); ``"relu"`` → ``("relu", 0)``.

    ``#1`` is accepted as the first call too. A ``#`` not followed by digits is part of the name.
    """
    base, sep, idx = name.rpartition("#")
    if not sep or not idx.isdigit() or not base:
        return name, 0
    return base, max(int(idx) - 1, 0)
