"""PyTorch Lightning integration: :class:`LightningCallback`.

>>> cb = nbdebug.LightningCallback()                                 # doctest: +SKIP
>>> L.Trainer(max_steps=100, callbacks=[cb]).fit(module, loader)    # doctest: +SKIP
>>> cb.result.series("loss"), cb.result.first_nonfinite_step         # doctest: +SKIP

Importing this module does not import Lightning: the class becomes a subclass of
``lightning.pytorch.Callback`` (and of ``pytorch_lightning.Callback`` when that package is there
too, so either Trainer accepts it) the first time one is created.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..capture.weak import weak_method
from ._watch import TrainingWatch, WatchedRun

__all__ = ["LightningCallback"]

_REAL: list[type] = []


def _real_class() -> type:
    if not _REAL:
        bases = []
        for mod in ("lightning.pytorch", "pytorch_lightning"):
            try:
                bases.append(importlib.import_module(mod).Callback)
            except ImportError:
                continue
        if not bases:
            raise ImportError("nbdebug.LightningCallback needs PyTorch Lightning: pip install 'nbdebug[lightning]'")
        _REAL.append(type("LightningCallback", (LightningCallback, *bases), {"__module__": __name__, "__doc__": LightningCallback.__doc__}))
    return _REAL[0]


class LightningCallback(WatchedRun):
    """Watch a PyTorch Lightning ``fit`` with an nbdebug view (the thermometer by default).

    ``L.Trainer(..., callbacks=[cb]).fit(module)`` records one history step per optimizer step
    (``accumulate_grad_batches`` micro-batches merge into their step; validation forwards, which
    Lightning runs without gradients, are not steps), shows the view live in the notebook and leaves
    ``cb.result`` (a :class:`~nbdebug.capture.result.CaptureResult` with the history API) and
    ``cb.widget``. The step's loss (``series("loss")``) is the mean of ``training_step``'s losses
    over its micro-batches (what Lightning backpropagates, from ``on_before_backward``), unless a
    ``loss=`` callable is given. Options as for :class:`nbdebug.TrainerCallback`.

    The capture opens in ``on_train_start`` (after Lightning's sanity-check validation) on the
    LightningModule and closes in ``on_train_end``, or in ``on_exception`` when ``fit`` raises.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> LightningCallback:
        if cls is LightningCallback:
            cls = _real_class()
        return super().__new__(cls)

    def __init__(
        self,
        view: str = "thermometer",
        layers: Any = None,
        max_bytes: int | str | None = None,
        every: int = 1,
        live: bool = True,
        **options: Any,
    ) -> None:
        self._losses: list[Any] = []  # the open step's (normalised) micro-batch losses
        if options.get("loss") is None:
            options["loss"] = weak_method(self._step_loss)
        self._watch = TrainingWatch(view, live=live, layers=layers, max_bytes=max_bytes, every=every, **options)

    def _step_loss(self) -> Any:
        """The closing step's loss: the sum of the losses Lightning backpropagated in it (each divided
        by ``accumulate_grad_batches``), i.e. the mean of ``training_step``'s losses."""
        losses, self._losses = self._losses, []
        if not losses:
            return None
        total = losses[0]
        for x in losses[1:]:
            total = total + x
        return total


    # -- Lightning hooks ------------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Open the capture on the LightningModule."""
        self._watch.start(pl_module)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        """Keep the micro-batch's loss for its step (detached; read once when the step closes)."""
        if self._watch.running:
            self._losses.append(loss.detach())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Close the capture: every hook removed, ``result`` and ``widget`` ready."""
        self._watch.stop()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """``fit`` raised: close the capture with what was recorded (the exception propagates)."""
        self._watch.stop(exception)

    def __repr__(self) -> str:
        w = self._watch
        state = "running" if w.running else (f"{w.result.steps} steps" if w.result is not None else "not run")
        return f"nbdebug.LightningCallback(view={w.view!r}, {state})"
