"""The Python API: every view without the magic.

>>> with nbdebug.debug(model, view="thermometer") as dbg:     # doctest: +SKIP
...     loss = criterion(model(x), y); loss.backward()
>>> dbg.show()                                                 # displays the widget
>>> dbg.result                                                 # the captured data

>>> nbdebug.thermometer(model, lambda: model(x).sum().backward())   # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from torch import nn

from .capture.hooks import COMPILED_NOTE, hooks_see_compiled
from .capture.weak import ModelRef
from .views import VIEWS, NotApplicableError, Recorder, get_recorder

__all__ = ["Debug", "debug", "thermometer"]


ALL = "all"
NOTE_CHARS = 160  # a reason longer than this is cut: a note is one line, not a traceback


def _split(view: str | list[str]) -> list[str]:
    return [v.strip() for v in (view.split(",") if isinstance(view, str) else view) if v.strip()]


def parse_views(view: str | list[str]) -> list[str]:
    """``"thermometer,gradcam"``, ``"all"`` or a list → validated view names (ValueError says what exists)."""
    names = _split(view)
    if not names:
        raise ValueError(f"no view given; choose from: {', '.join(VIEWS)}, {ALL}")
    if ALL in names:
        return [n for n, spec in VIEWS.items() if spec.in_all]
    for v in names:
        if v not in VIEWS:
            raise ValueError(f"unknown view {v!r}; choose from: {', '.join(VIEWS)}, {ALL}")
    return list(dict.fromkeys(names))


def does_not_apply(exc: BaseException) -> bool:
    """Whether a recorder's constructor said "this view cannot apply to this model" (a note), as
    opposed to a user error (bad option value, unknown layer name: ``ValueError``/``LookupError``,
    which the magic turns into a ``UsageError`` before the cell runs). Anything else a constructor
    raises (a bug on an unusual model) is isolated like "does not apply": the other views still run.
    """
    if isinstance(exc, NotApplicableError):
        return True
    from .adapters.transformers import AdapterError  # "no transformer blocks in this model"

    if isinstance(exc, AdapterError):
        return True
    return not isinstance(exc, (ValueError, LookupError))


def _gist(why: BaseException | str) -> str:
    """One short line: a reason as given, or an exception's first clause (its hints dropped)."""
    if isinstance(why, str):
        text = why
    else:
        text = str(why).strip().split("\n")[0].split("; ")[0]
        if not isinstance(why, (NotApplicableError, ValueError, LookupError)) or not text:
            text = f"{type(why).__name__}: {text}" if text else type(why).__name__
    text = " ".join(text.split())
    return text if len(text) <= NOTE_CHARS else text[: NOTE_CHARS - 1] + "…"


