"""Tensor statistics computed on the tensor's own device, without a host sync per statistic.

The reduction set is the fastest exact one we measured (see benchmarks/bench_capture.py): ``sum``,
``dot(x, x)`` for the sum of squares, ``aminmax`` and ``count_nonzero``. NaN and Inf propagate
through min/max, so the exact NaN/Inf counts are only computed when min or max is non-finite — on
the CPU that check is a plain memory read; on accelerators the counts are always computed on the
device (cheap there) so that nothing waits for the host.

On the host path, float32 CPU tensors take the fused native kernel instead (:mod:`.native`: one pass
for every field and the dead-unit mask; the torch/numpy path of :mod:`.hoststats` when it is off or
unavailable, with the same fields). While TorchDynamo traces a hook (``torch.compile``, compiled
autograd) the host path of a CPU tensor is one custom op (:mod:`.native_op`), chosen on the branch
the kernel's None leads to: the eager calls pay nothing for it.

A raw stat vector is laid out as :data:`FIELDS` (a float64 numpy row on the CPU, a
:class:`DeviceStats` pair of float32/int64 tensors elsewhere — never float64 on the device);
:func:`to_host_rows` brings many over at once and :func:`summarize` turns them into means, stds and
fractions.

>>> v = tensor_stats(torch.tensor([0.0, 1.0, -2.0, 3.0]))
>>> float(summarize(v[None])["mean"][0])
0.5
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from . import native, native_op
from .hoststats import (
    NP_DTYPES,
    NUMPY_MAX,
    count_nonzero,
    cpu_row,
    numpy_alive,
    numpy_stats,
    zero_raw,
)

__all__ = ["FIELDS", "SATURATING", "DeviceStats", "device_histogram", "host_stats", "merge_raw", "stats_and_units", "summarize",
           "tensor_stats", "to_host_rows"]

# Layout of one raw stat vector.
FIELDS = ("numel", "sum", "sumsq", "min", "max", "nonzero", "nan", "inf", "extra")
N_FIELDS = len(FIELDS)
IDX = {name: i for i, name in enumerate(FIELDS)}

# Bounded activations whose outputs pile up at the bounds when they saturate: type name → bounds.
SATURATING = {"Tanh": (-1.0, 1.0), "Sigmoid": (0.0, 1.0), "Hardtanh": (-1.0, 1.0), "Softsign": (-1.0, 1.0), "Hardsigmoid": (0.0, 1.0)}


def _float_view(t: torch.Tensor) -> torch.Tensor:
    """A 1-D float32/float64 view (copy only for half precision, integers and bools)."""
    if t.dtype in (torch.float32, torch.float64):
        x = t.detach()
    else:
        x = t.detach().float()
    return x.reshape(-1)


class DeviceStats(NamedTuple):
    """A raw stat vector still on the tensor's device (no host sync yet).

    ``floats`` is float32 ``[sum, sumsq, min, max]`` (half precision accumulates in float32; no
    float64 on the device: MPS has none), ``counts`` is int64 ``[numel, nonzero, nan, inf, extra]``
    (exact at any size). :func:`to_host_rows` brings many of them over in one transfer per device.
    """

    floats: torch.Tensor
    counts: torch.Tensor

    def clone(self) -> DeviceStats:
        return DeviceStats(self.floats.clone(), self.counts.clone())


Raw = np.ndarray | DeviceStats
_F_IDX = [IDX["sum"], IDX["sumsq"], IDX["min"], IDX["max"]]
_C_IDX = [IDX["numel"], IDX["nonzero"], IDX["nan"], IDX["inf"], IDX["extra"]]


def tensor_stats(
    t: torch.Tensor,
    *,
    saturation: tuple[float, float] | None = None,
    sat_eps: float = 1e-3,
    on_device: bool = False,
) -> Raw:
    """Raw stats of ``t`` laid out as :data:`FIELDS`.

    On the CPU the result is a float64 numpy array (reading a CPU scalar is free); elsewhere, or
    with ``on_device=True`` (the accelerator path run on the CPU, for tests), a
    :class:`DeviceStats` on ``t``'s device, brought to the host once for the whole capture.
    ``saturation=(lo, hi)`` also counts values within ``sat_eps`` of either bound into ``extra``.
    Float32 CPU tensors on the host path go through the fused native kernel when it is available
    (:mod:`.native`: one pass, same fields).
    """
    if not on_device:
        got = native.stats(t, saturation, sat_eps)
        if got is not None:
            return got[0]
        if _is_compiling() and t.device.type == "cpu":  # TorchDynamo traces this call: one op
            return native_op.traced_stats(t, saturation, sat_eps, False)[0]
    return _fallback_stats(t, saturation, sat_eps, on_device)


def host_stats(t: torch.Tensor, saturation: tuple[float, float] | None, sat_eps: float,
               units: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """``(row, alive)`` of a CPU tensor on the host path, eagerly: :func:`stats_and_units` with any
    ``sat_eps`` (the native kernel, else numpy/torch), never routed through the custom op (it is that
    op's CPU kernel, :mod:`.native_op`)."""
    got = native.stats(t, saturation, sat_eps, units)
    if got is not None:
        return got
    raw = _fallback_stats(t, saturation, sat_eps, False)
    return raw, (_fallback_alive(t, raw, False) if units else None)


native_op.serve(host_stats)
_is_compiling = native_op.is_compiling


def _fallback_stats(t: torch.Tensor, saturation: tuple[float, float] | None, sat_eps: float, on_device: bool) -> Raw:
    """:func:`tensor_stats` without the native kernel."""
    if not on_device:
        if t._is_zerotensor():  # no memory to read (numpy refuses it): exact zeros
            return zero_raw(t, saturation, sat_eps)
        if (t.dtype in NP_DTYPES and t.device.type == "cpu" and t.numel() <= NUMPY_MAX
                and t.layout == torch.strided and not t.is_inference()):
            return numpy_stats(t, saturation, sat_eps)
    x = _float_view(t)
    n = x.numel()
    if n == 0:
        out = np.zeros(N_FIELDS)
        out[IDX["min"]] = out[IDX["max"]] = math.nan
        return out
    s = x.sum()
    ss = torch.dot(x, x)
    extra = None
    if saturation is not None:
        lo, hi = saturation
        extra = torch.count_nonzero(x <= lo + sat_eps) + torch.count_nonzero(x >= hi - sat_eps)
    if x.device.type == "cpu" and not on_device:
        return cpu_row(x, n, s, ss, extra)
    mn, mx = torch.aminmax(x)
    nz = count_nonzero(x, sync_free=False)
    zero = torch.zeros((), dtype=torch.int64, device=x.device)
    floats = torch.stack([s, ss, mn, mx]).to(torch.float32)
    numel = torch.full((), n, dtype=torch.int64, device=x.device)
    parts = [numel, nz, torch.isnan(x).sum(), torch.isinf(x).sum(), zero if extra is None else extra]
    return DeviceStats(floats, torch.stack([p.to(torch.int64) for p in parts]))


def merge_raw(a: Raw, b: Raw) -> Raw:
    """Combine two raw stats of one tensor (e.g. a gradient reached twice), without a host sync."""
    if isinstance(a, DeviceStats) and isinstance(b, DeviceStats):
        f = torch.cat([a.floats[:2] + b.floats[:2], torch.minimum(a.floats[2:3], b.floats[2:3]),
                       torch.maximum(a.floats[3:4], b.floats[3:4])])
        return DeviceStats(f, a.counts + b.counts)
    return merge(np.stack([host_row(a), host_row(b)]))


def host_row(raw: Raw) -> np.ndarray:
    """One raw stats as a host row (syncs for a :class:`DeviceStats`: use :func:`to_host_rows`)."""
    if isinstance(raw, np.ndarray):
        return raw
    return to_host_rows([raw])[0]


def to_host_rows(raws: Sequence[Raw]) -> np.ndarray:
    """Stack raw stats into ``[N, len(FIELDS)]`` float64: one transfer per device and kind."""
    out = np.full((len(raws), N_FIELDS), np.nan)
    by_device: dict[torch.device, list[int]] = {}
    for i, r in enumerate(raws):
        if isinstance(r, np.ndarray):
            out[i] = r
        else:
            by_device.setdefault(r.floats.device, []).append(i)
    for idxs in by_device.values():
        floats = torch.stack([raws[i].floats for i in idxs]).cpu().numpy()  # type: ignore[union-attr]
        counts = torch.stack([raws[i].counts for i in idxs]).cpu().numpy()  # type: ignore[union-attr]
        out[np.ix_(idxs, _F_IDX)] = floats
        out[np.ix_(idxs, _C_IDX)] = counts
    return out


def nonfinite(row: np.ndarray) -> bool:
    """Whether a host raw row counts any NaN/Inf."""
    return bool(row[IDX["nan"]] + row[IDX["inf"]] > 0)


def summarize(raw: np.ndarray) -> dict[str, np.ndarray]:
    """Turn raw stat rows (``[N, len(FIELDS)]``, possibly summed/min-maxed across calls) into stats.

    Mean and std are over the finite values when NaN/Inf are present would be misleading, so they
    are reported as NaN then (the NaN/Inf counts say why).
    """
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return _summarize(np.asarray(raw, dtype=np.float64))


def _summarize(raw: np.ndarray) -> dict[str, np.ndarray]:
    n = raw[:, IDX["numel"]]
    safe_n = np.where(n > 0, n, np.nan)
    mean = raw[:, IDX["sum"]] / safe_n
    var = np.maximum(raw[:, IDX["sumsq"]] / safe_n - mean**2, 0.0)
    # Population -> sample variance, like torch.std's default (unbiased).
    var = np.where(n > 1, var * n / np.maximum(n - 1, 1), np.nan)
    return {
        "numel": n,
        "mean": mean,
        "std": np.sqrt(var),
        "min": raw[:, IDX["min"]],
        "max": raw[:, IDX["max"]],
        "zero_frac": 1.0 - raw[:, IDX["nonzero"]] / safe_n,
        "nan": raw[:, IDX["nan"]],
        "inf": raw[:, IDX["inf"]],
        "extra_frac": raw[:, IDX["extra"]] / safe_n,
        "norm": np.sqrt(raw[:, IDX["sumsq"]]),
    }


def merge(rows: np.ndarray) -> np.ndarray:
    """Combine raw stat rows of several calls of one layer into one raw row."""
    out = rows.sum(axis=0)
    out[IDX["min"]] = np.min(rows[:, IDX["min"]])
    out[IDX["max"]] = np.max(rows[:, IDX["max"]])
    return out


def device_histogram(t: torch.Tensor, bins: int) -> torch.Tensor:
    """``bins`` counts of the finite values over [finite min, finite max], then those two bounds.

    All on the device, no data-dependent shapes (no boolean indexing: that syncs on accelerators).
    """
    x = t.detach().reshape(-1).float()
    fin = torch.isfinite(x)
    lo = torch.where(fin, x, torch.inf).min()
    hi = torch.where(fin, x, -torch.inf).max()
    width = torch.clamp(hi - lo, min=1e-30)
    idx = ((x - lo) / width * bins).nan_to_num(0.0).clamp(0, bins - 1).long()
    counts = torch.zeros(bins, device=x.device).scatter_add_(0, idx, fin.float())
    return torch.cat([counts, torch.stack([lo, hi])])


def unit_alive(t: torch.Tensor, sign: int = 0, on_device: bool = False) -> torch.Tensor | np.ndarray | None:
    """bool ``[C]``: which units of ``t`` are non-zero for at least one sample (NaN counts as non-zero).

    A unit is dim 1 (channels of N×C×…, features of N×C); 0-d/1-d and non-float tensors give None.
    ``sign`` is what the caller knows of the values: ``1`` all ≥ 0 (ReLU: a plain max suffices),
    ``-1`` all ≤ 0, ``0`` unknown (max of the absolute values). Reductions only: no host sync
    (``on_device``: torch ops only; else small CPU tensors go through numpy).
    """
    if t.dim() < 2 or not t.is_floating_point() or t.numel() == 0:
        return None
    if not on_device:
        got = native.stats(t, units=True)
        if got is not None:
            return np.ones(t.shape[1], bool) if got[1] is None else got[1]
        if _is_compiling() and t.device.type == "cpu":  # TorchDynamo traces this call: one op
            return native_op.traced_stats(t, None, 1e-3, True)[1]
    return _fallback_units(t, sign, on_device)


def _fallback_units(t: torch.Tensor, sign: int, on_device: bool) -> torch.Tensor | np.ndarray:
    """:func:`unit_alive` without the native kernel (``t``: 2 or more dims, floating point, not empty)."""
    if not on_device and t._is_zerotensor():  # all zeros: every unit dead
        return np.zeros(t.shape[1], bool)
    if not on_device and t.device.type == "cpu" and t.dtype in NP_DTYPES and t.numel() <= NUMPY_MAX and not t.is_inference():
        return numpy_alive(t, sign)
    x = t.detach()
    dims = [0, *range(2, x.dim())]  # one reduction over every dim but the units (faster than two)
    m = x.amin(dims) if sign < 0 else (x if sign > 0 else x.abs()).amax(dims)
    return (m != 0).numpy() if not on_device and m.device.type == "cpu" else m != 0  # the host path: numpy, as the kernel's


def stats_and_units(
    t: torch.Tensor,
    *,
    saturation: tuple[float, float] | None = None,
    units: bool = False,
    on_device: bool = False,
) -> tuple[Raw, torch.Tensor | np.ndarray | None]:
    """:func:`tensor_stats` of ``t`` and, with ``units``, its dead-unit mask (:func:`unit_alive`) in
    one call: ``(raw, alive)``. ``alive`` is None when ``units`` is false, when ``t`` has no units
    (fewer than 2 dims, not floating point) or, on the host path, when no value is zero (every unit
    alive). The forward hook's one entry point for an output. Float32 CPU tensors on the host path:
    one fused native pass for both (:mod:`.native`)."""
    if not on_device:
        got = native.stats(t, saturation, 1e-3, units)
        if got is not None:
            return got
        if _is_compiling() and t.device.type == "cpu":  # TorchDynamo traces this call: one op
            return native_op.traced_stats(t, saturation, 1e-3, units)
    raw = _fallback_stats(t, saturation, 1e-3, on_device)
    return raw, (_fallback_alive(t, raw, on_device) if units else None)


def _fallback_alive(t: torch.Tensor, raw: Raw, on_device: bool) -> torch.Tensor | np.ndarray | None:
    """The unit mask of :func:`stats_and_units` without the native kernel, from ``t``'s raw stats."""
    if t.dim() < 2 or not t.is_floating_point():
        return None
    if not isinstance(raw, np.ndarray):
        return _fallback_units(t, 0, True)
    if raw[IDX["nonzero"]] >= raw[IDX["numel"]]:
        return None
    return _fallback_units(t, 1 if raw[IDX["min"]] >= 0 else (-1 if raw[IDX["max"]] <= 0 else 0), False)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` flattened as int64 without losing a bit (float32 through its int32 bit pattern)."""
    x = t.detach().reshape(-1)
    if x.dtype == torch.float32:
        return x.contiguous().view(torch.int32).to(torch.int64)
    if x.dtype == torch.float64:
        return x.contiguous().view(torch.int64)
    if x.is_floating_point():
        return x.float().contiguous().view(torch.int32).to(torch.int64)
    return x.to(torch.int64)


def packed_to_host(tensors: Sequence[torch.Tensor | None]) -> list[np.ndarray | None]:
    """Host copies (numpy, original shapes) of ``tensors`` in ONE transfer per device.

    Everything is packed into one int64 buffer on its device (float32 through its bit pattern,
    half precision widened to float32, bools and integers as int64) and crosses with a single
    ``.cpu()``; float tensors come back as float32 (float64 stays float64), the rest as int64/bool.
    """
    out: list[np.ndarray | None] = [None] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        if t is not None:
            by_device.setdefault(t.device, []).append(i)
    for idxs in by_device.values():
        flat = torch.cat([_bits(tensors[i]) for i in idxs]).cpu().numpy()  # type: ignore[arg-type]
        pos = 0
        for i in idxs:
            t = tensors[i]
            assert t is not None
            n = t.numel()
            chunk = flat[pos : pos + n]
            pos += n
            if t.dtype == torch.float64:
                arr = chunk.view(np.float64)
            elif t.is_floating_point():
                arr = chunk.astype(np.int32).view(np.float32)
            elif t.dtype == torch.bool:
                arr = chunk.astype(bool)
            else:
                arr = chunk
            out[i] = arr.reshape(tuple(t.shape))
    return out


def raw_from_host(floats: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """A host raw row from the two host arrays of a :class:`DeviceStats`."""
    out = np.empty(N_FIELDS)
    out[_F_IDX] = floats
    out[_C_IDX] = counts
    return out
