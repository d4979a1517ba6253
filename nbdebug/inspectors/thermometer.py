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

import numpy as np

from ..capture.history import FIELD_INDEX
from ..capture.result import CaptureResult
from .errors import ErrorReport, error_report, explain_error
from .events import Event, events
from .findings import findings_of, headline
from .history import Thresholds, input_graph, values_per_unit
from .report import COLUMNS, LEGEND, Diagnosis, ThermometerReport
from .steps import (
    SUGGEST,
    FirstNonfinite,
    dead_summary,
    diagnose_at,
    input_nan_message,
    input_where,
    nan_part,
    plural,
)

__all__ = ["COLUMNS", "LEGEND", "Diagnosis", "ErrorReport", "Event", "ThermometerReport", "Thresholds", "diagnose",
           "diagnose_at", "explain_error"]


def diagnose(result: CaptureResult, thresholds: Thresholds | None = None, step: int | str | None = None) -> ThermometerReport:
    """Table, flags and diagnoses of ``result``.

    With a per-step history of more than one step (or an explicit ``step``), everything is decided
    AT one kept step (default: the last; ``report.step`` says which), with ``report.events`` (rows
    that changed state over time: became dead, gradient fell, update ratio) and the flags of every
    kept step (``report.history_flags``). ``step="run"`` (or a single-step result) gives the merged
    whole-run table, decided on the merged stats. A step that was not kept raises KeyError naming
    the nearest kept steps.
    """
    th = thresholds or Thresholds()
    hist = getattr(result, "history", None)
    if step != "run" and hist is not None and len(hist) and (hist.steps > 1 or isinstance(step, (int, np.integer))):
        rep = diagnose_at(result, th, None if step is None else int(step))
        rep.error = error_report(result)
        if rep.error is not None:
            rep.diagnoses.insert(0, Diagnosis("raised", "error", "", rep.error.headline, rep.error.suggestion))
            rep.summary = f"{plural(len(rep.names), 'layer')} ran, then {rep.error.headline}"
    else:
        rep = _diagnose_run(result, th)
    rep.findings = findings_of(rep, result, th)
    quiet = f"no problems found in {plural(int(result.steps), 'step')}" if rep.step is not None else rep.summary
    rep.headline = headline(rep.findings, quiet)
    return rep


