"""Per-step flags over a capture's history (pure numpy: no torch calls, no Jupyter).

:func:`step_flags` decides every flag of the thermometer at every kept step at once (vectorised
over ``[K steps, R rows, F fields]``); the events over time (became dead, gradient fell, update
ratio out of range) are in :mod:`nbdebug.inspectors.events`, the report at one step in
:mod:`nbdebug.inspectors.steps`.

>>> bits = step_flags(history.values(), ["Linear", "ReLU"], Thresholds())       # doctest: +SKIP
>>> flag_names(int(bits[-1, 1]))                                                # doctest: +SKIP
['dead_units']

The input graph (``inputs[r]``: the rows whose outputs fed row ``r``'s module, from
``result.layers[i].inputs``, see :func:`input_graph`) decides which rows *inherit* a state (a pool
after a dead ReLU is not dead news) and where a NaN *originates*: a row whose output is non-finite
while every input row's output was finite at that step (a row with no captured input counts as an
origin). Without a graph (``inputs=None``, e.g. live, before the result exists) the rows are taken
as a chain: row ``r`` fed by row ``r - 1``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..capture.history import FIELD_INDEX

__all__ = ["FLAG_BITS", "Thresholds", "field_columns", "flag_names", "input_graph", "step_flags", "values_per_unit"]

#: one bit per flag in :func:`step_flags`' uint16 mask (decoded in this order by :func:`flag_names`)
FLAG_BITS: dict[str, int] = {
    "nan_origin_fwd": 1 << 0, "nan_origin_bwd": 1 << 1, "nonfinite": 1 << 2, "dead": 1 << 3,
    "saturated": 1 << 4, "exploding": 1 << 5, "vanishing": 1 << 6, "dead_units": 1 << 7, "update_ratio": 1 << 8,
}


@dataclass(frozen=True)
class Thresholds:
    """Configurable diagnosis thresholds (all also settable from the magic / %config)."""

    dead: float = 0.99  # fraction of exact zeros that makes an activation dead
    saturated: float = 0.5  # fraction of mass within 1e-3 of the bounds
    vanishing: float = 1e-7  # gradient L2 norm below this → vanishing
    exploding: float = 1e3  # gradient L2 norm above this → exploding
    ratio: float = 1e-4  # first/last layer gradient-norm ratio below this → vanishing toward the input
    dead_units: float = 0.5  # fraction of units zero for every sample of a step → "dead units" flag
    became_dead: float = 0.9  # "became dead" event: dead-unit fraction reached (then stays ≥ dead_units)
    update_low: float = 1e-4  # update ratio ‖Δθ‖/‖θ‖ healthy range (Karpathy: ~1e-3)
    update_high: float = 1e-2
    grad_fell: float = 3.0  # "grad_fell" event: gradient norm fell by ≥ 10^grad_fell from its first kept value
    unit_values: int = 4  # fewest values per unit (batch × positions) for dead units: with 1 sample half a ReLU's units are 0


def values_per_unit(shape: Sequence[int] | None) -> float:
    """Values each unit (dim 1: channels of N×C×…, features of N×F) has in one call of ``shape``;
    NaN when unknown or 0-D (no dead-unit decision is then withheld), 0 for 1-D outputs (no batch)."""
    if not shape:
        return math.nan
    if len(shape) < 2 or not shape[1]:
        return 0.0
    return float(np.prod(shape)) / shape[1]


def flag_names(bits: int) -> list[str]:
    """The flag names set in one ``bits`` value, in :data:`FLAG_BITS` order."""
    return [name for name, b in FLAG_BITS.items() if bits & b]


def input_graph(layers: Sequence[Any], rows: Sequence[str]) -> list[tuple[int, ...]]:
    """``result.layers[i].inputs`` (indices into ``layers``) re-indexed to ``rows`` (e.g. history rows),
    matching by row name; a row without a layer record has no inputs."""
    pos = {n: i for i, n in enumerate(rows)}
    by_name = {rec.name: rec for rec in layers}
    out: list[tuple[int, ...]] = []
    for n in rows:
        rec = by_name.get(n)
        ids = () if rec is None else tuple(pos[layers[j].name] for j in rec.inputs if layers[j].name in pos)
        out.append(ids)
    return out


def _padded(inputs: Sequence[Sequence[int]] | None, r: int) -> np.ndarray:
    """``[R, M]`` input indices, ``r`` (a padding column) where a row has fewer than ``M`` inputs."""
    if inputs is None:
        inputs = [(i - 1,) if i else () for i in range(r)]
    m = max((len(x) for x in inputs), default=0)
    pad = np.full((r, max(m, 1)), r, dtype=np.intp)
    for i, x in enumerate(inputs[:r]):
        pad[i, : len(x)] = list(x)
    return pad


def _over_inputs(mask: np.ndarray, pad: np.ndarray, fill: bool, how: str) -> np.ndarray:
    """``any``/``all`` of ``mask [K, R]`` over each row's inputs (padding reads ``fill``)."""
    k = mask.shape[0]
    ext = np.concatenate([mask, np.full((k, 1), fill)], axis=1)
    g = ext[:, pad]  # [K, R, M]
    return g.any(axis=2) if how == "any" else g.all(axis=2)


