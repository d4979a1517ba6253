"""Grad-CAM and the CAM family on a model call, without a cell or a widget: what the Grad-CAM view runs.

:func:`grad_cam` is the whole thing on a model and its input; :func:`compute_cams` one layer's
CAMs, every method asked for from one forward and one batched backward (the perturbation methods
add their batched forwards, :mod:`nbdebug.cams.perturb`); :func:`probe` the layers
with a spatial output; :class:`GradCamSession` a model call plus the CAMs computed on it so far
(other layers on demand, within a byte budget). They run nbdebug's passes
(:func:`~nbdebug.runs.gradients.target_grads`, :func:`~nbdebug.runs.gradients.probe_pass`:
nbdebug's own forward on cloned buffers, parameters frozen) and hand activations and gradients to
the pure :mod:`nbdebug.inspectors.gradcam`. :mod:`nbdebug.recorders.gradcam` runs them around a
cell (and re-exports these names).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..adapters.outputs import class_scores
from ..adapters.vision import (
    InputSize,
    Reshape,
    SpatialLayer,
    find_image,
    grid_from_config,
    image_hw,
    spatial_layers,
)
from ..capture import DEFAULT_MAX_BYTES, call_name, split_call_name
from ..capture.probe import OutputProbe
from ..capture.select import unwrap_compiled
from ..inspectors.cams import PERTURBATION, parse_methods
from ..inspectors.gradcam import (
    CamMaps,
    LayerError,
    Target,
    cam_maps,
    class_names_for,
    fallback_layers,
    layer_grid,
    pick_layer,
    resolve_targets,
)
from ..runs.gradients import LayerDidNotRun, autograd_inputs, probe_pass, target_grads
from ..runs.progress import Reporter
from .perturb import per_sample_bytes, perturbation_maps

__all__ = ["compute_cams", "grad_cam", "nonzero_fallback", "probe", "spatial_of"]


def spatial_of(model: nn.Module, pr: OutputProbe, hw: tuple[int, int] | None, reshape: Reshape) -> list[SpatialLayer]:
    """The layers with a spatial output among what the probe ``pr`` recorded of ``model``'s first call."""
    return spatial_layers(pr.records, pr.calls, input_hw=hw, grid_hw=grid_from_config(model, hw), reshape=reshape)


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
    methods: Sequence[str] | str | None = None,
    reshape: Reshape = None,
    output_hw: tuple[int, int] | None = None,
    name_of: Callable[[int], str] = str,
    max_bytes: int = DEFAULT_MAX_BYTES,
    item_bytes: int | None = None,
    samples: Sequence[int] | None = None,
    progress: Reporter | None = None,
    auto: bool = False,
) -> tuple[CamMaps, torch.Tensor, torch.Tensor]:
    """CAMs of ``layer`` for the target classes, one map per method: ``(maps, classes B×K, logits B×N)``.

    One forward of nbdebug's own (graph from the layer on, buffers cloned, parameters frozen) and
    one batched backward for all K classes (:func:`~nbdebug.runs.gradients.target_grads`) serve
    every gradient method and EigenCAM; AblationCAM and Score-CAM add their batched forwards
    (``max_bytes`` bounds a chunk, ``item_bytes`` is one perturbed forward's estimate, ``samples``
    limits them to some samples, ``progress`` reports). ``methods`` (default ``[method]``) as
    :func:`~nbdebug.inspectors.cams.parse_methods` reads it. ``auto``: the layer is a guess that is
    dropped when the scores do not depend on it (all-zero gradient), so the perturbation methods
    are not run there. ``args``/``kwargs`` should have gone through
    :func:`~nbdebug.runs.gradients.autograd_inputs`.
    """
    names = parse_methods(methods if methods is not None else method)
    seen: dict[str, torch.Tensor] = {}

    def pick(output: Any) -> torch.Tensor:
        logits = class_scores(output)
        chosen = resolve_targets(targets, logits, topk, name_of) if classes is None else classes
        seen["logits"], seen["classes"] = logits.detach(), chosen.to(logits.device)
        return logits.gather(1, seen["classes"])

    try:
        act, grads = target_grads(model, args, kwargs, layer.module, layer.call, pick)
    except LayerDidNotRun as exc:
        raise LayerError(str(exc)) from None
    grid_hw = grid_from_config(model, output_hw) if layer.grid is None else None
    given: dict[str, torch.Tensor] = {}
    notes: list[str] = []
    if auto and bool((grads == 0).all()):
        names = [m for m in names if m not in PERTURBATION] or ["gradcam"]
    if any(m in PERTURBATION for m in names):
        grid = layer_grid(layer, tuple(act.shape), reshape=reshape, output_hw=output_hw, grid_hw=grid_hw)
        img = find_image(args, dict(kwargs))
        if img is None and "scorecam" in names:
            raise LayerError("scorecam needs an image among the model's inputs")
        per_item = item_bytes if item_bytes is not None else 32 * per_sample_bytes(img if img is not None else act)
        given, notes = perturbation_maps(model, args, dict(kwargs), layer, act, grid, seen["classes"], seen["logits"], names,
                                         reshape=reshape, max_bytes=max_bytes, item_bytes=per_item, samples=samples,
                                         progress=progress)
        names = [m for m in names if m not in PERTURBATION or m in given] or ["gradcam"]
    maps = cam_maps(layer, act, grads, methods=names, given=given, reshape=reshape, output_hw=output_hw, grid_hw=grid_hw)
    maps.notes.extend(notes)
    return maps, seen["classes"].detach(), seen["logits"]


