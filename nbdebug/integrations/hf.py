"""Hugging Face ``transformers.Trainer`` integration: :class:`TrainerCallback`.

>>> cb = nbdebug.TrainerCallback()                                   # doctest: +SKIP
>>> Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb]).train()   # doctest: +SKIP
>>> cb.result.series("loss"), cb.result.first_nonfinite_step        # doctest: +SKIP

Importing this module (or ``nbdebug.TrainerCallback``) does not import transformers: the class
becomes a real ``transformers.TrainerCallback`` subclass the first time one is created. (Trainer
itself only looks events up by name — ``getattr(callback, "on_step_end")(args, state, control,
**kwargs)`` in ``CallbackHandler.call_event`` — but a subclass also inherits any event a newer
transformers adds.)
"""

from __future__ import annotations

from typing import Any

from ._watch import TrainingWatch, WatchedRun

__all__ = ["TrainerCallback"]

_REAL: list[type] = []  # the transformers subclass, made once


def _real_class() -> type:
    if not _REAL:
        try:
            import transformers
        except ImportError as exc:
            raise ImportError(
                "nbdebug.TrainerCallback needs transformers: pip install 'nbdebug[hf]'"
            ) from exc
        _REAL.append(type("TrainerCallback", (TrainerCallback, transformers.TrainerCallback), {"__module__": __name__, "__doc__": TrainerCallback.__doc__}))
    return _REAL[0]


class TrainerCallback(WatchedRun):
    """Watch a ``transformers.Trainer`` run with an nbdebug view (the thermometer by default).

    ``Trainer(..., callbacks=[cb])`` records one history step per optimizer step (the micro-batches
    of gradient accumulation merge into their step; evaluation forwards are not steps), shows the
    view live in the notebook while training runs, and leaves:

    - ``cb.result``: the run's :class:`~nbdebug.capture.result.CaptureResult` (``steps``,
      ``step_index``, ``series("loss")``, ``series(row, field)``, ``first_nonfinite_step``,
      ``incident``, ``to_pandas()``, ``to_tensorboard(logdir)``);
    - ``cb.widget``: the view's widget (``cb.widget`` in a cell shows it again).

    The step's loss is the mean of the model's own ``.loss`` over the step's micro-batches. A model
    that divides each micro-batch's loss by the tokens of the whole accumulated step
    (``num_items_in_batch``, e.g. GPT-2 in transformers ≥ 4.46) makes the Trainer log their sum,
    i.e. ``gradient_accumulation_steps`` × nbdebug's value; without accumulation the two are equal.

    Options: ``view`` (``"thermometer"``), ``layers`` (the ``--layers`` filter), ``max_bytes``
    (``"64MB"`` or bytes; the history decimates to stay within it), ``every`` (keep every N-th
    step; the non-finite check still runs on every step), ``live`` (update the view while training
    runs; else it is shown at the end). Other keyword options go to the view as in
    ``nbdebug.debug(model, view, **options)`` (e.g. ``break_on="nonfinite"``).

    The capture opens in ``on_train_begin`` on the model the Trainer trains and closes in
    ``on_train_end``. Trainer calls no callback when ``train()`` raises or is interrupted, so the
    capture is then closed (every hook removed) when the notebook cell ends, when the next
    ``train()`` starts, by ``cb.close()``, or when the callback is garbage-collected.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> TrainerCallback:
        if cls is TrainerCallback:
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
        self._watch = TrainingWatch(view, live=live, layers=layers, max_bytes=max_bytes, every=every, **options)

    # -- what the user reads --------------------------------------------------------------------

    # -- Trainer events -------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Open the capture on the model being trained (``kwargs["model"]``, unwrapped)."""
        if model is None:
            raise ValueError("nbdebug.TrainerCallback: the Trainer passed no model to on_train_begin")
        self._watch.start(model)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close the capture: every hook removed, ``result`` and ``widget`` ready."""
        self._watch.stop()

    def __repr__(self) -> str:
        w = self._watch
        state = "running" if w.running else (f"{w.result.steps} steps" if w.result is not None else "not run")
        return f"nbdebug.TrainerCallback(view={w.view!r}, {state})"
