"""Where steps begin and end in a :class:`~nbdebug.capture.session.Capture` (its root hooks and the
pass rules; see the session's module doc for the rules themselves).

A *pass* is one top-level forward: the model's own ``forward`` (the root pre-hook), or, when the loop
calls submodules directly, a stretch of selected-module calls that begins at the first of them
(:meth:`Passes.rootless`). :meth:`Passes.begin` decides what a pass is: an evaluation (a
no-grad pass once training has been seen: counted, not recorded), another pass of the open step
(``step_on="optimizer"``, until a pass that follows an optimizer step), or a new step (the open one
is closed first).

A :class:`Passes` owns where the capture is between steps (is a step open, of which kind, is the current
pass an evaluation); what must happen when a step closes or opens, or a pass begins, is handed to it
as callbacks when it is built (the capture's step close, the parameter-gradient watch, the open step's
records, the held-back steps).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .calls import in_backward
from .eager import eager_method

__all__ = ["Passes"]

# The entry points the hooks call run eagerly, never traced (``eager_method``; the root hooks and
# ``optimizer_stepped`` are registered as ``eager(passes.on_root_pre)``, ..., by the capture). In a cell
# that compiles the model's caller (``torch.compile(train_step)``), TorchDynamo would otherwise trace the
# step bookkeeping behind them (closing a step folds it with numpy: ~100 frame compiles of nbdebug's code
# per compiled step function, ~20 CPU-s on a small CNN); each is one graph break where the hook already
# broke the graph (``in_backward``'s task id is not a tensor). ~1 µs per call, once or twice per pass.


class Passes:
    """The pass/step boundaries (see the module doc).

    ``step_on``: ``"forward"`` or ``"optimizer"``. Callbacks: ``close_step()`` (fold the open step),
    ``step_opens()`` (a step opened), ``new_pass()`` (a top-level pass began), ``drop_held() -> int``
    (training began: the no-grad steps held back so far are evaluations; how many).

    Read by the forward hooks: ``root_depth`` (the model's own forward is running), ``eval`` (the
    current pass is an evaluation, not recorded), ``open``/``open_grad`` (a step is open / a training
    step), ``seen_training``; counted: ``passes``, ``eval_steps``.
    """

    __slots__ = ("_close", "_drop_held", "_eval_first", "_eval_stretch", "_first", "_new_pass", "_opt_stepped",
                 "_step_opens", "eval", "eval_steps", "open", "open_grad", "passes", "root_depth", "seen_training",
                 "step_on")

    def __init__(self, step_on: str, *, close_step: Callable[[], None], step_opens: Callable[[], None],
                 new_pass: Callable[[], None], drop_held: Callable[[], int]) -> None:
        self.step_on = step_on
        self._close, self._step_opens, self._new_pass, self._drop_held = close_step, step_opens, new_pass, drop_held
        self.root_depth = 0  # the model's own forward is running (nesting depth)
        self._first: str | None = None  # first selected module of the open pass when the root is not called
        self._eval_first: str | None = None  # ... of the evaluation pass
        self._eval_stretch = 0  # evaluation passes since the last training/no-grad pass
        self.eval = False  # the current top-level pass is an evaluation (not recorded)
        self.seen_training = False
        self.open = False  # a step is being recorded
        self.open_grad = False  # ... and it is a training step
        self._opt_stepped = False  # step_on="optimizer": an optimizer stepped in the open step
        self.passes = 0
        self.eval_steps = 0

    def on_root_pre(self, *_: object) -> None:
        """The model's own forward begins (its forward pre-hook)."""
        if in_backward():  # the whole model recomputed by checkpointing: not a new step
            return
        self.root_depth += 1
        self._first = None
        self.begin()

    def on_root_end(self, *_: object) -> None:
        """The model's own forward ended, or raised (its always-called forward hook)."""
        if not in_backward() and self.root_depth:
            self.root_depth -= 1

    @eager_method
    def rootless(self, name: str) -> None:
        """A selected module ran while the model's own ``forward`` is not running: a new pass begins
        when nothing is open, after a top-level forward, when grad mode changes, or when the pass's
        first module runs again."""
        grad = torch.is_grad_enabled()
        if not grad and self.seen_training:  # evaluation
            if not self.eval or name == self._eval_first:
                self.begin()
                self._eval_first = name
            return
        if self.eval:
            if self.open and self.open_grad and self._first is not None and name != self._first \
                    and self._eval_stretch == 1:
                # a no-grad call inside a training pass (a target network): part of that pass
                self.eval, self._eval_stretch = False, 0
                self.eval_steps -= 1
                return
        elif self.open and grad == self.open_grad and self._first is not None and name != self._first:
            return
        self.begin()
        self._first = name

    def begin(self) -> None:
        """A top-level pass begins: an evaluation, or a pass of the open step, or a new step."""
        grad = torch.is_grad_enabled()
        if not grad and self.seen_training:
            self.eval = True
            self._eval_stretch += 1
            self.eval_steps += 1
            return
        self.eval, self._eval_stretch = False, 0
        if grad and not self.seen_training:
            if self.open and not self.open_grad:
                self.close()  # held back: it becomes an evaluation just below
            self.seen_training = True
            self.eval_steps += self._drop_held()
        if self.open and (self.step_on == "forward" or not grad or not self.open_grad or self._opt_stepped):
            self.close()
        if not self.open:
            self._open_step(grad)
        self.passes += 1
        self._new_pass()

    @eager_method
    def open_unexpected(self) -> None:
        """A recorded call found no open step (not expected: every pass opens one); never lose the call."""
        self._open_step(torch.is_grad_enabled())
        self.passes += 1

    def close(self) -> None:
        """Close the open step (then fold it)."""
        self.open = False
        self._close()

    def optimizer_stepped(self) -> None:
        """``step_on="optimizer"``: the open training step ends at the next training pass (or at exit),
        so every optimizer stepped before it (two optimizers after one backward) belongs to it."""
        if self.step_on == "optimizer" and self.open and self.open_grad:
            self._opt_stepped = True

    def _open_step(self, grad: bool) -> None:
        """A step opens (a training step when ``grad``)."""
        self.open, self.open_grad, self._opt_stepped = True, grad, False
        self._step_opens()
