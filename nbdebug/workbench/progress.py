"""Progress of a long grid: a bar (``tqdm.auto`` when installed, else one stderr line rewritten) that
appears only once the work has taken ~2 s, and/or the caller's callback.

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

__all__ = ["Progress", "ProgressSpec"]

ProgressSpec = bool | Callable[[int, int], Any] | None
SHOW_AFTER = 2.0  # seconds


class Progress:
    """Counts ``done`` out of ``total`` and reports it (see the module docstring)."""

    def __init__(self, total: int, progress: ProgressSpec = None, what: str = "patching") -> None:
        self.total = max(int(total), 0)
        self.done = 0
        self.what = what
        self.callback = progress if callable(progress) else None
        self.bar_wanted = progress is None or progress is True
        self.show_after = 0.0 if progress is True else SHOW_AFTER
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
