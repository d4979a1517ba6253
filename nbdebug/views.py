"""The view registry: what `%%nndebug --view NAME` and the Python API can show.

A view is a :class:`Recorder` subclass living in ``nbdebug/recorders/<name>.py``: it is entered
around the user's code (install hooks, switch attention implementations, remember inputs...),
restores everything on exit (also on exceptions and KeyboardInterrupt), then turns what it saw into
plain data (``result()``, an inspector's dataclass, handed back by ``-o VAR``) and a widget
(``widget()``). The magic adds each view's ``arguments`` to its own, so ``%%nndebug?`` documents
every option, and knows nothing else about views.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from torch import nn

__all__ = ["VIEWS", "Recorder", "ViewSpec", "get_recorder"]


class Recorder:
    """Base class of a view's recorder. Subclasses override ``__enter__``/``__exit__``/``result``/``widget``.

    ``options`` holds the parsed magic arguments (or Python keyword arguments) by their ``dest``
    names; a recorder reads only its own and ignores the rest.
    """

    def __init__(self, model: nn.Module, **options: Any) -> None:
        self.model = model
        self.options = options

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def result(self) -> Any:
        """Plain data describing what was captured (dataclasses holding numpy arrays)."""
        raise NotImplementedError

    def widget(self) -> Any:
        """The anywidget that shows :meth:`result`."""
        raise NotImplementedError


@dataclass(frozen=True)
class ViewSpec:
    """One view: its name, a line of help, its extra magic arguments, and where its recorder lives."""

    name: str
    help: str
    recorder: str  # "module:Class", imported on first use
    # Extra magic arguments as (flags, argparse kwargs); dest names must be unique across views.
    arguments: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = field(default=())


VIEWS: dict[str, ViewSpec] = {}


def register(spec: ViewSpec) -> ViewSpec:
    VIEWS[spec.name] = spec
    return spec


def get_recorder(name: str) -> type[Recorder]:
    spec = VIEWS[name]
    module, _, cls = spec.recorder.partition(":")
    return getattr(importlib.import_module(module), cls)


register(
    ViewSpec(
        name="thermometer",
        help="per-layer activation and gradient health (dead units, NaN/Inf origin, vanishing/exploding gradients)",
        recorder="nbdebug.recorders.thermometer:ThermometerRecorder",
        arguments=(
            (("--histograms",), dict(action="store_true", help="keep a 32-bin histogram of every layer's output up front (otherwise fetched on click)")),
            (("--dead-threshold",), dict(type=float, default=None, dest="dead_threshold", help="fraction of exact zeros that makes a layer dead (default 0.99)")),
        ),
    )
)
