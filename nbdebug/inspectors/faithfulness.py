"""Faithfulness of saliency maps: deletion / insertion and ROAD, as perturbed images and AUCs (pure).

For one image ``x`` (C×H×W) and one map per method (H×W, at the input's resolution), pixels are
ranked by the map (most salient first; ties in raster order) and:

- **deletion** (lower is better): the top ``k/20`` of the pixels replaced by a blurred copy of ``x``
  (Gaussian, 11×11, σ = 5, as RISE), ``k = 0 … 20``;
- **insertion** (higher is better): the top ``k/20`` of the pixels of ``x`` put into the blurred copy;
- **ROAD** (Rong et al. 2022, "A Consistent and Efficient Evaluation Strategy for Attribution
  Methods"): the most (``road_morf``, lower is better) or least (``road_lerf``, higher is better)
  relevant 10 %, 20 % … 90 % of the pixels removed and imputed by noisy linear imputation
  (:func:`impute`: each removed pixel the weighted mean of its 8 neighbours, 1/6 for edges and 1/12
  for corners, solved jointly, plus Gaussian noise of σ = 0.01).

:class:`Plan` lists every perturbed image of every method (the clean and the fully blurred image
once, shared) and builds any slice of them as one batch, so all steps of all methods run batched
(:class:`~nbdebug.runs.perturb.Perturbed`); :meth:`Plan.report` turns the target class's
probabilities into curves and areas (:func:`auc`: trapezoid over the fractions, divided by their
range, i.e. the curve's mean height). :func:`rank_methods` orders methods by
``insertion − deletion + road_lerf − road_morf``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["FRACTIONS", "METRICS", "FaithfulnessReport", "Plan", "auc", "blur", "impute", "rank_methods"]

METRICS = ("deletion", "insertion", "road_morf", "road_lerf")
#: lower is better for these
LOWER_IS_BETTER = ("deletion", "road_morf")
STEPS = 20
ROAD = tuple(round(0.1 * k, 1) for k in range(1, 10))
#: the fractions of pixels perturbed at each point of each curve
FRACTIONS: dict[str, np.ndarray] = {
    "deletion": np.arange(STEPS + 1, dtype=np.float32) / STEPS,
    "insertion": np.arange(STEPS + 1, dtype=np.float32) / STEPS,
    "road_morf": np.array((0.0, *ROAD), dtype=np.float32),
    "road_lerf": np.array((0.0, *ROAD), dtype=np.float32),
}
_DENSE = 256  # the coarsest level of the imputation is solved exactly up to this many pixels


def blur(x: torch.Tensor, klen: int = 11, sigma: float = 5.0) -> torch.Tensor:
    """A Gaussian-blurred copy of ``x`` (…×C×H×W), ``klen``×``klen``, reflect-padded (replicate when
    the image is smaller than the kernel)."""
    r = torch.arange(klen, dtype=torch.float32, device=x.device) - (klen - 1) / 2
    g = torch.exp(-(r**2) / (2 * sigma**2))
    g = g / g.sum()
    lead, (c, h, w) = x.shape[:-3], x.shape[-3:]
    flat = x.reshape(-1, c, h, w).float()
    pad = klen // 2
    mode = "reflect" if min(h, w) > pad else "replicate"
    k2 = (g[:, None] * g[None, :]).expand(c, 1, klen, klen)
    out = F.conv2d(F.pad(flat, (pad, pad, pad, pad), mode=mode), k2, groups=c)
    return out.reshape(*lead, c, h, w).to(x.dtype)


def _neighbours(x: torch.Tensor) -> torch.Tensor:
    """The 8-neighbour weighted sum of ``x`` (…×H×W): 1/6 for edges, 1/12 for corners, 0 outside."""
    p = F.pad(x, (1, 1, 1, 1))
    corners = p[..., :-2, :-2] + p[..., :-2, 2:] + p[..., 2:, :-2] + p[..., 2:, 2:]
    edges = p[..., 1:-1, :-2] + p[..., 1:-1, 2:] + p[..., :-2, 1:-1] + p[..., 2:, 1:-1]
    return corners * (1 / 12) + edges * (1 / 6)


def _pool(m: torch.Tensor) -> torch.Tensor:
    """The next coarser grid's removed pixels: those whose 2×2 block is all removed."""
    return 1 - F.max_pool2d(1 - m, 2, ceil_mode=True)


