"""What a :class:`~nbdebug.capture.session.Capture` saw, as plain data (numpy arrays and floats).

>>> res = cap.result                                   # doctest: +SKIP
>>> res["features.1"].stats["zero_frac"], res.steps, res.first_nonfinite_step   # doctest: +SKIP
(0.98, 8, 6)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import ErrorSite

__all__ = ["CaptureResult", "LayerRecord"]


@dataclass
class LayerRecord:
    """One row: a tensor leaf of one module's output (per occurrence within a forward pass)."""

    name: str  # row name: 'features.0', 'block.0[1]', 'layer1.0.relu#2' for a second call
    module: str  # qualified module name
    type: str  # module class name
    shape: tuple[int, ...]
    dtype: str
    calls: int
    stats: dict[str, float]  # mean, std, min, max, zero_frac, near_zero_frac, nan, inf, numel, ...
    grad: dict[str, float] | None  # same keys for d(loss)/d(output), None when no backward reached it
    param_grad_norm: float | None  # L2 norm of this module's own parameters' fresh .grad
    sample: np.ndarray | None = None  # float32 sample of the first call's values (for histograms)
    histogram: tuple[np.ndarray, np.ndarray] | None = None  # exact (counts, edges) when requested
    inputs: tuple[int, ...] = ()  # row indices whose outputs fed this row's module (first call)
    external_input_nonfinite: bool = False  # an input not produced by a captured row was NaN/Inf
    first_step: int = 1  # the step of this row's first call

    @property
    def is_float(self) -> bool:
        """Floating-point output (an activation); integer/bool outputs are masks, indices, counts."""
        return self.dtype.startswith(("float", "bfloat", "complex"))


@dataclass
class CaptureResult:
    """What a :class:`Capture` saw, as plain data (numpy and floats only)."""

    layers: list[LayerRecord]
    forward_passes: int
    backward_ran: bool
    calls_recorded: int
    truncated: bool
    sample_size: int
    near_zero_eps: float
    bytes_kept: int
    budget_exceeded: bool
    forward_nonfinite_call: tuple[int, bool] | None  # (row index, inputs were finite) of the first non-finite forward output
    backward_nonfinite_row: int | None  # row whose output gradient was the first non-finite one in backward order
    elapsed_s: float
    notes: list[str] = field(default_factory=list)
    steps: int = 0  # calls of the model's top-level forward (recomputation during backward excluded)
    forward_nonfinite_step: int | None = None  # 1-based step of ``forward_nonfinite_call``
    backward_nonfinite_step: int | None = None  # 1-based step whose backward first went non-finite
    backward_origin_row: int | None = None  # consumer of ``backward_nonfinite_row`` with a finite output gradient (same step)
    error: ErrorSite | None = None  # the module that raised, when the cell raised inside the model
    raised: str | None = None  # "RuntimeError: ..." when the cell raised (inside the model or not)

    @property
    def first_nonfinite_step(self) -> int | None:
        """1-based step in which the first NaN/Inf appeared (forward or backward), or None."""
        steps = [s for s in (self.forward_nonfinite_step, self.backward_nonfinite_step) if s is not None]
        return min(steps) if steps else None

    def __getitem__(self, name: str) -> LayerRecord:
        for rec in self.layers:
            if rec.name == name:
                return rec
        matches = [r for r in self.layers if r.module == name]
        if matches:
            return matches[0]
        raise KeyError(f"no captured layer {name!r}; captured: {[r.name for r in self.layers][:20]}")

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        return (
            f"CaptureResult({len(self.layers)} layers, {self.forward_passes} forward pass(es), "
            f"backward={'yes' if self.backward_ran else 'no'}"
            + (f", raised in `{self.error.module}`" if self.error is not None else "") + ")"
        )
