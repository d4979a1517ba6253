"""PyTorch warnings raised inside the captured cell that point at a bug, kept for the findings.

While a :class:`~nbdebug.capture.session.Capture` is entered, ``warnings.showwarning`` is wrapped
(restored when its hooks are removed): those whose text matches :data:`BUG_WARNINGS` are kept once each
as ``(message, step)``. So that a second run of the cell (Python's "default" action shows a location
once per process) or a notebook's ``warnings.filterwarnings("ignore")`` does not hide them from the
findings, an "always" filter for exactly those texts is put first while held (and taken out after); what
is *displayed* still follows the user's own filters (an "ignore" shows nothing, an "error" raises, an
"always" shows each, any other action each text once per cell). Other warnings are untouched.

>>> w = Warned(lambda: 3); w.hold(hooks)                                # doctest: +SKIP
>>> w.seen                                                               # doctest: +SKIP
[('Using a target size (torch.Size([32])) that is different to the input size (torch.Size([32, 1])) …', 3)]
"""

from __future__ import annotations

import re
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
        """Wrap ``warnings.showwarning`` (and put the "always" filter first) until ``hooks`` are removed."""
        original = warnings.showwarning
        warnings.filterwarnings("always", message=_ANY_BUG)
        mine = warnings.filters[0]
        displayed: set[str] = set()

        def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            text = str(message)
            try:
                bug = any(b in text for b in BUG_WARNINGS)
                if bug and all(t != text for t, _ in self.seen):
                    self.seen.append((text.strip().splitlines()[0][:300], int(self.step()) + 1))
            except Exception:  # never break the user's warning
                bug = False
            if bug:
                action = _users_action([f for f in warnings.filters if f != mine], text, category, filename, lineno)
                if action == "error":
                    raise message if isinstance(message, Warning) else category(text)
                if action == "ignore" or (action != "always" and text in displayed):
                    return
                displayed.add(text)
            original(message, category, filename, lineno, file, line)

        warnings.showwarning = show

        def restore() -> None:
            if warnings.showwarning is show:
                warnings.showwarning = original
            if mine in warnings.filters:  # a reset or a catch_warnings of the user's may have taken it already
                warnings.filters.remove(mine)

        hooks.on_remove(restore)


#: one message pattern for every bug-pointing text (``warnings`` matches it at the message's start)
_ANY_BUG = "(?s).*(?:" + "|".join(re.escape(b) for b in BUG_WARNINGS) + ")"


def _users_action(filters: list[Any], text: str, category: type, filename: str, lineno: int) -> str:
    """The action the first matching entry of ``filters`` (the user's ``warnings.filters``) takes for a
    warning, as :func:`warnings.warn_explicit` decides it; the module is read from the file name."""
    module = re.sub(r"\.py$", "", filename.replace("\\", "/").split("site-packages/")[-1]).replace("/", ".")
    for action, msg, cat, mod, ln in filters:
        if ((msg is None or msg.match(text)) and issubclass(category, cat) and (mod is None or mod.match(module))
                and (ln == 0 or lineno == ln)):
            return str(action)
    return str(warnings.defaultaction)
