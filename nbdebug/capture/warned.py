"""PyTorch warnings raised inside the captured cell that point at a bug, kept for the findings.

While a :class:`~nbdebug.capture.session.Capture` is entered, ``warnings.showwarning`` is wrapped
(restored when its hooks are removed): every warning is still shown as before; those whose text
matches :data:`BUG_WARNINGS` are kept once each as ``(message, step)``. A warning Python's filters
suppress (the "default" action shows one location once per process) is not seen: a cell run a second
time in the same kernel may not show it again (a limit, said in docs/diagnosis.md).

>>> w = Warned(lambda: 3); w.hold(hooks)                                # doctest: +SKIP
>>> w.seen                                                               # doctest: +SKIP
[('Using a target size (torch.Size([32])) that is different to the input size (torch.Size([32, 1])) …', 3)]
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["BUG_WARNINGS", "Warned"]

#: substrings of PyTorch warnings that point at a bug in the user's loop (shape broadcast in a loss, a
#: softmax over an implicit dimension, a scheduler stepped before the optimizer, a transformer layer fed
#: (B, T, D) without batch_first)
BUG_WARNINGS = ("that is different to the input size", "Implicit dimension choice for",
                "lr_scheduler.step()` before `optimizer.step()", "batch_first was not True")


class Warned:
    """Keeps the bug-pointing warnings shown while held; ``step()`` gives the current step."""

    def __init__(self, step: Callable[[], int]) -> None:
        self.step = step
        self.seen: list[tuple[str, int]] = []

    def hold(self, hooks: Any) -> None:
        """Wrap ``warnings.showwarning`` until ``hooks`` are removed."""
        original = warnings.showwarning

        def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            try:
                text = str(message)
                if any(b in text for b in BUG_WARNINGS) and all(t != text for t, _ in self.seen):
                    self.seen.append((text.strip().splitlines()[0][:300], int(self.step()) + 1))
            except Exception:  # never break the user's warning
                pass
            original(message, category, filename, lineno, file, line)

        warnings.showwarning = show

        def restore() -> None:
            if warnings.showwarning is show:
                warnings.showwarning = original

        hooks.on_remove(restore)
