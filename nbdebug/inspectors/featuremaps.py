"""Feature maps: per-channel statistics and a compact uint8 encoding of one sample of one layer.

Each channel is quantised to uint8 with its own min/max (sent alongside), so the browser can draw
it with per-channel contrast or, by de-quantising, on a scale shared by all channels. One byte per
pixel; channel pages in any sort order (large C is paged, never dumped).

>>> fm = channel_stats(torch.randn(64, 56, 56))          # doctest: +SKIP
>>> page = encode_page(torch.randn(64, 56, 56), order="max", start=0, count=32)   # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..adapters.vision import GridInfo, to_nchw
from .events import fmt_p

__all__ = ["SORT_KEYS", "ChannelStats", "FeatureMapLayer", "FeatureMapsResult", "Page", "channel_stats", "encode_page",
           "layer_headline", "page_size", "silent_on_all"]

SORT_KEYS = ("index", "mean", "max", "sparsity")


@dataclass
class ChannelStats:
    """Per-channel statistics of one C×h×w map (numpy float32 arrays of length C)."""

    lo: np.ndarray
    hi: np.ndarray
    mean: np.ndarray
    sparsity: np.ndarray  # fraction of exact zeros
    dead: np.ndarray  # bool: every value is exactly zero on this input ("silent on this input": one sample
    #                   cannot tell a dead unit from one this input does not excite)

    def key(self, name: str) -> np.ndarray:
        if name == "index":
            return np.arange(len(self.lo), dtype=np.float32)
        if name == "max":
            return self.hi
        if name not in ("mean", "sparsity"):
            raise ValueError(f"unknown sort key {name!r}; use one of {', '.join(SORT_KEYS)}")
        return getattr(self, name)


def channel_stats(x: torch.Tensor) -> ChannelStats:
    """Statistics of every channel of ``x`` (C×h×w), computed on x's device with one transfer."""
    flat = x.detach().reshape(x.shape[0], -1).float()
    n = max(flat.shape[1], 1)
    # amin/amax/sum/count_nonzero: each a single fast pass (aminmax and std_mean are slower on CPU).
    zeros = 1.0 - torch.count_nonzero(flat, dim=1).float() / n
    packed = torch.stack([flat.amin(dim=1), flat.amax(dim=1), flat.sum(dim=1) / n, zeros]).cpu().numpy()
    return ChannelStats(packed[0], packed[1], packed[2], packed[3], packed[3] >= 1.0)


