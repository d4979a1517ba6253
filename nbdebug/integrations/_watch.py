"""The one training watch behind every framework callback.

A :class:`TrainingWatch` opens an ``nbdebug.debug(model, view, step_on="optimizer")`` capture when
training starts and closes it when training ends. Frameworks do not always say when training ends:
``transformers.Trainer`` calls no callback when ``train()`` raises (or is interrupted). So the capture
is also closed, each time with every hook removed:

- when the notebook cell that ran the training ends (IPython's ``post_run_cell`` event), with the
  cell's exception, if the framework never said training ended (not for training in a thread);
- when the next training starts with the same callback (a second ``train()``);
- by :meth:`TrainingWatch.close` (``cb.close()``), for scripts that catch the exception themselves;
- when the callback is garbage-collected, or at interpreter exit (a ``weakref.finalize``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from torch import nn

__all__ = ["TrainingWatch", "unwrap"]

STEP_ON = "optimizer"


def unwrap(model: Any) -> nn.Module:
    """The user's module inside ``DataParallel`` / ``DistributedDataParallel`` (what the trainer trains)."""
    for _ in range(8):
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        else:
            break
    if not isinstance(model, nn.Module):
        raise TypeError(f"nbdebug needs the torch.nn.Module being trained, got {type(model).__name__}")
    return model


def _shell() -> Any:
    """The running IPython shell, or None (plain Python, or IPython not installed)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


class _Open:
    """An open capture, with what closes it. Holds neither the callback nor the watch (a finalizer
    and the post-cell event keep this object), only a weak way to tell the watch it was closed."""

    def __init__(self, dbg: Any, on_closed: Callable[[Any], None]) -> None:
        self.dbg: Any = dbg
        self.on_closed = on_closed
        self.shell: Any = None
        self.note = ""  # why telling the watch failed, when it did

    def listen_to_cells(self) -> None:
        """Close at the end of the running cell (only when training runs in the kernel's main thread:
        a training thread outlives the cell that started it)."""
        sh = _shell()
        if sh is not None and hasattr(sh, "events") and threading.current_thread() is threading.main_thread():
            sh.events.register("post_run_cell", self.on_cell_end)
            self.shell = sh

    def on_cell_end(self, result: Any = None) -> None:
        """The cell that ran the training ended and the framework never said training ended."""
        exc = getattr(result, "error_in_exec", None)
        self.close(exc if isinstance(exc, BaseException) else None)

    def close(self, exc: BaseException | None = None) -> None:
        dbg, self.dbg = self.dbg, None
        if self.shell is not None:
            try:
                self.shell.events.unregister("post_run_cell", self.on_cell_end)
            except ValueError:
                pass
            self.shell = None
        if dbg is None:
            return
        try:
            if exc is None:
                dbg.__exit__(None, None, None)
            else:
                dbg.__exit__(type(exc), exc, exc.__traceback__)
        finally:
            try:
                self.on_closed(dbg)
            except Exception as e:  # the hooks are removed all the same; say what failed (TrainingWatch.note)
                self.note = f"{type(e).__name__}: {e}"


class TrainingWatch:
    """Runs one view's capture over a training run (see the module docstring for when it closes).

    ``result`` is the run's :class:`~nbdebug.capture.result.CaptureResult` (with the history API:
    ``steps``, ``step_index``, ``series()``, ``incident``, ``to_pandas()``…) once training ended;
    ``widget`` the view's widget (the live one, updated while training runs, when ``live``).
    ``note`` says why there is no result or widget (the view did not apply, or building or showing it
    failed: ``"RuntimeError: ..."``), else "".
    """

    def __init__(self, view: str = "thermometer", *, live: bool = True, **options: Any) -> None:
        self.view = view
        self.live = bool(live)
        self.options = {k: v for k, v in options.items() if v is not None}
        self.result: Any = None
        self.widget: Any = None
        self.note = ""
        self.runs = 0  # training runs watched (a second train() is a new run)
        self._open: _Open | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def running(self) -> bool:
        """Whether a capture is open (training in progress, or ended without saying so)."""
        return self._open is not None and self._open.dbg is not None

    def start(self, model: Any) -> None:
        """Open the capture around ``model`` (the one being trained); closes a previous run left open."""
        from ..api import debug

        self.close()
        module = unwrap(model)
        self.result, self.widget, self.note = None, None, ""
        dbg = debug(module, self.view, step_on=STEP_ON, live=self.live, **self.options)
        dbg.__enter__()
        self.runs += 1
        opened = _Open(dbg, _weak_call(self, "_closed"))
        self._open = opened
        opened.listen_to_cells()
        self._finalizer = weakref.finalize(self, _close_quietly, opened)
        # live: Debug displayed the view as it entered (in IPython); it updates as steps arrive
        self.widget = dbg.live_widgets[0] if getattr(dbg, "live_widgets", None) else None

    def stop(self, exc: BaseException | None = None) -> None:
        """Close the capture (training ended; ``exc`` when it raised); a no-op when none is open."""
        opened = self._open
        if opened is not None:
            opened.close(exc)
            if opened.note and not self.note:
                self.note = opened.note

    def close(self) -> None:
        """Remove every hook now if a run is still open (e.g. after ``train()`` raised in a script)."""
        self.stop(None)

    def _closed(self, dbg: Any) -> None:
        """Called once the capture is closed: keep the result and the widget, display it if not yet shown."""
        self._open = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        try:
            self.result = dbg.result
            self.widget = dbg.widget()  # the live widget itself, with its final state, when there was one
        except LookupError as exc:  # the view did not apply: say why (no widget is built)
            self.note = str(exc)
        except Exception as exc:  # building the view failed: say so (never a silent None widget and "" note)
            self.note = f"{type(exc).__name__}: {exc}"
        if _shell() is not None:
            try:
                dbg.show()  # displays what the live view did not (the view or the note) and refreshes the live one
            except Exception as exc:
                self.note = self.note or f"{type(exc).__name__}: {exc}"



class WatchedRun:
    """What both callbacks expose, read from their ``self._watch`` (a :class:`TrainingWatch`)."""

    _watch: TrainingWatch

    @property
    def result(self) -> Any:
        """The last run's CaptureResult (None while training runs, or when the view did not apply: see ``note``)."""
        return self._watch.result

    @property
    def widget(self) -> Any:
        """The view's widget (the live one while training runs)."""
        return self._watch.widget

    @property
    def note(self) -> str:
        """Why there is no result ("" when there is one)."""
        return self._watch.note

    @property
    def running(self) -> bool:
        """Whether the capture is still open."""
        return self._watch.running

    def close(self) -> None:
        """Remove every hook now if a run is still open (e.g. ``train()`` raised and the framework
        did not tell the callback)."""
        self._watch.close()

def _close_quietly(opened: _Open) -> None:
    """The finalizer: remove the hooks of a run nobody closed (callback collected, interpreter exit)."""
    try:
        opened.close(None)
    except Exception:  # at interpreter exit parts of torch may be gone already
        pass


def _weak_call(obj: Any, name: str) -> Callable[[Any], None]:
    """``getattr(obj, name)(x)`` while ``obj`` lives, without keeping it alive."""
    ref = weakref.ref(obj)

    def call(x: Any) -> None:
        o = ref()
        if o is not None:
            getattr(o, name)(x)

    return call
