"""The result of a :class:`~nbdebug.capture.session.Capture` at exit: whole-run rows (merged over
every step, see :mod:`.steps`) → a :class:`CaptureResult` of plain numpy and floats.

:func:`assemble` reads only what it is given: the row table, the run's steps (history, accumulators,
skipped steps, learning rates), the incident log, the memory budget, and the run's counts and notes.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from .budget import Budget
from .errors import ErrorSite
from .fold import Fetch, merge2
from .forward import MAX_CALLS
from .incidents import IncidentLog
from .leaves import local
from .optim import NO_OPTIMIZER_NOTE
from .result import CaptureResult, LayerRecord
from .rows import RowTable
from .stats import IDX, N_FIELDS, summarize
from .steps import Steps

__all__ = ["assemble", "grad_snapshot", "param_grad_norms"]


def grad_snapshot(model: nn.Module) -> dict[int, tuple[int, int | None]]:
    """Each parameter's gradient as the capture found it (its identity and version), to tell at exit
    which gradients the cell wrote."""
    return {id(p): (id(p.grad), None if p.grad.is_inference() else p.grad._version)
            for p in model.parameters() if p.grad is not None}


def param_grad_norms(modules: list[tuple[str, nn.Module]], snapshot: dict[int, tuple[int, int | None]]) -> dict[str, torch.Tensor]:
    """L2 norm of each selected module's own fresh parameter gradients at exit (fresh: not as in
    ``snapshot``, see :func:`grad_snapshot`), still on the device."""
    out: dict[str, torch.Tensor] = {}
    for name, module in modules:
        grads = []
        for p in module.parameters(recurse=False):
            g = p.grad
            if g is None:
                continue
            before = snapshot.get(id(p))
            if before is not None and before == (id(g), None if g.is_inference() else g._version):
                continue  # stale: the cell did not touch it
            half = g.dtype in (torch.float16, torch.bfloat16)
            norm = torch.linalg.vector_norm(local(g).detach(), dtype=torch.float32 if half else None)
            grads.append(norm.to(torch.float32))
        if grads:
            out[name] = torch.linalg.vector_norm(torch.stack(grads)).reshape(1)
    return out


def assemble(rows: RowTable, steps: Steps, log: IncidentLog, budget: Budget, *, param_norms: dict[str, torch.Tensor],
             device_path: bool, bins: int, near_zero_eps: float, sample_size: int, passes: int, eval_steps: int,
             truncated: bool, notes: list[str], watch: Any, params_seen: bool, error: ErrorSite | None, raised: str | None,
             elapsed: float, every: int, resume: CaptureResult | None) -> CaptureResult:
    """Turn a finished capture into a :class:`CaptureResult` (plain numpy and floats).

    ``param_norms``: :func:`param_grad_norms` at exit; ``passes``/``eval_steps``: counted by the pass
    rules; ``truncated``: a step had more calls than were recorded; ``notes``: the capture's own;
    ``watch``: the optimizer watch (its notes and step count) or None; ``params_seen``: some step had
    fresh parameter gradients; ``error``/``raised``: where and what the cell raised."""
    totals = steps.totals
    totals.ensure(rows.rows)
    kept = [r for r in rows.rows if totals.calls[r.id] > 0]
    for r in kept:
        r.calls, r.raw = int(totals.calls[r.id]), totals.raw[r.id].copy()
        g = totals.grad[r.id]
        r.grad = None if np.isnan(g[0]) else g.copy()
    fetch = Fetch(device_path)
    s_sample = [fetch.add(r.sample) for r in kept]
    s_hist = [fetch.add(r.hist) for r in kept]
    s_norm = {name: fetch.add(v) for name, v in param_norms.items()}
    host = fetch.run()
    norms = {name: float(np.asarray(host[i]).reshape(-1)[0]) for name, i in s_norm.items()}
    pos = {r.id: i for i, r in enumerate(kept)}
    prev = _resumed_rows(resume)
    merged = []
    for row in kept:
        old = prev.get(row.key)
        merged.append((row.raw, row.calls, row.first_step) if old is None else
                      (merge2(old[0], row.raw), row.calls + old[1], old[2]))
    # every row's stats in one summarize (element-wise: the same numbers as one row at a time)
    s_all = {k: v.tolist() for k, v in summarize(np.array([m[0] for m in merged]).reshape(-1, N_FIELDS)).items()}
    with_grad = [i for i, row in enumerate(kept) if row.grad is not None]
    g_pos = {i: j for j, i in enumerate(with_grad)}
    g_all = {k: v.tolist() for k, v in summarize(np.array([kept[i].grad for i in with_grad]).reshape(-1, N_FIELDS)).items()}
    layers = []
    for r, row in enumerate(kept):
        _, calls, first_step = merged[r]
        s = {k: v[r] for k, v in s_all.items()}
        j = g_pos.get(r)
        g = {k: v[j] for k, v in g_all.items()} if j is not None else None
        sample = host[s_sample[r]]
        if sample is not None and sample.size:
            s["near_zero_frac"] = float(np.mean(np.abs(sample) < near_zero_eps))
            s["near_zero_exact"] = float(sample.size >= s["numel"])
        else:
            s["near_zero_frac"] = math.nan
            s["near_zero_exact"] = 0.0
        if row.sat:
            s["saturated_frac"] = s["extra_frac"]
        s.pop("extra_frac", None)
        if row.units:
            a = row.alive
            s["dead_unit_frac"] = 0.0 if a is None else (float(np.count_nonzero(~a)) / a.size)
        hist = None
        h = host[s_hist[r]]
        if h is not None:
            lo, hi = float(h[-2]), float(h[-1])
            if not (math.isfinite(lo) and math.isfinite(hi)):
                lo, hi = 0.0, 0.0
            edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
            hist = (np.asarray(h[:-2], dtype=np.float64), edges)
        first = rows.first_of.get(row.module)
        layers.append(LayerRecord(
            name=row.key, module=row.module, type=row.type, shape=row.shape, dtype=row.dtype, calls=calls,
            stats=s, grad=g,
            param_grad_norm=norms.get(row.module) if first is row else None,  # on the module's first row
            sample=None if sample is None else np.array(sample, dtype=np.float32),
            histogram=hist,
            inputs=tuple(sorted(pos[i] for i in (row.inputs or ()) if i in pos)),
            external_input_nonfinite=row.ext_nonfinite,
            first_step=max(first_step, 1),
        ))
    notes = list(notes)
    budget_note = budget.note()
    if budget_note is not None:
        notes.append(budget_note)
    if truncated:
        notes.append(f"more than {MAX_CALLS:,} layer calls in one step: later calls were not recorded")
    if eval_steps:
        notes.append(f"{eval_steps} evaluation forward(s) under no_grad/inference_mode were not steps "
                     "(kept out of the rows and the history)")
    if watch is not None:
        notes += [n for n in getattr(watch, "notes", []) if n not in notes]
        if steps.count > 1 and watch.optimizer_steps == 0 and (params_seen or any(r.grad is not None for r in kept)):
            notes.append(NO_OPTIMIZER_NOTE)
    notes += [n for n in steps.history.notes if n not in notes]
    fwd = (pos[log.fwd_origin[0]], log.fwd_origin[1]) if log.fwd_origin is not None and log.fwd_origin[0] in pos else None
    res = CaptureResult(
        layers=layers,
        forward_passes=passes + (resume.forward_passes if resume is not None else 0),
        backward_ran=any(r.grad is not None for r in kept) or (resume is not None and resume.backward_ran),
        calls_recorded=sum(r.calls for r in kept),
        truncated=truncated,
        sample_size=sample_size,
        near_zero_eps=near_zero_eps,
        bytes_kept=budget.kept,
        budget_exceeded=budget.exceeded,
        forward_nonfinite_call=fwd,
        backward_nonfinite_row=pos.get(log.bwd_row) if log.bwd_row is not None else None,
        elapsed_s=elapsed,
        notes=notes,
        steps=steps.count,
        forward_nonfinite_step=log.fwd_step,
        backward_nonfinite_step=log.bwd_step,
        backward_origin_row=pos.get(log.bwd_origin) if log.bwd_origin is not None else None,
        error=error,
        raised=raised,
        history=steps.history,
        param_grad_nonfinite_step=log.pg_step,
        incidents=list(log.incidents),
        skipped=list(steps.skipped),
        eval_steps=eval_steps,
        every=every,
        lrs=dict(steps.lrs),
    )
    if resume is not None:
        _continue(res, resume)
    return res


def _resumed_rows(res0: CaptureResult | None) -> dict[str, tuple[np.ndarray, int, int]]:
    """``resume``: each earlier row as a raw row rebuilt from its merged stats, its calls, first step."""
    out: dict[str, tuple[np.ndarray, int, int]] = {}
    if res0 is None:
        return out
    for rec in res0.layers:
        s = rec.stats
        n = s.get("numel", math.nan)
        raw = np.zeros(N_FIELDS)
        raw[IDX["numel"]] = n
        raw[IDX["sum"]] = s.get("mean", math.nan) * n
        raw[IDX["sumsq"]] = s.get("norm", math.nan) ** 2
        raw[IDX["min"]], raw[IDX["max"]] = s.get("min", math.nan), s.get("max", math.nan)
        raw[IDX["nonzero"]] = (1.0 - s.get("zero_frac", math.nan)) * n
        raw[IDX["nan"]], raw[IDX["inf"]] = s.get("nan", 0.0), s.get("inf", 0.0)
        raw[IDX["extra"]] = s.get("saturated_frac", 0.0) * n
        out[rec.name] = (raw, rec.calls, rec.first_step)
    return out


def _continue(res: CaptureResult, res0: CaptureResult) -> None:
    """``resume``: first non-finite steps, incidents, skipped steps and counts carry over."""
    for attr in ("forward_nonfinite_step", "backward_nonfinite_step", "param_grad_nonfinite_step"):
        old = getattr(res0, attr)
        if old is not None:
            setattr(res, attr, old)
    if res0.forward_nonfinite_call is not None and res0.forward_nonfinite_step is not None:
        name = res0.layers[res0.forward_nonfinite_call[0]].name
        idx = next((i for i, r in enumerate(res.layers) if r.name == name), None)
        res.forward_nonfinite_call = None if idx is None else (idx, res0.forward_nonfinite_call[1])
    res.skipped = list(res0.skipped) + res.skipped
    res.eval_steps += res0.eval_steps
    res.calls_recorded += res0.calls_recorded
    names = {r.name for r in res.layers}
    res.layers += [replace(r, inputs=()) for r in res0.layers if r.name not in names]
    res.lrs = {**res0.lrs, **res.lrs}
