"""``--faithfulness`` and ``--sanity`` of the Grad-CAM view on a model call.

:func:`faithfulness`: deletion / insertion / ROAD of each method's map for sample 0 and its first
target, every distinct perturbed image of every method in one batched run
(:class:`~nbdebug.inspectors.faithfulness.Plan` builds them, :class:`~nbdebug.runs.perturb.Perturbed`
runs them). :func:`sanity`: each method's map against the map of a deep copy of the model whose
layers after the CAM layer are re-initialised, from the output down (:func:`reinitialise`); the
user's model is not touched (the copy is made with the user's hooks set aside, and dropped after).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..adapters.outputs import class_scores
from ..adapters.vision import SpatialLayer, find_image, image_layout
from ..capture.select import unwrap_compiled
from ..inspectors.faithfulness import FaithfulnessReport, Plan
from ..inspectors.gradcam import CamMaps
from ..inspectors.sanity import SanityReport, cascade_steps, spearman
from ..runs.gradients import probe_pass
from ..runs.own import hookless_copy
from ..runs.perturb import Perturbed, chunk_size
from ..runs.progress import Reporter
from .methods import compute_cams
from .perturb import per_sample_bytes

__all__ = ["faithfulness", "layers_after", "reinitialise", "sanity"]


def faithfulness(model: nn.Module, args: Sequence[Any], kwargs: dict[str, Any], maps: CamMaps, classes: torch.Tensor, *,
                 name_of: Callable[[int], str] = str, max_bytes: int, item_bytes: int | None = None,
                 progress: Reporter | None = None, seed: int = 0) -> FaithfulnessReport:
    """Deletion, insertion and ROAD curves of every method in ``maps`` (sample 0, class
    ``classes[0, 0]``): the target's softmax probability on each perturbed image."""
    img = find_image(args, kwargs)
    if img is None:
        raise ValueError("faithfulness needs an image among the model's inputs")
    nhwc = image_layout(img) == "nhwc"
    x = img[0].permute(2, 0, 1) if nhwc else img[0]
    plan = Plan(x, {m: torch.as_tensor(maps.of(m)[0][0, 0]) for m in maps.methods}, seed=seed)
    target = int(classes[0, 0])
    n = len(plan.runs)  # an image two methods share runs once
    per_item = item_bytes if item_bytes is not None else 32 * per_sample_bytes(img)
    cpu_input = x.numel() * x.element_size() if x.device.type == "cpu" else None
    runner = Perturbed(model, args, kwargs, sample=0, chunk=chunk_size(max_bytes, per_item, n, cpu_input_bytes=cpu_input),
                       on_chunk=(lambda d, total: progress("faithfulness", d, total)) if progress else None)

    def make(i: int, j: int) -> torch.Tensor:
        batch = plan.build(i, j)
        return batch.permute(0, 2, 3, 1) if nhwc else batch

    def pick(output: Any) -> torch.Tensor:
        return torch.softmax(class_scores(output).float(), dim=1)[:, target : target + 1]

    probs = runner.inputs(make, n, pick)[:, 0].cpu().numpy()
    return plan.report(plan.spread(probs), target, name_of(target), runner.forwards)


def layers_after(model: nn.Module, layer: SpatialLayer, calls: Sequence[tuple[str, int]]) -> list[str]:
    """Modules with parameters of their own whose every call ended after ``layer``'s call (``calls``:
    ``(module, call)`` of the first forward in the order the calls ended), ancestors of the layer's
    module left out; in call order."""
    model = unwrap_compiled(model)
    try:
        at = calls.index((layer.module, layer.call))
    except ValueError:
        return []
    before = {m for m, _ in calls[: at + 1]}
    prefix = layer.module + "."
    out: list[str] = []
    for m, _ in calls[at + 1 :]:
        if m in before or m in out or prefix.startswith(m + ".") or not m:
            continue
        if any(True for _ in model.get_submodule(m).parameters(recurse=False)):
            out.append(m)
    return out


def reinitialise(module: nn.Module, seed: int) -> None:
    """Re-initialise ``module``'s own parameters (a module of nbdebug's copy, never the user's): its
    ``reset_parameters()`` when it has one, else a normal draw with each parameter's own mean and
    standard deviation (0.02 for a constant one). Seeded, on a forked RNG: the user's stream does not move."""
    devices = sorted({p.device.index or 0 for p in module.parameters(recurse=False) if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()
            return
        for p in module.parameters(recurse=False):
            f = p.detach().float()
            std = float(f.std()) if p.numel() > 1 else 0.0
            p.copy_(torch.randn(p.shape, dtype=torch.float32).mul(std or 0.02).add(float(f.mean())).to(p.dtype))


def sanity(model: nn.Module, args: Sequence[Any], kwargs: dict[str, Any], layer: SpatialLayer, maps: CamMaps,
           classes: torch.Tensor, *, calls: Sequence[tuple[str, int]] | None = None, reshape: Any = None,
           output_hw: tuple[int, int] | None = None, max_bytes: int, item_bytes: int | None = None,
           progress: Reporter | None = None, steps: int = 12) -> SanityReport:
    """Spearman ρ between each method's map (sample 0, first target, at the layer's resolution) and
    the same map on a deep copy whose layers after ``layer`` are re-initialised from the output down
    (at most ``steps`` steps; ``calls`` as :func:`layers_after` reads them, from a probe pass of
    nbdebug's own when None). Problems (nothing after the layer, a model that cannot be copied) are
    notes of the report, not errors."""
    report = SanityReport(layer.name)
    if calls is None:
        pr = probe_pass(model, args, kwargs)
        calls = [(r.module, r.call) for r in pr.records]
    after = layers_after(model, layer, calls)
    report.layers = after
    if not after:
        report.notes.append(f"sanity: no layer with parameters runs after {layer.name}; nothing to re-initialise")
        return report
    try:
        clone = hookless_copy(unwrap_compiled(model), own=after)  # only the layers re-initialised are copied
    except Exception as exc:
        report.notes.append(f"sanity: the model could not be copied ({type(exc).__name__}: {exc}); not checked")
        return report
    methods = maps.methods
    for m in methods:
        report.cascade[m] = []
    per_item = item_bytes
    for step, group in enumerate(cascade_steps(after, steps)):
        for name in group:
            reinitialise(clone.get_submodule(name), seed=1000 + after.index(name))
        again, _, _ = compute_cams(clone, args, kwargs, layer, classes=classes, methods=methods, reshape=reshape,
                                   output_hw=output_hw, max_bytes=max_bytes, item_bytes=per_item, samples=[0],
                                   progress=(lambda label, d, n, s=step: progress(f"sanity {s + 1}: {label}", d, n)) if progress else None)
        for m in methods:
            rho = spearman(maps.of(m)[1][0, 0], again.of(m)[1][0, 0])
            report.cascade[m].append((group[-1], rho))
    report.rho = {m: report.cascade[m][-1][1] for m in methods}
    del clone
    nan = [m for m, r in report.rho.items() if np.isnan(r)]
    if nan:
        report.notes.append(f"sanity: the map of {', '.join(nan)} is constant before or after, so ρ is undefined")
    return report
