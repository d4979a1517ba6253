"""References for the workbench tests, written independently of nbdebug.workbench: one full forward
of the model per patch, with plain PyTorch hooks (what TransformerLens' generic_activation_patch does)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn


def logit_diff(answer: int, wrong: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def metric(logits: torch.Tensor) -> torch.Tensor:
        last = logits[:, -1].float()
        return last[:, answer] - last[:, wrong]

    return metric


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return out if isinstance(out, torch.Tensor) else out.logits


def _act(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def record(model: nn.Module, ids: torch.Tensor, module: nn.Module, where: str) -> torch.Tensor:
    """The activation at ``module``'s input (first positional) or output (first element) for ``ids``."""
    seen: list[torch.Tensor] = []
    if where == "input":
        h = module.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    else:
        h = module.register_forward_hook(lambda m, a, o: seen.append(_act(o).detach().clone()))
    try:
        with torch.no_grad():
            logits(model, ids)
    finally:
        h.remove()
    return seen[0]


def patched_metric(model: nn.Module, ids: torch.Tensor, module: nn.Module, where: str, positions: list[int],
                   value: torch.Tensor, metric: Callable[[torch.Tensor], torch.Tensor],
                   features: slice | tuple[Any, ...] = (), ) -> float:
    """One full forward of ``ids`` with ``module``'s activation at ``positions`` (and ``features`` of the
    trailing axes) replaced by ``value``'s."""
    idx = (slice(None), positions, *((features,) if isinstance(features, slice) else features))

    def put(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[idx] = value[idx].to(x.dtype)
        return x

    if where == "input":
        h = module.register_forward_pre_hook(lambda m, a: (put(a[0]), *a[1:]))
    else:
        h = module.register_forward_hook(
            lambda m, a, o: put(o) if isinstance(o, torch.Tensor) else (put(o[0]), *o[1:]))
    try:
        with torch.no_grad():
            return float(metric(logits(model, ids))[0])
    finally:
        h.remove()


def hand_grid(model: nn.Module, base: torch.Tensor, source: torch.Tensor, sites: list[tuple[nn.Module, str]],
              metric: Callable[[torch.Tensor], torch.Tensor], heads: int = 0, head_dim: int = 0,
              z_layout: bool = False, all_positions: bool = False) -> np.ndarray:
    """Raw metric grid, one forward per patch: rows = sites (× heads when ``heads``), columns = positions
    (or heads when ``all_positions``)."""
    T = base.shape[1]
    rows: list[list[float]] = []
    for module, where in sites:
        src = record(model, source, module, where)
        if not heads:
            cols = [list(range(T))] if all_positions else [[p] for p in range(T)]
            rows.append([patched_metric(model, base, module, where, c, src, metric) for c in cols])
            continue

        def feat(h: int) -> Any:
            return (h,) if z_layout else slice(h * head_dim, (h + 1) * head_dim)

        if all_positions:
            rows.append([patched_metric(model, base, module, where, list(range(T)), src, metric, feat(h))
                         for h in range(heads)])
        else:
            for h in range(heads):
                rows.append([patched_metric(model, base, module, where, [p], src, metric, feat(h)) for p in range(T)])
    return np.array(rows)