class _Level:
    """One grid of the multigrid preconditioner: ``op(v) = m ⊙ (diag ⊙ v − neighbours(m ⊙ v))`` on the
    removed pixels ``m`` (N×1×H×W, 1 = removed); the coarsest grid is inverted exactly."""

    def __init__(self, m: torch.Tensor) -> None:
        self.m = m
        h, w = m.shape[-2:]
        self.diag = _neighbours(torch.ones(1, 1, h, w, dtype=m.dtype, device=m.device))
        self.inv = 0.8 / self.diag  # damped Jacobi
        self.coarse = _Level(_pool(m)) if min(h, w) > 8 else None
        self.dense: torch.Tensor | None = None
        if self.coarse is None and h * w <= _DENSE:
            n = h * w
            eye = torch.eye(n, dtype=m.dtype, device=m.device).reshape(1, n, h, w)
            cols = self.op(eye)  # N×n×h×w: column j is op(e_j)
            a = cols.reshape(m.shape[0], n, n).transpose(1, 2) + torch.diag_embed(1 - m.reshape(m.shape[0], n))
            self.dense = torch.linalg.pinv(a)

    def op(self, v: torch.Tensor) -> torch.Tensor:
        return self.m * (self.diag * v - _neighbours(self.m * v))

    def vcycle(self, r: torch.Tensor) -> torch.Tensor:
        """An approximate solve of ``op(e) = r`` (symmetric: one Jacobi sweep before and after the
        coarse correction, restriction the transpose of prolongation), the preconditioner of CG."""
        if self.dense is not None:
            n, c, h, w = r.shape
            return torch.einsum("nij,ncj->nci", self.dense, r.reshape(n, c, h * w)).reshape(r.shape) * self.m
        if self.coarse is None:
            e = self.inv * r * self.m
            for _ in range(20):
                e = e + self.inv * (r - self.op(e)) * self.m
            return e
        e = self.inv * r * self.m
        h, w = r.shape[-2:]
        res = F.pad((r - self.op(e)) * self.m, (0, w % 2, 0, h % 2))
        ec = self.coarse.vcycle(F.avg_pool2d(res, 2) * 4 * self.coarse.m)
        e = e + F.interpolate(ec, scale_factor=2, mode="nearest")[..., :h, :w] * self.m
        return e + self.inv * (r - self.op(e)) * self.m


