"""The CAM family on any layer with a spatial output, for CNNs and vision transformers: the results.

Pure computation, no hooks and no model passes: :func:`cam_maps` turns a layer's activation and the
gradients of K class scores with respect to it into one map per method (the math of each method is
in :mod:`nbdebug.inspectors.cams`; the perturbation methods' maps come in ready-made),
:func:`resolve_targets` picks the classes, :func:`pick_layer` / :func:`fallback_layers` the layer.
The passes that produce activations and gradients (one forward of nbdebug's own, one batched
backward) are :func:`~nbdebug.runs.gradients.target_grads` /
:func:`~nbdebug.runs.gradients.probe_pass`, run by :mod:`nbdebug.recorders.gradcam` (``grad_cam()``
there is the whole thing without a widget).

    weights_k = mean_ij dScore_c / dA_kij          (Grad-CAM)
    CAM       = ReLU(sum_k weights_k A_k), bilinearly upsampled to the input size
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..adapters.vision import GridInfo, Reshape, SpatialLayer, infer_grid, to_nchw
from ..capture.names import call_name, split_call_name
from .cams import GRADIENT, eigen_map, gradient_map
from .events import fmt_p

__all__ = [
    "CamMaps", "GradCamResult", "LayerError", "Target", "cam_maps", "class_label", "class_names_for",
    "fallback_layers", "layer_grid", "overlay_headline", "parse_target", "pick_layer", "resolve_targets", "upsample",
]

#: "topk", a class index, a class name, or a list of indices/names (the same for every sample).
Target = str | int | Sequence[int | str] | None


class LayerError(ValueError):
    """The requested layer has no spatial output; the message lists the layers that qualify."""


@dataclass
class CamMaps:
    """CAMs of one layer: ``cams`` B×K×H×W at input size, ``low`` B×K×h×w at layer size (ReLU'd,
    unscaled), of the first method; ``by_method[m] = (cams, low)`` of every method computed."""

    layer: str
    grid: GridInfo
    cams: np.ndarray
    low: np.ndarray
    zero_grad: bool
    note: str = ""
    by_method: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    #: what the perturbation methods had to say (chunks under the budget, training mode)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.by_method:
            self.by_method = {"": (self.cams, self.low)}

    @property
    def methods(self) -> list[str]:
        """The methods whose maps this holds, in order."""
        return [m for m in self.by_method if m]

    def of(self, method: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(cams, low)`` of ``method`` (None: the first)."""
        if method is None:
            return self.cams, self.low
        if method not in self.by_method:
            raise KeyError(f"no {method!r} maps for {self.layer}; computed: {', '.join(self.methods) or 'one'}")
        return self.by_method[method]

    @property
    def nbytes(self) -> int:
        """Bytes of every method's maps."""
        return sum(int(c.nbytes + lo.nbytes) for c, lo in self.by_method.values())


@dataclass
class GradCamResult:
    """Everything the Grad-CAM view shows, as plain data.

    ``classes``/``scores``/``probs`` are B×K (the K targets of each sample, top-k order when
    ``targets="topk"``); ``class_names`` B×K strings; ``maps[layer]`` the :class:`CamMaps` computed
    so far (the auto layer first); ``layers`` every layer with a spatial output (selectable).
    """

    layer: str
    auto_layer: bool
    method: str
    classes: np.ndarray
    scores: np.ndarray
    probs: np.ndarray
    class_names: list[list[str]]
    layers: list[str]
    maps: dict[str, CamMaps]
    image: np.ndarray | None
    image_note: str
    notes: list[str] = field(default_factory=list)
    #: every method computed, in the view's order (``method`` is the first)
    methods: list[str] = field(default_factory=list)
    #: ``--faithfulness``: method → ``{"deletion", "insertion", "road_morf", "road_lerf"}`` AUCs (sample 0, first target)
    faithfulness: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the curves and ranking behind :attr:`faithfulness` (a ``FaithfulnessReport``), or None
    faithfulness_report: Any = None
    #: ``--sanity``: method → Spearman ρ between the map and the map with every layer after the CAM layer re-initialised
    sanity: dict[str, float] = field(default_factory=dict)
    #: method → ``[(layer, ρ)]``, layers re-initialised from the output down, one more each time
    sanity_cascade: dict[str, list[tuple[str, float]]] = field(default_factory=dict)

    @property
    def cams(self) -> np.ndarray:
        """CAMs of the chosen layer, B×K×H×W (input resolution)."""
        return self.maps[self.layer].cams

    def cam(self, method: str | None = None) -> np.ndarray:
        """``method``'s CAMs of the chosen layer, B×K×H×W at the input's resolution (None: the first method)."""
        return self.maps[self.layer].of(method)[0]

    def low(self, method: str | None = None) -> np.ndarray:
        """``method``'s own map of the chosen layer, B×K×h×w at the layer's resolution (before
        upsampling and normalisation; None: the first method)."""
        return self.maps[self.layer].of(method)[1]


