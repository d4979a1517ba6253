"""Parameter-gradient norms in one batch (:func:`grad_norms`): the native kernel's ``sq_norms`` in one
call for float32 CPU gradients (squares summed in float64), BLAS dots without it, batched
``_foreach_norm`` per device and dtype otherwise; float32 overflow of finite gradients is not called
non-finite; ZeroTensor gradients are 0. Used by :mod:`.paramgrads`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import native as _native

__all__ = ["grad_norms"]


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
