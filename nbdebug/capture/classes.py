"""The class make-up of a step's batch, read from the gradient of the model's classifier output
(one ``[N, C]`` tensor per step: the model's own output, never a layer's), for the ``unshuffled``
finding (:mod:`~nbdebug.inspectors.run_findings_order`).

Cross-entropy's gradient with respect to the logits is ``(softmax − one_hot(y)) × w`` (``w > 0``: the
reduction's 1/N, a class weight): in each row the label's entry is the only negative one (the only
non-positive one when the softmax is saturated at 1), whatever the loss's scale. NLL on log-softmax
outputs gives ``−w`` at the label and 0 elsewhere: one negative entry too. So a row with exactly one
negative entry, or with none and exactly one ≤ 0, names its sample's label (its argmin) without the
labels being seen; any other row (a regression's, label smoothing's, a perfectly fitted row of
zeros) names none. :func:`batch_classes` keeps two numbers per step: the share of the batch's rows
whose label is the most frequent one (``class_share``: 0 when no row names a label) and that label
(``class_top``). A shuffled 10-class batch of 64 has a share near 0.2; a batch of one class has 1.

Cost: a few vectorised operations on the ``[N, C]`` gradient, on the device (float32 counts, no
float64, no host sync: the two numbers cross with the step's one transfer) or in numpy for a float32
CPU tensor. Skipped for ``C`` outside [2, :data:`MAX_CLASSES`] and for one-sample batches.

>>> g = torch.tensor([[-0.3, 0.1, 0.2], [0.2, -0.5, 0.3], [0.1, -0.2, 0.1], [0.0, 0.0, 0.0]])
>>> batch_classes(g, False).tolist()                    # rows 1 and 2 are class 1, row 3 names none
[0.5, 1.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["MAX_CLASSES", "batch_classes", "classifier_output"]

#: more classes than this (a language model's vocabulary): no statistic (its cost grows with C)
MAX_CLASSES = 1024
_F32 = np.float32


def classifier_output(t: Any) -> bool:
    """``t`` is a classifier's ``[N, C]`` floating output (2 ≤ C ≤ :data:`MAX_CLASSES`, N ≥ 2) that
    a backward can reach (it requires grad: absent under ``no_grad``/``inference_mode``)."""
    return isinstance(t, torch.Tensor) and t.dim() == 2 and t.requires_grad and \
        t.is_floating_point() and 2 <= t.shape[1] <= MAX_CLASSES and t.shape[0] >= 2


def batch_classes(g: torch.Tensor, on_device: bool) -> Any:
    """``[class_share, class_top]`` of the output gradient ``g`` (see the module doc): a float32 numpy
    array for a float32 CPU tensor off the device path, else a float32 tensor on ``g``'s device."""
    n, c = g.shape
    if not on_device and g.device.type == "cpu" and g.dtype == torch.float32:
        a = g.detach().numpy()
        ok = (a < 0).sum(1) == 1
        if not ok.all():  # rows saturated at 1 (no negative entry): the one entry ≤ 0 is the label
            ok |= (a <= 0).sum(1) == 1
        counts = np.bincount(a.argmin(1)[ok], minlength=c)
        top = int(counts.argmax())
        return np.array([counts[top] / n, top], _F32)
    g = g.detach()
    neg = (g < 0).sum(1)
    ok = (neg == 1) | ((g <= 0).sum(1) == 1)
    counts = torch.zeros(c, dtype=torch.float32, device=g.device).index_add_(0, g.argmin(1), ok.to(torch.float32))
    top, at = counts.max(0)
    return torch.stack([top / n, at.to(torch.float32)])
