"""The host side of a :class:`~nbdebug.capture.session.Capture`: device stats → rows, in one sync.

Every device tensor a capture kept (stat vectors, gradient stats, samples, histograms, input
checks, parameter-gradient norms) crosses to the host in :func:`assemble` through
:func:`~nbdebug.capture.stats.to_host_rows` and :func:`~nbdebug.capture.transfer.to_host`: a
fixed number of transfers per device, however many layers and steps there were.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from .budget import format_bytes
from .result import CaptureResult, LayerRecord
from .stats import SATURATING, merge, nonfinite, summarize, to_host_rows
from .transfer import to_host

if TYPE_CHECKING:
    from .session import Capture, _Call

__all__ = ["assemble"]


def _param_grad_norms(cap: Capture) -> dict[str, torch.Tensor]:
    """L2 norm of each selected module's own fresh parameter gradients, still on the device."""
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
            norm = torch.linalg.vector_norm(g.detach(), dtype=torch.float32 if half else None)
            grads.append(norm.to(torch.float32))
        if grads:
            out[name] = torch.linalg.vector_norm(torch.stack(grads)).reshape(1)
    return out


def _rows_of(calls: list[_Call]) -> tuple[list[list[int]], dict[int, int]]:
    """Calls grouped by row name in order of first appearance, and each call's row."""
    row_of: dict[str, int] = {}
    members: list[list[int]] = []
    for i, c in enumerate(calls):
        r = row_of.setdefault(c.key, len(members))
        if r == len(members):
            members.append([])
        members[r].append(i)
    return members, {i: row_of[c.key] for i, c in enumerate(calls)}


def assemble(cap: Capture) -> CaptureResult:
    """Turn a finished capture's records into a :class:`CaptureResult` (plain numpy and floats)."""
    from .session import MAX_CALLS

    calls = cap._calls
    g_idx = [i for i, c in enumerate(calls) if c.grad_stats is not None]
    both = to_host_rows([c.raw for c in calls] + [calls[i].grad_stats for i in g_idx])  # type: ignore[misc]
    raws = both[: len(calls)]
    grads = dict(zip(g_idx, both[len(calls) :]))
    norms = _param_grad_norms(cap)
    # Everything else in one batched transfer: samples, histograms, input checks, norms.
    tensors: list[torch.Tensor | None] = []
    for c in calls:
        tensors += [c.sample, c.hist, *c.input_checks]
    tensors += list(norms.values())
    host = iter(to_host(tensors, batch_cpu=cap.device_path))
    samples, hists, checks = [], [], []
    for c in calls:
        samples.append(next(host))
        hists.append(next(host))
        checks.append([next(host) for _ in c.input_checks])
    param_norms = {name: float(v[0]) for name, v in zip(norms, host)}  # type: ignore[index]

    members, call_row = _rows_of(calls)
    layers = []
    for idxs in members:
        i0 = idxs[0]
        c0 = calls[i0]
        s = {k: float(v[0]) for k, v in summarize(merge(raws[idxs])[None]).items()}
        g_rows = [grads[i] for i in idxs if i in grads]
        g = {k: float(v[0]) for k, v in summarize(merge(np.stack(g_rows))[None]).items()} if g_rows else None
        sample = samples[i0]
        if sample is not None and sample.size:
            s["near_zero_frac"] = float(np.mean(np.abs(sample) < cap.near_zero_eps))
            s["near_zero_exact"] = float(sample.size >= s["numel"])
        else:
            s["near_zero_frac"] = math.nan
            s["near_zero_exact"] = 0.0
        if c0.type in SATURATING:
            s["saturated_frac"] = s["extra_frac"]
        s.pop("extra_frac", None)
        hist = None
        h = hists[i0]
        if h is not None:
            lo, hi = float(h[-2]), float(h[-1])
            if not (math.isfinite(lo) and math.isfinite(hi)):
                lo, hi = 0.0, 0.0
            edges = np.linspace(lo, hi if hi > lo else lo + 1.0, cap.bins + 1)
            hist = (h[:-2].astype(np.float64), edges)
        layers.append(
            LayerRecord(
                name=c0.key, module=c0.module, type=c0.type, shape=c0.shape, dtype=c0.dtype, calls=len(idxs),
                stats=s, grad=g,
                param_grad_norm=param_norms.pop(c0.module, None),  # on the module's first row
                sample=None if sample is None else np.array(sample, dtype=np.float32),
                histogram=hist,
                inputs=tuple(sorted({call_row[j] for j in c0.input_calls})),
                external_input_nonfinite=any(not np.all(np.isfinite(x)) for x in checks[i0]),
                first_step=max(c0.step, 1),
            )
        )

    # First non-finite forward output in execution order: its step is the first step with one.
    fwd = fwd_step = None
    for i, c in enumerate(calls):
        if nonfinite(raws[i]):
            fwd = (call_row[i], not any(not np.all(np.isfinite(x)) for x in checks[i]))
            fwd_step = max(c.step, 1)
            break
    # First non-finite output gradient in backward order, and the consumer (same step) whose
    # output gradient was still finite: the backward of that consumer made it.
    bwd = bwd_step = bwd_origin = None
    for _, i in sorted((c.grad_order, i) for i, c in enumerate(calls) if c.grad_order >= 0):
        if nonfinite(grads[i]):
            bwd, bwd_step = call_row[i], max(calls[i].step, 1)
            for j, c in enumerate(calls):
                if i in c.input_calls and j != i and c.step == calls[i].step and j in grads and not nonfinite(grads[j]):
                    bwd_origin = call_row[j]
                    break
            break

    notes: list[str] = []
    if cap._budget_exceeded:
        notes.append(
            f"byte budget of {format_bytes(cap.max_bytes)} reached: kept {format_bytes(cap._bytes)} of samples/histograms, "
            f"dropped {format_bytes(cap._dropped_bytes)} for later layers (stats are kept for every layer; raise max_bytes to keep them)"
        )
    if cap._truncated:
        notes.append(f"more than {MAX_CALLS:,} layer calls: later calls were not recorded")
    steps = cap._passes if cap._passes else (1 if calls else 0)
    return CaptureResult(
        layers=layers,
        forward_passes=steps,
        backward_ran=bool(grads),
        calls_recorded=len(calls),
        truncated=cap._truncated,
        sample_size=cap.sample_size,
        near_zero_eps=cap.near_zero_eps,
        bytes_kept=cap._bytes,
        budget_exceeded=cap._budget_exceeded,
        forward_nonfinite_call=fwd,
        backward_nonfinite_row=bwd,
        elapsed_s=time.perf_counter() - cap._t0,
        notes=notes,
        steps=steps,
        forward_nonfinite_step=fwd_step,
        backward_nonfinite_step=bwd_step,
        backward_origin_row=bwd_origin,
        error=cap._error,
        raised=cap._raised,
    )
