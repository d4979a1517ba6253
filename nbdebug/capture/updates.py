"""The numbers of an optimizer step (for :class:`~nbdebug.capture.optim.OptimizerWatch`): ‖θ_before‖ and
‖Δθ‖ per parameter (from a :class:`~nbdebug.capture.plans.ParamGroup`'s snapshot) summed per module
(:func:`aggregate`: the host path, one ``bincount`` per sum, in the same order as a loop;
:func:`aggregate_on_device`: tensors only, no host sync). The usual CPU step (one flat group, every
stepped parameter with its gradient) takes :func:`flat_update`: one native call and two ``bincount``s.
Also :func:`as_number` (a learning rate, without a sync on the device path) and :func:`optimizer_state`
(the flight recorder's look at an optimizer's state).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import torch

from .leaves import local
from .plans import ParamGroup, Plan

__all__ = ["aggregate", "aggregate_on_device", "as_number", "flat_update", "optimizer_state"]

_div, _sqrt = operator.truediv, math.sqrt


def flat_update(g: ParamGroup, before_flat: np.ndarray, m: int, skipped: bool) -> tuple[list[float], list[float]]:
    """The usual CPU step of a flat group (every stepped parameter had its gradient before the step):
    (ratios, parameter norms) of its ``m`` modules, exactly as :func:`aggregate` gives them."""
    before, diff = g.flat_norms(before_flat)
    pos, e = g.positions_a, g.entries_a
    if pos is not None:
        before, diff = before[pos], diff[pos]
    pnorms = list(map(_sqrt, np.bincount(e, weights=before, minlength=m).tolist()))
    if skipped:
        return [math.nan] * m, pnorms
    return _ratios(np.bincount(e, weights=diff, minlength=m).tolist(), pnorms), pnorms


def _ratios(d2: list[float], pnorms: list[float]) -> list[float]:
    """‖Δθ‖/‖θ‖ per module from ‖Δθ‖² and ‖θ‖ (‖θ‖ = 0: inf, or NaN when Δθ = 0 too)."""
    if 0.0 in pnorms:
        nan, inf = math.nan, math.inf
        return [_sqrt(d) / b if b else (nan if d == 0 else inf) for d, b in zip(d2, pnorms)]
    return list(map(_div, map(_sqrt, d2), pnorms))


def aggregate(plan: Plan, norms: list[tuple[Any, Any, bool]], found_inf: torch.Tensor | None,
              missing: list[list[bool]] | None = None) -> tuple[list[float], list[float], bool]:
    """CPU: per-parameter numbers summed per module; (ratios, parameter norms, skipped). ``norms`` per
    group: (before, diff or None, squared). ``missing`` (per group, per parameter): not stepped, left
    out of its module's numbers (a module with none stepped: its norm over all of them, ratio NaN)."""
    m = len(plan.names)
    if missing is None and all(sq and isinstance(b, np.ndarray) for b, _, sq in norms):
        bw, dw, ent = [], [], []
        for g, (before, diff, _) in zip(plan.groups, norms):
            pos = g.positions_a
            bw.append(before if pos is None else before[pos])
            if diff is not None:
                dw.append(diff if pos is None else diff[pos])
            ent.append(g.entries_a)
        one = len(ent) == 1
        e = ent[0] if one else np.concatenate(ent)
        b2 = np.bincount(e, weights=bw[0] if one else np.concatenate(bw), minlength=m).tolist()
        have_diff = len(dw) == len(bw)
        d2 = np.bincount(e, weights=dw[0] if one else np.concatenate(dw), minlength=m).tolist() if have_diff else [0.0] * m
        unstepped = [False] * m
        pnorms = [math.sqrt(b) for b in b2]
    else:
        d2, b2 = [0.0] * m, [0.0] * m
        all2, unstepped = [0.0] * m, [missing is not None] * m  # ‖θ‖² over every parameter; no parameter stepped
        for gi, (g, (before, diff, sq)) in enumerate(zip(plan.groups, norms)):
            n = len(g.params)
            if isinstance(before, np.ndarray):
                values = (before if diff is None else np.concatenate([before, diff]))
                values = (np.sqrt(values) if sq else values).tolist()
            else:
                values = (before if diff is None else torch.cat([before, diff])).tolist()
            miss = missing[gi] if missing is not None else None
            for pos, mi in zip(g.positions, g.entries):
                if miss is not None:
                    all2[mi] += values[pos] ** 2
                    if miss[pos]:
                        continue
                    unstepped[mi] = False
                b2[mi] += values[pos] ** 2
                if diff is not None:
                    d2[mi] += values[n + pos] ** 2
        # a module none of whose parameters the step touched: its norm over all of them, no ratio
        pnorms = [math.sqrt(a if no else b) for a, b, no in zip(all2, b2, unstepped)]
    skipped = found_inf is not None and bool(found_inf.reshape(-1)[0] > 0)
    if skipped:
        return [math.nan] * m, pnorms, True
    ratios = _ratios(d2, pnorms)
    return [math.nan if no else r for r, no in zip(ratios, unstepped)], pnorms, False


