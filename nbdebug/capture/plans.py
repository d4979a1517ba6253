"""What one optimizer steps of the watched modules (for :class:`~nbdebug.capture.optim.OptimizerWatch`).

A :class:`Plan` per optimizer lists the watched parameters it holds (:func:`new_plan`), grouped by device
and dtype (:class:`ParamGroup`, regrouped by :meth:`Plan.regroup` when its parameter groups or the set of
parameters with a gradient change). Before a step a group snapshots its parameters (small float32 CPU
parameters: one flat numpy copy into a buffer the group keeps; else per-tensor clones and stacked runs
of same-shape parameters); after it, :meth:`ParamGroup.norms` gives ‖θ_before‖ and ‖Δθ‖ per parameter
(the flat copy through the native kernel's ``seg_norms``: one call reading the parameters by pointer,
squared sums in float64). :mod:`.updates` sums them per module.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import native
from .budget import format_bytes
from .leaves import local

__all__ = ["ParamGroup", "Plan", "new_plan", "norms_of"]

_FLAT_MAX = 1 << 20  # float32 CPU parameters up to this many elements in all: the numpy path of ParamGroup
_BATCH = 4  # on the CPU, this many parameters of one shape are copied and normed as one stacked tensor
_ptr = torch.Tensor.data_ptr


class ParamGroup:
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
            before.append(torch.stack(norms_of(singles)))
            torch._foreach_sub_(singles, self.params[: self.n_single])  # θ_before − θ_after, on our copy
            diff.append(torch.stack(norms_of(singles)))
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


class Plan:
    """What one optimizer steps of the watched modules (cached; rebuilt when its groups or the set of
    parameters with a gradient change), with what each step needs laid out once."""

    __slots__ = ("candidates", "closure", "fast", "flat", "groups", "key", "lr_one", "mask", "module_group", "names",
                 "nbytes", "on_device", "params", "pending", "posts")

    def __init__(self, key: list[int], candidates: list[tuple[torch.Tensor, int, list[str]]]) -> None:
        self.key = key  # the number of parameters in each of the optimizer's param groups
        self.candidates = candidates  # (parameter, its param group, watched modules owning it)
        self.params = [p for p, _, _ in candidates]
        self.mask: list[bool] | None = None  # which candidates the step touches (have a gradient)
        self.groups: list[ParamGroup] = []
        self.names: list[str] = []
        self.module_group: list[int] = []
        self.lr_one = True  # every module's parameters are in the first param group
        self.nbytes = 0
        # per group, before the step: the snapshot, or (over budget) the parameter norms
        self.pending: list[Any] | None = None
        self.posts = 0  # completed steps (post-hook calls) of this optimizer
        self.closure = False  # the pending step was given a closure (gradients appear inside the step)
        self.flat = False  # every group copies its parameters into one numpy buffer (no torch op per step)
        self.fast: ParamGroup | None = None  # the one group when ``flat`` (float32 CPU: a flat group is the only one)
        self.on_device = False  # numbers as 0-d tensors (the device path)


    def regroup(self, mask: list[bool], on_device: bool | None, max_bytes: int) -> str | None:
        """Group the parameters that have a gradient (``mask``) by device and dtype (the optimizer steps
        those); ``on_device``: numbers as 0-d tensors (None: when the parameters are not on the CPU).
        Returns a note when the snapshot does not fit in ``max_bytes`` (no update ratio then)."""
        self.mask = mask
        names: dict[str, int] = {}
        module_group: list[int] = []
        by: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[int], list[int], list[torch.Tensor]]] = {}
        nbytes = 0
        for (p, gi, mods), has_grad in zip(self.candidates, mask):
            if not has_grad:
                continue
            params, entries, positions, originals = by.setdefault((p.device, p.dtype), ([], [], [], []))
            originals.append(p)
            for m in mods:
                if m not in names:
                    names[m] = len(names)
                    module_group.append(gi)
                entries.append(names[m])
                positions.append(len(params))
            p = local(p)  # FSDP2: this rank's shard
            params.append(p)
            nbytes += p.numel() * p.element_size()
        self.names, self.module_group = list(names), module_group
        stack = on_device is not True
        self.groups = [ParamGroup(params, entries, positions, stack and dev.type == "cpu", originals)
                       for (dev, _), (params, entries, positions, originals) in by.items()]
        self.flat = bool(self.groups) and all(g.flat is not None for g in self.groups)
        self.fast = self.groups[0] if self.flat and len(self.groups) == 1 else None
        self.on_device = on_device if on_device is not None else bool(self.groups) and self.groups[0].params[0].device.type != "cpu"
        self.lr_one = not any(module_group)
        # the snapshot, and for stacked runs the stacked parameters after the step
        self.nbytes = nbytes = nbytes + sum(p.numel() * p.element_size() for g in self.groups for p in g.params[g.n_single:])
        if self.groups and nbytes > max_bytes:
            return (f"update ratio unavailable: a copy of the parameters the optimizer steps ({format_bytes(nbytes)}) "
                    f"does not fit in --max-bytes ({format_bytes(max_bytes)}); parameter norms and learning rates are kept")
        return None


def _native(name: str) -> Any:
    """The native kernel's helper ``name`` when the kernel is in use, else None (asked each time: the
    kernel may be switched off, e.g. ``NBDEBUG_NATIVE=0`` and ``native._reset()`` in tests)."""
    return getattr(native, name, None) if native.available() else None


def new_plan(opt: torch.optim.Optimizer, key: list[int], owners: dict[int, tuple[torch.Tensor, list[str]]],
             ours: set[int]) -> Plan | None:
    """The plan of ``opt`` (``key``: the number of parameters in each of its param groups), or None when it
    holds none of the model's parameters (``ours``: their ids; ``owners``: id → (watched parameter, the
    watched modules owning it))."""
    belongs = False
    candidates: list[tuple[torch.Tensor, int, list[str]]] = []
    for gi, g in enumerate(opt.param_groups):
        for p in g["params"]:
            belongs = belongs or id(p) in ours
            hit = owners.get(id(p))
            if (hit is not None and hit[0] is p and p.is_floating_point() and p.layout == torch.strided
                    and p.device.type != "meta"):  # offloaded weights have no values to diff
                candidates.append((p, gi, hit[1]))
    return Plan(key, candidates) if belongs or candidates else None


_HALF = (torch.float16, torch.bfloat16)


def norms_of(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms in one batched op (accumulated in float32 for half-precision tensors)."""
    return torch._foreach_norm(ts, 2, dtype=torch.float32) if ts and ts[0].dtype in _HALF else torch._foreach_norm(ts)


def _row_norms(x: torch.Tensor) -> torch.Tensor:
    """L2 norm of each x[i] (a stack of same-shape parameters), in float32 for half precision."""
    return torch.linalg.vector_norm(x.reshape(x.shape[0], -1), dim=1, dtype=torch.float32 if x.dtype in _HALF else None)


def _clone(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    clone = getattr(torch, "_foreach_clone", None)
    return list(clone(ts)) if clone is not None and ts else [t.clone() for t in ts]


