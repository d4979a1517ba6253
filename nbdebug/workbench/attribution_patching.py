"""Attribution patching (``patch(method="attribution")``; not token attribution, which is
:func:`nbdebug.attribute`): a first-order estimate of every patch at once.

``m(patched) ≈ m(base) + (a_source - a_base) · ∂m/∂a``, the gradient taken on the base run
(Nanda's attribution patching; Syed et al. 2023). It needs the source run's activations (a cached
forward), one forward of the base run that keeps its graph, and one backward with
``torch.autograd.grad`` on the activations (parameters stop requiring grad for the pass: no
``.grad`` is ever written). Exact for a model linear in the patched activation; use ``verify=k`` to
re-measure the top ``k`` exactly.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..adapters.blockparts import PatchParts
from ..adapters.blockrun import BlockRunner
from ..adapters.outputs import logits_of
from ..runs.patchrun import record_run
from .metric import Metric
from .runs import RunState
from .sites import Cell, cell_masks

__all__ = ["PatchEstimate", "estimate_patches"]


@dataclass
class PatchEstimate:
    """Estimated metric of each cell's patched run ``(n,)``, the base run's metric and its activations
    at the kind's sites (detached, one per layer)."""

    estimate: torch.Tensor
    metric_base: float
    base: list[torch.Tensor]


def estimate_patches(model: nn.Module, pp: PatchParts, runner: BlockRunner, metric: Metric, base_ids: torch.Tensor,
              source: RunState, cells: Sequence[Cell], kind: str) -> PatchEstimate:
    """Estimate ``cells`` (all of one kind) from ``source``'s recorded activations and one forward and
    backward of ``base_ids`` (that forward is also the base run: its metric and activations are returned)."""
    mods = pp.sites(kind)
    taps = {kind: [(m, pp.where(kind)) for _, m in mods]}
    args, kwargs = runner.plain_call(base_ids, last_only=not metric.needs_all_positions)
    blocks = [b for _, b in pp.parts.blocks]
    rec = record_run(model, (args, kwargs), blocks, taps, grad=True)
    logits = logits_of(rec.output)
    if logits is None:
        raise RuntimeError(f"no logits in the output of {type(model).__name__}")
    acts = rec.taps[kind]
    with torch.inference_mode(False), torch.enable_grad():
        m = metric(logits)
        grads = torch.autograd.grad(m.sum(), acts, allow_unused=True)
    by_layer: dict[int, list[int]] = defaultdict(list)
    for i, cell in enumerate(cells):
        by_layer[cell.site.layer].append(i)
    out = torch.zeros(len(cells), dtype=torch.float32)
    T = int(base_ids.shape[1])
    with torch.no_grad():
        for layer, idx in by_layer.items():
            g = grads[layer]
            if g is None:  # the metric does not depend on this activation
                continue
            a = acts[layer].detach()
            prod = ((source.activation(kind, layer).to(a.device, a.dtype) - a).float() * g.float())[0]
            mask = cell_masks(pp, [cells[i] for i in idx], 0, T, int(a.shape[-1])).to(prod.device)
            values = (mask * prod).flatten(1).sum(1)
            out[idx] = values.cpu()
    m_base = float(m.detach().sum())
    return PatchEstimate(estimate=m_base + out, metric_base=m_base, base=[a.detach() for a in acts])