def aggregate_on_device(plan: Plan, norms: list[tuple[Any, Any, bool]], found_inf: torch.Tensor | None,
                        missing: list[list[bool]] | None = None,
                        ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor | None]:
    """Device path: everything stays a tensor (0-d results), no host sync; (ratios, parameter norms,
    skipped as a 0-d bool tensor or None)."""
    # [‖Δθ‖² per module, ‖θ‖² per module], and with ``missing`` [‖θ‖² over all, stepped parameters]
    acc: torch.Tensor | None = None
    for gi, (g, (before, diff, _)) in enumerate(zip(plan.groups, norms)):
        sq = torch.stack([torch.full_like(before, torch.nan) if diff is None else diff, before]).square()
        if missing is not None:
            keep = torch.tensor([not x for x in missing[gi]], dtype=sq.dtype, device=sq.device)
            sq = torch.cat([sq * keep, sq[1:], keep[None]])
        if acc is None:
            acc = torch.zeros(sq.shape[0], len(plan.names), dtype=torch.float32, device=sq.device)
        entries, positions = g.index(acc.device)
        if positions is not None:
            sq = sq.index_select(1, positions.to(sq.device))
        acc.index_add_(1, entries, sq.to(acc.device))
    assert acc is not None
    norm = acc.sqrt()
    ratio = norm[0] / norm[1]
    pnorm = norm[1]
    if missing is not None:  # a module none of whose parameters the step touched: no ratio, norm over all
        none = acc[3] == 0
        ratio = torch.where(none, torch.nan, ratio)
        pnorm = torch.where(none, norm[2], pnorm)
    skipped = None
    if found_inf is not None:
        skipped = found_inf.to(acc.device).reshape(-1)[0] > 0
        ratio = torch.where(skipped, torch.nan, ratio)
    return list(ratio.unbind()), list(pnorm.unbind()), skipped


def _to_float(x: Any) -> float:
    if isinstance(x, torch.Tensor):
        return float(x.detach().float().reshape(-1)[0]) if x.numel() else float("nan")
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def as_number(x: Any, on_device: bool) -> float | torch.Tensor:
    """A learning rate as a float, or as a 0-d float32 tensor when it is a device tensor."""
    if isinstance(x, torch.Tensor) and on_device and x.device.type != "cpu":
        return x.detach().reshape(-1)[0].to(torch.float32, copy=True)
    return _to_float(x)


def optimizer_state(mod: torch.nn.Module, opts: list[torch.optim.Optimizer]) -> dict[str, dict[str, float]]:
    """``OptimizerWatch.state_of`` for module ``mod`` and the optimizers that stepped: one sync."""
    out: dict[str, dict[str, float]] = {}
    pending: list[tuple[dict[str, float], str, torch.Tensor]] = []
    for pname, p in mod.named_parameters(recurse=False):
        for opt in opts:
            group = next((g for g in opt.param_groups if any(q is p for q in g["params"])), None)
            if group is None:
                continue
            entry = out[pname] = {"lr": _to_float(group.get("lr"))}
            for key, value in opt.state.get(p, {}).items():
                if isinstance(value, torch.Tensor) and value.numel() and not value.is_complex():
                    v = local(value).detach().float()
                    pending.append((entry, str(key), v.norm() if value.numel() > 1 else v.reshape(())))
                elif isinstance(value, (int, float)) and not isinstance(value, bool):
                    entry[str(key)] = float(value)
            break
    if pending:
        with torch.no_grad():
            values = torch.stack([v.cpu() for _, _, v in pending]).tolist()
        for (entry, key, _), v in zip(pending, values):
            entry[key] = v
    return out
