"""What one optimizer steps of the watched modules, and the numbers of a step (for
:class:`~nbdebug.capture.optim.OptimizerWatch`).

A :class:`_Plan` per optimizer lists the watched parameters it holds, grouped by device and dtype
(:class:`_Group`), rebuilt when its parameter groups or the set of parameters with a gradient change.
Before a step a group snapshots its parameters (small float32 CPU parameters: one flat numpy copy into
a buffer the group keeps; else per-tensor clones and stacked runs of same-shape parameters); after it,
:meth:`_Group.norms` gives ‖θ_before‖ and ‖Δθ‖ per parameter (the flat copy through the native kernel's
``seg_norms``: one call reading the parameters by pointer, squared sums in float64), and
:func:`aggregate` / :func:`aggregate_on_device` sum them per module (the host path: one ``bincount``
per sum, in the same order as a loop; the device path: tensors only, no host sync). The usual CPU step
(one flat group, every stepped parameter with its gradient) takes :func:`flat_update`: one snapshot
copy before, one native call and two ``bincount``s after.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import torch

from . import native
from .leaves import local

__all__: list[str] = []  # private to the capture package (optim.py)

_FLAT_MAX = 1 << 20  # float32 CPU parameters up to this many elements in all: the numpy path of _Group
_BATCH = 4  # on the CPU, this many parameters of one shape are copied and normed as one stacked tensor
_ptr, _div, _sqrt = torch.Tensor.data_ptr, operator.truediv, math.sqrt


class _Group:
    """Parameters of one device and dtype in a plan (single ones first, then runs of one shape that
    are stacked on the CPU: one op instead of one per tensor), and which module each norm belongs to."""

    __slots__ = ("_index", "_seg", "_views", "batches", "entries", "entries_a", "flat", "n_single", "originals", "params", "positions",
                 "positions_a")

    def __init__(self, params: list[torch.Tensor], entries: list[int], positions: list[int], stack: bool,
                 originals: list[torch.Tensor]) -> None:
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, p in enumerate(params):
            by_shape.setdefault(tuple(p.shape), []).append(i)
        runs = [ix for ix in by_shape.values() if stack and len(ix) >= _BATCH]
        batched = {i for ix in runs for i in ix}
        order = [i for i in range(len(params)) if i not in batched] + [i for ix in runs for i in ix]
        where = {old: new for new, old in enumerate(order)}
        self.params = [params[i] for i in order]
        self.originals = [originals[i] for i in order]  # the optimizer's own tensors (``params`` may be FSDP2 shards)
        self.n_single = len(params) - len(batched)
        self.batches: list[slice] = []
        start = self.n_single
        for ix in runs:
            self.batches.append(slice(start, start + len(ix)))
            start += len(ix)
        self.entries = entries  # module index (in the plan) of each (parameter, module) pair
        self.positions = [where[i] for i in positions]  # parameter position (in ``self.params``) of each pair
        self.entries_a = np.array(entries, dtype=np.intp)
        # None when the pairs are the parameters in order (one module each): no gather needed
        self.positions_a = None if self.positions == list(range(len(self.params))) else np.array(self.positions, dtype=np.intp)
        self._index: tuple[torch.Tensor, torch.Tensor | None] | None = None
        # small float32 CPU parameters: the snapshot is one numpy concatenation and the norms BLAS dots
        # (a few µs per step instead of a dozen torch dispatches)
        self.flat: list[int] | None = None
        self._views: tuple[list[int], list[np.ndarray], list[np.ndarray]] | None = None  # (data_ptrs, numpy views, 2 buffers)
        self._seg: Any = None  # the native kernel's seg_plan for the snapshot buffer and these parameters (when it has one)
        if stack and self.params and all(
                p.dtype == torch.float32 and p.device.type == "cpu" and p.layout == torch.strided and p.is_contiguous()
                and not p.is_inference() for p in self.params) and sum(p.numel() for p in self.params) <= _FLAT_MAX:
            ends = np.cumsum([p.numel() for p in self.params]).tolist()
            self.flat = [0, *ends]

    def index(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``entries`` and ``positions`` (None when one pair per parameter, in order) as device tensors."""
        if self._index is None or self._index[0].device != device:
            identity = self.positions == list(range(len(self.params)))
            self._index = (torch.tensor(self.entries, device=device),
                           None if identity else torch.tensor(self.positions, device=device))
        return self._index

    def _flat(self, slot: int) -> np.ndarray:
        """The parameters' values copied into buffer ``slot`` (0: before the step, 1: after). The two
        buffers live as long as the group: a fresh megabyte-sized array per step costs page faults."""
        views = self._views
        ptrs = list(map(_ptr, self.params))
        if views is None or views[0] != ptrs:  # first use, or a parameter's storage was replaced (p.data = ...)
            assert self.flat is not None
            views = self._views = (ptrs, [p.detach().numpy().reshape(-1) for p in self.params],
                                   [np.empty(self.flat[-1], np.float32), np.empty(self.flat[-1], np.float32)])
        return np.concatenate(views[1], out=views[2][slot])

    def snapshot(self) -> Any:
        """Copies of the parameters before the step: the single ones, and one stacked tensor per run
        (small CPU parameters: one flat numpy copy)."""
        if self.flat is not None:
            return self._flat(0)  # the numpy views are cached: one concatenate
        return _clone(self.params[: self.n_single]), [torch.stack(self.params[s]) for s in self.batches]

    def norms(self, copy: Any) -> tuple[Any, Any, bool]:
        """(θ_before, Δθ) per parameter in ``params`` order from the snapshot (consumed), and whether they
        are squared: float64 sums of squares on the flat path (:meth:`flat_norms`), float32 L2 norms
        (tensors) otherwise."""
        if self.flat is not None:
            b, d = self.flat_norms(copy)
            return b, d, True
        singles, stacks = copy
        before: list[torch.Tensor] = []
        diff: list[torch.Tensor] = []
        if singles:
            before.append(torch.stack(_norms(singles)))
            torch._foreach_sub_(singles, self.params[: self.n_single])  # θ_before − θ_after, on our copy
            diff.append(torch.stack(_norms(singles)))
        for s, snap in zip(self.batches, stacks):
            before.append(_row_norms(snap))
            diff.append(_row_norms(torch.stack(self.params[s]).sub_(snap)))
        return torch.cat(before).float(), torch.cat(diff).float(), False

    def flat_norms(self, before_flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Float64 sums of squares of θ_before and Δθ per parameter from the flat snapshot: the native
        kernel's ``seg_plan`` (pointers, sizes and addresses packed once; rebuilt when a parameter's
        storage moved, ``p.data = ...``, or the snapshot buffer is another one), else its ``seg_norms``,
        else a BLAS dot each."""
        make = _native("seg_plan")
        if make is not None:
            ptrs = list(map(_ptr, self.params))
            plan = self._seg
            if plan is None or plan[0] != ptrs or plan[1] is not before_flat:
                try:
                    run = make(before_flat, self.params)
                except Exception:  # a parameter that no longer qualifies: seg_norms decides
                    run = None
                plan = self._seg = (ptrs, before_flat, run)
            if plan[2] is not None:
                return plan[2]()
        seg = _native("seg_norms")
        if seg is not None:
            try:
                got = seg(before_flat, self.params)
            except Exception:  # a parameter that no longer qualifies: the numpy path
                got = None
            if got is not None:
                return got
        assert self.flat is not None
        diff_flat = np.subtract(before_flat, self._flat(1), out=self._views[2][1])  # type: ignore[index]
        b, d = np.empty(len(self.params)), np.empty(len(self.params))
        with np.errstate(over="ignore", invalid="ignore"):
            for i, (lo, hi) in enumerate(zip(self.flat, self.flat[1:])):
                x, y = before_flat[lo:hi], diff_flat[lo:hi]
                b[i], d[i] = float(np.dot(x, x)), float(np.dot(y, y))
        return b, d


class _Plan:
    """What one optimizer steps of the watched modules (cached; rebuilt when its groups or the set of
    parameters with a gradient change), with what each step needs laid out once."""

    __slots__ = ("candidates", "closure", "fast", "flat", "groups", "key", "lr_one", "mask", "module_group", "names",
                 "nbytes", "on_device", "params", "pending", "posts")

    def __init__(self, key: list[int], candidates: list[tuple[torch.Tensor, int, list[str]]]) -> None:
        self.key = key  # the number of parameters in each of the optimizer's param groups
        self.candidates = candidates  # (parameter, its param group, watched modules owning it)
        self.params = [p for p, _, _ in candidates]
        self.mask: list[bool] | None = None  # which candidates the step touches (have a gradient)
        self.groups: list[_Group] = []
        self.names: list[str] = []
        self.module_group: list[int] = []
        self.lr_one = True  # every module's parameters are in the first param group
        self.nbytes = 0
        # per group, before the step: the snapshot, or (over budget) the parameter norms
        self.pending: list[Any] | None = None
        self.posts = 0  # completed steps (post-hook calls) of this optimizer
        self.closure = False  # the pending step was given a closure (gradients appear inside the step)
        self.flat = False  # every group copies its parameters into one numpy buffer (no torch op per step)
        self.fast: _Group | None = None  # the one group when ``flat`` (float32 CPU: a flat group is the only one)
        self.on_device = False  # numbers as 0-d tensors (the device path)


def _native(name: str) -> Any:
    """The native kernel's helper ``name`` when the kernel is in use, else None (asked each time: the
    kernel may be switched off, e.g. ``NBDEBUG_NATIVE=0`` and ``native._reset()`` in tests)."""
    return getattr(native, name, None) if native.available() else None


def flat_update(g: _Group, before_flat: np.ndarray, m: int, skipped: bool) -> tuple[list[float], list[float]]:
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


def aggregate(plan: _Plan, norms: list[tuple[Any, Any, bool]], found_inf: torch.Tensor | None,
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


def aggregate_on_device(plan: _Plan, norms: list[tuple[Any, Any, bool]], found_inf: torch.Tensor | None,
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


_HALF = (torch.float16, torch.bfloat16)


def _norms(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms in one batched op (accumulated in float32 for half-precision tensors)."""
    return torch._foreach_norm(ts, 2, dtype=torch.float32) if ts and ts[0].dtype in _HALF else torch._foreach_norm(ts)


def _row_norms(x: torch.Tensor) -> torch.Tensor:
    """L2 norm of each x[i] (a stack of same-shape parameters), in float32 for half precision."""
    return torch.linalg.vector_norm(x.reshape(x.shape[0], -1), dim=1, dtype=torch.float32 if x.dtype in _HALF else None)


def _clone(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    clone = getattr(torch, "_foreach_clone", None)
    return list(clone(ts)) if clone is not None and ts else [t.clone() for t in ts]


def _to_float(x: Any) -> float:
    if isinstance(x, torch.Tensor):
        return float(x.detach().float().reshape(-1)[0]) if x.numel() else float("nan")
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _number(x: Any, on_device: bool) -> float | torch.Tensor:
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
