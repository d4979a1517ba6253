"""The CAM family's math, one small function per method: pure torch, no hooks, no model passes.

With ``A`` a layer's activation (``B×C×h×w``), ``g = dy_c/dA`` the gradients of K class scores
(``B×K×C×h×w``) and ``ε = 1e-7``, each method returns its own map ``B×K×h×w`` at the layer's
resolution (before upsampling and normalisation):

==============  ===========================================================================
gradcam         ``ReLU(Σ_k mean_hw(g_k) A_k)``
gradcam++       ``ReLU(Σ_k w_k A_k)``, ``w_k = Σ_hw α ReLU(g_k)``, ``α = g² / (2g² + Σ_hw A · g³)``
hirescam        ``ReLU(Σ_k g_k ⊙ A_k)``
xgradcam        ``ReLU(Σ_k w_k A_k)``, ``w_k = Σ_hw(g_k A_k) / (Σ_hw A_k + ε)``
layercam        ``ReLU(Σ_k ReLU(g_k) ⊙ A_k)``
eigencam        ``A`` (positions × channels, centred over positions) projected on its first
                right-singular vector; no gradient, the same map for every class, the sign as
                the SVD gives it (no ReLU: :func:`eigen_map`)
ablationcam     ``ReLU(Σ_k w_k A_k)``, ``w_k = (y_c − y_c with channel k zeroed) / y_c``
scorecam        ``ReLU(Σ_k w_k A_k)``, ``w = softmax_k`` of the target logit of the input times
                ``A_k`` upsampled (bilinear) and min-max normalised to [0, 1]
==============  ===========================================================================

The perturbation methods need forwards of their own; this module builds their inputs
(:func:`ablated`, :func:`score_masks`) and turns their scores into maps (:func:`ablation_map`,
:func:`score_map`). The passes are :mod:`nbdebug.runs.perturb`'s.

Where pytorch-grad-cam (``jacobgil/pytorch-grad-cam``) defines a method the same way its maps are
equal to these before its own upsampling and scaling: gradcam, gradcam++, hirescam, xgradcam,
layercam, eigencam (it clips at 0 afterwards; here ``low`` keeps the sign) and scorecam (its
masks: ``UpsamplingBilinear2d``, i.e. ``align_corners=True``, and ``(m − min) / (max − min + 1e-8)``,
as here). Its AblationCAM sets a channel to ``min − 1e7`` when the layer's minimum is not 0; here
the channel is zeroed, as the issue defines it (the same on post-ReLU layers).

>>> import torch
>>> a, g = torch.rand(1, 4, 3, 3), torch.rand(1, 2, 4, 3, 3)
>>> gradient_map("hirescam", a, g).shape
torch.Size([1, 2, 3, 3])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "ACTIVATION", "EPS", "GRADIENT", "METHODS", "PERTURBATION", "ablated", "ablation_map", "eigen_map", "gradient_map",
    "parse_methods", "score_map", "score_masks",
]

GRADIENT = ("gradcam", "gradcam++", "hirescam", "xgradcam", "layercam")
ACTIVATION = ("eigencam",)
PERTURBATION = ("ablationcam", "scorecam")
#: every method, in the order the view shows them
METHODS = GRADIENT + ACTIVATION + PERTURBATION
EPS = 1e-7
_ALIASES = {"gradcampp": "gradcam++", "gradcamplusplus": "gradcam++", "hirescam": "hirescam", "scorecam": "scorecam",
            "xgradcam": "xgradcam", "layercam": "layercam", "eigencam": "eigencam", "ablationcam": "ablationcam",
            "gradcam": "gradcam", "gradcam++": "gradcam++"}


def parse_methods(value: str | Iterable[str] | None) -> list[str]:
    """``--method`` as written → method names in the order given: ``gradcam`` (None, the default),
    ``gradcam,eigencam``, ``all`` (every method, :data:`METHODS` order), a list. ``Grad-CAM++``,
    ``gradcampp`` and ``score_cam`` are read too; duplicates dropped. ValueError names the methods."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return ["gradcam"]
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in items:
        key = str(item).strip().lower().replace("-", "").replace("_", "").replace(" ", "")
        if not key:
            continue
        if key == "all":
            names: Sequence[str] = METHODS
        elif key in _ALIASES:
            names = [_ALIASES[key]]
        else:
            raise ValueError(f"unknown CAM method {str(item).strip()!r}; use all or some of: {', '.join(METHODS)}")
        out.extend(n for n in names if n not in out)
    return out or ["gradcam"]


