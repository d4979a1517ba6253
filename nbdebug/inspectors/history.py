"""Per-step flags and events over a capture's history (pure numpy: no torch calls, no Jupyter).

:func:`step_flags` decides every flag of the thermometer at every kept step at once (vectorised
over ``[K steps, R rows, F fields]``); :func:`events` finds rows whose state changed over time
(became dead, gradient norm fell by decades, update ratio out of range) and tells the dead-unit
story: which ReLU died, from which step, after which update. Every number an event cites is a value
of the history at the step the message names (``at step k`` / ``from step k``).

>>> bits = step_flags(history.values(), ["Linear", "ReLU"], Thresholds())       # doctest: +SKIP
>>> flag_names(int(bits[-1, 1]))                                                # doctest: +SKIP
['dead_units']
>>> events(history)[0].message                                                  # doctest: +SKIP
'ReLU `1`: 97% of units dead from step 8, after an update ratio of 1.01 at step 7 in `0` (learning rate too high)'

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

__all__ = [
    "FLAG_BITS",
    "Diagnosis",
    "Event",
    "Thresholds",
    "dead_summary",
    "diagnoses_at",
    "events",
    "flag_names",
    "input_graph",
    "step_flags",
    "values_per_unit",
]

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


@dataclass(frozen=True)
class Diagnosis:
    """A finding at one step (or over the merged run): ``layer`` is a row name, "" for model-wide."""

    code: str
    severity: str  # "error" | "warning" | "info"
    layer: str
    message: str
    suggestion: str


@dataclass(frozen=True)
class Event:
    """A row whose state changed over time: ``code`` is "became_dead" | "grad_fell" | "update_ratio"."""

    step: int  # 1-based step where it happened
    row: str
    code: str
    message: str
    suggestion: str


SUGGEST_EVENTS = {
    "became_dead": "Lower the learning rate (or warm it up, clip gradients): one large update pushed these units' "
                   "pre-activations below zero for every sample, and a dead ReLU gets no gradient to come back. "
                   "LeakyReLU/GELU or a smaller init of the bias also help.",
    "grad_fell": "Gradients shrank by orders of magnitude during training: look for units dying or saturating "
                 "upstream, a learning rate that decays too fast, or add normalisation/residual connections.",
    "update_high": "Lower the learning rate: an update ratio ‖Δθ‖/‖θ‖ around 1e-3 is healthy (Karpathy's rule of "
                   "thumb); above 1e-2 the weights change too fast.",
    "update_low": "Raise the learning rate (or check this layer's param group): an update ratio ‖Δθ‖/‖θ‖ around "
                  "1e-3 is healthy; below 1e-4 the layer barely learns.",
}


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


def _fields(v: np.ndarray, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Contiguous ``[K, R]`` copies of some fields (elementwise work on strided views is ~20× slower)."""
    k, r, f = v.shape
    block = np.ascontiguousarray(np.take(v.reshape(k * r, f), [FIELD_INDEX[n] for n in names], axis=1).T)
    return {n: block[i].reshape(k, r) for i, n in enumerate(names)}


