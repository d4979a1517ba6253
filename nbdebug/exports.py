"""A capture's per-step history, out to the tools people already use: pandas and TensorBoard.

>>> df = to_pandas(result)                      # doctest: +SKIP   (or result.to_pandas())
>>> df[df.layer == "fc1"].plot(x="step", y="grad_norm")   # doctest: +SKIP
>>> to_tensorboard(result, "runs/debug")        # doctest: +SKIP

The functional forms of :meth:`CaptureResult.to_pandas <nbdebug.capture.result.CaptureResult.to_pandas>`
and :meth:`~nbdebug.capture.result.CaptureResult.to_tensorboard`; the work is done in
:mod:`nbdebug.capture.history_export`. Both are optional extras: ``pip install nbdebug[pandas]``
and ``pip install nbdebug[tensorboard]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .capture.result import CaptureResult

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["to_pandas", "to_tensorboard"]


def to_pandas(result: CaptureResult, agg: str = "last") -> pd.DataFrame:
    """One row per kept step × layer (:meth:`CaptureResult.to_pandas`); ValueError without a history."""
    return result.to_pandas(agg=agg)


def to_tensorboard(result: CaptureResult, logdir: str | Path, fields: Sequence[str] | None = None,
                   agg: str = "last", histograms: bool = True) -> str:
    """The history as TensorBoard events in ``logdir`` (:meth:`CaptureResult.to_tensorboard`)."""
    return result.to_tensorboard(logdir, fields=fields, agg=agg, histograms=histograms)
