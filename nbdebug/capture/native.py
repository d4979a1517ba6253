"""The fused native statistics kernel (``_native/stats.c``, ``norms.c``): compiled on first use, called through a CPython module or ctypes.

One pass over a float32 CPU tensor gives every field of :data:`~nbdebug.capture.stats.FIELDS`
(and, on request, the dead-unit mask) instead of the 4-5 torch/numpy passes of the fallback path.
The C source ships in the package and is compiled on first use with the system C compiler into a
per-user cache, ``$NBDEBUG_CACHE_DIR/<key>/`` (default ``~/.cache/nbdebug/native/<key>/``, or under
``$XDG_CACHE_HOME``): see :mod:`.native_build`. Two artefacts live there: the ctypes library
``libnbdstats.so`` and, when Python's and numpy's headers are present, the CPython module
``_nbdext<EXT_SUFFIX>`` (``_native/pyext.c`` with the same sources). The module's METH_FASTCALL
entry points (``stats``, ``sq_norms``, the ``seg_plan`` run) read the tensors' attributes in C and
return fresh numpy arrays filled there (``stats`` of a 1-element tensor: ~0.5 µs a call instead of
~1.5 µs; of a [16, 32] one with saturation and units: ~0.8 instead of ~2.6). What the module's
``stats`` leaves to Python (non-contiguous tensors, ZeroTensors, tensors of :data:`GIL_MAX` elements
or more, saturation bounds or ``sat_eps`` that are not floats) and every call when the module is missing
take the ctypes path: a few attribute reads, one ctypes call, results in preallocated buffers (of
the first calling thread; other threads get their own) copied out. Both paths run the same C code:
the same rows and masks, bit for bit, and the same None cases.

``NBDEBUG_NATIVE=0`` turns it off; no compiler, a failed build, a failed load or a failed self-test
all mean the torch/numpy path, silently except for :func:`status` (a one-line reason); so does any
error while building or loading it (never raised into the caller's hook).

A ZeroTensor (``torch.sgn``'s gradients, ``_efficientzerotensor``) has no memory (``data_ptr() == 0``):
its stats are exact zeros, computed without reading anything.

While TorchDynamo traces (``torch.compile``, compiled autograd) :func:`stats` returns None and
:mod:`.stats` takes the custom op of :mod:`.native_op` instead (eager calls pay nothing for it).

>>> available() in (True, False)
True
"""

from __future__ import annotations

import ctypes
import functools
import threading
import weakref
from collections.abc import Callable, Sequence

import numpy as np
import torch

from . import native_build, native_op
from .hoststats import zero_row
from .native_build import cache_dir

__all__ = ["available", "cache_dir", "gather", "seg_norms", "seg_plan", "sq_norms", "stats", "status"]

# Elements per thread before a tensor is split across threads (torch.get_num_threads() > 1): a part
# of 1M floats takes ~60-110 µs, creating and joining a thread ~20 µs (more when cores are busy), so
# only tensors of 2M+ elements are split; below, one thread already beats torch's 4-5 parallel passes.
MIN_PER_THREAD = 1 << 20
GIL_MAX = 1 << 16  # tensors below this many elements: calls that keep the GIL (cheaper by ~0.1 µs); never split (< 2 * MIN_PER_THREAD)

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False
_status = "not loaded yet"
# the bound entry points, set once loaded: nbd_stats / nbd_stats_sat keeping the GIL and releasing it
_stats_fn = _sat_fn = _stats_big = _sat_big = None
# the CPython module's entry points (None without it); _SLOW: "not decided here, take the ctypes path"
_fast_stats = _fast_sq = _fast_seg = None
_SLOW = object()
_owner = 0  # thread id owning the scratch buffer below
_get_ident = threading.get_ident