def _diagnose_run(result: CaptureResult, th: Thresholds) -> ThermometerReport:
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
    hist = getattr(result, "history", None)
    if hist is not None and len(hist):  # the update ratio of the last step (not a merged quantity)
        last = hist.values("last")[-1]
        pos = {n: i for i, n in enumerate(hist.rows)}
        table[:, COLUMNS.index("update_ratio")] = [last[pos[r.name], FIELD_INDEX["update_ratio"]] if r.name in pos else np.nan for r in rows]
    flags: list[list[str]] = [[] for _ in rows]
    diags: list[Diagnosis] = []

    # NaN/Inf: the origin, forward and backward, and everything that inherits it.
    fwd_origin = None
    many = result.steps > 1
    nan_parts: list[tuple[int, str]] = []  # (step, summary part), in step order
    bwd_first = (
        result.backward_nonfinite_step is not None
        and (result.forward_nonfinite_step is None or result.backward_nonfinite_step < result.forward_nonfinite_step)
    )
    if result.forward_nonfinite_call is not None:
        # Decided per call by the capture: the first non-finite output in execution order, in the
        # first step that had one; made there when its captured inputs were finite, else it came in
        # with an input (no layer is the origin: the row only inherits it).
        row, inputs_finite = result.forward_nonfinite_call
        name = rows[row].name
        at = _at_step(result.forward_nonfinite_step, many)
        if inputs_finite:
            fwd_origin = row
            flags[row].append("nan_origin_fwd")
            msg = f"NaN/Inf first appears{at} in the output of `{name}` ({rows[row].type}) in the forward pass; its inputs were finite."
            if bwd_first:
                msg += f" The backward of step {result.backward_nonfinite_step} had gone non-finite before (see below): an optimiser step may have written NaN into the weights."
            diags.append(Diagnosis("nan_origin_fwd", "error", name, msg, SUGGEST["nan_origin_fwd"]))
            where = "forward"
        else:
            where = input_where(rows, row)
            diags.append(Diagnosis("nonfinite", "error", name, input_nan_message(f"`{name}` ({rows[row].type})", at, where == "input"),
                                   SUGGEST["nan_input"]))
        nan_parts.append((result.forward_nonfinite_step or 0, nan_part(FirstNonfinite(result.forward_nonfinite_step or 0, name, where), many)))
    # A backward NaN in the step whose forward went non-finite is that NaN flowing back: inherited.
    bwd_inherited = result.forward_nonfinite_call is not None and result.backward_nonfinite_step == result.forward_nonfinite_step
    if result.backward_nonfinite_row is not None and not bwd_inherited:
        g_row = result.backward_nonfinite_row
        at = _at_step(result.backward_nonfinite_step, many)
        # The gradient w.r.t. g_row's output went bad in the backward of a layer that consumed it
        # (the capture found that consumer within the same step).
        if result.backward_origin_row is not None:
            bwd_origin = result.backward_origin_row
            name = rows[bwd_origin].name
            msg = f"the gradient first becomes NaN/Inf{at} in the backward of `{name}` ({rows[bwd_origin].type}): finite gradient at its output, non-finite at its input."
        else:
            bwd_origin = g_row
            name = rows[g_row].name
            msg = f"the gradient first becomes NaN/Inf{at} just after `{name}` (w.r.t. its output), in code between captured modules or in the loss."
        if fwd_origin is None or bwd_origin != fwd_origin:
            flags[bwd_origin].append("nan_origin_bwd")
            diags.append(Diagnosis("nan_origin_bwd", "error", name, "Backward: " + msg, SUGGEST["nan_origin_bwd"]))
            step = result.backward_nonfinite_step or 0
            nan_parts.append((step, nan_part(FirstNonfinite(step, name, "backward"), many)))
    for i, r in enumerate(rows):
        bad = r.stats["nan"] + r.stats["inf"] > 0 or (r.grad is not None and r.grad["nan"] + r.grad["inf"] > 0)
        if bad and "nan_origin_fwd" not in flags[i] and "nan_origin_bwd" not in flags[i]:
            flags[i].append("nonfinite")

    # Dead activations: the first in a chain (a pooling layer after a dead ReLU is not news).
    # Integer/bool outputs (masks, indices, argmax) are counts, not activations: never dead.
    for i, r in enumerate(rows):
        zf = r.stats["zero_frac"]
        if not r.is_float or not (r.stats["numel"] > 0 and zf >= th.dead):
            continue
        # Inherited zeros (pooling/flatten after a dead ReLU) are not news: flag the first only.
        if r.inputs and all(rows[j].stats["zero_frac"] >= th.dead and rows[j].is_float for j in r.inputs):
            continue
        flags[i].append("dead")
        diags.append(Diagnosis("dead", "warning", r.name,
                               f"`{r.name}` ({r.type}) outputs {zf:.1%} exact zeros: its units are dead and pass no gradient.",
                               SUGGEST["dead"]))

    # Dead units (channels/features zero for every sample), on the first row of a chain only.
    def units_dead(j: int) -> bool:
        return (rows[j].is_float and rows[j].stats.get("dead_unit_frac", math.nan) >= th.dead_units
                and not values_per_unit(rows[j].shape) < th.unit_values)

    # Over a history, rows that died during the run (and stayed dead) tell their story here too.
    evs = events(hist, th, inputs=input_graph(rows, hist.rows)) if hist is not None and hist.steps > 1 and len(hist) else []
    died = {e.row: e for e in evs if e.code == "became_dead"}
    # Below a dead layer (through the input graph) every input is constant: units that are zero for
    # every sample there are its consequence, not a finding of their own.
    below_dead = [False] * len(rows)
    for i, r in enumerate(rows):
        below_dead[i] = any(below_dead[j] or (rows[j].is_float and rows[j].stats["zero_frac"] >= th.dead)
                            for j in r.inputs if j < i)
    for i, r in enumerate(rows):
        e = died.get(r.name)
        if "dead" in flags[i] or not (e or units_dead(i)) or (not e and r.inputs and all(units_dead(j) for j in r.inputs)):
            continue
        if not e and below_dead[i]:
            continue
        flags[i].append("dead_units")
        msg = (f"{e.message}." if e else
               f"`{r.name}` ({r.type}): {r.stats['dead_unit_frac']:.0%} of its units are zero for every sample.")
        diags.append(Diagnosis("dead_units", "warning", r.name, msg, e.suggestion if e else SUGGEST["dead_units"]))
    for i, r in enumerate(rows):
        sat = r.stats.get("saturated_frac")
        if r.is_float and sat is not None and sat >= th.saturated:
            flags[i].append("saturated")
            diags.append(Diagnosis("saturated", "warning", r.name,
                                   f"`{r.name}` ({r.type}) has {sat:.1%} of its outputs within 1e-3 of its bounds: saturated, gradients vanish there.",
                                   SUGGEST["saturated"]))

    # Gradient magnitudes: a layer's parameter-gradient norm where it has one (what the optimiser
    # sees), else the norm of the gradient w.r.t. its output; exploding if either is too large.
    gn = table[:, COLUMNS.index("grad_norm")]
    pn = table[:, COLUMNS.index("param_grad_norm")]
    have = [i for i in range(n) if np.isfinite(gn[i]) or np.isfinite(pn[i])]
    any_dead = any("dead" in f or "dead_units" in f for f in flags)
    for i in have:
        size = pn[i] if np.isfinite(pn[i]) else gn[i]
        if np.nanmax([gn[i], pn[i]]) > th.exploding:
            flags[i].append("exploding")
        elif size < th.vanishing and not any("dead" in f or "dead_units" in f for f in flags[i + 1:]):
            # A gradient cut by dead units later in the model is the dead diagnosis, not a second one.
            flags[i].append("vanishing")
    explo = [rows[i].name for i in have if "exploding" in flags[i]]
    vani = [rows[i].name for i in have if "vanishing" in flags[i]]
    if explo:
        diags.append(Diagnosis("exploding", "error", explo[0],
                               f"gradient norm above {th.exploding:g} in {plural(len(explo), 'layer')} (largest {np.nanmax(np.r_[gn, pn]):.3g}, first at `{explo[0]}`).",
                               SUGGEST["exploding"]))
    if vani:
        diags.append(Diagnosis("vanishing", "warning", vani[0],
                               f"gradient norm below {th.vanishing:g} in {plural(len(vani), 'layer')} (first at `{vani[0]}`).",
                               SUGGEST["vanishing"]))
    ratio = None
    act = [i for i in range(n) if np.isfinite(gn[i])]
    if len(act) >= 2:
        first, last = gn[act[0]], gn[act[-1]]
        if last > 0 and np.isfinite(first) and np.isfinite(last) and not any_dead:
            ratio = float(first / last)
            if ratio < th.ratio:
                diags.append(Diagnosis("vanishing", "warning", "",
                                       f"the gradient norm at the first layer is {ratio:.2g}× the last layer's: gradients vanish toward the input.",
                                       SUGGEST["vanishing"]))
            elif ratio > 1 / th.ratio:
                diags.append(Diagnosis("exploding", "warning", "",
                                       f"the gradient norm at the first layer is {ratio:.2g}× the last layer's: gradients grow toward the input.",
                                       SUGGEST["exploding"]))

    error = error_report(result)
    if error is not None:
        diags.insert(0, Diagnosis("raised", "error", "", error.headline, error.suggestion))
    summary = _summary(rows, flags, diags, result, error, died, nan_parts)
    notes = list(result.notes)
    ints = [r.name for r in rows if not r.is_float]
    if ints:
        notes.append(
            f"{plural(len(ints), 'integer/bool output')} ({', '.join(f'`{n}`' for n in ints[:3])}{'…' if len(ints) > 3 else ''}): "
            "masks, indices or counts, shown with their dtype and zero/non-zero counts, never flagged dead or saturated"
        )
    if not result.backward_ran:
        notes.append("no backward ran inside the cell: gradient columns are empty (call loss.backward() in the cell to see them)")
    if result.steps > 1:
        notes.append(f"the model ran {result.steps} steps (calls of its forward): stats cover every step, histograms the first; NaN/Inf origins are decided per step")
    notes.append(
        f"histograms from a sample of up to {result.sample_size:,} values per layer (exact for smaller tensors); near-zero means |x| < {result.near_zero_eps:g}"
    )
    return ThermometerReport(
        names=[r.name for r in rows], modules=[r.module for r in rows], types=[r.type for r in rows],
        shapes=[r.shape for r in rows], dtypes=[r.dtype for r in rows], calls=[r.calls for r in rows],
        table=table, flags=flags, diagnoses=diags, summary=summary, notes=notes, grad_ratio=ratio,
        steps=result.steps, first_nonfinite_step=result.first_nonfinite_step, error=error, events=evs,
        step_index=hist.step_index if hist is not None else None,
    )


