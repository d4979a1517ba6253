"""The host path of :func:`~nbdebug.capture.stats.tensor_stats` without the native kernel: numpy for
small CPU tensors, the float32 bit pattern for large ones (the fallback when
:mod:`~nbdebug.capture.native` is off, has no compiler, or does not apply: float64, inference tensors
of the torch path, ...). Exactly the same fields as the native kernel."""

from __future__ import annotations

import math

import numpy as np
import torch

_NP_DTYPES = (torch.float32, torch.float64)
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


def zero_row(n: int, bounds: tuple[float, float] | None = None) -> np.ndarray:
    """The raw row of ``n`` zeros (a ZeroTensor's stats, computed without reading memory: it has
    none). ``bounds=(lo, hi)`` are the saturation thresholds already offset by ``sat_eps`` (and
    rounded to the tensor's dtype): ``extra`` counts the zeros ``<= lo`` and ``>= hi``."""
    extra = 0 if bounds is None else n * ((0.0 <= bounds[0]) + (0.0 >= bounds[1]))
    if n == 0:
        return np.array([0.0, 0.0, 0.0, math.nan, math.nan, 0.0, 0.0, 0.0, 0.0])
    return np.array([n, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, extra], dtype=np.float64)


NUMPY_MAX = 1 << 16  # CPU tensors up to this size: numpy reductions (a few µs less dispatch each)


_minimum, _maximum, _add = np.minimum.reduce, np.maximum.reduce, np.add.reduce
_F32_SAFE = 1e16  # |x| below this: the float32 sum of squares cannot overflow for any tensor under NUMPY_MAX


def _numpy_stats(t: torch.Tensor, saturation: tuple[float, float] | None, sat_eps: float) -> np.ndarray:
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