def class_names_for(model: nn.Module, names: Any, n_classes: int) -> Callable[[int], str]:
    """Class index → display name, from a list/dict/callable the user passed or ``config.id2label``."""
    if names is None:
        id2label = getattr(getattr(model, "config", None), "id2label", None)
        names = dict(id2label) if id2label else None
    if names is None:
        return str
    if callable(names) and not isinstance(names, (Mapping, Sequence)):
        return lambda i: str(names(i))
    if isinstance(names, Mapping):
        lookup = {int(k): str(v) for k, v in names.items()}
        return lambda i: lookup.get(i, str(i))
    seq = [str(v) for v in names]
    return lambda i: seq[i] if 0 <= i < len(seq) else str(i)


def class_label(name: str, index: int) -> str:
    """A class as the view writes it: its name quoted (``'tabby'``), or ``class 285`` when no name is
    known (the name is then the index itself: pass ``class_names=`` to get names)."""
    return f"class {index}" if str(name) == str(index) else repr(str(name))


def overlay_headline(method: str, layer: str, cam: np.ndarray, *, name: str, index: int, prob: float, rank: int,
                     zero_grad: bool = False, note: str = "") -> str:
    """The single-method Grad-CAM view's sentence for one sample, class and layer: how much of the
    image the map points at (the share of pixels at half its peak or more), with the class's
    probability written as everywhere (:func:`~nbdebug.inspectors.events.fmt_p`). When the map is
    empty (a zero gradient at this layer, or no positive evidence), it says so instead.

    ``cam`` H×W (≥ 0, at the input's size); ``rank`` 0-based among the sample's target classes.
    """
    who = f"{class_label(name, index)} (#{rank + 1}, p {fmt_p(prob)})"
    peak = float(np.max(cam)) if cam.size else 0.0
    if zero_grad or not peak > 0:
        why = note or "no position of this layer raises the class score"
        return f"{method} on `{layer}` shows nothing for {who}: {why}."
    share = float(np.mean(cam >= 0.5 * peak))
    return f"{method} on `{layer}` for {who}: {fmt_p(share)} of the image is at half the map's peak or more."


