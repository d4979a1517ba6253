"""What a :class:`~nbdebug.capture.session.Capture` saw, as plain data (numpy arrays and floats).

>>> res = cap.result                                   # doctest: +SKIP
>>> res["features.1"].stats["zero_frac"], res.steps, res.first_nonfinite_step   # doctest: +SKIP
(0.98, 8, 6)

Over time (training loops): ``res.step_index`` are the kept steps, ``res.series("features.1",
"zero_frac")`` a row's stat at each of them (``agg="min"|"max"``: a decimated bucket's extremes),
``res.series("loss")`` the loss, ``res.at(41)`` the rows at step 41 as :class:`LayerRecord`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ErrorSite
from .history import FIELD_INDEX, HISTORY_FIELDS, SCALARS, History
from .history_export import history_frame, write_tensorboard

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PHASES", "CaptureResult", "LayerRecord"]

#: where a step's first non-finite value appeared, in the order they happen within a step
PHASES: tuple[str, ...] = ("forward", "output_grad", "param_grad")
_STAT_FIELDS = ("mean", "std", "min", "max", "zero_frac", "nan", "inf", "norm", "dead_unit_frac")
_GRAD_FIELDS = ("mean", "std", "min", "max", "norm", "nan", "inf")
_OPTIONAL_STATS = ("saturated_frac", "param_norm", "update_ratio")


@dataclass(repr=False)
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

    def __repr__(self) -> str:
        """One line: the row, its shape and its headline stats (never the sample or histogram arrays)."""
        def num(d: dict[str, float] | None, k: str) -> str:
            v = None if d is None else d.get(k)
            return "–" if v is None else f"{v:.4g}"

        grad = "" if self.grad is None else f", grad norm={num(self.grad, 'norm')}"
        return (f"LayerRecord({self.name!r}, {self.type}, shape={tuple(self.shape)}, {self.dtype}, calls={self.calls}, "
                f"mean={num(self.stats, 'mean')}, std={num(self.stats, 'std')}, zero_frac={num(self.stats, 'zero_frac')}"
                f"{grad})")


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
    # --- over time (issue 10): the capture fills these; the defaults keep hand-built results working
    history: History | None = None  # per-step row stats (see :mod:`nbdebug.capture.history`)
    param_grad_nonfinite_step: int | None = None  # 1-based step whose parameter gradients first went non-finite
    incidents: list[Any] = field(default_factory=list)  # nbdebug.capture.incidents.Incident, in step order
    skipped: list[int] = field(default_factory=list)  # steps whose optimizer step a GradScaler skipped
    eval_steps: int = 0  # no-grad forwards inside a training loop (kept out of the history)
    every: int = 1  # --every N: the history samples every N-th step
    lrs: dict[str, float] = field(default_factory=dict)  # module → lr of its parameters' group (last step)
    # --- the training loop as the capture saw it (issue 26; read by nbdebug.inspectors.loop_findings)
    loop: dict[str, Any] = field(default_factory=dict)
    # --- filled by the thermometer (nbdebug.debug / %%nndebug; nbdebug.inspectors.thermometer.diagnose for a
    # Capture of your own): the ranked findings (.code, .severity, .step, .rows, .text, .advice, .cause), the header
    findings: list[Any] = field(default_factory=list)
    headline: str = ""

    def _first_nonfinite(self) -> tuple[int, int] | None:
        steps = (self.forward_nonfinite_step, self.backward_nonfinite_step, self.param_grad_nonfinite_step)
        cands = [(s, phase) for phase, s in enumerate(steps) if s is not None]
        return min(cands) if cands else None

    @property
    def first_nonfinite_step(self) -> int | None:
        """1-based step in which the first NaN/Inf appeared (forward output, output gradient or
        parameter gradient), or None."""
        first = self._first_nonfinite()
        return None if first is None else first[0]

    @property
    def first_nonfinite_phase(self) -> str | None:
        """Where the first NaN/Inf appeared within its step: "forward" < "output_grad" < "param_grad"."""
        first = self._first_nonfinite()
        return None if first is None else PHASES[first[1]]

    @property
    def incident(self) -> Any | None:
        """The first "nonfinite" :class:`~nbdebug.capture.incidents.Incident`, or None."""
        return next((i for i in self.incidents if getattr(i, "kind", None) == "nonfinite"), None)

    @property
    def skipped_steps(self) -> np.ndarray:
        """int64: the steps whose optimizer step a GradScaler skipped (inf/NaN gradients): ``skipped``
        and the kept history steps marked skipped."""
        steps = set(self.skipped)
        h = self.history
        if h is not None and len(h):
            steps.update(h.step_index[h.scalar("skipped") == 1.0].tolist())
        return np.array(sorted(steps), dtype=np.int64)

    @property
    def step_index(self) -> np.ndarray:
        """int64 ``[K]``: the kept steps (1-based; each a bucket's last step once decimated)."""
        return np.zeros(0, np.int64) if self.history is None else self.history.step_index

    def row_name(self, name: str) -> str:
        """The row ``name`` names: a row name, or a module name → its first row; KeyError listing the valid names."""
        if not isinstance(name, str):
            hint = f"; for this record pass its name, {name.name!r}" if isinstance(name, LayerRecord) else ""
            raise KeyError(f"a row is named by a string, got a {type(name).__name__}{hint}")
        h = self.history
        rows = h.rows if h is not None else [r.name for r in self.layers]
        if name in rows:
            return name
        modules = [str(i["module"]) for i in h.row_info] if h is not None else [r.module for r in self.layers]
        if name in modules:
            return rows[modules.index(name)]
        listed = ", ".join(map(repr, rows[:30])) + (" …" if len(rows) > 30 else "")
        raise KeyError(f"no row {name!r}; valid names: {', '.join(map(repr, SCALARS))} or a row: {listed}")

    def series(self, name: str, field: str | None = None, agg: str = "last") -> np.ndarray:
        """float64 ``[K]`` aligned with :attr:`step_index`.

        ``field`` (default ``"mean"``, any of :data:`~nbdebug.capture.history.HISTORY_FIELDS`) of row
        ``name`` (a row name, or a module name for its first row); or the per-step scalar ``name``
        (``"loss"``, ``"lr"``, ``"skipped"``) when no field is given. ``agg="min"|"max"`` gives each
        kept bucket's extremes. NaN where unknown (before a row appeared, no loss, …); empty when the
        result has no history. A bad name or field raises KeyError listing the valid ones.
        """
        if agg not in ("last", "min", "max"):
            raise ValueError(f"agg must be 'last', 'min' or 'max', got {agg!r}")
        h = self.history
        if field is None and name in SCALARS:
            return np.zeros(0) if h is None else h.scalar(name, agg).astype(np.float64)
        f = "mean" if field is None else field
        if f not in FIELD_INDEX:
            raise KeyError(f"no field {f!r}; valid fields: {', '.join(HISTORY_FIELDS)}")
        row = self.row_name(name)
        return np.zeros(0) if h is None else h.series(row, f, agg).astype(np.float64)

    def at(self, step: int) -> list[LayerRecord]:
        """The rows at kept step ``step`` (one of :attr:`step_index`) as :class:`LayerRecord`.

        ``stats``/``grad``/``param_grad_norm`` are that step's values (the merged rows' keys;
        ``numel`` is one call's, from the row's shape; ``near_zero_frac`` NaN: samples are whole-run;
        ``param_norm``/``update_ratio`` in ``stats`` when known); ``calls`` is 1 and ``inputs`` index
        the returned list. Rows absent at that step are left out. KeyError names the nearest kept steps.
        """
        h = self.history
        if h is None:
            raise KeyError(f"step {step}: this result has no per-step history")
        values = h.at(step)
        merged = {r.name: r for r in self.layers}
        order = [r.name for r in self.layers if r.name in values] + [n for n in values if n not in merged]
        pos = {n: i for i, n in enumerate(order)}
        row_ids = {n: i for i, n in enumerate(h.rows)}
        return [_record_at(n, values[n], merged.get(n), h.row_info[row_ids[n]], step, pos, self.layers) for n in order]

    def to_pandas(self, agg: str = "last") -> pd.DataFrame:
        """One row per kept step × layer: ``step``, ``layer``, ``module``, ``type``, every field of
        :data:`~nbdebug.capture.history.HISTORY_FIELDS`, and the step's ``loss``, ``lr``, ``skipped``
        (float64, NaN where unknown; ``agg="min"|"max"``: each decimated bucket's extremes). Needs
        pandas (``pip install nbdebug[pandas]``); ValueError when the result has no history."""
        return history_frame(self.history, agg)

    def to_tensorboard(self, logdir: Any, fields: Sequence[str] | None = None, agg: str = "last",
                       histograms: bool = True) -> str:
        """Write the history as TensorBoard events in ``logdir``; returns ``logdir``.

        Scalars ``<row>/<field>`` (every field of :data:`~nbdebug.capture.history.HISTORY_FIELDS`, or
        ``fields``) at each kept step (NaN values left out), and ``loss``, ``lr``, ``skipped``; with
        ``histograms``, each row's kept sample as the histogram ``<row>/values`` at the row's first
        step (see :func:`~nbdebug.capture.history_export.write_tensorboard`). ``tensorboard --logdir
        <logdir>`` shows them. Needs tensorboard (``pip install nbdebug[tensorboard]``).
        """
        samples = [(rec.name, rec.sample, rec.first_step) for rec in self.layers] if histograms else []
        return write_tensorboard(self.history, logdir, fields, agg, samples)

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


def _nan_none(x: float) -> float | None:
    return None if math.isnan(x) else x


def _record_at(name: str, v: dict[str, float], rec: LayerRecord | None, info: dict[str, Any], step: int,
               pos: dict[str, int], layers: list[LayerRecord]) -> LayerRecord:
    """One row's :class:`LayerRecord` at a step, from its history values (and its whole-run record)."""
    shape = tuple(rec.shape if rec is not None else info.get("shape") or ())
    numel = float(np.prod(shape)) if rec is not None or shape else math.nan
    stats = {"numel": numel, **{k: v[k] for k in _STAT_FIELDS}, "near_zero_frac": math.nan, "near_zero_exact": 0.0}
    for k in _OPTIONAL_STATS:
        if not math.isnan(v[k]) or (k == "saturated_frac" and rec is not None and k in rec.stats):
            stats[k] = v[k]
    grad = {k: v["grad_" + k] for k in _GRAD_FIELDS}
    has_grad = any(not math.isnan(x) for x in grad.values())
    inputs: tuple[int, ...] = ()
    if rec is not None:
        inputs = tuple(sorted(pos[layers[j].name] for j in rec.inputs if j < len(layers) and layers[j].name in pos))
    return LayerRecord(
        name=name,
        module=rec.module if rec is not None else str(info.get("module", name)),
        type=rec.type if rec is not None else str(info.get("type", "")),
        shape=shape,
        dtype=rec.dtype if rec is not None else str(info.get("dtype", "")),
        calls=1,
        stats=stats,
        grad={"numel": numel, **grad} if has_grad else None,
        param_grad_norm=_nan_none(v["param_grad_norm"]),
        inputs=inputs,
        external_input_nonfinite=rec.external_input_nonfinite if rec is not None else False,
        first_step=rec.first_step if rec is not None else step,
    )