def _weighted(weights: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
    """``ReLU(Σ_c weights[b,k,c] · act[b,c])`` → B×K×h×w."""
    return F.relu(torch.einsum("bkc,bchw->bkhw", weights, act))


def gradient_map(method: str, act: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """One gradient method's map: ``act`` B×C×h×w, ``grads`` B×K×C×h×w (float) → B×K×h×w (≥ 0)."""
    a = act.unsqueeze(1)  # B×1×C×h×w
    if method == "gradcam":
        return _weighted(grads.mean(dim=(-2, -1)), act)
    if method == "gradcam++":
        g2, g3 = grads.pow(2), grads.pow(3)
        denom = 2 * g2 + a.sum(dim=(-2, -1), keepdim=True) * g3
        alpha = torch.where(denom != 0, g2 / torch.where(denom != 0, denom, torch.ones_like(denom)), torch.zeros_like(denom))
        return _weighted((alpha * F.relu(grads)).sum(dim=(-2, -1)), act)
    if method == "hirescam":
        return F.relu((grads * a).sum(dim=2))
    if method == "layercam":
        return F.relu((F.relu(grads) * a).sum(dim=2))
    if method == "xgradcam":
        weights = (grads * a).sum(dim=(-2, -1)) / (a.sum(dim=(-2, -1)) + EPS)
        return _weighted(weights, act)
    raise ValueError(f"{method!r} is not a gradient method ({', '.join(GRADIENT)})")


def eigen_map(act: torch.Tensor, k: int) -> torch.Tensor:
    """EigenCAM: each sample's activation as positions × channels, centred over positions, projected
    on its first right-singular vector (``torch.linalg.svd``; its sign, no ReLU) → B×K×h×w, the same
    map for each of the ``k`` classes. NaNs count as 0 (as pytorch-grad-cam)."""
    b, c, h, w = act.shape
    m = torch.nan_to_num(act.float(), nan=0.0).reshape(b, c, h * w).transpose(1, 2)  # B×hw×C
    m = m - m.mean(dim=1, keepdim=True)
    _, _, vh = torch.linalg.svd(m, full_matrices=False)
    proj = torch.einsum("bpc,bc->bp", m, vh[:, 0, :]).reshape(b, 1, h, w)
    return proj.expand(b, k, h, w).to(act.dtype)


def ablated(act: torch.Tensor, channels: Sequence[int], dim: int) -> torch.Tensor:
    """``len(channels)`` copies of one sample's layer output ``act`` (its native layout, no batch
    dim), copy ``i`` with channel ``channels[i]`` (along ``dim`` of ``act``) set to 0."""
    d = dim % act.dim()
    c = act.shape[d]
    shape = [len(channels)] + [1] * act.dim()
    shape[d + 1] = c
    mask = F.one_hot(torch.as_tensor(list(channels), device=act.device, dtype=torch.long), c).bool().reshape(shape)
    return torch.where(mask, torch.zeros((), dtype=act.dtype, device=act.device), act.unsqueeze(0))


def ablation_map(act: torch.Tensor, base: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """AblationCAM from ``base`` (B×K, the target scores) and ``drop`` (B×C×K, the scores with channel
    k zeroed): ``w = (y − y_k) / y`` (0 where ``y`` is 0) → ``ReLU(Σ_k w_k A_k)`` B×K×h×w."""
    y = base.unsqueeze(1)  # B×1×K
    w = torch.where(y != 0, (y - drop) / torch.where(y != 0, y, torch.ones_like(y)), torch.zeros_like(drop))
    return _weighted(w.transpose(1, 2).to(act.dtype), act)


def score_masks(act: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Score-CAM's masks of one sample: ``act`` C×h×w → C×1×H×W, each channel upsampled (bilinear,
    ``align_corners=True`` as pytorch-grad-cam) and min-max normalised (``/ (max − min + 1e-8)``)."""
    up = F.interpolate(act.float().unsqueeze(1), size=size, mode="bilinear", align_corners=True)  # C×1×H×W
    flat = up.flatten(1)
    lo, hi = flat.min(dim=1).values, flat.max(dim=1).values
    return (up - lo[:, None, None, None]) / (hi - lo + 1e-8)[:, None, None, None]


def score_map(act: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Score-CAM from ``scores`` (B×C×K: the target logits of the masked inputs): ``w = softmax`` over
    the channels → ``ReLU(Σ_k w_k A_k)`` B×K×h×w."""
    w = torch.softmax(scores.float(), dim=1).transpose(1, 2)  # B×K×C
    return _weighted(w.to(act.dtype), act)
