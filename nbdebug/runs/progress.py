"""THE progress bar of nbdebug's long runs of its own (a patching grid, a lens fit, the CAM methods'
perturbed forwards): ``tqdm.auto`` when installed (a widget in Jupyter), else one stderr line
rewritten, shown only once the work has taken ``show_after`` seconds (~2 s), and/or the caller's callback.

``progress=None``: the bar when slow; ``False``: nothing; ``True``: the bar from the start;
a callable: ``progress(done, total)`` after every step (a widget's hook; an exception it raises,
KeyboardInterrupt included, stops the grid and propagates, with every hook removed).

>>> with Progress(total=270, progress=None, what="resid grid") as bar:    # doctest: +SKIP
...     bar.update(1)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["LabelledProgress", "Progress", "ProgressSpec", "Reporter"]

ProgressSpec = bool | Callable[[int, int], Any] | None
SHOW_AFTER = 2.0  # seconds


class Progress:
    """Counts ``done`` out of ``total`` and reports it (see the module docstring)."""

    def __init__(self, total: int, progress: ProgressSpec = None, what: str = "patching", *,
                 show_after: float = SHOW_AFTER) -> None:
        self.total = max(int(total), 0)
        self.done = 0
        self.what = what
        self.callback = progress if callable(progress) else None
        self.bar_wanted = progress is None or progress is True
        self.show_after = 0.0 if progress is True else show_after
        self.start = time.perf_counter()
        self._bar: Any = None
        self._line = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.callback is not None:
            self.callback(self.done, self.total)
        if not self.bar_wanted:
            return
        if self._bar is None and not self._line and time.perf_counter() - self.start < self.show_after:
            return
        self._draw()

    @property
    def shown(self) -> bool:
        """Whether the bar (or the line) is on screen."""
        return self._bar is not None or self._line

    def _draw(self) -> None:
        if self._bar is None and not self._line:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=self.total, desc=self.what, leave=False)
            except Exception:  # no tqdm (or no notebook frontend for it): a plain line
                self._line = True
        if self._bar is not None:
            self._bar.n = self.done
            self._bar.refresh()
        else:
            sys.stderr.write(f"\r{self.what}: {self.done}/{self.total}")
            sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._line:
            sys.stderr.write("\n")
            self._line = False


#: ``(label, done, total)`` after each chunk of a run made of several labelled parts (the CAM methods)
Reporter = Callable[[str, int, int], None]


class LabelledProgress:
    """A :data:`Reporter` drawing :class:`Progress` (one bar per label, shown once a label has run
    ``delay`` seconds, never first drawn at its end); :meth:`close` (also on exceptions) removes it."""

    def __init__(self, delay: float = 0.5) -> None:
        self.delay = delay
        self.label = ""
        self.bar: Progress | None = None

    def __call__(self, label: str, done: int, total: int) -> None:
        if label != self.label or self.bar is None:
            self.close()
            self.label, self.bar = label, Progress(total, None, f"nbdebug {label}", show_after=self.delay)
        if done >= total and not self.bar.shown:
            return
        self.bar.update(done - self.bar.done)

    def close(self) -> None:
        """Remove the bar (or end the line) of the current label."""
        if self.bar is not None:
            self.bar.close()
        self.bar, self.label = None, ""
