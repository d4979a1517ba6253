"""Layer health diagnoses from a :class:`~nbdebug.capture.session.CaptureResult`.

Pure computation: takes the captured stats, returns a :class:`ThermometerReport` (a stats table
as a numpy array, one list of flags per row, diagnoses with explanations and next steps, a summary
line). No Jupyter, no torch.

>>> report = diagnose(cap.result)                       # doctest: +SKIP
>>> report.summary                                      # doctest: +SKIP
'1 dead layer (features.1)'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..capture.session import CaptureResult

__all__ = ["COLUMNS", "LEGEND", "Diagnosis", "ThermometerReport", "Thresholds", "diagnose"]

COLUMNS = (
    "mean", "std", "min", "max", "zero_frac", "near_zero_frac", "nan", "inf", "numel",
    "grad_norm", "grad_mean", "grad_std", "grad_min", "grad_max", "grad_nan", "grad_inf",
    "param_grad_norm",
)

LEGEND: dict[str, dict[str, str]] = {
    "nan_origin_fwd": {"label": "NaN/Inf origin (forward)", "color": "#b30000", "description": "first layer whose output is non-finite while its inputs were finite"},
    "nan_origin_bwd": {"label": "NaN/Inf origin (backward)", "color": "#e6550d", "description": "the gradient first became non-finite in this layer's backward"},
    "nonfinite": {"label": "non-finite", "color": "#fc9272", "description": "output or gradient contains NaN/Inf (inherited)"},
    "dead": {"label": "dead", "color": "#756bb1", "description": "almost all outputs exactly zero"},
    "saturated": {"label": "saturated", "color": "#3182bd", "description": "bounded activation stuck at its bounds"},
    "exploding": {"label": "exploding grad", "color": "#d62728", "description": "gradient norm above the exploding threshold"},
    "vanishing": {"label": "vanishing grad", "color": "#969696", "description": "gradient norm below the vanishing threshold"},
}

SUGGEST = {
    "dead": "Check the init (Kaiming/He for ReLU layers) and the bias of the layer before it, lower the learning rate, or try LeakyReLU/GELU.",
    "saturated": "Scale the pre-activations down (init, normalisation before the activation) or lower the learning rate.",
    "nan_origin_fwd": "Look at this layer's op for log/sqrt/division of values ≤ 0 or overflow (add an epsilon, clamp), and at its weights (NaN from an earlier bad step?).",
    "nan_origin_bwd": "The backward of this layer produced NaN/Inf from finite gradients: look for sqrt/log/pow at 0, division by small numbers; clip gradients or add an epsilon.",
    "exploding": "Clip gradients (torch.nn.utils.clip_grad_norm_), lower the learning rate, or add normalisation.",
    "vanishing": "Use residual connections or normalisation, ReLU-family activations, and check the init scale.",
}


@dataclass(frozen=True)
class Thresholds:
    """Configurable diagnosis thresholds (all also settable from the magic / %config)."""

    dead: float = 0.99  # fraction of exact zeros that makes an activation dead
    saturated: float = 0.5  # fraction of mass within 1e-3 of the bounds
    vanishing: float = 1e-7  # gradient L2 norm below this → vanishing
    exploding: float = 1e3  # gradient L2 norm above this → exploding
    ratio: float = 1e-4  # first/last layer gradient-norm ratio below this → vanishing toward the input


@dataclass(frozen=True)
class Diagnosis:
    code: str
    severity: str  # "error" | "warning" | "info"
    layer: str  # row name, or "" for model-wide findings
    message: str
    suggestion: str


@dataclass
class ThermometerReport:
    """Rows in execution order with their stats table, flags and the diagnoses."""

    names: list[str]
    modules: list[str]
    types: list[str]
    shapes: list[tuple[int, ...]]
    dtypes: list[str]
    calls: list[int]
    table: np.ndarray  # float64 [rows, len(COLUMNS)], NaN where missing
    flags: list[list[str]]
    diagnoses: list[Diagnosis]
    summary: str
    notes: list[str] = field(default_factory=list)
    grad_ratio: float | None = None  # first / last layer gradient norm

    def column(self, name: str) -> np.ndarray:
        return self.table[:, COLUMNS.index(name)]

    def flagged(self, code: str) -> list[str]:
        return [n for n, f in zip(self.names, self.flags) if code in f]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def diagnose(result: CaptureResult, thresholds: Thresholds | None = None) -> ThermometerReport:
    th = thresholds or Thresholds()
    rows = result.layers
    n = len(rows)
    table = np.full((n, len(COLUMNS)), np.nan)
    for i, r in enumerate(rows):
        for j, col in enumerate(COLUMNS):
            if col.startswith("grad_"):
                key = col[5:]
                if r.grad is not None:
                    table[i, j] = r.grad.get(key, math.nan)
            elif col == "param_grad_norm":
                table[i, j] = math.nan if r.param_grad_norm is None else r.param_grad_norm
            else:
                table[i, j] = r.stats.get(col, math.nan)
    flags: list[list[str]] = [[] for _ in rows]
    diags: list[Diagnosis] = []

    # NaN/Inf: the origin, forward and backward, and everything that inherits it.
    fwd_origin = None
    if result.forward_nonfinite_call is not None:
        row, inputs_finite = result.forward_nonfinite_call
        inputs_bad = any(rows[j].stats["nan"] + rows[j].stats["inf"] > 0 for j in rows[row].inputs if j != row)
        fwd_origin = row
        name = rows[row].name
        if inputs_finite and not inputs_bad:
            flags[row].append("nan_origin_fwd")
            diags.append(Diagnosis("nan_origin_fwd", "error", name,
                                   f"NaN/Inf first appears in the output of `{name}` ({rows[row].type}) in the forward pass; its inputs were finite.",
                                   SUGGEST["nan_origin_fwd"]))
        else:
            flags[row].append("nan_origin_fwd")
            diags.append(Diagnosis("nan_origin_fwd", "error", name,
                                   f"NaN/Inf first seen at `{name}`, but its input was already non-finite: it comes from the model's input or from code between captured modules.",
                                   "Check the input batch (torch.isfinite(x).all()) and functional ops in the parent module's forward()."))
    bwd_origin = None
    if result.backward_nonfinite_row is not None:
        g_row = result.backward_nonfinite_row
        # The gradient w.r.t. g_row's output went bad in the backward of a layer that consumed it.
        consumers = [i for i, r in enumerate(rows) if g_row in r.inputs and i != g_row]
        finite_consumers = [i for i in consumers if rows[i].grad is not None and rows[i].grad["nan"] + rows[i].grad["inf"] == 0]
        if finite_consumers:
            bwd_origin = finite_consumers[0]
            name = rows[bwd_origin].name
            msg = f"the gradient first becomes NaN/Inf in the backward of `{name}` ({rows[bwd_origin].type}): finite gradient at its output, non-finite at its input."
        else:
            bwd_origin = g_row
            name = rows[g_row].name
            msg = f"the gradient first becomes NaN/Inf just after `{name}` (w.r.t. its output), in code between captured modules or in the loss."
        if fwd_origin is None or bwd_origin != fwd_origin:
            flags[bwd_origin].append("nan_origin_bwd")
            diags.append(Diagnosis("nan_origin_bwd", "error", name, "Backward: " + msg, SUGGEST["nan_origin_bwd"]))
    for i, r in enumerate(rows):
        bad = r.stats["nan"] + r.stats["inf"] > 0 or (r.grad is not None and r.grad["nan"] + r.grad["inf"] > 0)
        if bad and "nan_origin_fwd" not in flags[i] and "nan_origin_bwd" not in flags[i]:
            flags[i].append("nonfinite")

    # Dead activations: the first in a chain (a pooling layer after a dead ReLU is not news).
    for i, r in enumerate(rows):
        zf = r.stats["zero_frac"]
        if not (r.stats["numel"] > 0 and zf >= th.dead):
            continue
        # Inherited zeros (pooling/flatten after a dead ReLU) are not news: flag the first only.
        if r.inputs and all(rows[j].stats["zero_frac"] >= th.dead for j in r.inputs):
            continue
        flags[i].append("dead")
        diags.append(Diagnosis("dead", "warning", r.name,
                               f"`{r.name}` ({r.type}) outputs {zf:.1%} exact zeros: its units are dead and pass no gradient.",
                               SUGGEST["dead"]))

    for i, r in enumerate(rows):
        sat = r.stats.get("saturated_frac")
        if sat is not None and sat >= th.saturated:
            flags[i].append("saturated")
            diags.append(Diagnosis("saturated", "warning", r.name,
                                   f"`{r.name}` ({r.type}) has {sat:.1%} of its outputs within 1e-3 of its bounds: saturated, gradients vanish there.",
                                   SUGGEST["saturated"]))

    # Gradient magnitudes: a layer's parameter-gradient norm where it has one (what the optimiser
    # sees), else the norm of the gradient w.r.t. its output; exploding if either is too large.
    gn = table[:, COLUMNS.index("grad_norm")]
    pn = table[:, COLUMNS.index("param_grad_norm")]
    have = [i for i in range(n) if np.isfinite(gn[i]) or np.isfinite(pn[i])]
    any_dead = any("dead" in f for f in flags)
    for i in have:
        size = pn[i] if np.isfinite(pn[i]) else gn[i]
        if np.nanmax([gn[i], pn[i]]) > th.exploding:
            flags[i].append("exploding")
        elif size < th.vanishing and not (size == 0 and any_dead):
            # An exactly-zero gradient behind dead units is the dead diagnosis, not a second one.
            flags[i].append("vanishing")
    explo = [rows[i].name for i in have if "exploding" in flags[i]]
    vani = [rows[i].name for i in have if "vanishing" in flags[i]]
    if explo:
        diags.append(Diagnosis("exploding", "error", explo[0],
                               f"gradient norm above {th.exploding:g} in {_plural(len(explo), 'layer')} (largest {np.nanmax(np.r_[gn, pn]):.3g}, first at `{explo[0]}`).",
                               SUGGEST["exploding"]))
    if vani:
        diags.append(Diagnosis("vanishing", "warning", vani[0],
                               f"gradient norm below {th.vanishing:g} in {_plural(len(vani), 'layer')} (first at `{vani[0]}`).",
                               SUGGEST["vanishing"]))
    ratio = None
    act = [i for i in range(n) if np.isfinite(gn[i])]
    if len(act) >= 2:
        first, last = gn[act[0]], gn[act[-1]]
        if last > 0 and np.isfinite(first) and np.isfinite(last) and not (first == 0 and any_dead):
            ratio = float(first / last)
            if ratio < th.ratio:
                diags.append(Diagnosis("vanishing", "warning", "",
                                       f"the gradient norm at the first layer is {ratio:.2g}× the last layer's: gradients vanish toward the input.",
                                       SUGGEST["vanishing"]))
            elif ratio > 1 / th.ratio:
                diags.append(Diagnosis("exploding", "warning", "",
                                       f"the gradient norm at the first layer is {ratio:.2g}× the last layer's: gradients grow toward the input.",
                                       SUGGEST["exploding"]))

    summary = _summary(rows, flags, diags, result)
    notes = list(result.notes)
    if not result.backward_ran:
        notes.append("no backward ran inside the cell: gradient columns are empty (call loss.backward() in the cell to see them)")
    if result.forward_passes > 1:
        notes.append(f"the model ran {result.forward_passes} times: stats cover every call, histograms the first")
    notes.append(
        f"histograms from a sample of up to {result.sample_size:,} values per layer (exact for smaller tensors); near-zero means |x| < {result.near_zero_eps:g}"
    )
    return ThermometerReport(
        names=[r.name for r in rows], modules=[r.module for r in rows], types=[r.type for r in rows],
        shapes=[r.shape for r in rows], dtypes=[r.dtype for r in rows], calls=[r.calls for r in rows],
        table=table, flags=flags, diagnoses=diags, summary=summary, notes=notes, grad_ratio=ratio,
    )


def _summary(rows: list, flags: list[list[str]], diags: list[Diagnosis], result: CaptureResult) -> str:
    if not rows:
        return "no layer ran inside the cell (did the cell call the model?)"
    parts: list[str] = []
    dead = [rows[i].name for i, f in enumerate(flags) if "dead" in f]
    if dead:
        parts.append(f"{_plural(len(dead), 'dead layer')} ({', '.join(dead[:3])}{'…' if len(dead) > 3 else ''})")
    for d in diags:
        if d.code == "nan_origin_fwd":
            parts.append(f"NaN first appears in `{d.layer}` (forward)")
        elif d.code == "nan_origin_bwd":
            parts.append(f"NaN first appears in `{d.layer}` (backward)")
    sat = sum("saturated" in f for f in flags)
    if sat:
        parts.append(_plural(sat, "saturated layer"))
    ex = sum("exploding" in f for f in flags)
    if ex:
        parts.append(f"exploding gradients in {_plural(ex, 'layer')}")
    va = sum("vanishing" in f for f in flags)
    if va or any(d.code == "vanishing" and not d.layer for d in diags):
        parts.append("vanishing gradients")
    head = f"{len(rows)} layers"
    if not parts:
        return f"{head}: no problems found"
    return f"{head}: " + ", ".join(parts)
