"""The perturbation CAMs (AblationCAM, Score-CAM) on a model call.

:func:`perturbation_maps` builds the perturbed copies with :mod:`nbdebug.inspectors.cams`
(:func:`~nbdebug.inspectors.cams.ablated`, :func:`~nbdebug.inspectors.cams.score_masks`), runs them
batched under the byte budget (:class:`~nbdebug.runs.perturb.Perturbed`: AblationCAM from the
layer on only, Score-CAM on masked inputs) and turns the scores into maps; progress is reported as a
:data:`~nbdebug.runs.progress.Reporter` (:class:`~nbdebug.runs.progress.LabelledProgress` draws it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..adapters.outputs import class_scores
from ..adapters.vision import GridInfo, SpatialLayer, image_layout, to_nchw
from ..capture import format_bytes
from ..inspectors.cams import ablated, ablation_map, score_map, score_masks
from ..runs.perturb import Perturbed, chunk_size
from ..runs.progress import LabelledProgress, Reporter

__all__ = ["per_sample_bytes", "perturbation_maps"]

def per_sample_bytes(t: torch.Tensor) -> int:
    """Bytes of one sample of a batch ``t``."""
    return int(t[:1].numel() * t.element_size()) if t.dim() else int(t.element_size())


def _channel_dim(grid: GridInfo) -> int | None:
    """The channel dim of one sample's layer output (no batch dim) in its native layout."""
    return {"nchw": 0, "nhwc": -1, "tokens": -1}.get(grid.layout)


def perturbation_maps(
    model: nn.Module,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    layer: SpatialLayer,
    act: torch.Tensor,
    grid: GridInfo,
    classes: torch.Tensor,
    logits: torch.Tensor,
    methods: Sequence[str],
    *,
    reshape: Any = None,
    max_bytes: int,
    item_bytes: int,
    samples: Sequence[int] | None = None,
    progress: Reporter | None = None,
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """``({method: B×K×h×w map}, notes)`` of the perturbation methods among ``methods`` at ``layer``.

    ``act`` is the layer's output (native layout, B×…), ``classes`` B×K, ``logits`` B×N the scores of
    the pass that produced ``act``. One sample at a time (``samples``: only these; the others'
    maps stay 0): AblationCAM's copies run from the layer on (``C`` forwards of the rest of the
    model), Score-CAM's masked inputs through the whole model; ``item_bytes`` is what one copy's
    forward is expected to need (the chunks' size under ``max_bytes``).
    """
    a = to_nchw(act, grid, reshape).float()
    b_all, c = int(a.shape[0]), int(a.shape[1])
    picked = list(range(b_all)) if samples is None else [s for s in samples if 0 <= s < b_all]
    out: dict[str, torch.Tensor] = {}
    notes: list[str] = []
    want = [m for m in ("ablationcam", "scorecam") if m in methods]
    if not want:
        return out, notes
    dim = _channel_dim(grid)
    for method in want:
        if method == "ablationcam" and dim is None:
            notes.append(f"ablationcam at {layer.name}: a custom reshape hides which dim of the output is channels; not computed")
            continue
        low = torch.zeros(b_all, classes.shape[1], *a.shape[-2:], dtype=a.dtype, device=a.device)
        item = per_sample_bytes(act) * 3 if method == "ablationcam" else item_bytes
        chunk = chunk_size(max_bytes, item, c)
        label = f"{method} at {layer.name}"
        for pos, b in enumerate(picked):
            cls = classes[b].to(logits.device)

            def pick(output: Any, cls: torch.Tensor = cls) -> torch.Tensor:
                scores = class_scores(output).float()
                return scores.index_select(1, cls.to(scores.device))

            runner = Perturbed(model, args, kwargs, sample=b, chunk=chunk,
                               on_chunk=(lambda d, n, pos=pos, label=label: progress(label, pos * c + d, len(picked) * c)) if progress else None)
            if method == "ablationcam":
                one = act[b]
                drop = runner.layer(layer.module, layer.call, lambda i, j, one=one: ablated(one, range(i, j), dim), c, pick)  # type: ignore[arg-type]
                low[b] = ablation_map(a[b : b + 1], logits[b : b + 1].float().index_select(1, cls).to(a.device),
                                      drop.to(a.device)[None])[0]
            else:
                image = runner.image
                nhwc = image_layout(image[None]) == "nhwc"
                hw = (int(image.shape[0]), int(image.shape[1])) if nhwc else (int(image.shape[-2]), int(image.shape[-1]))
                masks = score_masks(a[b], hw).to(image.device)  # C×1×H×W

                def make(i: int, j: int, image: torch.Tensor = image, masks: torch.Tensor = masks, nhwc: bool = nhwc) -> torch.Tensor:
                    m = masks[i:j].permute(0, 2, 3, 1) if nhwc else masks[i:j]
                    return (image.unsqueeze(0).float() * m).to(image.dtype)

                scores = runner.inputs(make, c, pick)
                low[b] = score_map(a[b : b + 1], scores.to(a.device)[None])[0]
        if chunk < c:
            notes.append(f"{method} at {layer.name}: {c} channels, one forward each (~{format_bytes(item)}) do not fit "
                         f"--max-bytes {format_bytes(max_bytes)} at once; ran in chunks of {chunk}")
        out[method] = low
    if isinstance(progress, LabelledProgress):
        progress.close()
    if want and model.training:
        notes.append("the model is in training mode: batch statistics and dropout applied to each chunk of perturbed copies")
    return out, notes