def probe(model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any], reshape: Reshape = None) -> tuple[list[SpatialLayer], str]:
    """``(spatial layers, every output described)`` of ``model`` from one inference pass of nbdebug's
    own (:func:`~nbdebug.runs.gradients.probe_pass`)."""
    size = InputSize()
    pr = probe_pass(model, args, kwargs, on_first_call=size)
    return spatial_of(unwrap_compiled(model), pr, size.hw, reshape), pr.describe_all()


def grad_cam(
    model: nn.Module,
    args: Sequence[Any] | torch.Tensor,
    kwargs: Mapping[str, Any] | None = None,
    *,
    layer: str | None = None,
    targets: Target = "topk",
    topk: int = 5,
    method: str = "gradcam",
    methods: Sequence[str] | str | None = None,
    class_names: Any = None,
    reshape: Reshape = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress: Reporter | None = None,
) -> tuple[CamMaps, torch.Tensor, torch.Tensor, list[SpatialLayer], bool]:
    """Grad-CAM (or ``methods``: ``"all"``, ``"gradcam,eigencam"``, a list) of ``model`` called as
    ``model(*args, **kwargs)``; see :func:`compute_cams`. ``maps.of(method)`` gives each method's.

    Returns ``(maps, classes, logits, spatial_layers, auto)``. With ``layer=None`` the last layer with
    a spatial output is used; if the scores do not depend on its grid (a ViT's final norm only
    feeds the class token) earlier layers are tried, norms first, until one does.
    """
    if isinstance(args, torch.Tensor):
        args = (args,)
    args, kwargs = autograd_inputs(args, kwargs or {})
    layers: list[SpatialLayer] = []
    if layer is not None:  # named layer: no probe pass, the CAM's own forward decides
        base, k = split_call_name(layer)
        unwrap_compiled(model).get_submodule(base)  # AttributeError early for unknown names
        chosen, auto = SpatialLayer(call_name(base, k), base, k, k + 1, (), None, 0, ""), False  # type: ignore[arg-type]
    else:
        layers, described = probe(model, args, kwargs, reshape)
        chosen, auto = pick_layer(layers, layer, described)
    img = find_image(args, kwargs)
    out_hw = image_hw(img) if img is not None else None
    name_of: Callable[[int], str] = str
    if class_names is not None or getattr(getattr(model, "config", None), "id2label", None):
        name_of = class_names_for(model, class_names, 0)
    common = dict(targets=targets, topk=topk, method=method, methods=methods, reshape=reshape, output_hw=out_hw, name_of=name_of,
                  max_bytes=max_bytes, progress=progress, auto=auto)
    try:
        maps, classes, logits = compute_cams(model, args, kwargs, chosen, **common)  # type: ignore[arg-type]
    except LayerError:
        if layer is None:
            raise
        qualify, described = probe(model, args, kwargs, reshape)
        pick_layer(qualify, layer, described)  # raises, saying which layers would qualify
        raise
    if auto:
        found = nonzero_fallback(layers, chosen, maps, lambda cand: compute_cams(model, args, kwargs, cand, classes=classes, **common)[0])  # type: ignore[arg-type]
        if found is not None:
            found[1].note = f"auto layer: {chosen.name} gave a zero gradient, so the last layer the scores depend on is used"
            maps = found[1]
    return maps, classes, logits, layers, auto


def nonzero_fallback(layers: list[SpatialLayer], chosen: SpatialLayer, maps: CamMaps,
                      compute: Callable[[SpatialLayer], CamMaps]) -> tuple[SpatialLayer, CamMaps] | None:
    """When the auto layer's gradient is zero: the first :func:`fallback_layers` candidate whose is not."""
    if maps.zero_grad:
        for cand in fallback_layers(layers, chosen):
            m2 = compute(cand)
            if not m2.zero_grad:
                return cand, m2
    return None