def parse_target(value: Any) -> Target:
    """A ``--target`` as written: ``topk`` (also None, "", ``top``, ``auto``), ``3``, ``tabby``, ``3,tabby``."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "topk", "top", "auto")):
        return "topk"
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        items: list[int | str] = [int(p) if p.lstrip("-").isdigit() else p for p in parts]
        return items[0] if len(items) == 1 else items
    return value


def resolve_targets(targets: Target, logits: torch.Tensor, topk: int, name_of: Callable[[int], str]) -> torch.Tensor:
    """B×K class indices from the B×N scores: the top ``topk`` of each sample, or the named/indexed classes."""
    b, n = logits.shape
    if targets is None or (isinstance(targets, str) and targets.lower() in ("topk", "top", "auto")):
        return logits.detach().topk(min(topk, n), dim=1).indices
    items = [targets] if isinstance(targets, (int, str)) else list(targets)
    idx: list[int] = []
    lookup: dict[str, int] | None = None
    for t in items:
        if isinstance(t, str) and t.lstrip("-").isdigit():
            t = int(t)
        if isinstance(t, int):
            if not -n <= t < n:
                raise ValueError(f"class {t} out of range: the model has {n} classes")
            idx.append(t % n)
            continue
        if lookup is None:
            lookup = {name_of(i).lower(): i for i in range(n)}
        key = str(t).lower()
        hits = [i for nm, i in lookup.items() if nm == key] or [i for nm, i in lookup.items() if key in [p.strip() for p in nm.split(",")]]
        if not hits:
            close = [nm for nm in lookup if key in nm][:5]
            hint = f" Close: {', '.join(close)}" if close else ""
            raise ValueError(f"no class named {t!r}.{hint}")
        idx.append(hits[0])
    return torch.tensor(idx, device=logits.device).unsqueeze(0).expand(b, -1)


def upsample(low: torch.Tensor, size: tuple[int, int] | None) -> torch.Tensor:
    """``low`` (…×h×w) bilinearly upsampled to ``size`` (the input image's; None: as is)."""
    size = size or (int(low.shape[-2]), int(low.shape[-1]))
    return F.interpolate(low, size=size, mode="bilinear", align_corners=False)


def layer_grid(layer: SpatialLayer, shape: tuple[int, ...], *, reshape: Reshape = None, output_hw: tuple[int, int] | None = None,
               grid_hw: tuple[int, int] | None = None) -> GridInfo:
    """The grid of ``layer``'s output (of ``shape``): the probe's, else worked out from the shape
    (``grid_hw``: a ViT config's patch grid); LayerError when it has none."""
    grid = layer.grid
    if grid is None:
        grid = infer_grid(shape, input_hw=output_hw, grid_hw=grid_hw, reshape=reshape if isinstance(reshape, str) else None)
        if grid is None and callable(reshape):
            grid = GridInfo("custom", 0, 0, 0)
        if grid is None:
            raise LayerError(f"layer {layer.name!r} has no spatial output (shape {list(shape)})")
    return grid


def cam_maps(
    layer: SpatialLayer,
    act: torch.Tensor,
    grads: torch.Tensor | None,
    *,
    method: str = "gradcam",
    methods: Sequence[str] | None = None,
    given: Mapping[str, torch.Tensor] | None = None,
    reshape: Reshape = None,
    output_hw: tuple[int, int] | None = None,
    grid_hw: tuple[int, int] | None = None,
    k: int | None = None,
) -> CamMaps:
    """CAMs of ``layer`` from its output ``act`` and ``grads`` (K×(act shape), one per target class;
    None when no gradient method is asked for, then ``k`` says how many classes), one map per method
    of ``methods`` (default ``[method]``); ``given`` holds maps computed elsewhere (the perturbation
    methods', B×K×h×w).

    ``layer.grid`` None (a layer named by the caller without a probe pass): the activation's shape
    decides (``grid_hw``: a ViT config's patch grid). ``output_hw``: the input image's size.
    """
    names = list(methods or [method])
    grid = layer_grid(layer, tuple(act.shape), reshape=reshape, output_hw=output_hw, grid_hw=grid_hw)
    by: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    zero = False
    with torch.no_grad():
        a = to_nchw(act, grid, reshape).float()  # B×C×h×w
        if grads is not None:
            g = to_nchw(grads, grid, reshape).float().transpose(0, 1)  # B×K×C×h×w
            zero = bool((g == 0).all())
        n_cls = int(grads.shape[0]) if grads is not None else int(k or 1)
        for m in names:
            if given is not None and m in given:
                low = given[m].float()
            elif m == "eigencam":
                low = eigen_map(a, n_cls)
            elif m in GRADIENT:
                if grads is None:
                    raise ValueError(f"{m} needs the gradients of the class scores")
                low = gradient_map(m, a, g)
            else:
                raise ValueError(f"no maps given for {m!r}")
            by[m] = (upsample(low, output_hw).cpu().numpy(), low.cpu().numpy())
    note = ""
    if zero and any(m in GRADIENT for m in names):
        note = (f"the scores do not depend on {layer.name}'s grid positions (gradient is zero), "
                "e.g. a transformer layer after the last attention only feeds the class token")
    first = by[names[0]]
    return CamMaps(layer.name, grid, first[0], first[1], zero, note, by)


def pick_layer(layers: list[SpatialLayer], requested: str | None, describe: str = "") -> tuple[SpatialLayer, bool]:
    """The requested layer (a call name: ``act``, ``act#2``), or the auto choice (last spatial layer) and whether auto."""
    candidates = [lay for lay in layers if lay.module]
    if not candidates:
        raise LayerError(f"no layer has a spatial output (B×C×H×W, B×H×W×C or a token grid); outputs seen: {describe}")
    if requested is None:
        return candidates[-1], True
    base, call = split_call_name(requested)
    name = call_name(base, call)
    hits = [lay for lay in candidates if lay.name == name]
    if not hits and "#" not in requested:  # a bare module name: its last call
        hits = [lay for lay in candidates if lay.module == requested]
    if not hits:
        names = [lay.name for lay in candidates]
        import difflib

        close = difflib.get_close_matches(requested, names, n=5, cutoff=0.4)
        listed = ", ".join((close or []) + [n for n in names[-8:] if n not in close])
        more = f", {len(names)} in all" if len(names) > 8 else ""
        raise LayerError(f"layer {requested!r} has no spatial output or did not run (layers that qualify: {listed}{more})")
    return hits[-1], False


def fallback_layers(layers: list[SpatialLayer], failed: SpatialLayer, limit: int = 40) -> list[SpatialLayer]:
    """Candidates to try when the auto layer's gradient is zero, latest first.

    Conv maps (an HF backbone whose pooled output, not its feature map, feeds the head): the
    layers just before, in order. Token grids (a ViT's final norm only feeds the class token): the
    three latest norms first, i.e. the last block's input norm, where pytorch-grad-cam users put it.
    """
    earlier = [lay for lay in layers if lay.module and lay.order < failed.order][::-1][:limit]
    if failed.grid is None or failed.grid.layout != "tokens":
        return earlier
    norms = [lay for lay in earlier if lay.is_norm][:3]
    return norms + [lay for lay in earlier if lay not in norms]