def step_flags(values: np.ndarray, types: Sequence[str], thresholds: Thresholds | None = None, *,
               dtypes: Sequence[str] | None = None, inputs: Sequence[Sequence[int]] | None = None,
               skipped: np.ndarray | None = None, shapes: Sequence[Sequence[int] | None] | None = None) -> np.ndarray:
    """uint16 ``[K, R]`` bitmask (:data:`FLAG_BITS`) of every row at every kept step.

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
    (``History.changes_since``) and keep the others (~0.5 ms for a few slots of 300 rows; the whole
    1000 × 300 history takes ~15 ms).
    """
    th = thresholds or Thresholds()
    v = np.asarray(values, dtype=np.float32)
    k, r = v.shape[0], v.shape[1]
    del types  # the decisions do not depend on the module type (kept for the contract's signature)
    out = np.zeros((k, r), np.uint16)
    if k == 0 or r == 0:
        return out
    col = _fields(v, ("nan", "inf", "grad_nan", "grad_inf", "zero_frac", "dead_unit_frac", "saturated_frac",
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
        dead_units = units & ~(has_in & _over_inputs(units, pad, True, "all"))
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
        later = np.zeros_like(deadish)
        later[:, :-1] = np.logical_or.accumulate(deadish[:, ::-1], axis=1)[:, ::-1][:, 1:]
        vanishing = (size < th.vanishing) & ~exploding & ~later
        ur = col["update_ratio"]
        upd = ((ur > 0) & (ur < th.update_low)) | (ur > th.update_high)
    nonfinite = (bad_f | bad_g) & ~origin_f & ~origin_b
    for name, m in (("nan_origin_fwd", origin_f), ("nan_origin_bwd", origin_b), ("nonfinite", nonfinite),
                    ("dead", dead), ("saturated", saturated), ("exploding", exploding), ("vanishing", vanishing),
                    ("dead_units", dead_units), ("update_ratio", upd)):
        out[m] |= np.uint16(FLAG_BITS[name])
    return out


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _g(x: float) -> str:
    return f"{x:.3g}"


def _first_true(mask: np.ndarray) -> np.ndarray:
    """Per column of ``mask [K, R]``: the first row index that is True, -1 when none."""
    return np.where(mask.any(axis=0), mask.argmax(axis=0), -1)


def _update_source(ur: np.ndarray, j: int, r: int, inputs: Sequence[Sequence[int]] | None) -> tuple[int, bool] | None:
    """The row whose update ratio at slot ``j`` explains row ``r``: ``r`` itself or the nearest row up
    the input graph with a finite ratio (True), else the largest ratio in the model (False)."""
    seen, todo = {r}, [r]
    while todo:
        nxt: list[int] = []
        for i in todo:
            if np.isfinite(ur[j, i]):
                return i, True
            ins = inputs[i] if inputs is not None else ((i - 1,) if i else ())
            nxt += [x for x in ins if x not in seen]
            seen.update(ins)
        todo = nxt
    fin = np.isfinite(ur[j])
    if not fin.any():
        return None
    return int(np.nanargmax(np.where(fin, ur[j], -np.inf))), False


def _dead_story(row: str, typ: str, frac: float, step: int, prev: tuple[float, int, str, bool] | None,
                th: Thresholds, what: str = "of units dead") -> str:
    msg = f"{typ} `{row}`: {_pct(frac)} {what} from step {step}" if typ else f"`{row}`: {_pct(frac)} {what} from step {step}"
    if prev is not None:
        x, pstep, src, feeding = prev
        msg += f", after an update ratio of {_g(x)} at step {pstep} in `{src}`"
        if not feeding:
            msg += " (the largest in the model)" if x <= th.update_high else " (the largest in the model; learning rate too high)"
        elif x > th.update_high:
            msg += " (learning rate too high)"
    return msg


def events(history: Any, thresholds: Thresholds | None = None, *, inputs: Sequence[Sequence[int]] | None = None,
           flags: np.ndarray | None = None) -> list[Event]:
    """Rows that changed state over the kept steps of ``history`` (a :class:`~nbdebug.capture.history.History`).

    - ``became_dead``: the row's dead-unit fraction reached ``became_dead`` at step k (flagged there,
      not inherited) and stayed ≥ ``dead_units`` until the last kept step, after being lower before;
      the message cites the update ratio at the previous kept step of the row itself or the nearest
      row feeding it (input graph), else the largest in the model. Rows without a dead-unit fraction
      use their zero fraction against ``dead``.
    - ``grad_fell``: the parameter-gradient norm (else the output-gradient norm) fell by ≥ 10^grad_fell
      from its first kept positive value (first step where it did).
    - ``update_ratio``: the first kept step where the row's update ratio is out of range.

    Sorted by step, then row order. ``flags``: :func:`step_flags` of the same history, if at hand.
    """
    th = thresholds or Thresholds()
    v = history.values("last")
    steps = np.asarray(history.step_index)
    rows = list(history.rows)
    info = list(getattr(history, "row_info", [{}] * len(rows)))
    types = [str(i.get("type", "")) for i in info]
    if flags is None:
        skipped = history.scalar("skipped") == 1 if hasattr(history, "scalar") else None
        flags = step_flags(v, types, th, dtypes=[str(i.get("dtype", "")) for i in info], inputs=inputs, skipped=skipped,
                           shapes=[i.get("shape") for i in info])
    k, r = v.shape[:2]
    out: list[tuple[int, int, int, Event]] = []
    if k == 0 or r == 0:
        return []
    col = _fields(v, ("update_ratio", "dead_unit_frac", "zero_frac", "param_grad_norm", "grad_norm"))
    ur = col["update_ratio"]
    idx = np.arange(k)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        # -- became dead ------------------------------------------------------------------------
        duf, zf = col["dead_unit_frac"], col["zero_frac"]
        use_units = np.isfinite(duf).any(axis=0)
        frac = np.where(use_units[None, :], duf, zf)
        hi = np.where(use_units, th.became_dead, th.dead)[None, :]
        stay = np.where(use_units, th.dead_units, th.dead)[None, :]
        bits = np.uint16(FLAG_BITS["dead_units"] | FLAG_BITS["dead"])
        below = frac < stay
        last_alive = np.where(below.any(axis=0), k - 1 - below[::-1].argmax(axis=0), -1)
        cand = (frac >= hi) & (idx > last_alive[None, :]) & ((flags & bits) > 0)
        was_lower = np.zeros_like(cand)
        was_lower[1:] = np.logical_or.accumulate(frac < hi, axis=0)[:-1]
        kd = _first_true(cand & was_lower)
        for i in np.flatnonzero(kd >= 0):
            j = int(kd[i])
            src = _update_source(ur, j - 1, int(i), inputs)
            prev = None if src is None else (float(ur[j - 1, src[0]]), int(steps[j - 1]), rows[src[0]], src[1])
            what = "of units dead" if use_units[i] else "of outputs exactly zero"
            msg = _dead_story(rows[i], types[i], float(frac[j, i]), int(steps[j]), prev, th, what)
            out.append((j, int(i), 0, Event(int(steps[j]), rows[i], "became_dead", msg, SUGGEST_EVENTS["became_dead"])))
        # -- gradient norm fell by decades ------------------------------------------------------
        pn, gn = col["param_grad_norm"], col["grad_norm"]
        use_p = np.isfinite(pn).any(axis=0)
        size = np.where(use_p[None, :], pn, gn)
        pos = np.isfinite(size) & (size > 0)
        f0 = _first_true(pos)
        first = size[np.maximum(f0, 0), np.arange(r)]
        fell = (idx > f0[None, :]) & (f0[None, :] >= 0) & np.isfinite(size) & (size * 10.0 ** th.grad_fell <= first[None, :])
        kg = _first_true(fell)
        for i in np.flatnonzero(kg >= 0):
            j, j0 = int(kg[i]), int(f0[i])
            a, b = float(first[i]), float(size[j, i])
            what = "parameter-gradient norm" if use_p[i] else "output-gradient norm"
            by = f" (10^{math.floor(math.log10(a / b))} smaller)" if b > 0 else ""
            msg = f"`{rows[i]}`: {what} fell from {_g(a)} at step {int(steps[j0])} to {_g(b)} at step {int(steps[j])}{by}"
            out.append((j, int(i), 1, Event(int(steps[j]), rows[i], "grad_fell", msg, SUGGEST_EVENTS["grad_fell"])))
    # -- update ratio out of range --------------------------------------------------------------
    ku = _first_true((flags & np.uint16(FLAG_BITS["update_ratio"])) > 0)
    for i in np.flatnonzero(ku >= 0):
        j = int(ku[i])
        x = float(ur[j, i])
        high = x > th.update_high
        how = "too large: the learning rate is too high for this layer" if high else "too small: this layer barely learns"
        msg = f"`{rows[i]}`: update ratio ‖Δθ‖/‖θ‖ of {_g(x)} at step {int(steps[j])}, {how}"
        out.append((j, int(i), 2, Event(int(steps[j]), rows[i], "update_ratio", msg,
                                        SUGGEST_EVENTS["update_high" if high else "update_low"])))
    out.sort(key=lambda t: t[:3])
    return [e for *_, e in out]


SUGGEST = {
    "dead": "Check the init (Kaiming/He for ReLU layers) and the bias of the layer before it, lower the learning rate, or try LeakyReLU/GELU.",
    "saturated": "Scale the pre-activations down (init, normalisation before the activation) or lower the learning rate.",
    "nan_origin_fwd": "Look at this layer's op for log/sqrt/division of values ≤ 0 or overflow (add an epsilon, clamp), and at its weights (NaN from an earlier bad step?).",
    "nan_origin_bwd": "The backward of this layer produced NaN/Inf from finite gradients: look for sqrt/log/pow at 0, division by small numbers; clip gradients or add an epsilon.",
    "exploding": "Clip gradients (torch.nn.utils.clip_grad_norm_), lower the learning rate, or add normalisation.",
    "vanishing": "Use residual connections or normalisation, ReLU-family activations, and check the init scale.",
    "dead_units": "These units output zero for every sample: check the init and the bias of the layer before, lower the learning rate, or try LeakyReLU/GELU.",
    "update_ratio": "An update ratio ‖Δθ‖/‖θ‖ around 1e-3 is healthy (Karpathy's rule of thumb): above 1e-2 lower the learning rate, below 1e-4 raise it.",
}


def _names(xs: list[str]) -> str:
    return ", ".join(xs[:3]) + ("…" if len(xs) > 3 else "")


def dead_summary(dead: list[str], units: list[str], story: dict[str, Event]) -> list[str]:
    """Summary parts for dead layers and layers with dead units; the earliest became-dead story among
    them adds "from step k (learning rate too high)" to the last part."""
    parts = []
    if dead:
        parts.append(f"{len(dead)} dead layer{'s' * (len(dead) != 1)} ({_names(dead)})")
    if units:
        parts.append(f"dead units in {len(units)} layer{'s' * (len(units) != 1)} ({_names(units)})")
    told = [story[n] for n in dead + units if n in story]
    if told and parts:
        e = min(told, key=lambda e: e.step)
        parts[-1] += f" from step {e.step}" + (" (learning rate too high)" if "learning rate too high" in e.message else "")
    return parts


def diagnoses_at(j: int, values: np.ndarray, steps: np.ndarray, rows: Sequence[str], types: Sequence[str],
                 bits: np.ndarray, evs: Sequence[Event], thresholds: Thresholds | None = None,
                 first_nonfinite: tuple[int, str | None] | None = None) -> tuple[list[Diagnosis], list[str], float | None]:
    """Diagnoses, summary parts and the first/last gradient-norm ratio at kept slot ``j`` of ``values [K, R, F]`` with flags ``bits [K, R]``.

    Every number cited is ``values[j]`` (the table at that step), except the dead-unit story, which
    cites the became-dead event's own steps. ``first_nonfinite``: (step, row) of the run's first
    NaN/Inf, to say when a later step's NaN is inherited from it.
    """
    th = thresholds or Thresholds()
    s = int(steps[j])
    x = {f: values[j, :, i] for f, i in FIELD_INDEX.items()}
    fl = [flag_names(int(b)) for b in bits[j]]
    story = {e.row: e for e in evs if e.code == "became_dead" and e.step <= s}
    diags: list[Diagnosis] = []
    parts: list[str] = []

    def rows_with(code: str) -> list[int]:
        return [i for i, f in enumerate(fl) if code in f]

    def name(i: int) -> str:
        return f"`{rows[i]}` ({types[i]})" if types[i] else f"`{rows[i]}`"

    later = ""
    if first_nonfinite is not None and first_nonfinite[0] < s:
        fs, frow = first_nonfinite
        later = f" The first non-finite value was at step {fs}" + (f" in `{frow}`" if frow else "") + ": the weights may hold NaN since."
    for i in rows_with("nan_origin_fwd"):
        diags.append(Diagnosis("nan_origin_fwd", "error", rows[i],
                               f"{name(i)} outputs NaN/Inf at step {s} while its inputs were finite.{later}", SUGGEST["nan_origin_fwd"]))
    for i in rows_with("nan_origin_bwd"):
        diags.append(Diagnosis("nan_origin_bwd", "error", rows[i],
                               f"Backward: the gradient becomes NaN/Inf at step {s} in or just after {name(i)}.{later}", SUGGEST["nan_origin_bwd"]))
    if first_nonfinite is not None and first_nonfinite[0] <= s:
        fs, frow = first_nonfinite
        parts.append(f"first non-finite value at step {fs}" + (f", in `{frow}`" if frow else ""))
        if fs < s and not any({"nan_origin_fwd", "nan_origin_bwd", "nonfinite"} & set(f) for f in fl):
            diags.append(Diagnosis("nonfinite", "error", frow or "",
                                   f"NaN/Inf first appeared at step {fs}" + (f" in `{frow}`" if frow else "")
                                   + f"; step {s} is finite again (choose step {fs} to see where it came from).",
                                   SUGGEST["nan_origin_fwd"]))
    dead, units = rows_with("dead"), [i for i in rows_with("dead_units") if "dead" not in fl[i]]
    for code, idx in (("dead", dead), ("dead_units", units)):
        for i in idx:
            now = (f"{name(i)} outputs {x['zero_frac'][i]:.1%} exact zeros at step {s}: its units are dead and pass no gradient"
                   if code == "dead" else f"{name(i)}: {_pct(float(x['dead_unit_frac'][i]))} of its units are zero for every sample at step {s}")
            e = story.get(rows[i])
            if e is not None:
                now = (f"{x['zero_frac'][i]:.1%} exact zeros at step {s}" if code == "dead"
                       else f"{_pct(float(x['dead_unit_frac'][i]))} at step {s}")
            msg = f"{e.message}; {now}." if e else now + "."
            diags.append(Diagnosis(code, "warning", rows[i], msg, e.suggestion if e else SUGGEST[code]))
    parts += dead_summary([rows[i] for i in dead], [rows[i] for i in units], story)
    for i in rows_with("saturated"):
        diags.append(Diagnosis("saturated", "warning", rows[i],
                               f"{name(i)} has {x['saturated_frac'][i]:.1%} of its outputs within 1e-3 of its bounds at step {s}: saturated, gradients vanish there.",
                               SUGGEST["saturated"]))
    if rows_with("saturated"):
        parts.append(f"{len(rows_with('saturated'))} saturated layer{'s' * (len(rows_with('saturated')) != 1)}")
    explo, vani = rows_with("exploding"), rows_with("vanishing")
    if explo:
        big = np.fmax(x["grad_norm"][explo], x["param_grad_norm"][explo])
        diags.append(Diagnosis("exploding", "error", rows[explo[0]],
                               f"gradient norm above the threshold at step {s} in {len(explo)} layer{'s' * (len(explo) != 1)} (largest {_g(float(np.nanmax(big)))}, first at `{rows[explo[0]]}`).",
                               SUGGEST["exploding"]))
        parts.append(f"exploding gradients in {len(explo)} layer{'s' * (len(explo) != 1)}")
    if vani:
        diags.append(Diagnosis("vanishing", "warning", rows[vani[0]],
                               f"gradient norm below the threshold at step {s} in {len(vani)} layer{'s' * (len(vani) != 1)} (first at `{rows[vani[0]]}`).",
                               SUGGEST["vanishing"]))
        parts.append("vanishing gradients")
    upd = rows_with("update_ratio")
    if upd:
        ur = x["update_ratio"]
        listed = ", ".join(f"`{rows[i]}` {_g(float(ur[i]))}" for i in upd[:3]) + ("…" if len(upd) > 3 else "")
        diags.append(Diagnosis("update_ratio", "warning", rows[upd[0]],
                               f"update ratio ‖Δθ‖/‖θ‖ out of the healthy range at step {s} in {len(upd)} layer{'s' * (len(upd) != 1)}: {listed}.",
                               SUGGEST["update_ratio"]))
        parts.append(f"update ratio out of range in {len(upd)} layer{'s' * (len(upd) != 1)}")
    # First/last layer output-gradient ratio; behind dead units the gradient is cut: not "vanishing".
    ratio = None
    gn = x["grad_norm"]
    act = np.flatnonzero(np.isfinite(gn))
    if len(act) >= 2 and gn[act[-1]] > 0:
        ratio = float(gn[act[0]] / gn[act[-1]])
        if any("dead" in f or "dead_units" in f for f in fl):
            pass
        elif ratio < th.ratio:
            diags.append(Diagnosis("vanishing", "warning", "", f"the gradient norm at the first layer is {ratio:.2g}× the last layer's at step {s}: gradients vanish toward the input.", SUGGEST["vanishing"]))
            if "vanishing gradients" not in parts:
                parts.append("vanishing gradients")
        elif ratio > 1 / th.ratio:
            diags.append(Diagnosis("exploding", "warning", "", f"the gradient norm at the first layer is {ratio:.2g}× the last layer's at step {s}: gradients grow toward the input.", SUGGEST["exploding"]))
    return diags, parts, ratio