def _summary(rows: list, flags: list[list[str]], diags: list[Diagnosis], result: CaptureResult,
             error: ErrorReport | None = None, died: dict[str, Event] | None = None,
             nan_parts: list[tuple[int, str]] | None = None) -> str:
    head = f"{len(rows)} layers"
    if error is not None:
        return f"{plural(len(rows), 'layer')} ran, then {error.headline}"
    if result.raised is not None:
        return f"{plural(len(rows), 'layer')} ran; the cell raised {result.raised} outside the model's modules"
    if not rows:
        return "no layer ran inside the cell (did the cell call the model?)"
    parts: list[str] = []
    parts += dead_summary([rows[i].name for i, f in enumerate(flags) if "dead" in f],
                          [rows[i].name for i, f in enumerate(flags) if "dead_units" in f and "dead" not in f], died or {})
    parts += [p for _, p in sorted(nan_parts or [], key=lambda x: x[0])]
    sat = sum("saturated" in f for f in flags)
    if sat:
        parts.append(plural(sat, "saturated layer"))
    ex = sum("exploding" in f for f in flags)
    if ex:
        parts.append(f"exploding gradients in {plural(ex, 'layer')}")
    va = sum("vanishing" in f for f in flags)
    if va or any(d.code == "vanishing" and not d.layer for d in diags):
        parts.append("vanishing gradients")
    if not parts:
        return f"{head}: no problems found"
    return f"{head}: " + ", ".join(parts)


def _at_step(step: int | None, many: bool) -> str:
    return f" at step {step}" if many and step is not None else ""
