"""The result of a :class:`~nbdebug.capture.session.Capture` at exit: whole-run rows (merged over
every step, see :mod:`.steps`) → a :class:`CaptureResult` of plain numpy and floats.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from .budget import format_bytes
from .fold import _ensure_run, _Fetch, _merge2
from .leaves import local
from .result import CaptureResult, LayerRecord
from .stats import IDX, N_FIELDS, summarize

if TYPE_CHECKING:
    from .session import Capture

__all__ = ["assemble"]


def _param_grad_norms(cap: Capture) -> dict[str, torch.Tensor]:
    """L2 norm of each selected module's own fresh parameter gradients at exit, still on the device."""
    out: dict[str, torch.Tensor] = {}
    for name, module in cap.modules:
        grads = []
        for p in module.parameters(recurse=False):
            g = p.grad
            if g is None:
                continue
            before = cap._grad_snapshot.get(id(p))
            if before is not None and before == (id(g), None if g.is_inference() else g._version):
                continue  # stale: the cell did not touch it
            half = g.dtype in (torch.float16, torch.bfloat16)
            norm = torch.linalg.vector_norm(local(g).detach(), dtype=torch.float32 if half else None)
            grads.append(norm.to(torch.float32))
        if grads:
            out[name] = torch.linalg.vector_norm(torch.stack(grads)).reshape(1)
    return out


def assemble(cap: Capture) -> CaptureResult:
    """Turn a finished capture into a :class:`CaptureResult` (plain numpy and floats)."""
    _ensure_run(cap)
    rows = [r for r in cap._rows if cap.run_calls[r.id] > 0]
    for r in rows:
        r.calls, r.raw = int(cap.run_calls[r.id]), cap.run_raw[r.id].copy()
        g = cap.run_grad[r.id]
        r.grad = None if np.isnan(g[0]) else g.copy()
    norms = _param_grad_norms(cap) if cap.modules else {}
    fetch = _Fetch(cap.device_path)
    s_sample = [fetch.add(r.sample) for r in rows]
    s_hist = [fetch.add(r.hist) for r in rows]
    s_norm = {name: fetch.add(v) for name, v in norms.items()}
    host = fetch.run()
    param_norms = {name: float(np.asarray(host[i]).reshape(-1)[0]) for name, i in s_norm.items()}
    pos = {r.id: i for i, r in enumerate(rows)}
    prev = _resumed_rows(cap)
    merged = []
    for row in rows:
        old = prev.get(row.key)
        merged.append((row.raw, row.calls, row.first_step) if old is None else
                      (_merge2(old[0], row.raw), row.calls + old[1], old[2]))
    # every row's stats in one summarize (element-wise: the same numbers as one row at a time)
    s_all = {k: v.tolist() for k, v in summarize(np.array([m[0] for m in merged]).reshape(-1, N_FIELDS)).items()}
    with_grad = [i for i, row in enumerate(rows) if row.grad is not None]
    g_pos = {i: j for j, i in enumerate(with_grad)}
    g_all = {k: v.tolist() for k, v in summarize(np.array([rows[i].grad for i in with_grad]).reshape(-1, N_FIELDS)).items()}
    layers = []
    for r, row in zip(range(len(rows)), rows):
        _, calls, first_step = merged[r]
        s = {k: v[r] for k, v in s_all.items()}
        j = g_pos.get(r)
        g = {k: v[j] for k, v in g_all.items()} if j is not None else None
        sample = host[s_sample[r]]
        if sample is not None and sample.size:
            s["near_zero_frac"] = float(np.mean(np.abs(sample) < cap.near_zero_eps))
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
            edges = np.linspace(lo, hi if hi > lo else lo + 1.0, cap.bins + 1)
            hist = (np.asarray(h[:-2], dtype=np.float64), edges)
        first = cap.first_row.get(row.module)
        layers.append(LayerRecord(
            name=row.key, module=row.module, type=row.type, shape=row.shape, dtype=row.dtype, calls=calls,
            stats=s, grad=g,
            param_grad_norm=param_norms.get(row.module) if first is row else None,  # on the module's first row
            sample=None if sample is None else np.array(sample, dtype=np.float32),
            histogram=hist,
            inputs=tuple(sorted(pos[i] for i in (row.inputs or ()) if i in pos)),
            external_input_nonfinite=row.ext_nonfinite,
            first_step=max(first_step, 1),
        ))
    notes = list(cap.notes)
    if cap._budget_exceeded:
        notes.append(
            f"byte budget of {format_bytes(cap.max_bytes)} reached: kept {format_bytes(cap._bytes)} of samples/histograms, "
            f"dropped {format_bytes(cap._dropped_bytes)} for later layers (stats are kept for every layer; raise max_bytes to keep them)")
    if cap._truncated:
        from .session import MAX_CALLS

        notes.append(f"more than {MAX_CALLS:,} layer calls in one step: later calls were not recorded")
    if cap.eval_steps:
        notes.append(f"{cap.eval_steps} evaluation forward(s) under no_grad/inference_mode were not steps "
                     "(kept out of the rows and the history)")
    if cap.watch is not None:
        notes += [n for n in getattr(cap.watch, "notes", []) if n not in notes]
        if cap.step > 1 and cap.watch.optimizer_steps == 0 and (cap.pg_seen or any(r.grad is not None for r in rows)):
            from .optim import NO_OPTIMIZER_NOTE

            notes.append(NO_OPTIMIZER_NOTE)
    notes += [n for n in cap.history.notes if n not in notes]
    res0 = cap.resume
    steps = cap.step
    fwd = (pos[cap.fwd_origin[0]], cap.fwd_origin[1]) if cap.fwd_origin is not None and cap.fwd_origin[0] in pos else None
    res = CaptureResult(
        layers=layers,
        forward_passes=cap._passes + (res0.forward_passes if res0 is not None else 0),
        backward_ran=any(r.grad is not None for r in rows) or (res0 is not None and res0.backward_ran),
        calls_recorded=sum(r.calls for r in rows),
        truncated=cap._truncated,
        sample_size=cap.sample_size,
        near_zero_eps=cap.near_zero_eps,
        bytes_kept=cap._bytes,
        budget_exceeded=cap._budget_exceeded,
        forward_nonfinite_call=fwd,
        backward_nonfinite_row=pos.get(cap.bwd_row) if cap.bwd_row is not None else None,
        elapsed_s=time.perf_counter() - cap._t0,
        notes=notes,
        steps=steps,
        forward_nonfinite_step=cap.fwd_step,
        backward_nonfinite_step=cap.bwd_step,
        backward_origin_row=pos.get(cap.bwd_origin) if cap.bwd_origin is not None else None,
        error=cap._error,
        raised=cap._raised,
        history=cap.history,
        param_grad_nonfinite_step=cap.pg_step,
        incidents=list(cap.incidents),
        skipped=list(cap.skipped),
        eval_steps=cap.eval_steps,
        every=cap.every,
        lrs=dict(cap.lrs),
    )
    if res0 is not None:
        _continue(res, res0)
    return res


def _resumed_rows(cap: Capture) -> dict[str, tuple[np.ndarray, int, int]]:
    """``resume``: each earlier row as a raw row rebuilt from its merged stats, its calls, first step."""
    res0 = cap.resume
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