def _float_rows(dtypes: Sequence[str] | None, r: int) -> np.ndarray:
    if dtypes is None:
        return np.ones(r, bool)
    return np.array([not d or d.startswith(("float", "bfloat", "complex")) for d in dtypes], bool)


#: rows of ``[K·R, F]`` read per block in :func:`field_columns` (~640 KB of float32 at F = 20: stays in cache)
_BLOCK = 8192


def field_columns(v: np.ndarray, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Contiguous ``[K, R]`` copies of some fields of ``v [K, R, F]``.

    Elementwise work on the strided ``v[:, :, f]`` views is ~20× slower than on contiguous arrays, and
    one whole-array transpose or one strided copy per field walks all of ``v`` once per field; a
    fancy-index take of the needed fields per cache-sized block of rows, transposed into one
    ``[len(names), K·R]`` array, reads ``v`` once (1000 × 300 × 10 fields: ~1.5 ms, was ~5 ms).
    """
    k, r, f = v.shape
    n = k * r
    flat = v.reshape(n, f)
    idx = np.array([FIELD_INDEX[x] for x in names], dtype=np.intp)
    block = np.empty((len(names), n), dtype=v.dtype)
    for a in range(0, n, _BLOCK):
        block[:, a : a + _BLOCK] = flat[a : a + _BLOCK].take(idx, axis=1).T
    return {x: block[i].reshape(k, r) for i, x in enumerate(names)}


def _below_dead(zeros: np.ndarray, pad: np.ndarray) -> np.ndarray:
    """``[K, R]``: a row somewhere upstream (through the input graph, transitively) is all zeros at
    that step. Everything below a dead layer sees a constant input, so units that are zero for every
    sample there are the dead layer's consequence, not a finding of their own."""
    k, r = zeros.shape
    up = np.zeros((k, r), bool)
    for j in range(r):
        ins = pad[j][pad[j] < r]
        if ins.size:
            up[:, j] = (up[:, ins] | zeros[:, ins]).any(axis=1)
    return up


def step_flags(values: np.ndarray, types: Sequence[str], thresholds: Thresholds | None = None, *,
               dtypes: Sequence[str] | None = None, inputs: Sequence[Sequence[int]] | None = None,
               skipped: np.ndarray | None = None, shapes: Sequence[Sequence[int] | None] | None = None,
               start: int = 0) -> np.ndarray:
    """uint16 ``[K - start, R]`` bitmask (:data:`FLAG_BITS`) of every row at every kept step from slot ``start`` on.

    ``values``: ``[K, R, F]`` in ``HISTORY_FIELDS`` order (NaN where unknown); ``types``: module class
    names per row; ``dtypes``: output dtypes (integer/bool rows are never dead, saturated or with dead
    units); ``inputs``: the row input graph (default: a chain). Per step: dead (zero_frac ≥ dead) and
    dead_units (dead_unit_frac ≥ dead_units) only on the first row of a chain (not when every input is
    in the same state); NaN origin forward = non-finite output from finite inputs; NaN origin backward
    (only at steps whose forward is finite) = a finite output gradient that became non-finite at an
    input of the row, or a non-finite output gradient of a row nothing captured consumed; exploding =
    gradient or parameter-gradient norm above ``exploding``; vanishing = the parameter-gradient norm
    (else the output-gradient norm) below ``vanishing`` unless a later row has dead units (the dead
    units cut it: that is the dead story, not vanishing); update_ratio outside [update_low,
    update_high] (an exact 0, a layer the optimizer did not move, is not flagged). ``skipped``: ``[K]``
    steps whose optimizer step a GradScaler skipped (``History.scalar("skipped") == 1``): their
    non-finite gradients are expected, never NaN/exploding flags. ``shapes``: output shapes; dead units
    need ``unit_values`` values per unit (one sample's zeros say nothing about a unit).

    A step's flags depend on that step's values alone: live, compute only the slots that changed
    (``first`` of ``History.changes_since``: ``step_flags(values, …, start=first)``, with ``values``
    and ``skipped`` still whole) and keep the others (~0.2 ms for a few slots of 300 rows; the whole
    1000 × 300 history takes ~6 ms).
    """
    th = thresholds or Thresholds()
    v = np.asarray(values, dtype=np.float32)
    if start:
        v = v[start:]
        skipped = None if skipped is None else np.asarray(skipped)[start:]
    k, r = v.shape[0], v.shape[1]
    del types  # the decisions do not depend on the module type (kept for the contract's signature)
    out = np.zeros((k, r), np.uint16)
    if k == 0 or r == 0:
        return out
    col = field_columns(v, ("nan", "inf", "grad_nan", "grad_inf", "zero_frac", "dead_unit_frac", "saturated_frac",
                      "grad_norm", "param_grad_norm", "update_ratio"))
    isf = _float_rows(dtypes, r)[None, :]
    pad = _padded(inputs, r)
    has_in = (pad < r).any(axis=1)[None, :]
    with np.errstate(invalid="ignore"):
        bad_f = (col["nan"] > 0) | (col["inf"] > 0)
        bad_g = (col["grad_nan"] > 0) | (col["grad_inf"] > 0)
        ok_g = np.ones((k, 1), bool) if skipped is None else ~(np.asarray(skipped)[:k, None] > 0)
        bad_g &= ok_g
        zeros = isf & (col["zero_frac"] >= th.dead)
        dead = zeros & ~(has_in & _over_inputs(zeros, pad, True, "all"))
        units = isf & (col["dead_unit_frac"] >= th.dead_units)
        if shapes is not None:
            per = np.array([values_per_unit(sh) for sh in shapes], np.float64)
            units &= ~(per < th.unit_values)[None, :r]
        # a dead row's units are all dead (one flag says it); below a dead row they are its consequence
        dead_units = units & ~zeros & ~(has_in & _over_inputs(units, pad, True, "all")) & ~_below_dead(zeros, pad)
        saturated = isf & (col["saturated_frac"] >= th.saturated)
        origin_f = bad_f & ~_over_inputs(bad_f, pad, False, "any")
        consumed = np.zeros(r + 1, bool)
        consumed[pad.ravel()] = True
        fwd_ok = ~bad_f.any(axis=1, keepdims=True)
        turned = ~bad_g & _over_inputs(bad_g & ~bad_f, pad, False, "any")
        origin_b = fwd_ok & ((turned) | (bad_g & ~consumed[None, :r]))
        gn, pn = col["grad_norm"], col["param_grad_norm"]
        exploding = (np.fmax(gn, pn) > th.exploding) & ok_g
        size = np.where(np.isfinite(pn), pn, gn)
        deadish = dead | dead_units | (zeros & isf)
        last_dead = np.where(deadish.any(axis=1), r - 1 - deadish[:, ::-1].argmax(axis=1), -1)
        later = np.arange(r)[None, :] < last_dead[:, None]  # a row after this one has dead units
        vanishing = (size < th.vanishing) & ~exploding & ~later
        ur = col["update_ratio"]
        upd = ((ur > 0) & (ur < th.update_low)) | (ur > th.update_high)
    nonfinite = (bad_f | bad_g) & ~origin_f & ~origin_b
    for name, m in (("nan_origin_fwd", origin_f), ("nan_origin_bwd", origin_b), ("nonfinite", nonfinite),
                    ("dead", dead), ("saturated", saturated), ("exploding", exploding), ("vanishing", vanishing),
                    ("dead_units", dead_units), ("update_ratio", upd)):
        out |= m * np.uint16(FLAG_BITS[name])  # (boolean-mask assignment is ~10× slower)
    return out
