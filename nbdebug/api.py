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


ALL = "all"
#: errors meaning "this view does not apply to this model" (e.g. AdapterError: no transformer blocks)
NOT_APPLICABLE = (ValueError, TypeError, LookupError, RuntimeError)


def _split(view: str | list[str]) -> list[str]:
    return [v.strip() for v in (view.split(",") if isinstance(view, str) else view) if v.strip()]


def parse_views(view: str | list[str]) -> list[str]:
    """``"thermometer,gradcam"``, ``"all"`` or a list → validated view names (ValueError says what exists)."""
    names = _split(view)
    if not names:
        raise ValueError(f"no view given; choose from: {', '.join(VIEWS)}, {ALL}")
    if ALL in names:
        return list(VIEWS)
    for v in names:
        if v not in VIEWS:
            raise ValueError(f"unknown view {v!r}; choose from: {', '.join(VIEWS)}, {ALL}")
    return list(dict.fromkeys(names))


class Debug:
    """Runs one or more views' recorders around a block of code.

    After the block: ``result`` (the first view's data; ``results`` has all), ``widget()`` /
    ``widgets()`` build the widgets, ``show()`` displays them (two or more views: one
    :class:`~nbdebug.widgets.dashboard.Dashboard` with a tab each, ``dashboard()``).

    ``view="all"`` tries every registered view and keeps those that apply to the model: a view
    whose recorder cannot be built for it (e.g. attention on a CNN), or that finds nothing to show
    after the run (no layer with a spatial output...), is left out; ``skipped`` says why.
    """

    def __init__(self, model: nn.Module, view: str | list[str] = "thermometer", **options: Any) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"nbdebug needs a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.auto = ALL in _split(view)
        self.views = parse_views(view)
        self.skipped: dict[str, str] = {}  # view → why it does not apply (view="all" only)
        # Recorders are built (and layer names validated) before any user code runs.
        self.recorders: list[Recorder] = []
        for v in list(self.views):
            try:
                self.recorders.append(get_recorder(v)(model, **options))
            except NOT_APPLICABLE as exc:
                if not self.auto:
                    raise
                self._skip(v, exc)
        if not self.views:
            raise ValueError("no view applies to this model: " + "; ".join(f"{v}: {r}" for v, r in self.skipped.items()))
        self._stack: ExitStack | None = None
        self._widgets: list[Any] | None = None
        self._dashboard: Any = None

    def _skip(self, view: str, why: BaseException | str) -> None:
        i = self.views.index(view)
        del self.views[i]
        if i < len(self.recorders):
            del self.recorders[i]
        text = why if isinstance(why, str) else str(why).split("\n")[0].split("; ")[0]  # the gist, not the hints
        text = text if len(text) <= 200 else text[:199] + "…"
        self.skipped[view] = text

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
            if not self.auto:
                self._widgets = [r.widget() for r in self.recorders]
            else:  # a view that cannot show anything for this run is left out, with the reason
                built: list[Any] = []
                for v, r in list(zip(self.views, self.recorders)):
                    try:
                        w = r.widget()
                    except NOT_APPLICABLE as exc:
                        self._skip(v, exc)
                        continue
                    if v == "featuremaps" and not w.layers:
                        w.close()
                        self._skip(v, "no captured layer has a spatial output")
                        continue
                    built.append(w)
                self._widgets = built
        return self._widgets

    def widget(self) -> Any:
        return self.widgets()[0]

    def skip_notes(self) -> list[str]:
        """One line per reason: ``"attention, logitlens skipped: could not find ..."``."""
        by_reason: dict[str, list[str]] = {}
        for v, why in self.skipped.items():
            by_reason.setdefault(why, []).append(v)
        return [f"{', '.join(vs)} skipped: {why}" for why, vs in by_reason.items()]

    def dashboard(self) -> Any:
        """All the views in one :class:`~nbdebug.widgets.dashboard.Dashboard` (tabs, linked selections)."""
        if self._dashboard is None:
            from .widgets.dashboard import Dashboard

            self._dashboard = Dashboard(dict(zip(self.views, self.widgets())), notes=self.skip_notes())
        return self._dashboard

    @property
    def tabbed(self) -> bool:
        """Whether the views are shown as one dashboard (``view="all"`` or two or more views)."""
        return self.auto or len(self.views) > 1

    def show(self) -> None:
        from IPython.display import display

        if self.tabbed:
            display(self.dashboard())
            return
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
