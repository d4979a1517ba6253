"""Recorded runs kept between a view's requests on a weakly held model.

A view holds its model weakly, so each request builds a fresh :class:`~nbdebug.workbench.session.Workbench`
around it; :class:`KeptRuns` carries the runs that Workbench recorded (and its runner's KV-reuse
decision) from one request to the next, and between requests keeps nothing that references the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

from .session import Workbench

__all__ = ["KeptRuns"]


class KeptRuns:
    """The recorded runs of a clean (and corrupt) prompt, lent to one Workbench at a time (``bench``)."""

    def __init__(self) -> None:
        self.runs: dict[str, Any] = {}
        self.kinds: dict[str, set[str]] = {"clean": set(), "corrupt": set()}
        self.runner_state: tuple[bool, str] | None = None

    @contextmanager
    def bench(self, model: nn.Module, clean: Any, corrupt: Any = None, **metric: Any) -> Iterator[Workbench]:
        """A Workbench on ``model`` (``metric``: ``answer``, ``wrong``, ``tokenizer``) with the kept runs;
        they come back here at exit, without their runner (nothing that references the model)."""
        wb = Workbench(model, clean, corrupt, **metric)
        if self.runner_state is not None:
            wb.runner.kv_reuse, wb.runner.note = self.runner_state
        for run in self.runs.values():
            run.runner = wb.runner
        wb.runs, wb.kinds = self.runs, self.kinds
        try:
            yield wb
        finally:
            self.runs, self.kinds = wb.runs, wb.kinds
            self.runner_state = (wb.runner.kv_reuse, wb.runner.note)
            for run in self.runs.values():
                run.runner = None
                run.prefixes = {}
