"""Where steps begin and end in a :class:`~nbdebug.capture.session.Capture` (its root hooks and the
pass rules; see the session's module doc for the rules themselves).

A *pass* is one top-level forward: the model's own ``forward`` (the root pre-hook), or, when the loop
calls submodules directly, a stretch of selected-module calls that begins at the first of them
(:meth:`_Passes._rootless`). :meth:`_Passes._begin_pass` decides what a pass is: an evaluation (a
no-grad pass once training has been seen: counted, not recorded), another pass of the open step
(``step_on="optimizer"``, until a pass that follows an optimizer step), or a new step (the open one
is closed first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .calls import _in_backward
from .optim import as_float_later, loss_of_output

__all__: list[str] = []  # private to the capture package


class _Passes:
    """Mixin of :class:`~nbdebug.capture.session.Capture`: the root hooks and the pass/step boundaries."""

    _root_depth: int
    _first: str | None
    _eval: bool
    _eval_first: str | None
    _eval_stretch: int
    _seen_training: bool
    _open: bool
    _open_grad: bool
    _opt_stepped: bool  # step_on="optimizer": an optimizer stepped since the open step began
    _pending: list[Any]
    _passes: int
    _occurrence: dict[str, Any]
    _claimed: set[int]
    _losses: list[Any]
    eval_steps: int
    step_on: str
    loss_fn: Any
    _close_step: Callable[[], None]  # Capture's
    _pg_step_opens: Callable[[], None]  # _ParamGrads'

    def _on_root_pre(self, *_: Any) -> None:
        if _in_backward():  # the whole model recomputed by checkpointing: not a new step
            return
        self._root_depth += 1
        self._first = None
        self._begin_pass()

    def _on_root_end(self, *_: Any) -> None:
        if not _in_backward() and self._root_depth:
            self._root_depth -= 1

    def _rootless(self, name: str) -> None:
        """A selected module ran while the model's own ``forward`` is not running: a new pass begins
        when nothing is open, after a top-level forward, when grad mode changes, or when the pass's
        first module runs again."""
        grad = torch.is_grad_enabled()
        if not grad and self._seen_training:  # evaluation
            if not self._eval or name == self._eval_first:
                self._begin_pass()
                self._eval_first = name
            return
        if self._eval:
            if self._open and self._open_grad and self._first is not None and name != self._first \
                    and self._eval_stretch == 1:
                # a no-grad call inside a training pass (a target network): part of that pass
                self._eval, self._eval_stretch = False, 0
                self.eval_steps -= 1
                return
        elif self._open and grad == self._open_grad and self._first is not None and name != self._first:
            return
        self._begin_pass()
        self._first = name

    def _begin_pass(self) -> None:
        """A top-level pass begins: an evaluation, or a pass of the open step, or a new step."""
        grad = torch.is_grad_enabled()
        if not grad and self._seen_training:
            self._eval = True
            self._eval_stretch += 1
            self.eval_steps += 1
            return
        self._eval, self._eval_stretch = False, 0
        if grad and not self._seen_training:
            if self._open and not self._open_grad:
                self._close_step()  # held back: it becomes an evaluation just below
            self._seen_training = True
            if self._pending:
                self.eval_steps += len(self._pending)
                self._pending.clear()
        if self._open and (self.step_on == "forward" or not grad or not self._open_grad or self._opt_stepped):
            self._close_step()
        if not self._open:
            self._open_step(grad)
        self._passes += 1
        self._occurrence.clear()
        self._claimed.clear()

    def _on_root_out(self, _m: nn.Module, _args: Any, output: Any) -> None:
        if self._eval or _in_backward() or self.loss_fn is not None:
            return
        loss = loss_of_output(output)
        if loss is not None:
            self._losses.append(as_float_later(loss))

    def _open_step(self, grad: bool) -> None:
        """A step opens (a training step when ``grad``)."""
        self._open, self._open_grad, self._opt_stepped = True, grad, False
        self._pg_step_opens()

    def _on_optimizer_step(self) -> None:
        """``step_on="optimizer"``: the open training step ends at the next training pass (or at exit),
        so every optimizer stepped before it (two optimizers after one backward) belongs to it."""
        if self.step_on == "optimizer" and self._open and self._open_grad:
            self._opt_stepped = True
