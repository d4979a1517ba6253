"""The host path of :func:`~nbdebug.capture.stats.tensor_stats` and
:func:`~nbdebug.capture.stats.unit_alive` without the native kernel: numpy for small CPU tensors,
the float32 bit pattern for large ones (the fallback when :mod:`~nbdebug.capture.native` is off, has
no compiler, or does not apply: float64, inference tensors of the torch path, ...), and ZeroTensors.
Exactly the same fields as the native kernel.

>>> numpy_stats(torch.tensor([0.0, 1.0, -2.0]), None, 1e-3).tolist()
[3.0, -1.0, 5.0, -2.0, 1.0, 2.0, 0.0, 0.0, 0.0]
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["NP_DTYPES", "NUMPY_MAX", "count_nonzero", "cpu_row", "numpy_alive", "numpy_stats", "zero_raw", "zero_row"]

NP_DTYPES = (torch.float32, torch.float64)  # what numpy reads of a CPU tensor without a copy
_I32_MIN = -(2**31)  # -0.0 as int32


def _cpu_f32_rest(x: torch.Tensor, n: int) -> tuple[float, float, int, int, int]:
    """(min, max, nonzero, nan, inf) of a flat float32 CPU tensor (not an inference tensor) from its
    int32 bit pattern, in as few passes as we found (memory-bound on large tensors: every pass counts).

    Non-negative floats order like their bits, negative ones in reverse (larger magnitude, larger
    int32), and as uint32 every negative float is above every non-negative one. So one int32
    min/max gives the float min and max when all signs agree (ReLU outputs), and mixed signs take
    one more uint32 max (the most negative float); -0.0 is the int32 minimum. Non-zeros are counted
    on the int32 view (numpy: vectorised there, not on floats), only when a zero can be present.
    """
    bits = x.view(torch.int32)
    arr = bits.numpy()
    bmin, bmax = (int(v) for v in torch.aminmax(bits))
    f32 = np.float32
    if bmin >= 0:  # all non-negative (+0.0 included)
        mn_f, mx_f = float(np.int32(bmin).view(f32)), float(np.int32(bmax).view(f32))
    elif bmax < 0:  # all negative (-0.0 included)
        mn_f, mx_f = float(np.int32(bmax).view(f32)), float(np.int32(bmin).view(f32))
    else:
        mn_f, mx_f = float(_maximum(arr.view(np.uint32)).view(f32)), float(np.int32(bmax).view(f32))
    nan = inf = 0
    if not (math.isfinite(mn_f) and math.isfinite(mx_f)):  # exact counts only when needed
        nan, inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
        if nan:
            mn_f = mx_f = math.nan  # like aminmax: NaN propagates
    if bmin > 0 or (bmax < 0 and bmin > _I32_MIN):  # all positive, or all negative without -0.0: no zero
        nz = n
    else:
        nz = int(np.count_nonzero(arr))
        if bmin == _I32_MIN:  # -0.0 values: their bits count as non-zero, take them off
            nz -= int(np.count_nonzero(arr == _I32_MIN))
    return mn_f, mx_f, nz, nan, inf


def cpu_row(x: torch.Tensor, n: int, s: torch.Tensor, ss: torch.Tensor, extra: torch.Tensor | None) -> np.ndarray:
    """The raw row of a flat float32/float64 CPU tensor of ``n > 0`` elements through torch (tensors
    numpy does not take: large, inference), given its sum, sum of squares and saturation count."""
    if x.dtype == torch.float32 and not x.is_inference():
        # Memory-bound on large tensors: every pass counts. amin + amax beat aminmax (~1.6×); the
        # int32 bit pattern gives both the non-negative case (ReLU outputs: one int min/max, no
        # float min/max and no -0.0 pass) and a vectorised count of non-zeros (through numpy).
        rest = _cpu_f32_rest(x, n)
        return np.array([n, s.item(), ss.item(), *rest, 0 if extra is None else extra.item()], dtype=np.float64)
    mn, mx = torch.aminmax(x)
    mn_f, mx_f = mn.item(), mx.item()
    nan = inf = 0
    if not (math.isfinite(mn_f) and math.isfinite(mx_f)):  # exact counts only when needed
        nan, inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
    # No zero can hide outside [min, max] (NaN compares false: count then).
    nz = n if (mn_f > 0 or mx_f < 0) else int(count_nonzero(x, sync_free=True))
    return np.array([n, s.item(), ss.item(), mn_f, mx_f, nz, nan, inf, 0 if extra is None else extra.item()], dtype=np.float64)


_INT_MIN = {torch.float32: (torch.int32, -(2**31)), torch.float64: (torch.int64, -(2**63))}


def count_nonzero(x: torch.Tensor, sync_free: bool) -> torch.Tensor | int:
    """Exact count of values != 0 (-0.0 counts as zero, NaN as non-zero), torch reductions on any
    device (:func:`~nbdebug.capture.stats.tensor_stats`' device path uses it too).

    ``count_nonzero`` on floats is not vectorised on the CPU; on the integer bit pattern it is
    ~20× faster. That counts -0.0 (the bit pattern INT_MIN, the smallest integer) as non-zero, so
    the integer minimum tells whether a correction is needed at all (``sync_free``: read on the
    host first, a CPU tensor's read being free).
    """
    if x.dtype not in _INT_MIN:
        return torch.count_nonzero(x)
    int_dtype, int_min = _INT_MIN[x.dtype]
    bits = x.view(int_dtype)
    nz = torch.count_nonzero(bits)
    if sync_free:
        if bits.min().item() == int_min:
            nz = nz - torch.count_nonzero(bits == int_min)
        return nz
    return nz - torch.count_nonzero(bits == int_min)


def zero_row(n: int, bounds: tuple[float, float] | None = None) -> np.ndarray:
    """The raw row of ``n`` zeros (a ZeroTensor's stats, computed without reading memory: it has
    none). ``bounds=(lo, hi)`` are the saturation thresholds already offset by ``sat_eps`` (and
    rounded to the tensor's dtype): ``extra`` counts the zeros ``<= lo`` and ``>= hi``."""
    extra = 0 if bounds is None else n * ((0.0 <= bounds[0]) + (0.0 >= bounds[1]))
    if n == 0:
        return np.array([0.0, 0.0, 0.0, math.nan, math.nan, 0.0, 0.0, 0.0, 0.0])
    return np.array([n, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, extra], dtype=np.float64)


def zero_raw(t: torch.Tensor, saturation: tuple[float, float] | None, sat_eps: float) -> np.ndarray:
    """The host row of a ZeroTensor: ``t.numel()`` zeros (bounds compared in ``t``'s dtype, like the
    torch/numpy comparison of a tensor with a Python float)."""
    bounds = None
    if saturation is not None:
        lo, hi = saturation
        one = torch.tensor([lo + sat_eps, hi - sat_eps], dtype=t.dtype if t.is_floating_point() else torch.float32)
        bounds = (float(one[0]), float(one[1]))
    return zero_row(t.numel(), bounds)


NUMPY_MAX = 1 << 16  # CPU tensors up to this size: numpy reductions (a few µs less dispatch each)


_minimum, _maximum, _add = np.minimum.reduce, np.maximum.reduce, np.add.reduce
_F32_SAFE = 1e16  # |x| below this: the float32 sum of squares cannot overflow for any tensor under NUMPY_MAX


def numpy_stats(t: torch.Tensor, saturation: tuple[float, float] | None, sat_eps: float) -> np.ndarray:
    """:func:`tensor_stats` of a small float32/float64 CPU tensor through numpy (same fields; the sum
    accumulates in float64, ``-0.0`` counts as zero, NaN as non-zero). Few Python-level calls: this
    runs once per module call and per output gradient."""
    x = t.detach().numpy().reshape(-1)
    n = x.size
    if n == 0:
        return np.array([0.0, 0.0, 0.0, math.nan, math.nan, 0.0, 0.0, 0.0, 0.0])
    mn, mx = float(_minimum(x)), float(_maximum(x))
    nan = inf = 0
    if -_F32_SAFE < mn and mx < _F32_SAFE:  # finite and small: nothing can overflow or be NaN
        s, ss = float(_add(x, dtype=np.float64)), float(np.dot(x, x))
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            s, ss = float(_add(x, dtype=np.float64)), float(np.dot(x, x))
            if not (math.isfinite(mn) and math.isfinite(mx)):  # exact counts only when needed
                nan, inf = int(np.count_nonzero(np.isnan(x))), int(np.count_nonzero(np.isinf(x)))
    if mn > 0 or mx < 0:
        nz = n
    elif x.dtype == np.float32:  # count_nonzero is vectorised on ints, not floats; -0.0 is the int32 minimum
        bits = x.view(np.int32)
        nz = int(np.count_nonzero(bits))
        if _minimum(bits) == _I32_MIN:
            nz -= int(np.count_nonzero(bits == _I32_MIN))
    else:
        nz = int(np.count_nonzero(x))
    extra = 0
    if saturation is not None:
        lo, hi = saturation
        extra = int(np.count_nonzero(x <= lo + sat_eps)) + int(np.count_nonzero(x >= hi - sat_eps))
    return np.array([n, s, ss, mn, mx, nz, nan, inf, extra], dtype=np.float64)


def numpy_alive(x: torch.Tensor, sign: int) -> np.ndarray:
    """bool ``[C]``: which units (dim 1) of a small float32/float64 CPU tensor of 2 or more dims hold a
    value != 0, through numpy; ``sign`` as in :func:`~nbdebug.capture.stats.unit_alive` (1: all >= 0,
    a plain max; -1: all <= 0, a min; 0: max of the absolute values)."""
    a = x.detach().numpy()
    if sign == 0:
        a = np.abs(a)
    red = _minimum if sign < 0 else _maximum
    m = red(a, axis=0)
    if m.ndim > 1:
        m = red(m.reshape(x.shape[1], -1), axis=1)
    return m != 0
