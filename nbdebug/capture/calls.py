"""Per-call records of a :class:`~nbdebug.capture.session.Capture`: :class:`_Row` (one row of the
whole run, merged over its calls in every step) and :class:`_Call` (one recorded tensor leaf of one
module call in the open step, which is also that tensor's output-gradient hook), two small autograd
helpers the session's hooks use, and :func:`grad_norms` (parameter-gradient norms: the native kernel's
``sq_norms`` in one call for float32 CPU gradients, BLAS dots without it, batched ``_foreach_norm``
otherwise; float32 overflow of finite gradients is not called non-finite).
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import native as _native
from .stats import IDX, SATURATING, Raw, merge_raw, tensor_stats

if TYPE_CHECKING:
    from .session import Capture

__all__: list[str] = []  # private to the capture package

_ndarray = np.ndarray
_NAN, _INF = IDX["nan"], IDX["inf"]


class _Row:
    """One row of the whole run (merged over its calls in every step)."""

    __slots__ = (
        "alive",
        "calls",
        "dtype",
        "ext_nonfinite",
        "first_step",
        "grad",
        "hid",
        "hist",
        "id",
        "inputs",
        "key",
        "module",
        "raw",
        "sample",
        "sample_tried",
        "sat",
        "shape",
        "type",
        "units",
    )

    def __init__(self, rid: int, key: str, module: str, type_: str, shape: tuple[int, ...], dtype: str) -> None:
        self.id, self.key, self.module, self.type, self.shape, self.dtype = rid, key, module, type_, shape, dtype
        self.calls = 0
        self.raw: np.ndarray | None = None  # merged raw stats (host)
        self.grad: np.ndarray | None = None  # merged output-gradient raw stats (host)
        self.sample: torch.Tensor | np.ndarray | None = None
        self.sample_tried = False
        self.hist: torch.Tensor | np.ndarray | None = None
        self.inputs: tuple[int, ...] | None = None  # row ids feeding its first folded call
        self.ext_nonfinite = False
        self.first_step = 0
        self.units = 0  # units per call (dim 1), 0 when not applicable
        self.alive: np.ndarray | None = None  # units non-zero in some call of the run (None: all, so far)
        self.sat = type_ in SATURATING
        self.hid = -1  # its History row id (assigned when first folded)


class _StepMark:
    """What the calls of one step share: whether the step closed (a gradient arriving later belongs to
    a delayed backward) and its number once committed (0 before). Set once for all of them."""

    __slots__ = ("closed", "step")

    def __init__(self) -> None:
        self.closed = False
        self.step = 0


class _Call:
    """One recorded tensor leaf of one module call in the open step; it is also the output-gradient
    hook of that tensor (no closure per call: fewer objects for the garbage collector)."""

    __slots__ = ("alive", "cap", "grad_order", "grad_stats", "held", "hooked", "input_calls",
                 "input_checks", "late", "mark", "module", "raw", "ref", "row", "shape", "version")

    def __init__(self, cap: Capture, row: _Row, module: str, shape: tuple[int, ...], mark: _StepMark) -> None:
        self.cap, self.row, self.module, self.shape, self.mark = cap, row, module, shape, mark
        self.raw: Raw | None = None
        self.grad_stats: Raw | None = None
        self.late: Raw | None = None  # gradient stats that arrived after the step closed
        self.grad_order = -1
        self.hooked = False
        self.alive: Any = None  # bool [units] (None: every unit non-zero, or n/a)
        self.input_calls: list[_Call] = _EMPTY  # type: ignore[assignment]  # a list once linked
        self.input_checks: list[torch.Tensor] = _EMPTY  # type: ignore[assignment]
        self.held: tuple[Any, Any] | None = None  # (inputs, output) until the step's check (device path)
        self.ref: Any = None  # weakref to the output tensor (input linking, aliasing)
        self.version: int | None = None

    def __call__(self, g: torch.Tensor) -> None:
        """The output-gradient hook."""
        cap = self.cap
        # The gradient of a view (Flatten, reshape) is a view of the next gradient: same elements, same
        # stats (same start, size and dtype, both contiguous, that tensor alive and unchanged).
        last = cap._last_grad
        ptr, n, contiguous = g.data_ptr(), g.numel(), g.is_contiguous()
        if (last is not None and ptr == last[1] and n == last[2] and contiguous and g.dtype == last[3]
                and (src := last[0]()) is not None and src._version == last[4]):
            stats = last[5].copy() if isinstance(last[5], np.ndarray) else last[5].clone()
        else:
            if not ptr and n and g._is_zerotensor():  # a ZeroTensor (torch.sgn's): no memory to read, all zeros
                g = torch.zeros(g.shape, dtype=g.dtype, device=g.device)
            stats = tensor_stats(g, on_device=cap.device_path)
            if type(stats) is not _ndarray or stats[_NAN] + stats[_INF] > 0:
                cap._maybe_bad = True  # the step's close looks for the first non-finite gradient
            if contiguous and n and not g.is_inference():
                cap._last_grad = (weakref.ref(g), ptr, n, g.dtype, g._version, stats)
        if self.mark.closed:  # a delayed backward: folded with the next step (History.update)
            if self.late is None:
                cap._late.append(self)
            self.late = stats if self.late is None else merge_raw(self.late, stats)
        elif self.grad_stats is None:
            self.grad_stats = stats
        else:
            self.grad_stats = merge_raw(self.grad_stats, stats)
        if self.grad_order < 0:
            self.grad_order = cap._grad_counter
            cap._grad_counter += 1
        if not cap._pg_queued and cap._pg_params:  # look at the parameter gradients when this backward ends
            cap._pg_backward()
        return None


_EMPTY: list = []  # shared, never appended to (replaced by a new list on first use)


def _in_backward() -> bool:
    """True while autograd runs a backward on this thread (checkpoint recomputation happens there)."""
    return torch._C._current_graph_task_id() != -1


def _version(t: torch.Tensor) -> int | None:
    """The version counter, or None for inference tensors (they have none)."""
    return None if t.is_inference() else t._version


def grad_norms(grads: list[torch.Tensor], device_path: bool) -> np.ndarray | list[torch.Tensor]:
    """L2 norm of each gradient: a float64 host array for small contiguous float32 CPU gradients (not on
    the device path: one native call, or a BLAS dot each), else float32 0-d tensors from batched
    ``_foreach_norm`` per device and dtype."""
    if not device_path:
        sq = _host_sq_norms(grads)
        if sq is not None:
            return np.sqrt(sq)
    with torch.no_grad():
        kinds = {(g.device, g.dtype) for g in grads}
        if len(kinds) == 1 and grads[0].dtype == torch.float32:
            norms = list(torch._foreach_norm(grads))  # one op for every parameter
        else:
            grads = [g.float() if g.dtype in (torch.float16, torch.bfloat16) else g for g in grads]
            by_kind: dict[tuple[torch.device, torch.dtype], list[int]] = {}
            for i, g in enumerate(grads):
                by_kind.setdefault((g.device, g.dtype), []).append(i)
            norms = [None] * len(grads)  # type: ignore[list-item]
            for idxs in by_kind.values():
                for i, v in zip(idxs, torch._foreach_norm([grads[i] for i in idxs])):
                    norms[i] = v.to(torch.float32)
        norms = _without_overflow(grads, norms, device_path)
    return norms


_F32 = torch.float32
_SMALL = 1 << 16


def _host_sq_norms(grads: list[torch.Tensor]) -> np.ndarray | None:
    """float64 sums of squares of contiguous float32 CPU gradients (the native kernel's one call when it is
    in use: any size when torch runs one thread; else a BLAS dot each for small ones: float32 overflow of finite
    values recounted in float64), or None when one of them is not such a gradient."""
    # one thread per call: any size when torch runs one thread too, else small gradients only (torch's
    # parallel norms win on large ones); None from the kernel when it is not in use (it gives 0 for a ZeroTensor)
    if torch.get_num_threads() == 1 or all(g.numel() <= _SMALL for g in grads):
        try:
            sq = _native.sq_norms(grads)
        except Exception:
            sq = None
        if sq is not None:
            return sq
    if any(map(_is_zero, grads)):
        return _with_zeros(grads)
    for g in grads:
        if g.dtype != _F32 or not g.is_cpu or not g.is_contiguous() or g.numel() > _SMALL:
            return None
    out = np.empty(len(grads))
    dot = np.dot
    with np.errstate(over="ignore", invalid="ignore"):
        for i, g in enumerate(grads):
            f = g.numpy().reshape(-1)
            sq = float(dot(f, f))
            if sq == math.inf:  # float32 overflow of finite values (|g| > ~1e19): recount in float64
                f64 = f.astype(np.float64)
                sq = float(dot(f64, f64))
            out[i] = sq
    return out


_is_zero = torch.Tensor._is_zerotensor


def _with_zeros(grads: list[torch.Tensor]) -> np.ndarray | None:
    """:func:`_host_sq_norms` when some gradients are ZeroTensors (``torch.sgn``'s gradients): they
    have no memory (``data_ptr() == 0``, ``.numpy()`` raises) and their sum of squares is 0."""
    live = [i for i, g in enumerate(grads) if not g._is_zerotensor()]
    out = np.zeros(len(grads))
    if live:
        sq = _host_sq_norms([grads[i] for i in live])
        if sq is None:
            return None
        out[live] = sq
    return out


def _without_overflow(grads: list[torch.Tensor], norms: list[torch.Tensor], device_path: bool) -> list[torch.Tensor]:
    """Finite gradients whose float32 L2 norm overflows (|g| > ~1e19) are not non-finite: on the CPU
    their norm is recomputed in float64 (rare: only when a norm is inf); on the device path (no host
    read, no float64 there) it is reported as float32's largest value, decided from the max-norm."""
    if not norms:
        return norms
    if not device_path:
        if not bool(torch.isinf(torch.stack([n.reshape(()) for n in norms])).any()):
            return norms
        return [torch.linalg.vector_norm(g.detach().double()) if bool(torch.isinf(n)) else n for g, n in zip(grads, norms)]
    big = torch.finfo(torch.float32).max
    amax = torch._foreach_norm([g.detach() for g in grads], float("inf"))
    return [torch.where(torch.isinf(n) & torch.isfinite(a), big, n) for n, a in zip(norms, amax)]
