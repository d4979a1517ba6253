"""The residual stream row of a language model: how big the hidden state is after each block.

The quantity people plot first when a deep model misbehaves (a block that multiplies the stream by
100, a stream that grows without bound with depth, NaN from block k on). It comes from the
thermometer's own statistics of each block's output, so it costs no extra hook and no extra
transfer: the root-mean-square over tokens of the per-token L2 norm,

    ``rms_norm = sqrt(Σ_t ‖h_t‖² / tokens) = norm / sqrt(numel / d)``  (whole run: ``norm``, ``numel``)

and per step, from the history's ``mean`` and ``std`` (which do not depend on the sequence length):
``sqrt(d · ((n - 1)/n · std² + mean²))``.

>>> res = residual_stream(result.layers, [name for name, _ in find_parts(model).blocks])  # doctest: +SKIP
>>> res.norm            # (L,) per-token RMS norm after each block
>>> residual_history(result.history, res.blocks)   # (K, L) over the kept steps
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

__all__ = ["ResidualStream", "block_rows", "residual_history", "residual_stream"]


class _Row(Protocol):
    name: str
    shape: tuple[int, ...]
    stats: Mapping[str, float]


@dataclass
class ResidualStream:
    """Per block (in order): ``rows`` the thermometer row read (``None``: that block's output was not
    captured), ``norm`` the per-token RMS norm of its output (float64; NaN when not captured or
    non-finite), ``growth`` ``norm[i] / norm[i - 1]`` (NaN for the first block), ``nonfinite`` NaN/Inf
    in its output. ``d`` is the hidden size; ``largest_jump`` the block with the largest growth."""

    blocks: list[str]
    rows: list[str | None]
    d: int
    norm: np.ndarray
    growth: np.ndarray
    nonfinite: np.ndarray
    notes: list[str] = field(default_factory=list)

    @property
    def largest_jump(self) -> int | None:
        """Index of the block whose output grew the most relative to the previous block (None: no two norms)."""
        g = np.where(np.isfinite(self.growth), self.growth, -np.inf)
        return int(g.argmax()) if np.isfinite(g).any() else None

    @property
    def first_nonfinite(self) -> int | None:
        """Index of the first block whose output holds NaN/Inf."""
        hit = np.flatnonzero(self.nonfinite)
        return int(hit[0]) if hit.size else None


def block_rows(names: Sequence[str], blocks: Sequence[str]) -> list[str | None]:
    """The row holding each block's output: the block's own row (it returns a tensor), else its
    first leaf ``block[0]`` (it returns a tuple, hidden state first); first call only (``#2`` rows
    are later calls). ``None`` where neither was captured."""
    have = set(names)
    return [b if b in have else f"{b}[0]" if f"{b}[0]" in have else None for b in blocks]


def _growth(norm: np.ndarray) -> np.ndarray:
    g = np.full(norm.shape, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        g[..., 1:] = norm[..., 1:] / norm[..., :-1]
    return g


def residual_stream(layers: Sequence[_Row], blocks: Sequence[str]) -> ResidualStream:
    """The residual stream row from a capture's rows (``CaptureResult.layers``: the blocks must be
    among the captured layers) and the block module names in order (``find_parts(model).blocks``)."""
    by_name = {r.name: r for r in layers}
    rows = block_rows(list(by_name), blocks)
    L = len(blocks)
    norm = np.full(L, np.nan)
    nonfinite = np.zeros(L, dtype=bool)
    d = 0
    for i, name in enumerate(rows):
        if name is None:
            continue
        rec = by_name[name]
        d = int(rec.shape[-1]) if rec.shape else 1
        s = rec.stats
        nonfinite[i] = bool(s.get("nan", 0.0) or s.get("inf", 0.0))
        numel = float(s.get("numel", math.nan))
        if not nonfinite[i] and numel > 0:
            norm[i] = float(s["norm"]) / math.sqrt(numel / d)
    notes = []
    missing = [b for b, r in zip(blocks, rows, strict=True) if r is None]
    if missing:
        notes.append(f"{len(missing)} of {L} blocks' outputs were not captured (e.g. {missing[0]}): no residual norm there")
    return ResidualStream(list(blocks), rows, d, norm, _growth(norm), nonfinite, notes)


def residual_history(history: Any, blocks: Sequence[str], agg: str = "last") -> np.ndarray:
    """``(K, L)`` float64 per-token RMS norm after each block at each kept step of ``history``
    (:class:`~nbdebug.capture.history.History`); NaN where the block's output was not captured,
    not seen at that step, or non-finite. ``agg="last"``: each kept bucket's last step;
    ``agg="max"``: an upper bound over a decimated bucket's steps (its largest std and |mean|)."""
    from ..capture.history import FIELD_INDEX

    if agg not in ("last", "max"):
        raise ValueError(f"agg must be 'last' or 'max', got {agg!r}")

    rows = block_rows(history.rows, blocks)
    K = len(history.step_index)
    out = np.full((K, len(blocks)), np.nan)
    if K == 0:
        return out
    vals = history.values(agg)
    index = {name: i for i, name in enumerate(history.rows)}
    mean_i, std_i, nan_i, inf_i = (FIELD_INDEX[f] for f in ("mean", "std", "nan", "inf"))
    for j, name in enumerate(rows):
        if name is None:
            continue
        r = index[name]
        shape = tuple(history.row_info[r].get("shape") or ())
        d = int(shape[-1]) if shape else 1
        n = float(np.prod(shape)) if shape else math.inf
        mean = vals[:, r, mean_i].astype(np.float64)
        if agg == "max":  # the largest |mean| of the bucket: max of |min| and |max| of the mean
            mean = np.maximum(np.abs(mean), np.abs(history.values("min")[:, r, mean_i].astype(np.float64)))
        std = vals[:, r, std_i].astype(np.float64)
        corr = (n - 1) / n if n > 1 and math.isfinite(n) else 1.0
        norm = np.sqrt(d * (corr * std**2 + mean**2))
        bad = (vals[:, r, nan_i] > 0) | (vals[:, r, inf_i] > 0)
        out[:, j] = np.where(bad, np.nan, norm)
    return out