class Debug:
    """Runs one or more views' recorders around a block of code.

    After the block: ``results`` (view → data), ``result`` (the first shown view's data),
    ``widgets()`` / ``widget()`` build the widgets, ``show()`` displays them (two or more views
    requested: one :class:`~nbdebug.widgets.dashboard.Dashboard` with a tab each, ``dashboard()``).

    Each view is isolated at every stage (recorder construction, enter, exit, ``applies()``,
    ``result()``, ``widget()``): a view that does not apply to the model, or fails, is left out and
    ``skipped`` says why; ``note()`` is the one line shown in its place. The user's code and its
    exceptions are never affected. Bad option values and unknown layer names still raise from the
    constructor, before any code runs.

    The model is held weakly (strongly only while the block runs); once the widgets are built the
    recorders are dropped, so neither this object nor the widgets keep a deleted model alive.

    ``live=True`` (the magic's default): when one view was asked for and its recorder offers
    ``live_widget()`` (the thermometer), that widget is created right after every recorder entered
    and displayed at once in IPython (``live_widgets``); it updates while the block runs and
    ``widgets()`` returns the same widget with its final state, which ``show()`` does not display a
    second time. With several views there is no live display: the dashboard comes at the end.
    """

    def __init__(self, model: nn.Module, view: str | list[str] = "thermometer", **options: Any) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"nbdebug needs a torch.nn.Module, got {type(model).__name__}")
        self._model_ref: ModelRef[nn.Module] = ModelRef(model)
        self._hold: nn.Module | None = model  # strong only until the block ends
        self.auto = ALL in _split(view)
        self.requested = parse_views(view)
        self.skipped: dict[str, str] = {}  # view → one-line reason it is not shown
        self._recorders: dict[str, Recorder] = {}
        self._entered: list[str] = []
        self._settled = False
        self._eager: Any = None  # hooks_see_compiled() while the block runs
        self.notes: list[str] = []  # about the whole run (not one view)
        self._results: dict[str, Any] = {}
        self._widgets: dict[str, Any] | None = None
        self._dashboard: Any = None
        self.live = bool(options.get("live"))
        self.live_widgets: list[Any] = []  # displayed when the block started
        self._live_handles: list[Any] = []  # their IPython display handles
        # Recorders are built (and option values, layer names validated) before any user code runs.
        for v in self.requested:
            try:
                self._recorders[v] = get_recorder(v)(model, **options)
            except Exception as exc:
                if not does_not_apply(exc):
                    raise
                self._skip(v, exc)

    # -- bookkeeping --------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The model (``ModelGoneError`` once it has been deleted)."""
        return self._model_ref.get()

    @property
    def views(self) -> list[str]:
        """The requested views still in play (not skipped), in order."""
        return [v for v in self.requested if v not in self.skipped]

    @property
    def recorders(self) -> list[Recorder]:
        """The recorders of :attr:`views` (empty once the widgets are built and the recorders dropped)."""
        return [self._recorders[v] for v in self.views if v in self._recorders]

    def _skip(self, view: str, why: BaseException | str) -> None:
        if view not in self.skipped:
            text = _gist(why)
            if self.auto and isinstance(why, BaseException) and does_not_apply(why) and not text.startswith(type(why).__name__):
                # `--view all` asked for "whatever applies": the gist of why not is enough
                head = text.split(": ")[0]
                text = head if len(head) >= 20 else text
            self.skipped[view] = text
        self._results.pop(view, None)

    # -- the block ----------------------------------------------------------------------------
    def __enter__(self) -> Debug:
        self._eager = hooks_see_compiled(self.model)
        if self._eager.__enter__() and COMPILED_NOTE not in self.notes:
            self.notes.append(COMPILED_NOTE)
        for v in self.views:
            rec = self._recorders[v]
            try:
                rec.__enter__()
            except Exception as exc:  # this view cannot start; the others (and the user's code) run
                self._skip(v, exc)
                try:
                    rec.__exit__(type(exc), exc, exc.__traceback__)  # remove whatever it installed
                except Exception:
                    pass
                except BaseException:
                    self._exit_all(None, None, None)
                    raise
                continue
            except BaseException:  # KeyboardInterrupt while starting: undo everything, then stop
                self._entered.append(v)
                self._exit_all(None, None, None)
                raise
            self._entered.append(v)
        self._start_live()
        return self

    def _start_live(self) -> None:
        """Create and display the live widget (one view asked for, ``live=True``, in IPython)."""
        if not self.live or self.tabbed:
            return
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:  # pragma: no cover - IPython is a dependency
            return
        if get_ipython() is None:
            return
        for v in self._entered:
            make = getattr(self._recorders[v], "live_widget", None)
            if make is None:
                continue
            try:
                w = make()
                handle = display(w, display_id=True)
            except Exception as exc:  # no live view; the final one still comes
                self.notes.append(_gist(f"no live view: {type(exc).__name__}: {exc}"))
                continue
            self.live_widgets.append(w)
            self._live_handles.append(handle)

    def settle_live(self) -> None:
        """Once the widgets have their final state: refresh the live displays in place (same widget,
        so a saved notebook's static fallback shows the final state, not the "running" one)."""
        handles, self._live_handles = self._live_handles, []
        for w, handle in zip(self.live_widgets, handles):
            try:
                if handle is not None:
                    handle.update(w)
            except Exception:
                pass

    def _exit_all(self, *exc: Any) -> BaseException | None:
        """Exit every entered recorder (last first), each isolated; returns a KeyboardInterrupt
        (or other BaseException) raised while cleaning up, after all the others were cleaned."""
        pending: BaseException | None = None
        entered, self._entered = self._entered, []
        for v in reversed(entered):
            try:
                self._recorders[v].__exit__(*exc)  # its return value never suppresses the user's error
            except Exception as err:
                self._skip(v, err)
            except BaseException as err:
                pending = pending or err
        eager, self._eager = self._eager, None
        if eager is not None:
            eager.__exit__(None, None, None)
        self._hold = None
        return pending

    def __exit__(self, *exc: Any) -> None:
        pending = self._exit_all(*exc)
        if self.live_widgets:  # the live view gets its final state now, shown or not
            try:
                self.widgets()
                self.settle_live()
            except Exception:
                pass
        if pending is not None and pending is not exc[1]:
            raise pending

    # -- after the block ------------------------------------------------------------------------
    def _settle(self) -> None:
        """Ask each view whether it applies, then for its result; a view that does not or fails is skipped."""
        if self._settled:
            return
        self._settled = True
        for v in self.views:
            rec = self._recorders[v]
            try:
                why = rec.applies()
                if why:
                    self._skip(v, why)
                    continue
                self._results[v] = rec.result()
            except Exception as exc:
                self._skip(v, exc)

    @property
    def results(self) -> dict[str, Any]:
        """View → its data, for the views shown."""
        self._settle()
        return {v: self._results[v] for v in self.views if v in self._results}

    @property
    def result(self) -> Any:
        """The first shown view's data (``LookupError`` with :meth:`note` when no view is shown)."""
        res = self.results
        if not res:
            raise LookupError(self.note() or "no view to show")
        return next(iter(res.values()))

    def widgets(self) -> list[Any]:
        """The widgets of the views that apply (built once; no widget is created for the others)."""
        self._settle()
        if self._widgets is None:
            built: dict[str, Any] = {}
            for v in self.views:
                try:
                    built[v] = self._recorders[v].widget()
                except Exception as exc:
                    self._skip(v, exc)
            self._widgets = built
            self._recorders = {}  # their work is done; the widgets hold what they need
        return [w for v, w in self._widgets.items() if v not in self.skipped]

    def widget(self) -> Any:
        """The first widget (``LookupError`` with :meth:`note` when no view applies)."""
        ws = self.widgets()
        if not ws:
            raise LookupError(self.note() or "no view to show")
        return ws[0]

    def note(self) -> str:
        """One line saying which views are not shown and why, then notes about the whole run ("" when none)."""
        by_reason: dict[str, list[str]] = {}
        for v, why in self.skipped.items():
            by_reason.setdefault(why, []).append(v)
        parts = ["not shown: " + "; ".join(f"{', '.join(vs)} ({why})" for why, vs in by_reason.items())] if by_reason else []
        return "; ".join(parts + self.notes)

    def dashboard(self) -> Any:
        """All the views in one :class:`~nbdebug.widgets.dashboard.Dashboard` (tabs, linked selections)."""
        if self._dashboard is None:
            from .widgets.dashboard import Dashboard

            ws = self.widgets()
            note = self.note()
            self._dashboard = Dashboard(dict(zip(self.views, ws)), notes=[note] if note else [])
        return self._dashboard

    @property
    def tabbed(self) -> bool:
        """Whether the views are shown as one dashboard (``view="all"`` or two or more views requested)."""
        return self.auto or len(self.requested) > 1

    def show(self) -> None:
        """Display the dashboard (or the single widget), and the note when a view is not shown."""
        from IPython.display import display

        from .widgets.dashboard import ViewNote

        ws = self.widgets()
        if self.tabbed and ws:
            display(self.dashboard())
            return
        for w in ws:
            if not any(w is x for x in self.live_widgets):  # shown when the block started
                display(w)
        self.settle_live()
        if self.note():
            display(ViewNote(self.note()))


def debug(model: nn.Module, view: str | list[str] = "thermometer", *, spool: str | os.PathLike[str] | None = None,
          **options: Any) -> Any:
    """Context manager running ``view``'s recorder(s) around a block; see :class:`Debug`.

    In a worker process launched under ``%%nndebug --distributed`` (or with ``NBDEBUG_SPOOL`` set for a
    ``torchrun``/script launch), or with ``spool=`` a directory, it records this rank's steps to the
    spool instead (:class:`nbdebug.distributed.SpoolDebug`; DDP/FSDP wrappers are fine). The launching
    process itself never spools, so the same worker code runs in one process.
    """
    from .capture.spool import SPOOL_ENV, wants_spool

    if spool is None and wants_spool():
        spool = os.environ[SPOOL_ENV]
    if spool is not None:
        from .distributed.worker import SpoolDebug

        return SpoolDebug(model, view, spool=spool, **options)
    return Debug(model, view, **options)


def thermometer(model: nn.Module, fn: Callable[[], Any], **options: Any) -> Any:
    """Run ``fn()`` under a thermometer capture and return the widget (exceptions propagate)."""
    with Debug(model, "thermometer", **options) as dbg:
        fn()
    return dbg.widget()
