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

from ..capture.errors import ErrorSite, TensorInfo
from ..capture.history import FIELD_INDEX
from ..capture.result import CaptureResult
from .history import (
    FLAG_BITS,
    SUGGEST,
    Diagnosis,
    Event,
    Thresholds,
    dead_summary,
    diagnoses_at,
    events,
    flag_names,
    input_graph,
    step_flags,
    values_per_unit,
)

__all__ = ["COLUMNS", "LEGEND", "Diagnosis", "ErrorReport", "Event", "ThermometerReport", "Thresholds", "diagnose", "explain_error"]

COLUMNS = (
    "mean", "std", "min", "max", "zero_frac", "near_zero_frac", "nan", "inf", "numel",
    "grad_norm", "grad_mean", "grad_std", "grad_min", "grad_max", "grad_nan", "grad_inf",
    "param_grad_norm", "dead_unit_frac", "update_ratio",
)

LEGEND: dict[str, dict[str, str]] = {
    "raised": {"label": "raised", "color": "#7f0000", "description": "the cell raised inside the model (see the card above the table)"},
    "nan_origin_fwd": {"label": "NaN/Inf origin (forward)", "color": "#b30000", "description": "first layer whose output is non-finite while its inputs were finite"},
    "nan_origin_bwd": {"label": "NaN/Inf origin (backward)", "color": "#e6550d", "description": "the gradient first became non-finite in this layer's backward"},
    "nonfinite": {"label": "non-finite", "color": "#fc9272", "description": "output or gradient contains NaN/Inf (inherited)"},
    "dead": {"label": "dead", "color": "#756bb1", "description": "almost all outputs exactly zero"},
    "saturated": {"label": "saturated", "color": "#3182bd", "description": "bounded activation stuck at its bounds"},
    "exploding": {"label": "exploding grad", "color": "#d62728", "description": "gradient norm above the exploding threshold"},
    "vanishing": {"label": "vanishing grad", "color": "#969696", "description": "gradient norm below the vanishing threshold"},
    "dead_units": {"label": "dead units", "color": "#9e9ac8", "description": "many units (channels / features) zero for every sample of the step"},
    "update_ratio": {"label": "update ratio", "color": "#ff7f0e", "description": "update/parameter ratio ‖Δθ‖/‖θ‖ outside [1e-4, 1e-2] (healthy ~1e-3)"},
}

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
    steps: int = 1  # calls of the model's forward in the cell
    first_nonfinite_step: int | None = None  # 1-based step where the first NaN/Inf appeared
    error: ErrorReport | None = None  # the cell raised inside the model: where, and what does not fit
    step: int | None = None  # the step the table and flags are at (None: merged over the whole run)
    events: list[Event] = field(default_factory=list)  # rows that changed state over the kept steps
    step_index: np.ndarray | None = None  # int64 [K]: the kept steps (None without a history)
    history_flags: np.ndarray | None = None  # uint16 [K, rows] FLAG_BITS of every row at every kept step

    def column(self, name: str) -> np.ndarray:
        return self.table[:, COLUMNS.index(name)]

    def flagged(self, code: str) -> list[str]:
        return [n for n, f in zip(self.names, self.flags) if code in f]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


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
        rep.error = _error_report(result)
        if rep.error is not None:
            rep.diagnoses.insert(0, Diagnosis("raised", "error", "", rep.error.headline, rep.error.suggestion))
            rep.summary = f"{_plural(len(rep.names), 'layer')} ran, then {rep.error.headline}"
        return rep
    return _diagnose_run(result, th)