def quantise(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> np.ndarray:
    """uint8 C×h×w: each channel mapped linearly from [lo, hi] to [0, 255] (constant channels → 0)."""
    span = (hi - lo).clamp_min(torch.finfo(torch.float32).tiny)
    scaled = (x.float() - lo[:, None, None]) * (255.0 / span)[:, None, None]
    return scaled.round_().clamp_(0, 255).to(torch.uint8).cpu().numpy()


def page_size(c: int, h: int, w: int, max_bytes: int = 1 << 20, max_channels: int = 256) -> int:
    """Channels per page: all of them when small, else as many as fit in ``max_bytes`` (≥ 1)."""
    return max(1, min(c, max_channels, max_bytes // max(h * w, 1)))


@dataclass
class Page:
    """One page of channels of one sample: uint8 pixels (n×h×w) with the per-channel lo/hi they need."""

    channels: np.ndarray  # int32 channel indices, in display order
    pixels: np.ndarray  # uint8 n×h×w
    stats: ChannelStats  # of the whole layer (all C channels)
    start: int
    total: int


def encode_page(x: torch.Tensor, *, order: str = "index", descending: bool = True, start: int = 0, count: int | None = None) -> Page:
    """Encode channels ``start:start+count`` of ``x`` (C×h×w) in ``order`` (a :data:`SORT_KEYS` key)."""
    c, h, w = x.shape
    stats = channel_stats(x)
    key = stats.key(order)
    idx = np.arange(c) if order == "index" else np.argsort(-key if descending else key, kind="stable")
    count = page_size(c, h, w) if count is None else count
    chosen = idx[start : start + count].astype(np.int32)
    sel = torch.from_numpy(chosen.astype(np.int64)).to(x.device)
    part = x.detach().index_select(0, sel) if len(chosen) != c or order != "index" else x.detach()
    lo = torch.from_numpy(stats.lo[chosen]).to(x.device)
    hi = torch.from_numpy(stats.hi[chosen]).to(x.device)
    return Page(chosen, quantise(part, lo, hi), stats, start, c)


@dataclass
class FeatureMapLayer:
    """One captured layer: its name, output shape, grid layout, and the kept samples (float tensor)."""

    name: str
    shape: tuple[int, ...]
    grid: GridInfo
    data: torch.Tensor = field(repr=False)

    def maps(self, sample: int = 0) -> torch.Tensor:
        """C×h×w maps of ``sample`` (tokens and channels-last rearranged)."""
        if not 0 <= sample < self.data.shape[0]:
            raise IndexError(f"sample {sample} not kept (0..{self.data.shape[0] - 1})")
        return to_nchw(self.data[sample : sample + 1], self.grid)[0]

    @property
    def samples(self) -> int:
        return int(self.data.shape[0])


@dataclass
class FeatureMapsResult:
    """Feature maps captured in a cell: ``layers`` by call name (``result["layer1"].maps(0)`` → C×h×w).

    ``default_layer`` is the one the view opens on: the deepest spatial output kept.
    """

    layers: dict[str, FeatureMapLayer]
    batch: int
    notes: list[str] = field(default_factory=list)
    default_layer: str = ""

    def __getitem__(self, name: str) -> FeatureMapLayer:
        return self.layers[name]

    def names(self) -> list[str]:
        return list(self.layers)

    def stats(self, layer: str, sample: int = 0) -> ChannelStats:
        return channel_stats(self.layers[layer].maps(sample))


#: silent channels named in the headline (the others are counted; every one is marked in the grid)
NAMED_CHANNELS = 8


def silent_on_all(layer: FeatureMapLayer) -> np.ndarray:
    """Per channel (bool, length C): every value is exactly zero on every kept sample of ``layer``
    (one pass on the layer's device, one transfer)."""
    maps = to_nchw(layer.data, layer.grid)
    return (torch.count_nonzero(maps.detach().transpose(0, 1).reshape(maps.shape[1], -1), dim=1) == 0).cpu().numpy()


def _channels(idx: np.ndarray) -> str:
    ids = [str(int(i)) for i in idx]
    if len(ids) > NAMED_CHANNELS + 1:
        ids = [*ids[:NAMED_CHANNELS], f"{len(ids) - NAMED_CHANNELS} others"]
    return ", ".join(ids[:-1]) + f" and {ids[-1]}" if len(ids) > 1 else ids[0]


def layer_headline(name: str, stats: ChannelStats, *, sample: int = 0, samples: int = 1,
                   silent_all: np.ndarray | None = None) -> str:
    """The feature-map view's sentence for one layer and sample: which channels are silent (every
    value exactly 0). From one kept sample that is all it knows ("silent on this input", never
    "dead": another input may excite them); with several kept samples it says which are silent on
    all of them (``silent_all``, see :func:`silent_on_all`). Otherwise it names the channel that
    peaks highest.

    >>> layer_headline("conv1", channel_stats(torch.zeros(2, 3, 3)))   # doctest: +SKIP
    '`conv1`: 2 of 2 channels are silent on this input (every value 0): 0 and 1.'
    """
    c = len(stats.lo)
    silent = np.flatnonzero(stats.dead)
    where = "this input" if samples <= 1 else f"sample {sample}"
    if c == 0:
        return f"`{name}` has no channels."
    if len(silent) == 0:
        top = int(np.argmax(stats.hi))
        return (f"`{name}`: all {c} channels respond to {where}; channel {top} peaks highest "
                f"(max {stats.hi[top]:.3g}; {fmt_p(float(stats.sparsity.mean()))} of all values are 0).")
    verb = "is" if len(silent) == 1 else "are"
    out = f"`{name}`: {len(silent)} of {c} channels {verb} silent on {where} (every value 0): {_channels(silent)}"
    if samples > 1 and silent_all is not None:
        both = np.flatnonzero(np.asarray(silent_all, bool))
        if len(both) == 0:
            out += f"; none is silent on all {samples} kept inputs"
        elif len(both) == len(silent):
            out += f"; {'it is' if len(both) == 1 else 'all are'} silent on all {samples} kept inputs"
        else:
            out += f"; {_channels(both)} {'is' if len(both) == 1 else 'are'} silent on all {samples} kept inputs"
    return out + "."