def _solve(img: torch.Tensor, removed: torch.Tensor, tol: float, iters: int) -> torch.Tensor:
    """The linear imputation of ``img`` (N×C×H×W) at ``removed`` (N×1×H×W): conjugate gradients
    preconditioned by a multigrid V-cycle, one system per image and channel, each until its residual
    is below ``tol`` of its right-hand side."""
    m = removed.to(img.dtype)
    level = _Level(m)
    b = m * _neighbours(img * (1 - m))
    x = torch.zeros_like(img)
    r = b.clone()

    def dot(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return (u * v).sum(dim=(-2, -1), keepdim=True)

    z = level.vcycle(r)
    p, rz = z, dot(r, z)
    stop = tol**2 * dot(b, b)
    for _ in range(iters):
        active = dot(r, r) > stop  # a converged system stops moving: the same result alone or in any batch
        if not bool(active.any()):
            break
        ap = level.op(p)
        pap = dot(p, ap)
        alpha = torch.where(active & (pap > 0), rz / torch.where(pap > 0, pap, torch.ones_like(pap)), torch.zeros_like(pap))
        x = x + alpha * p
        r = r - alpha * ap
        z = level.vcycle(r)
        rz_new = dot(r, z)
        p = z + torch.where(rz > 0, rz_new / torch.where(rz > 0, rz, torch.ones_like(rz)), torch.zeros_like(rz)) * p
        rz = rz_new
    return torch.where(removed, x, img)


def impute(img: torch.Tensor, removed: torch.Tensor, *, noise: float = 0.01, generator: torch.Generator | None = None,
           seeds: Sequence[int] | None = None, tol: float = 1e-3, iters: int = 200) -> torch.Tensor:
    """ROAD's noisy linear imputation of ``img`` (N×C×H×W) at the ``removed`` pixels (N×H×W bool):
    each removed pixel is the weighted mean of its neighbours inside the image (1/6 edge, 1/12
    corner), all solved jointly (the system Rong et al. solve with a sparse direct solver; here
    multigrid-preconditioned conjugate gradients in float32 to a relative residual ``tol``, about
    0.2 % of the image's range, well below the noise), plus ``noise`` × N(0, 1) on the removed
    pixels, drawn from ``generator`` (default: one seeded 0) or, with ``seeds``, image ``i``'s from a generator seeded
    ``seeds[i]`` (the same image whatever else is in the batch); the user's random stream is not used."""
    rem = removed.unsqueeze(1).bool()
    out = _solve(img.float(), rem, tol, iters)
    if noise:
        if seeds is not None:
            eps = torch.stack([torch.randn(out.shape[1:], generator=torch.Generator().manual_seed(int(s))) for s in seeds])
        else:
            eps = torch.randn(out.shape, generator=generator if generator is not None else torch.Generator().manual_seed(0))
        out = torch.where(rem, out + noise * eps.to(out.device), out)
    return out.to(img.dtype)


def auc(fractions: np.ndarray, values: np.ndarray) -> float:
    """Area under ``values`` over ``fractions`` (trapezoid), divided by the fractions' range."""
    f, v = np.asarray(fractions, dtype=np.float64), np.asarray(values, dtype=np.float64)
    width = float(f[-1] - f[0])
    area = float(((v[1:] + v[:-1]) / 2 * np.diff(f)).sum())
    return area / width if width > 0 else float(v.mean())


def rank_methods(aucs: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Methods best first by ``insertion − deletion + road_lerf − road_morf`` (ties: the given order)."""
    def score(m: str) -> float:
        a = aucs[m]
        return a["insertion"] - a["deletion"] + a["road_lerf"] - a["road_morf"]

    return sorted(aucs, key=lambda m: -score(m))


@dataclass
class FaithfulnessReport:
    """Per method: ``curves[method][metric]`` the target's probability at ``FRACTIONS[metric]``,
    ``auc[method][metric]``; ``ranking`` best first; ``target`` the class, sample 0."""

    target: int
    target_name: str
    auc: dict[str, dict[str, float]]
    curves: dict[str, dict[str, np.ndarray]]
    ranking: list[str]
    forwards: int = 0
    images: int = 0
    fractions: dict[str, np.ndarray] = field(default_factory=lambda: dict(FRACTIONS))


class Plan:
    """Every perturbed image of every method for one image ``x`` (C×H×W) and ``maps`` (method → H×W).

    ``items`` lists them: ``("clean", "", 0)``, ``("blurred", "", 0)``, then per method
    ``(method, metric, k)`` for the points that are not the clean or blurred image. ``batch(i, j)``
    builds items ``i`` to ``j`` as one N×C×H×W tensor (ROAD's imputation solved for the slice at once).
    """

    def __init__(self, x: torch.Tensor, maps: Mapping[str, torch.Tensor], *, seed: int = 0) -> None:
        self.x = x
        self.blurred = blur(x)
        self.methods = list(maps)
        hw = x.shape[-1] * x.shape[-2]
        self.hw = hw
        self.order = {m: torch.argsort(v.flatten().float(), descending=True, stable=True).to(x.device) for m, v in maps.items()}
        self.items: list[tuple[str, str, int]] = [("clean", "", 0), ("blurred", "", 0)]
        for m in self.methods:
            for metric in METRICS:
                for k in range(len(FRACTIONS[metric])):
                    if not self._shared(metric, k):
                        self.items.append((m, metric, k))
        self.seed = seed

    @staticmethod
    def _shared(metric: str, k: int) -> str:
        """The shared image a point is (``clean``/``blurred``), or ""."""
        last = len(FRACTIONS[metric]) - 1
        if metric == "deletion":
            return "clean" if k == 0 else "blurred" if k == last else ""
        if metric == "insertion":
            return "blurred" if k == 0 else "clean" if k == last else ""
        return "clean" if k == 0 else ""

    def _count(self, metric: str, k: int) -> int:
        return round(float(FRACTIONS[metric][k]) * self.hw)

    def _mask(self, method: str, metric: str, k: int) -> torch.Tensor:
        """H×W bool: the pixels perturbed at point ``k``."""
        n = self._count(metric, k)
        order = self.order[method]
        idx = order[-n:] if metric == "road_lerf" and n else order[:n]
        mask = torch.zeros(self.hw, dtype=torch.bool, device=self.x.device)
        mask[idx] = True
        return mask.reshape(self.x.shape[-2:])

    def batch(self, i: int, j: int) -> torch.Tensor:
        """Items ``i`` to ``j`` (exclusive) as one batch, in order."""
        out: list[torch.Tensor | None] = [None] * (j - i)
        road: list[tuple[int, torch.Tensor]] = []
        for pos, (method, metric, k) in enumerate(self.items[i:j]):
            if method in ("clean", "blurred"):
                out[pos] = self.x if method == "clean" else self.blurred
            elif metric in ("deletion", "insertion"):
                mask = self._mask(method, metric, k)
                a, b = (self.blurred, self.x) if metric == "deletion" else (self.x, self.blurred)
                out[pos] = torch.where(mask, a, b)
            else:
                road.append((pos, self._mask(method, metric, k)))
        if road:
            imgs = self.x.unsqueeze(0).expand(len(road), *self.x.shape)
            seeds = [self.seed * 1_000_003 + i + pos for pos, _ in road]  # the noise of item i: the same in any chunk
            filled = impute(imgs, torch.stack([m for _, m in road]), seeds=seeds)
            for (pos, _), img in zip(road, filled):
                out[pos] = img
        return torch.stack([t for t in out if t is not None])

    def report(self, probs: Sequence[float] | np.ndarray, target: int, target_name: str, forwards: int = 0) -> FaithfulnessReport:
        """Curves and areas from the target's probability on every item (in ``items`` order)."""
        p = np.asarray(probs, dtype=np.float64).reshape(-1)
        at = {item: float(v) for item, v in zip(self.items, p)}
        shared = {"clean": at[("clean", "", 0)], "blurred": at[("blurred", "", 0)]}
        curves: dict[str, dict[str, np.ndarray]] = {}
        aucs: dict[str, dict[str, float]] = {}
        for m in self.methods:
            curves[m], aucs[m] = {}, {}
            for metric in METRICS:
                n = len(FRACTIONS[metric])
                vals = [shared[s] if (s := self._shared(metric, k)) else at[(m, metric, k)] for k in range(n)]
                curves[m][metric] = np.asarray(vals, dtype=np.float32)
                aucs[m][metric] = auc(FRACTIONS[metric], curves[m][metric])
        return FaithfulnessReport(target, target_name, aucs, curves, rank_methods(aucs), forwards, len(self.items))