def diagnose_at(result: CaptureResult, th: Thresholds, step: int | None) -> ThermometerReport:
    """The report at one kept step of ``result.history`` (the last when ``step`` is None)."""
    h = result.history
    steps = h.step_index
    j = len(steps) - 1 if step is None else h.slot_of(step)
    s = int(steps[j])
    rows = result.layers
    hrows = list(h.rows)
    graph = input_graph(rows, hrows)
    info = h.row_info
    values = h.values("last")
    layer_type = {r.name: r.type for r in rows}
    types = [layer_type.get(n) or str(i.get("type", "")) for n, i in zip(hrows, info)]
    skipped = h.scalar("skipped") == 1
    bits = step_flags(values, types, th, dtypes=[str(i.get("dtype", "")) for i in info], inputs=graph, skipped=skipped,
                      shapes=[i.get("shape") for i in info])
    # At the run's first non-finite step, the capture's per-call check names the origins exactly.
    hid = {n: i for i, n in enumerate(hrows)}
    for st, row, code in ((result.forward_nonfinite_step, (result.forward_nonfinite_call or (None,))[0], "nan_origin_fwd"),
                          (result.backward_nonfinite_step,
                           result.backward_origin_row if result.backward_origin_row is not None else result.backward_nonfinite_row,
                           "nan_origin_bwd")):
        k = np.flatnonzero(steps == st) if st is not None and row is not None else []
        if len(k) and rows[row].name in hid and not (code == "nan_origin_bwd" and skipped[k[0]]):
            b = np.uint16(FLAG_BITS[code])
            bad = (bits[k[0]] & b) > 0
            bits[k[0], bad] = (bits[k[0], bad] & ~b) | np.uint16(FLAG_BITS["nonfinite"])
            bits[k[0], hid[rows[row].name]] = (bits[k[0], hid[rows[row].name]] & ~np.uint16(FLAG_BITS["nonfinite"])) | b
    evs = events(h, th, inputs=graph, flags=bits)
    first = result.first_nonfinite_step
    first_row = None
    inc = getattr(result, "incident", None)
    if inc is not None:
        first_row = inc.row
    elif first is not None and first == result.forward_nonfinite_step and result.forward_nonfinite_call is not None:
        first_row = rows[result.forward_nonfinite_call[0]].name
    diags, parts, ratio = diagnoses_at(j, values, steps, hrows, types, bits, evs, th,
                                       None if first is None else (first, first_row))
    # The table in result.layers order (the widget's row index is the layer index).
    table = np.full((len(rows), len(COLUMNS)), np.nan)
    pick = [hid.get(r.name, -1) for r in rows]
    for c, col in enumerate(COLUMNS):
        if col in FIELD_INDEX:
            table[:, c] = [values[j, i, FIELD_INDEX[col]] if i >= 0 else np.nan for i in pick]
    present = np.isfinite(table).any(axis=1)
    table[:, COLUMNS.index("numel")] = [float(np.prod(r.shape)) if p else np.nan for r, p in zip(rows, present)]
    flags = [flag_names(int(bits[j, i])) if i >= 0 else [] for i in pick]
    hflags = np.stack([bits[:, i] if i >= 0 else np.zeros(len(steps), np.uint16) for i in pick], axis=1) if rows else bits[:, :0]
    if result.raised is not None:
        parts.append(f"the cell raised {result.raised.split(':')[0]}")
    head = f"step {s}: {_plural(len(rows), 'layer')}"
    summary = f"{head}: " + ", ".join(parts) if parts else f"{head}: no problems found"
    notes = list(result.notes) + list(getattr(h, "notes", []))
    notes.append(f"table and flags at step {s} of {result.steps} ({_plural(len(steps), 'kept step')}); flags are decided "
                 "per step, events over the kept steps; numel is one call's, near-zero is only in the whole-run table")
    return ThermometerReport(
        names=[r.name for r in rows], modules=[r.module for r in rows], types=[r.type for r in rows],
        shapes=[r.shape for r in rows], dtypes=[r.dtype for r in rows], calls=[r.calls for r in rows],
        table=table, flags=flags, diagnoses=diags, summary=summary, notes=list(dict.fromkeys(notes)), grad_ratio=ratio,
        steps=result.steps, first_nonfinite_step=first, step=s, events=evs, step_index=steps, history_flags=hflags,
    )


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
    bwd_first = (
        result.backward_nonfinite_step is not None
        and (result.forward_nonfinite_step is None or result.backward_nonfinite_step < result.forward_nonfinite_step)
    )
    if result.forward_nonfinite_call is not None:
        # Decided per call by the capture: the first non-finite output in execution order, in the
        # first step that had one; its captured inputs ran before it and were finite.
        row, inputs_finite = result.forward_nonfinite_call
        fwd_origin = row
        name = rows[row].name
        at = _at_step(result.forward_nonfinite_step, many)
        flags[row].append("nan_origin_fwd")
        if inputs_finite:
            msg = f"NaN/Inf first appears{at} in the output of `{name}` ({rows[row].type}) in the forward pass; its inputs were finite."
            if bwd_first:
                msg += f" The backward of step {result.backward_nonfinite_step} had gone non-finite before (see below): an optimiser step may have written NaN into the weights."
            diags.append(Diagnosis("nan_origin_fwd", "error", name, msg, SUGGEST["nan_origin_fwd"]))
        else:
            diags.append(Diagnosis("nan_origin_fwd", "error", name,
                                   f"NaN/Inf first seen{at} at `{name}`, but its input was already non-finite: it comes from the model's input or from code between captured modules.",
                                   "Check the input batch (torch.isfinite(x).all()) and functional ops in the parent module's forward()."))
    bwd_origin = None
    if result.backward_nonfinite_row is not None:
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
    for i, r in enumerate(rows):
        e = died.get(r.name)
        if "dead" in flags[i] or not (e or units_dead(i)) or (not e and r.inputs and all(units_dead(j) for j in r.inputs)):
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

    error = _error_report(result)
    if error is not None:
        diags.insert(0, Diagnosis("raised", "error", "", error.headline, error.suggestion))
    summary = _summary(rows, flags, diags, result, error, died)
    notes = list(result.notes)
    ints = [r.name for r in rows if not r.is_float]
    if ints:
        notes.append(
            f"{_plural(len(ints), 'integer/bool output')} ({', '.join(f'`{n}`' for n in ints[:3])}{'…' if len(ints) > 3 else ''}): "
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
             error: ErrorReport | None = None, died: dict[str, Event] | None = None) -> str:
    head = f"{len(rows)} layers"
    if error is not None:
        return f"{_plural(len(rows), 'layer')} ran, then {error.headline}"
    if result.raised is not None:
        return f"{_plural(len(rows), 'layer')} ran; the cell raised {result.raised} outside the model's modules"
    if not rows:
        return "no layer ran inside the cell (did the cell call the model?)"
    parts: list[str] = []
    parts += dead_summary([rows[i].name for i, f in enumerate(flags) if "dead" in f],
                          [rows[i].name for i, f in enumerate(flags) if "dead_units" in f and "dead" not in f], died or {})
    nan_parts = []
    for d in diags:
        if d.code in ("nan_origin_fwd", "nan_origin_bwd"):
            fwd = d.code == "nan_origin_fwd"
            step = result.forward_nonfinite_step if fwd else result.backward_nonfinite_step
            where = "forward" if fwd else "backward"
            if result.steps > 1:
                nan_parts.append((step or 0, f"first non-finite value at step {step}, in `{d.layer}` ({where})"))
            else:
                nan_parts.append((0, f"NaN first appears in `{d.layer}` ({where})"))
    parts += [p for _, p in sorted(nan_parts, key=lambda x: x[0])]
    sat = sum("saturated" in f for f in flags)
    if sat:
        parts.append(_plural(sat, "saturated layer"))
    ex = sum("exploding" in f for f in flags)
    if ex:
        parts.append(f"exploding gradients in {_plural(ex, 'layer')}")
    va = sum("vanishing" in f for f in flags)
    if va or any(d.code == "vanishing" and not d.layer for d in diags):
        parts.append("vanishing gradients")
    if not parts:
        return f"{head}: no problems found"
    return f"{head}: " + ", ".join(parts)