def _load() -> None:
    global _lib, _tried, _status, _stats_fn, _sat_fn, _stats_big, _sat_big, _fast_stats, _fast_sq, _fast_seg
    with _lock:
        if _tried:
            return
        try:
            libs, why = native_build.load()
        except Exception as e:  # anything at all (no home directory, a broken toolchain): the torch path
            libs, why = None, f"kernel unavailable ({type(e).__name__}: {e})"
        if libs is not None:
            _lib, held, ext = libs
            _stats_fn, _sat_fn, _stats_big, _sat_big = held.nbd_stats, held.nbd_stats_sat, _lib.nbd_stats, _lib.nbd_stats_sat
            if ext is not None:
                try:
                    ext.setup(_Tensor, _Param, _F32, _STRIDED, _SLOW, GIL_MAX)
                    _fast_stats, _fast_sq, _fast_seg = ext.stats, ext.sq_norms, ext.seg_run
                    native_op.decline_in_graph(ext.stats)  # traced: None (eagerly untouched)
                except Exception as e:  # never raised into a hook: the ctypes calls
                    why = f"{why.removesuffix('; CPython entry points)')}; ctypes calls: {type(e).__name__}: {e})"
        _status, _tried = why, True


def available() -> bool:
    """Whether the native kernel is in use (builds/loads it on the first call)."""
    if not _tried:
        _load()
    return _lib is not None


def status() -> str:
    """One line: where the kernel was loaded from, or why it is not used."""
    if not _tried:
        _load()
    return _status


def _reset() -> None:
    """Forget the loaded kernel (and the scratch buffer) so that the next use reads ``NBDEBUG_NATIVE``/``CC``
    again (tests)."""
    global _lib, _tried, _status, _stats_fn, _sat_fn, _stats_big, _sat_big, _owner, _own, _fast_stats, _fast_sq, _fast_seg
    with _lock:
        _lib, _tried, _status, _owner, _own = None, False, "not loaded yet", 0, _new_scratch(0)
        _stats_fn = _sat_fn = _stats_big = _sat_big = _fast_stats = _fast_sq = _fast_seg = None


