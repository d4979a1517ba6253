"""Bringing device tensors to the host in as few transfers as possible.

>>> [a.tolist() for a in to_host([torch.ones(2), None, torch.zeros(1)])]  # doctest: +SKIP
[[1.0, 1.0], None, [0.0]]

Tensors are grouped by device and dtype, flattened and concatenated on their device, and cross
with one ``.cpu()`` per group: a capture's samples, histograms and input checks reach the host in
one transfer however many layers there are. CPU tensors are read in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["to_host"]


def to_host(tensors: Sequence[torch.Tensor | None], *, batch_cpu: bool = False) -> list[np.ndarray | None]:
    """Host copies (numpy) of ``tensors`` in their shapes; ``None`` entries stay ``None``.

    ``batch_cpu`` batches CPU tensors like device ones (the accelerator path run on the CPU).
    """
    out: list[np.ndarray | None] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        if t is None:
            continue
        if t.device.type == "cpu" and not batch_cpu:
            out[i] = t.detach().numpy()
        else:
            groups.setdefault((t.device, t.dtype), []).append(i)
    for idxs in groups.values():
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in idxs])  # type: ignore[union-attr]
        host = flat.cpu().numpy()  # the one transfer of this group
        pos = 0
        for i in idxs:
            t = tensors[i]
            assert t is not None
            n = t.numel()
            out[i] = host[pos : pos + n].reshape(tuple(t.shape))
            pos += n
    return out

