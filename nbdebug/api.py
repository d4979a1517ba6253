"""The Python API: every view without the magic.

>>> with nbdebug.debug(model, view="thermometer") as dbg:     # doctest: +SKIP
...     loss = criterion(model(x), y); loss.backward()
>>> dbg.show()                                                 # displays the widget
>>> dbg.result                                                 # the captured data

>>> nbdebug.thermometer(model, lambda: model(x).sum().backward())   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from torch import nn

from .views import VIEWS, Recorder, get_recorder

__all__ = ["Debug", "debug", "thermometer"]


def parse_views(view: str | list[str]) -> list[str]:
    """``"thermometer,gradcam"`` or a list → validated view names (ValueError says what exists)."""
    names = [v.strip() for v in (view.split(",") if isinstance(view, str) else view) if v.strip()]
    if not names:
        raise ValueError(f"no view given; choose from: {', '.join(VIEWS)}")
    for v in names:
        if v not in VIEWS:
            raise ValueError(f"unknown view {v!r}; choose from: {', '.join(VIEWS)}")
    return names


class Debug:
    """Runs one or more views' recorders around a block of code.

    After the block: ``result`` (the first view's data; ``results`` has all), ``widget()`` /
    ``widgets()`` build the widgets, ``show()`` displays them.
    """

    def __init__(self, model: nn.Module, view: str | list[str] = "thermometer", **options: Any) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"nbdebug needs a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.views = parse_views(view)
        # Recorders are built (and layer names validated) before any user code runs.
        self.recorders: list[Recorder] = [get_recorder(v)(model, **options) for v in self.views]
        self._stack: ExitStack | None = None
        self._widgets: list[Any] | None = None

    def __enter__(self) -> Debug:
        stack = ExitStack()
        try:
            for rec in self.recorders:
                stack.enter_context(rec)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.__exit__(*exc)  # type: ignore[arg-type]

    @property
    def results(self) -> dict[str, Any]:
        return {v: r.result() for v, r in zip(self.views, self.recorders)}

    @property
    def result(self) -> Any:
        return self.recorders[0].result()

    def widgets(self) -> list[Any]:
        if self._widgets is None:
            self._widgets = [r.widget() for r in self.recorders]
        return self._widgets

    def widget(self) -> Any:
        return self.widgets()[0]

    def show(self) -> None:
        from IPython.display import display

        for w in self.widgets():
            display(w)


def debug(model: nn.Module, view: str | list[str] = "thermometer", **options: Any) -> Debug:
    """Context manager running ``view``'s recorder(s) around a block; see :class:`Debug`."""
    return Debug(model, view, **options)


def thermometer(model: nn.Module, fn: Callable[[], Any], **options: Any) -> Any:
    """Run ``fn()`` under a thermometer capture and return the widget (exceptions propagate)."""
    with Debug(model, "thermometer", **options) as dbg:
        fn()
    return dbg.widget()
