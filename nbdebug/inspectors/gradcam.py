"""Grad-CAM and Grad-CAM++ on any layer with a spatial output, for CNNs and vision transformers.

One forward pass of nbdebug's own (:func:`~nbdebug.capture.gradients.layer_pass`: gradients
tracked only from the target layer onward, its output swapped for a leaf copy, parameters frozen,
buffers cloned so a graph the user still holds stays valid) and one batched backward through the
part of the model after the layer give the CAMs of all target classes at once. This module holds
no hooks: it picks layers and targets and turns activations and gradients into CAMs
(:func:`cams_from`, pure). The model is left as it was: ``.grad`` untouched, buffers and their
version counters untouched, ``training`` never switched, every hook removed.

    weights_k = mean_ij dScore_c / dA_kij          (Grad-CAM)
    CAM       = ReLU(sum_k weights_k A_k), bilinearly upsampled to the input size

>>> res = grad_cam(model, (x,), layer="layer4", targets="topk", topk=5)   # doctest: +SKIP
>>> res.cams.shape            # (batch, classes, H, W) at input resolution
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..adapters.outputs import class_scores
from ..adapters.vision import (
    GridInfo,
    InputSize,
    Reshape,
    SpatialLayer,
    find_image,
    grid_from_config,
    image_hw,
    infer_grid,
    spatial_layers,
    to_nchw,
)
from ..capture import preserve_buffers, split_call_name
from ..capture.gradients import LayerDidNotRun, autograd_inputs, class_grads, layer_pass
from ..capture.names import call_name
from ..capture.probe import OutputProbe
from ..capture.select import unwrap_compiled
from ..capture.state import suspend_hooks

__all__ = ["CamMaps", "GradCamResult", "LayerError", "Probed", "Target", "cams_from", "class_names_for", "compute_cams", "grad_cam"]

#: "topk", a class index, a class name, or a list of indices/names (the same for every sample).
Target = str | int | Sequence[int | str] | None


class LayerError(ValueError):
    """The requested layer has no spatial output; the message lists the layers that qualify."""


@dataclass
class CamMaps:
    """CAMs of one layer: ``cams`` B×K×H×W at input size, ``low`` B×K×h×w at layer size (ReLU'd, unscaled)."""

    layer: str
    grid: GridInfo
    cams: np.ndarray
    low: np.ndarray
    zero_grad: bool
    note: str = ""


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

    @property
    def cams(self) -> np.ndarray:
        """CAMs of the chosen layer, B×K×H×W (input resolution)."""
        return self.maps[self.layer].cams


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


def _resolve_targets(targets: Target, logits: torch.Tensor, topk: int, name_of: Callable[[int], str]) -> torch.Tensor:
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


def cams_from(act: torch.Tensor, grads: torch.Tensor, method: str, size: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Pure CAM math: ``act`` B×C×h×w, ``grads`` B×K×C×h×w (float) → ``(up B×K×H×W, low B×K×h×w, all-zero gradient)``.

    Grad-CAM weights each channel by its mean gradient; Grad-CAM++ by ``sum_ij alpha_kij ReLU(g_kij)``
    with ``alpha = g² / (2g² + sum_ij A · g³)``. ``size`` is the output size (the input image's).
    """
    a = act.unsqueeze(1)  # B×1×C×h×w
    if method == "gradcam++":
        g2, g3 = grads.pow(2), grads.pow(3)
        denom = 2 * g2 + a.sum(dim=(-2, -1), keepdim=True) * g3
        alpha = torch.where(denom != 0, g2 / torch.where(denom != 0, denom, torch.ones_like(denom)), torch.zeros_like(denom))
        weights = (alpha * F.relu(grads)).sum(dim=(-2, -1))
    elif method == "gradcam":
        weights = grads.mean(dim=(-2, -1))  # B×K×C
    else:
        raise ValueError(f"unknown method {method!r}: use 'gradcam' or 'gradcam++'")
    low = F.relu(torch.einsum("bkc,bchw->bkhw", weights, act))  # B×K×h×w
    size = size or (int(low.shape[-2]), int(low.shape[-1]))
    up = F.interpolate(low, size=size, mode="bilinear", align_corners=False)
    return up, low, bool((grads == 0).all())


def compute_cams(
    model: nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    layer: SpatialLayer,
    *,
    targets: Target = "topk",
    topk: int = 5,
    classes: torch.Tensor | None = None,
    method: str = "gradcam",
    reshape: Reshape = None,
    output_hw: tuple[int, int] | None = None,
    name_of: Callable[[int], str] = str,
) -> tuple[CamMaps, torch.Tensor, torch.Tensor]:
    """CAMs of ``layer`` for the target classes: ``(maps, classes B×K, logits B×N)``.

    One forward of nbdebug's own (:func:`~nbdebug.capture.gradients.layer_pass`: graph from the
    layer on, buffers cloned, parameters frozen) and one batched backward for all K classes.
    ``args``/``kwargs`` should have gone through :func:`~nbdebug.capture.gradients.autograd_inputs`.
    """
    try:
        with layer_pass(model, args, kwargs, layer.module, layer.call) as (output, leaf):
            logits = class_scores(output)
            if classes is None:
                classes = _resolve_targets(targets, logits, topk, name_of)
            classes = classes.to(logits.device)
            grads = class_grads(logits.gather(1, classes), leaf)
    except LayerDidNotRun as exc:
        raise LayerError(str(exc)) from None
    logits, leaf = logits.detach(), leaf.detach()
    grid = layer.grid
    if grid is None:  # a layer named by the caller without a probe pass: the shape decides now
        grid = infer_grid(tuple(leaf.shape), input_hw=output_hw, grid_hw=grid_from_config(model, output_hw),
                          reshape=reshape if isinstance(reshape, str) else None)
        if grid is None and callable(reshape):
            grid = GridInfo("custom", 0, 0, 0)
        if grid is None:
            raise LayerError(f"layer {layer.name!r} has no spatial output (shape {list(leaf.shape)})")
        layer = SpatialLayer(layer.name, layer.module, layer.call, layer.calls, tuple(leaf.shape), grid, layer.order, layer.kind)
    with torch.no_grad():
        act = to_nchw(leaf.detach(), grid, reshape).float()  # B×C×h×w
        g = to_nchw(grads, grid, reshape).float().transpose(0, 1)  # B×K×C×h×w
        up, low, zero = cams_from(act, g, method, output_hw)
    note = ""
    if zero:
        note = (f"the scores do not depend on {layer.name}'s grid positions (gradient is zero), "
                "e.g. a transformer layer after the last attention only feeds the class token")
    maps = CamMaps(layer.name, grid, up.cpu().numpy(), low.cpu().numpy(), zero, note)
    return maps, classes.detach(), logits


class Probed:
    """The spatial layers of one forward pass (see :func:`probe`), and a description of every output."""

    def __init__(self, layers: list[SpatialLayer], described: str) -> None:
        self.layers = layers
        self.described = described

    def spatial(self) -> list[SpatialLayer]:
        return self.layers

    def describe_all(self) -> str:
        return self.described


def probe(model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any], reshape: Reshape = None) -> Probed:
    """Spatial layers of ``model`` from one inference pass of nbdebug's own (buffers untouched, the
    user's hooks not called)."""
    size = InputSize()
    model = unwrap_compiled(model)
    with (suspend_hooks(model), OutputProbe(model, on_first_call=size) as pr, preserve_buffers(model), torch.no_grad(),
          warnings.catch_warnings()):
        warnings.filterwarnings("ignore", message="None of the inputs have requires_grad")  # reentrant checkpoint
        model(*args, **kwargs)
    layers = spatial_layers(pr.records, pr.calls, input_hw=size.hw, grid_hw=grid_from_config(model, size.hw), reshape=reshape)
    return Probed(layers, pr.describe_all())


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


def grad_cam(
    model: nn.Module,
    args: Sequence[Any] | torch.Tensor,
    kwargs: Mapping[str, Any] | None = None,
    *,
    layer: str | None = None,
    targets: Target = "topk",
    topk: int = 5,
    method: str = "gradcam",
    class_names: Any = None,
    reshape: Reshape = None,
    probe_result: Probed | None = None,
) -> tuple[CamMaps, torch.Tensor, torch.Tensor, list[SpatialLayer], bool]:
    """Grad-CAM of ``model`` called as ``model(*args, **kwargs)``; see :func:`compute_cams`.

    Returns ``(maps, classes, logits, spatial_layers, auto)``. With ``layer=None`` the last layer with
    a spatial output is used; if the scores do not depend on its grid (a ViT's final norm only
    feeds the class token) earlier layers are tried, norms first, until one does.
    """
    if isinstance(args, torch.Tensor):
        args = (args,)
    args, kwargs = autograd_inputs(args, kwargs or {})
    pr = probe_result
    if pr is None and layer is not None:  # named layer: no probe pass, the CAM's own forward decides
        base, k = split_call_name(layer)
        unwrap_compiled(model).get_submodule(base)  # AttributeError early for unknown names
        chosen, auto, layers = SpatialLayer(call_name(base, k), base, k, k + 1, (), None, 0, ""), False, []  # type: ignore[arg-type]
    else:
        pr = pr or probe(model, args, kwargs, reshape)
        layers = pr.spatial()
        chosen, auto = pick_layer(layers, layer, pr.describe_all())
    img = find_image(args, kwargs)
    out_hw = image_hw(img) if img is not None else None
    name_of: Callable[[int], str] = str
    if class_names is not None or getattr(getattr(model, "config", None), "id2label", None):
        name_of = class_names_for(model, class_names, 0)
    common = dict(targets=targets, topk=topk, method=method, reshape=reshape, output_hw=out_hw, name_of=name_of)
    try:
        maps, classes, logits = compute_cams(model, args, kwargs, chosen, **common)  # type: ignore[arg-type]
    except LayerError:
        if pr is not None:
            raise
        pr = probe(model, args, kwargs, reshape)  # say which layers would qualify
        pick_layer(pr.spatial(), layer, pr.describe_all())
        raise
    if auto and maps.zero_grad:
        for cand in fallback_layers(layers, chosen):
            m2, _, _ = compute_cams(model, args, kwargs, cand, classes=classes, **common)  # type: ignore[arg-type]
            if not m2.zero_grad:
                m2.note = f"auto layer: {chosen.name} gave a zero gradient, so the last layer the scores depend on is used"
                maps, chosen = m2, cand
                break
    return maps, classes, logits, layers, auto


def infer_grid_for(model: nn.Module, shape: Sequence[int], input_hw: tuple[int, int] | None) -> GridInfo | None:
    """:func:`infer_grid` with the patch grid of HF configs filled in."""
    return infer_grid(shape, input_hw=input_hw, grid_hw=grid_from_config(model, input_hw))