def _new_scratch(c: int) -> tuple[np.ndarray, np.ndarray, int]:
    buf = np.zeros(9 + (max(c, 1024) + 7) // 8)  # 9 fields, then the unit mask's bytes
    return buf[:9], buf[9:].view(np.uint8), buf.ctypes.data


_own = _new_scratch(0)  # (fields, unit bytes, address) of the owning thread


def _scratch(c: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The calling thread's output buffer for ``c`` units (0 without a unit mask; the first caller
    owns a cached one, grown only for a mask of more units)."""
    global _owner, _own
    ident = _get_ident()
    if _owner == 0:
        _owner = ident
    if ident != _owner:
        return _new_scratch(c)
    if c > _own[1].size:
        _own = _new_scratch(2 * c)
    return _own


_Tensor, _Param, _F32, _STRIDED = torch.Tensor, torch.nn.Parameter, torch.float32, torch.strided
_is_compiling = native_op.is_compiling
_sat_cache: dict[tuple[float, float, float], tuple[float, float]] = {}


def _dense_units(t: torch.Tensor, n: int) -> tuple[int, int] | None:
    """``(C, inner)`` of a non-contiguous tensor whose memory is still dense (a permutation,
    e.g. channels-last): unit ``c`` (dim 1) is every ``inner`` run at ``c`` of each ``C * inner``
    row. None when the memory has gaps or overlaps."""
    shape, strides = t.shape, t.stride()
    expect = 1
    for st, sz in sorted((st, sz) for sz, st in zip(shape, strides) if sz != 1):
        if st != expect:
            return None
        expect *= sz
    if len(shape) < 2 or shape[1] == 1:
        return 1, n
    return shape[1], strides[1]


def stats(t: torch.Tensor, saturation: tuple[float, float] | None = None, sat_eps: float = 1e-3,
          units: bool = False) -> tuple[np.ndarray, np.ndarray | None] | None:
    """``(row, alive)`` of a float32 CPU tensor in one native pass, or None when the kernel is not
    available or does not apply (another dtype or device, a tensor subclass or wrapper, memory with
    gaps): the caller then takes the torch/numpy path.

    ``row`` is a new float64 array laid out as ``FIELDS`` (numel, sum, sumsq, min, max, nonzero,
    nan, inf, extra); ``extra`` counts values ``<= lo + sat_eps`` plus values ``>= hi - sat_eps``
    (both bounds rounded to float32, as numpy/torch compare a float32 tensor with a Python float)
    when ``saturation=(lo, hi)``. ``alive`` (only with ``units``, for tensors of 2 or more dims) is a
    bool ``[C]`` array over dim 1, True where the unit holds a value != 0 (NaN counts), and None when
    no value is zero (every unit alive) or ``units`` is false.
    """
    fast = _fast_stats
    if fast is not None:  # the CPython module: the whole call in C, or _SLOW
        got = fast(t, saturation, sat_eps, units)
        if got is not _SLOW:
            return got
    fn = _stats_fn
    if fn is None:
        if _tried or _is_compiling():  # not in use; or TorchDynamo traces this call: no loading there
            return None
        _load()
        fn = _stats_fn
        if fn is None:
            return None
    elif _is_compiling():  # the ctypes path while TorchDynamo traces (the module's entry point declines itself)
        return None
    tp = type(t)
    if (tp is not _Tensor and tp is not _Param) or t.dtype is not _F32 or not t.is_cpu or t.layout is not _STRIDED:
        return None
    n = t.numel()
    shape = t.shape
    if t.is_contiguous():
        if len(shape) >= 2:
            c = shape[1]
            inner = n // (shape[0] * c) if n else 0
        else:
            c, inner = 1, n
    else:
        layout = _dense_units(t, n)
        if layout is None:
            return None
        c, inner = layout
    try:
        ptr = t.data_ptr()
    except (RuntimeError, NotImplementedError):  # functorch wrappers and other storage-less tensors
        return None
    flags = 2 if units and len(shape) >= 2 else 0
    if not ptr and n:  # no memory: a ZeroTensor (exact zeros, nothing to read), else not ours
        return _zero_stats(t, n, saturation, sat_eps, flags) if t._is_zerotensor() else None
    cu = c if flags and n else 0  # unit bytes needed (none without elements: the kernel writes no mask)
    own = _own
    if cu > own[1].size or _get_ident() != _owner:
        own = _scratch(cu)
    out, alive, addr = own
    if n < GIL_MAX:
        if saturation is None:
            rc = fn(ptr, n, c, inner, flags, addr)
        else:
            rc = _sat_fn(ptr, n, c, inner, flags | 1, *_bounds(saturation, sat_eps), addr)  # type: ignore[misc]
    else:
        if n >= 2 * MIN_PER_THREAD:
            flags |= min(torch.get_num_threads(), n // MIN_PER_THREAD) << 8
        if saturation is None:
            rc = _stats_big(ptr, n, c, inner, flags, addr)  # type: ignore[misc]
        else:
            rc = _sat_big(ptr, n, c, inner, flags | 1, *_bounds(saturation, sat_eps), addr)  # type: ignore[misc]
    if rc:
        return None
    row = out.copy()
    if flags & 2 and row[5] < row[0]:
        return row, alive[:c].astype(bool)
    return row, None


def _zero_stats(t: torch.Tensor, n: int, saturation: tuple[float, float] | None, sat_eps: float,
                flags: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The row (and, with the unit flag, the all-dead mask) of ``n`` zeros."""
    row = zero_row(n, None if saturation is None else _bounds(saturation, sat_eps))
    return row, (np.zeros(t.shape[1], bool) if flags & 2 else None)


def _bounds(saturation: tuple[float, float], sat_eps: float) -> tuple[float, float]:
    """``(lo + sat_eps, hi - sat_eps)`` rounded to float32 (how numpy/torch compare a float32 tensor
    with a Python float), cached."""
    key = (saturation[0], saturation[1], sat_eps)
    bounds = _sat_cache.get(key)
    if bounds is None:
        bounds = _sat_cache[key] = (float(np.float32(key[0] + sat_eps)), float(np.float32(key[1] - sat_eps)))
    return bounds


def _pointers(tensors: Sequence[torch.Tensor], zeros: bool = False) -> tuple[list[int], list[int]] | None:
    """Addresses and sizes of plain float32 contiguous CPU tensors, or None when one is not such a
    tensor or has no memory; with ``zeros``, a ZeroTensor passes as an empty array (its sum of
    squares is 0)."""
    ptrs, sizes = [], []
    for t in tensors:
        tp = type(t)
        if ((tp is not _Tensor and tp is not _Param) or t.dtype is not _F32 or not t.is_cpu
                or t.layout is not _STRIDED or not t.is_contiguous()):
            return None
        try:
            ptr = t.data_ptr()
        except (RuntimeError, NotImplementedError):
            return None
        n = t.numel()
        if not ptr and n:  # nothing to read there
            if not (zeros and t._is_zerotensor()):
                return None
            n = 0
        ptrs.append(ptr)
        sizes.append(n)
    return ptrs, sizes


def _ready(tensors: Sequence[torch.Tensor], zeros: bool = False) -> tuple[list[int], list[int]] | None:
    """:func:`_pointers` of ``tensors`` when the kernel is in use (loading it on first use), else None."""
    if not (_lib is not None or (not _tried and available())):
        return None
    return _pointers(tensors, zeros)


def sq_norms(tensors: Sequence[torch.Tensor]) -> np.ndarray | None:
    """Float64 sums of squares of float32 contiguous CPU tensors, in one native call.

    ``sq_norms([g1, g2, ...]) -> np.ndarray`` of shape ``[len(tensors)]`` (take ``np.sqrt`` for
    L2 norms). Each value is squared and summed in float64 (no float32 overflow of finite values,
    no underflow of tiny ones); NaN/Inf in a tensor give NaN/Inf; a ZeroTensor gives 0.
    None when the kernel is not available or any tensor is not a plain float32 contiguous CPU
    tensor (the caller keeps its own path then).
    """
    fast = _fast_sq
    if fast is not None:  # the CPython module: the same checks and sums in C, a fresh array
        return fast(tensors)
    got = _ready(tensors, zeros=True)
    if got is None:
        return None
    ptrs, sizes = got
    k = len(ptrs)
    out = (ctypes.c_double * k)()
    if k:
        i64 = ctypes.c_int64 * k
        _lib.nbd_sq_norms(i64(*ptrs), i64(*sizes), k, out)  # type: ignore[union-attr]
    return np.frombuffer(out, np.float64) if k else np.zeros(0)


_addr_cache: list[tuple[weakref.ref[np.ndarray], int]] = []


def _address(a: np.ndarray) -> int:
    """``a.ctypes.data``, cached for the few long-lived buffers (a lookup costs ~1 µs); held weakly,
    so a snapshot buffer the caller drops is freed."""
    for ref, addr in _addr_cache:
        if ref() is a:
            return addr
    addr = a.ctypes.data
    _addr_cache.insert(0, (weakref.ref(a), addr))
    del _addr_cache[8:]
    return addr


def _flat_f32(a: np.ndarray, n: int) -> None:
    if not (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 1 and a.flags.c_contiguous
            and a.flags.writeable is not None and a.size == n):
        raise ValueError(f"expected a contiguous 1-D float32 array of {n} elements")


def seg_norms(before_flat: np.ndarray, params: Sequence[torch.Tensor]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(sumsq_before, sumsq_diff)`` per parameter for the optimizer watch's update ratios.

    ``before_flat`` is a contiguous 1-D float32 numpy array holding every parameter's values from
    before the step, one after the other in ``params`` order (e.g. filled by :func:`gather`);
    ``params`` are the live float32 contiguous CPU parameters (read through ``data_ptr``, nothing
    copied). Returns two float64 arrays of ``len(params)``: ``sum(before_i ** 2)`` and
    ``sum((before_i - param_i) ** 2)`` (the difference taken in float32, like ``np.subtract`` on
    the two float32 arrays; squares summed in float64 as in :func:`sq_norms`). ``before_flat`` is not modified. None when
    the kernel is not available or a parameter does not qualify; ValueError when ``before_flat``'s
    size is not the parameters' total.
    """
    got = _ready(params)
    if got is None:
        return None
    ptrs, sizes = got
    _flat_f32(before_flat, sum(sizes))
    k = len(ptrs)
    out = (ctypes.c_double * (2 * k))()
    if k:
        i64 = ctypes.c_int64 * k
        _lib.nbd_seg_norms(_address(before_flat), i64(*ptrs), i64(*sizes), k, out, ctypes.byref(out, 8 * k))  # type: ignore[union-attr]
    both = np.frombuffer(out, np.float64) if k else np.zeros(0)
    return both[:k], both[k:]


def seg_plan(before_flat: np.ndarray, params: Sequence[torch.Tensor]) -> Callable[[], tuple[np.ndarray, np.ndarray]] | None:
    """:func:`seg_norms` for a fixed snapshot buffer and fixed parameters, packed once.

    Returns a function of no arguments giving ``(sumsq_before, sumsq_diff)`` exactly as
    ``seg_norms(before_flat, params)`` would at the time of the call (fresh arrays each time), or
    None when :func:`seg_norms` would be None. The plan holds the parameters' addresses: the caller
    must build a new one when a parameter's storage moves (``p.data = ...``: compare ``data_ptr()``s)
    or the buffer changes. It keeps ``before_flat`` alive while it exists.
    """
    got = _ready(params)
    if got is None or not got[0]:
        return None
    ptrs, sizes = got
    _flat_f32(before_flat, sum(sizes))
    k = len(ptrs)
    i64 = ctypes.c_int64 * k
    ptr_arr, size_arr = i64(*ptrs), i64(*sizes)
    seg = _fast_seg
    if seg is not None:  # the CPython module: one call giving two fresh arrays
        run_fast = functools.partial(seg, before_flat.ctypes.data, ctypes.addressof(ptr_arr), ctypes.addressof(size_arr), k, sum(sizes))
        run_fast.keep = (before_flat, ptr_arr, size_arr)  # type: ignore[attr-defined]  # alive as long as the plan
        return run_fast
    out = np.empty(2 * k)
    fn, before_addr, out_addr = _lib.nbd_seg_norms, before_flat.ctypes.data, out.ctypes.data  # type: ignore[union-attr]

    def run() -> tuple[np.ndarray, np.ndarray]:
        fn(before_addr, ptr_arr, size_arr, k, out_addr, out_addr + 8 * k)
        both = out.copy()
        return both[:k], both[k:]

    run.keep = (before_flat, out, ptr_arr, size_arr)  # type: ignore[attr-defined]  # alive as long as the plan
    return run


def gather(params: Sequence[torch.Tensor], out: np.ndarray) -> bool:
    """Copy float32 contiguous CPU tensors one after the other into ``out`` (a contiguous 1-D
    float32 array of their total size): the snapshot :func:`seg_norms` reads. False (nothing
    written) when the kernel is not available or a tensor does not qualify; ValueError on a size
    mismatch."""
    got = _ready(params)
    if got is None:
        return False
    ptrs, sizes = got
    _flat_f32(out, sum(sizes))
    if ptrs:
        i64 = ctypes.c_int64 * len(ptrs)
        _lib.nbd_gather(i64(*ptrs), i64(*sizes), len(ptrs), _address(out))  # type: ignore[union-attr]
    return True
