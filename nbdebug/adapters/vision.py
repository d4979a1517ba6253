"""Vision adapter: spatial layouts of layer outputs and how to show the input image.

Conv nets give ``B×C×H×W``; some models (torchvision Swin, ConvNeXt variants) keep channels last
(``B×H×W×C``); vision transformers give tokens ``B×N×C`` where ``N`` = leading extra tokens (CLS,
distillation, registers) + ``h·w`` patches. :func:`infer_grid` tells which, :func:`to_nchw` turns
any of them into ``B×C×h×w`` (a view, differentiable), and :func:`image_for_display` undoes the
input normalisation for display.

>>> infer_grid((2, 197, 192), input_hw=(224, 224))
GridInfo(layout='tokens', height=14, width=14, channels=192, extra_tokens=1)
>>> infer_grid((2, 64, 56, 56)).layout
'nchw'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..capture.probe import CallRecord

__all__ = [
    "GridInfo",
    "InputSize",
    "Reshape",
    "SpatialLayer",
    "deepest",
    "describe_normalisation",
    "detect_normalisation",
    "find_image",
    "image_for_display",
    "infer_grid",
    "parse_floats",
    "spatial_layers",
    "to_nchw",
]

#: Escape hatch for layouts the heuristics get wrong: "nchw", "nhwc", "tokens", "tokens:K"
#: (K leading extra tokens), "tokens:K:HxW", or a callable turning the layer output into
#: ``…×C×H×W``; it is applied to the activations (``B×…``) and to the gradient stack (``K×B×…``),
#: so it should only touch the trailing dims (e.g. ``lambda t: t.transpose(-1, -2).unflatten(-1, (14, 14))``).
Reshape = str | Callable[[torch.Tensor], torch.Tensor] | None

_MAX_EXTRA_TOKENS = 16


@dataclass(frozen=True)
class GridInfo:
    """How a layer output maps to a ``B×C×h×w`` grid.

    ``layout`` is ``"nchw"``, ``"nhwc"``, ``"tokens"`` (``B×N×C``, the first ``extra_tokens``
    dropped) or ``"custom"`` (a user callable).
    """

    layout: str
    height: int
    width: int
    channels: int
    extra_tokens: int = 0

    def describe(self) -> str:
        if self.layout == "tokens":
            extra = f", {self.extra_tokens} extra token(s) dropped" if self.extra_tokens else ""
            return f"tokens → {self.height}×{self.width} grid of {self.channels} channels{extra}"
        if self.layout == "nhwc":
            return f"channels-last {self.height}×{self.width}×{self.channels}"
        return f"{self.channels}×{self.height}×{self.width}"


def _token_grid(n: int, input_hw: tuple[int, int] | None, grid_hw: tuple[int, int] | None) -> tuple[int, int, int] | None:
    """``(extra, h, w)`` with ``n = extra + h*w`` (smallest ``extra``), or None."""
    if grid_hw is not None:
        h, w = grid_hw
        extra = n - h * w
        return (extra, h, w) if 0 <= extra <= _MAX_EXTRA_TOKENS else None
    for extra in range(0, min(_MAX_EXTRA_TOKENS, n - 4) + 1):
        m = n - extra
        if input_hw is None or input_hw[0] == input_hw[1]:
            s = math.isqrt(m)
            if s * s == m and s >= 2:
                return extra, s, s
            continue
        ratio = input_hw[0] / input_hw[1]
        h = round(math.sqrt(m * ratio))
        for hh in (h - 1, h, h + 1):
            if hh >= 2 and m % hh == 0:
                ww = m // hh
                if ww >= 2 and abs(hh / ww - ratio) <= 0.1 * ratio:
                    return extra, hh, ww
    return None


def infer_grid(
    shape: Sequence[int],
    *,
    input_hw: tuple[int, int] | None = None,
    grid_hw: tuple[int, int] | None = None,
    reshape: Reshape = None,
) -> GridInfo | None:
    """The spatial layout of a layer output of ``shape``, or None when it has no spatial grid.

    ``input_hw`` (the image size) enables token grids and breaks ties between channels-first and
    channels-last; ``grid_hw`` (e.g. image size // patch size from a HF config) fixes the patch
    grid of token outputs. ``reshape`` forces a layout (see :data:`Reshape`).
    """
    shape = tuple(int(s) for s in shape)
    if isinstance(reshape, str):
        return _forced(shape, reshape, input_hw, grid_hw)
    if len(shape) == 4:
        _, d1, d2, d3 = shape
        if d2 == d3 and d1 != d2:
            layout = "nchw"
        elif d1 == d2 and d3 != d2:
            layout = "nhwc"
        elif input_hw is not None and d1 * d2 > 1:
            r = input_hw[0] / input_hw[1]
            first = abs(d2 / d3 - r) if d3 else math.inf
            last = abs(d1 / d2 - r) if d2 else math.inf
            layout = "nhwc" if last < first and d3 > 4 * max(d1, d2) else "nchw"
        else:
            layout = "nchw"
        h, w, c = (d2, d3, d1) if layout == "nchw" else (d1, d2, d3)
        return GridInfo(layout, h, w, c) if h * w > 1 else None
    if len(shape) == 3 and (input_hw is not None or grid_hw is not None):
        _, n, c = shape
        found = _token_grid(n, input_hw, grid_hw)
        if found is None:
            return None
        extra, h, w = found
        return GridInfo("tokens", h, w, c, extra)
    return None


def _forced(shape: tuple[int, ...], spec: str, input_hw: tuple[int, int] | None, grid_hw: tuple[int, int] | None) -> GridInfo:
    parts = spec.split(":")
    kind = parts[0].lower()
    if kind in ("nchw", "nhwc"):
        if len(shape) != 4:
            raise ValueError(f"reshape={spec!r} needs a 4-d output, got shape {list(shape)}")
        _, d1, d2, d3 = shape
        return GridInfo("nchw", d2, d3, d1) if kind == "nchw" else GridInfo("nhwc", d1, d2, d3)
    if kind == "tokens":
        if len(shape) != 3:
            raise ValueError(f"reshape={spec!r} needs a B×N×C output, got shape {list(shape)}")
        n, c = shape[1], shape[2]
        if len(parts) >= 3:
            h, w = (int(v) for v in parts[2].lower().split("x"))
            extra = int(parts[1]) if parts[1] else n - h * w
        else:
            found = _token_grid(n - int(parts[1]), input_hw, grid_hw) if len(parts) == 2 else _token_grid(n, input_hw, grid_hw)
            if found is None:
                raise ValueError(f"cannot arrange {n} tokens as a grid; pass reshape='tokens:K:HxW'")
            extra, h, w = found
            if len(parts) == 2:
                extra += int(parts[1])
        if extra < 0 or extra + h * w != n:
            raise ValueError(f"reshape={spec!r} does not fit {n} tokens")
        return GridInfo("tokens", h, w, c, extra)
    raise ValueError(f"unknown reshape {spec!r}: use 'nchw', 'nhwc', 'tokens', 'tokens:K' or 'tokens:K:HxW'")


def to_nchw(t: torch.Tensor, grid: GridInfo, reshape: Reshape = None) -> torch.Tensor:
    """``t`` (any batch of layer outputs in ``grid``'s layout) as ``B×C×h×w``; extra leading dims kept.

    Works on gradient stacks too (``K×B×...``): only the last 3 (or 2 for tokens) dims move.
    """
    if callable(reshape):
        return reshape(t)
    if grid.layout == "nchw":
        return t
    if grid.layout == "nhwc":
        return t.movedim(-1, -3)
    if grid.layout == "tokens":
        lead = t.shape[:-2]
        patches = t[..., grid.extra_tokens :, :]
        return patches.reshape(*lead, grid.height, grid.width, grid.channels).movedim(-1, -3)
    raise ValueError(f"unknown layout {grid.layout!r}")


def grid_from_config(model: torch.nn.Module, input_hw: tuple[int, int] | None) -> tuple[int, int] | None:
    """Patch grid of HF ViT-style models (``config.patch_size``), for the input actually passed."""
    config = getattr(model, "config", None)
    patch = getattr(config, "patch_size", None)
    if patch is None or input_hw is None:
        return None
    ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)[:2]
    if not ph or not pw:
        return None
    return input_hw[0] // ph, input_hw[1] // pw


# -- the input image --------------------------------------------------------------------------

def find_image(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The image batch among a model call's arguments: ``pixel_values`` or the first 4-d float tensor."""
    pv = kwargs.get("pixel_values")
    if isinstance(pv, torch.Tensor):
        return pv
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
            return value
    return None


def image_layout(x: torch.Tensor) -> str:
    """``"nchw"`` or ``"nhwc"`` for an image batch (channels are the dim of size 1, 3 or 4)."""
    if x.shape[1] in (1, 3, 4) or x.shape[-1] not in (1, 3, 4):
        return "nchw"
    return "nhwc"


def image_hw(x: torch.Tensor) -> tuple[int, int]:
    return (int(x.shape[2]), int(x.shape[3])) if image_layout(x) == "nchw" else (int(x.shape[1]), int(x.shape[2]))


_CONVENTIONS: tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...] = (
    # x = (pixel - mean) / std with pixel in 0–1
    ("0–1", (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    ("0–255", (0.0, 0.0, 0.0), (1 / 255, 1 / 255, 1 / 255)),
    ("mean=std=0.5 (−1–1)", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    ("ImageNet mean/std", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ("CLIP mean/std", (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
)


def detect_normalisation(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...], str] | None:
    """Guess ``(mean, std, name)`` with ``x = (pixel - mean) / std`` and pixels in 0–1.

    Tries the common conventions in order (0–1, 0–255, ±1, ImageNet, CLIP) and picks the first
    under which every channel's values fall inside 0–1 (2% slack) and use a good part of it
    (span ≥ 0.3). None when none fits (the caller then min-max scales).
    """
    x = x.detach().float()
    cdim = 1 if image_layout(x) == "nchw" else x.dim() - 1
    chans = x.shape[cdim]
    dims = [d for d in range(x.dim()) if d != cdim]
    lo = x.amin(dim=dims).cpu().tolist()
    hi = x.amax(dim=dims).cpu().tolist()
    tol = 0.02
    for name, mean, std in _CONVENTIONS:
        m = [mean[c % 3] for c in range(chans)]
        s = [std[c % 3] for c in range(chans)]
        pix_lo = [lo[c] * s[c] + m[c] for c in range(chans)]
        pix_hi = [hi[c] * s[c] + m[c] for c in range(chans)]
        if min(pix_lo) >= -tol and max(pix_hi) <= 1 + tol and max(h - lo_ for h, lo_ in zip(pix_hi, pix_lo, strict=True)) >= 0.3:
            return tuple(m), tuple(s), name
    return None


def describe_normalisation(mean: Sequence[float], std: Sequence[float]) -> str:
    for name, m, s in _CONVENTIONS:
        if np.allclose(mean, m[: len(mean)], atol=1e-3) and np.allclose(std, s[: len(std)], atol=1e-3):
            return name
    return f"mean={[round(v, 4) for v in mean]}, std={[round(v, 4) for v in std]}"


def parse_floats(value: Any) -> list[float] | None:
    """An image mean/std as the user writes it (``"0.485,0.456,0.406"``, a number, a sequence); None/"" → None."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return [float(v) for v in value.replace(" ", "").split(",") if v]
    if isinstance(value, (int, float)):
        return [float(value)]
    return [float(v) for v in value]


def image_for_display(
    x: torch.Tensor,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> tuple[np.ndarray, str]:
    """``B×H×W×3`` uint8 pixels of an image batch, and how it was de-normalised (a sentence).

    With ``mean``/``std`` given they are used; otherwise :func:`detect_normalisation`; otherwise
    each image is min-max scaled. One- and four-channel images become RGB (gray repeated, alpha
    dropped).
    """
    x = x.detach().float().cpu()
    if image_layout(x) == "nhwc":
        x = x.permute(0, 3, 1, 2)
    how: str
    if mean is not None or std is not None:
        c = x.shape[1]
        m = torch.tensor(list(mean) if mean is not None else [0.0] * c, dtype=torch.float32)
        s = torch.tensor(list(std) if std is not None else [1.0] * c, dtype=torch.float32)
        if m.numel() == 1:
            m = m.expand(c)
        if s.numel() == 1:
            s = s.expand(c)
        pix = x * s[: c, None, None] + m[: c, None, None]
        how = f"de-normalised with the mean/std you passed ({describe_normalisation(m.tolist(), s.tolist())})"
    else:
        found = detect_normalisation(x)
        if found is not None:
            m_, s_, name = found
            c = x.shape[1]
            mt = torch.tensor(m_[:c], dtype=torch.float32)
            st = torch.tensor(s_[:c], dtype=torch.float32)
            pix = x * st[:, None, None] + mt[:, None, None]
            how = f"de-normalised assuming {name} (detected from the value range; pass mean/std to override)"
        else:
            lo = x.amin(dim=(1, 2, 3), keepdim=True)
            hi = x.amax(dim=(1, 2, 3), keepdim=True)
            pix = (x - lo) / (hi - lo).clamp_min(1e-12)
            how = "min-max scaled per image (no known normalisation fits; pass mean/std)"
    if pix.shape[1] == 1:
        pix = pix.expand(-1, 3, -1, -1)
    pix = pix[:, :3]
    out = (pix.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
    return out, how


# -- which layers have a spatial output -------------------------------------------------------

_NORM_WORDS = ("Norm",)


@dataclass(frozen=True)
class SpatialLayer:
    """One call of one module whose (first) output has a spatial grid.

    ``name`` is the call's name in every view (:func:`~nbdebug.capture.names.call_name`): the
    module's qualified name for its first call in the step, ``name#2``, ``name#3`` … for later calls
    of a shared module (e.g. EfficientNet's one ``_swish`` used twice: ``_swish``, ``_swish#2``).
    """

    name: str
    module: str
    call: int  # 0-based
    calls: int
    shape: tuple[int, ...]
    grid: GridInfo  # (None only while a layer named without a probe pass is being computed)
    order: int
    kind: str

    @property
    def is_norm(self) -> bool:
        return any(w in self.kind for w in _NORM_WORDS)


class InputSize:
    """``on_first_call`` of an :class:`~nbdebug.capture.probe.OutputProbe`: the image size (H, W) of the
    model's first call, or None when no image was passed."""

    def __init__(self) -> None:
        self.hw: tuple[int, int] | None = None

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        img = find_image(args, kwargs)
        if img is not None:
            self.hw = image_hw(img)


def spatial_layers(
    records: Sequence[CallRecord],
    calls: dict[str, int],
    *,
    input_hw: tuple[int, int] | None,
    grid_hw: tuple[int, int] | None = None,
    reshape: Reshape = None,
) -> list[SpatialLayer]:
    """The recorded calls whose floating-point output has a spatial grid (see :func:`infer_grid`), in
    completion order (a container after its children); ``calls`` counts the calls of each module.
    Integer and bool outputs (masks, indices) are left out."""
    out: list[SpatialLayer] = []
    for order, rec in enumerate(records):
        if not rec.dtype.is_floating_point:  # masks, indices: not activations to explain or tile
            continue
        try:
            grid = infer_grid(rec.shape, input_hw=input_hw, grid_hw=grid_hw, reshape=reshape if isinstance(reshape, str) else None)
        except ValueError:
            grid = None
        if grid is None and callable(reshape) and len(rec.shape) >= 3:
            grid = GridInfo("custom", 0, 0, 0)
        if grid is None:
            continue
        out.append(SpatialLayer(rec.name, rec.module, rec.call, calls.get(rec.module, 1), rec.shape, grid, order, rec.kind))
    return out


def deepest(layers: Sequence[SpatialLayer]) -> SpatialLayer | None:
    """The last spatial output of the forward pass (the one Grad-CAM tries first): more informative
    to open on than the first one (often a padding or stem layer)."""
    return layers[-1] if layers else None