def _at_step(step: int | None, many: bool) -> str:
    return f" at step {step}" if many and step is not None else ""


# -- a cell that raised inside the model --------------------------------------------------------
@dataclass(frozen=True)
class ErrorReport:
    """The module that raised, what it was given and what it holds, and what does not fit."""

    module: str
    type: str
    error: str  # the exception's type and first line
    problems: list[str]  # "`head` expects 512 input features, got 800 from `flat` (8×10×10)"
    inputs: list[str]  # "4×800 float32 cpu, from `flat`"
    params: list[str]  # "weight 10×512 float32 cpu"
    headline: str
    suggestion: str


def _dims(shape: tuple[int, ...] | list[int]) -> str:
    return "×".join(map(str, shape)) if len(shape) else "scalar"


def _source(x: TensorInfo, per_sample: int | None = None) -> str:
    """`` from `flat` (8×10×10)``: the producing row, and its input's per-sample shape when that
    is where ``per_sample`` values came from (a Flatten or a view)."""
    if x.producer is None:
        return ""
    out = f" from `{x.producer}`"
    src = x.producer_input
    if per_sample is not None and src is not None and len(src) > 2 and int(np.prod(src[1:])) == per_sample:
        out += f" ({_dims(src[1:])})"
    return out


def explain_error(site: ErrorSite) -> list[str]:
    """What does not fit between the module that raised and its inputs (pure: metadata only)."""
    out: list[str] = []
    name = f"`{site.module or site.type}`"
    cfg = site.config
    x = site.inputs[0] if site.inputs else None
    weights = [p for p in site.params if p.name == "weight"] or list(site.params)
    if x is not None:
        nd = len(x.shape)
        if "in_features" in cfg and nd and x.shape[-1] != cfg["in_features"]:
            out.append(f"{name} expects {cfg['in_features']} input features, got {x.shape[-1]}{_source(x, x.shape[-1])}")
        if "in_channels" in cfg and weights:
            d = len(weights[0].shape) - 2  # spatial dims of the kernel
            if nd not in (d + 1, d + 2):
                out.append(f"{name} expects a {d + 1}D or {d + 2}D input (channels{', batch' if d else ''} first), got {nd}D {_dims(x.shape)}{_source(x)}")
            else:
                ch = x.shape[1] if nd == d + 2 else x.shape[0]
                if ch != cfg["in_channels"]:
                    out.append(f"{name} expects {cfg['in_channels']} input channels, got {ch}{_source(x)} ({_dims(x.shape)})")
        if "num_features" in cfg and nd >= 2 and x.shape[1] != cfg["num_features"]:
            out.append(f"{name} expects {cfg['num_features']} channels/features (dim 1), got {x.shape[1]}{_source(x)}")
        ns = cfg.get("normalized_shape")
        if isinstance(ns, tuple) and tuple(x.shape[-len(ns):]) != ns:
            out.append(f"{name} normalises over the last dims {_dims(ns)}, got an input ending in {_dims(x.shape[-len(ns):])}{_source(x)}")
        if "num_embeddings" in cfg and not x.dtype.startswith(("int", "uint")):
            out.append(f"{name} expects integer token ids, got {x.dtype}{_source(x)}")
    pdtypes = {p.dtype for p in site.params if p.dtype.startswith(("float", "bfloat"))}
    pdevices = {p.device for p in site.params}
    for t in site.inputs:
        if pdtypes and t.dtype.startswith(("float", "bfloat")) and t.dtype not in pdtypes:
            want = "/".join(sorted(pdtypes))
            out.append(f"{name} has {want} parameters, got a {t.dtype} input{_source(t)}: convert it with .to(torch.{next(iter(sorted(pdtypes)))})")
        if "meta" in pdevices and t.device != "meta":
            out.append(f"{name}'s parameters are on the meta device (never loaded): materialise them (.to_empty(device=...) and load the weights)")
        elif pdevices and t.device not in pdevices:
            out.append(f"{name}'s parameters are on {'/'.join(sorted(pdevices))}, got an input on {t.device}{_source(t)}: move it with .to('{next(iter(sorted(pdevices)))}')")
    return list(dict.fromkeys(out))


def _error_report(result: CaptureResult) -> ErrorReport | None:
    site = result.error
    if site is None:
        return None
    problems = explain_error(site)
    what = problems[0] if problems else site.error
    headline = f"`{site.module}` ({site.type}) raised {site.error.split(':')[0]}: {what}"
    suggestion = (
        "Fix the mismatch above (layer sizes, .to(dtype)/.to(device)); the rows show what ran before the error."
        if problems else "The rows show what ran before the error; compare the input shapes with the module's parameters."
    )
    return ErrorReport(
        module=site.module, type=site.type, error=site.error, problems=problems,
        inputs=[f"{_dims(t.shape)} {t.dtype} {t.device}" + (f", from `{t.producer}`" if t.producer else "") for t in site.inputs],
        params=[f"{p.name} {_dims(p.shape)} {p.dtype} {p.device}" for p in site.params],
        headline=headline, suggestion=suggestion,
    )
