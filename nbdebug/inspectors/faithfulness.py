"""Faithfulness of saliency maps: deletion / insertion and ROAD, as perturbed images and AUCs (pure).

For one image ``x`` (C×H×W) and one map per method (H×W, at the input's resolution), pixels are
ranked by the map (most salient first; ties in raster order) and:

- **deletion** (lower is better): the top ``k/20`` of the pixels replaced by a blurred copy of ``x``
  (Gaussian, 11×11, σ = 5, as RISE), ``k = 0 … 20``;
- **insertion** (higher is better): the top ``k/20`` of the pixels of ``x`` put into the blurred copy;
- **ROAD** (Rong et al. 2022, "A Consistent and Efficient Evaluation Strategy for Attribution
  Methods"): the most (``road_morf``, lower is better) or least (``road_lerf``, higher is better)
  relevant 10 %, 20 % … 90 % of the pixels removed and imputed by noisy linear imputation
  (:func:`~nbdebug.inspectors.road.impute`: each removed pixel the weighted mean of its 8 neighbours,
  1/6 for edges and 1/12 for corners, solved jointly, plus Gaussian noise of σ = 0.01 seeded by the
  removed pixels: the same pixels removed, the same image).

:class:`Plan` lists every perturbed image of every method (the clean and the fully blurred image
once, shared; an image two methods share, once) and builds any slice of them as one batch, so all
steps of all methods run batched (:class:`~nbdebug.runs.perturb.Perturbed`); :meth:`Plan.report` turns the target class's
probabilities into curves and areas (:func:`auc`: trapezoid over the fractions, divided by their
range, i.e. the curve's mean height). :func:`rank_methods` orders methods by
``insertion − deletion + road_lerf − road_morf``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from .road import add_noise, impute, linear_fill

__all__ = ["FRACTIONS", "METRICS", "FaithfulnessReport", "Plan", "auc", "blur", "impute", "rank_methods"]

METRICS = ("deletion", "insertion", "road_morf", "road_lerf")
#: lower is better for these
LOWER_IS_BETTER = ("deletion", "road_morf")
STEPS = 20
ROAD = tuple(round(0.1 * k, 1) for k in range(1, 10))
#: σ of ROAD's imputation noise
NOISE = 0.01
#: ROAD's images are solved together up to this many pixels: small images share the per-step overhead,
#: a 224² image is solved alone (a batch iterates until its slowest system converges: 15 of them
#: together took 1.7× the CPU of one by one)
SOLVE_PIXELS = 65_536
#: the fractions of pixels perturbed at each point of each curve
FRACTIONS: dict[str, np.ndarray] = {
    "deletion": np.arange(STEPS + 1, dtype=np.float32) / STEPS,
    "insertion": np.arange(STEPS + 1, dtype=np.float32) / STEPS,
    "road_morf": np.array((0.0, *ROAD), dtype=np.float32),
    "road_lerf": np.array((0.0, *ROAD), dtype=np.float32),
}


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


def _digest(mask: torch.Tensor, salt: bytes = b"") -> bytes:
    """16 bytes naming a CPU bool mask's pixels."""
    return hashlib.blake2b(salt + np.packbits(mask.numpy()).tobytes() + bytes(str(tuple(mask.shape)), "ascii"), digest_size=16).digest()


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
    #: the images run: ``images`` less those two methods share (:attr:`Plan.runs`)
    distinct: int = 0
    fractions: dict[str, np.ndarray] = field(default_factory=lambda: dict(FRACTIONS))


class Plan:
    """Every perturbed image of every method for one image ``x`` (C×H×W) and ``maps`` (method → H×W).

    ``items`` lists them: ``("clean", "", 0)``, ``("blurred", "", 0)``, then per method
    ``(method, metric, k)`` for the points that are not the clean or blurred image. ``batch(i, j)``
    builds items ``i`` to ``j`` as one N×C×H×W tensor.

    Methods often rank the pixels alike (gradcam, hirescam and xgradcam on a layer followed by global
    pooling give proportional maps), so many items are the same image: ``runs`` lists the items whose
    images are run (an item whose metric family, deletion, insertion or ROAD, and perturbed pixels are an
    earlier item's is not; ``run_of[i]`` is item ``i``'s run), ``build(i, j)`` builds runs ``i`` to ``j``
    and :meth:`spread` gives each item its run's value. ROAD's noise is drawn from a generator seeded by
    ``seed`` and the removed pixels (:meth:`noise_seed`), never by the item's place: the same removed
    pixels make the same image for every method, in any chunk, so methods that remove the same pixels
    get the same ROAD scores. The ROAD images of one build are solved in groups of
    :data:`SOLVE_PIXELS` pixels (:func:`~nbdebug.inspectors.road.linear_fill`: a converged system stops
    moving, each image's bits are the same in any batch).
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
        self._dedupe()

    def _dedupe(self) -> None:
        """``same[i]``: the first item whose metric family and perturbed pixels are item ``i``'s;
        ``runs`` (the items that are their own ``same``) and ``run_of``."""
        cpu = {m: o.cpu() for m, o in self.order.items()}  # one transfer per method
        first: dict[tuple[str, bytes], int] = {}
        self.same = list(range(len(self.items)))
        self._noise_seeds: dict[int, int] = {}  # ROAD item → its noise's seed, from the CPU mask made here
        for i, (method, metric, k) in enumerate(self.items):
            if method in ("clean", "blurred"):
                continue
            mask = self._mask(method, metric, k, cpu[method])
            if metric not in ("deletion", "insertion"):
                self._noise_seeds[i] = self.noise_seed(mask)
            key = (metric if metric in ("deletion", "insertion") else "road", _digest(mask))
            j = first.setdefault(key, i)
            if j != i and torch.equal(mask, self._mask(*self.items[j], cpu[self.items[j][0]])):  # the digest's word checked
                self.same[i] = j
        self.runs = [i for i, j in enumerate(self.same) if i == j]
        at = {item: pos for pos, item in enumerate(self.runs)}
        self.run_of = [at[j] for j in self.same]

    def noise_seed(self, removed: torch.Tensor) -> int:
        """The seed of ROAD's noise on an image with ``removed`` pixels (H×W bool): from :attr:`seed` and
        the pixels only, so equal perturbations get equal noise."""
        return int.from_bytes(_digest(removed, self.seed.to_bytes(8, "little", signed=True))[:8], "little") >> 1

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

    def _mask(self, method: str, metric: str, k: int, order: torch.Tensor | None = None) -> torch.Tensor:
        """H×W bool: the pixels perturbed at point ``k`` (on ``order``'s device: default the image's)."""
        n = self._count(metric, k)
        order = self.order[method] if order is None else order
        idx = order[-n:] if metric == "road_lerf" and n else order[:n]
        mask = torch.zeros(self.hw, dtype=torch.bool, device=order.device)
        mask[idx] = True
        return mask.reshape(self.x.shape[-2:])

    def batch(self, i: int, j: int) -> torch.Tensor:
        """Items ``i`` to ``j`` (exclusive) as one batch, in order."""
        return self._images(range(i, j))

    def build(self, i: int, j: int) -> torch.Tensor:
        """Runs ``i`` to ``j`` (exclusive) as one batch, in order (:attr:`runs`)."""
        return self._images(self.runs[i:j])

    def spread(self, values: Sequence[float] | np.ndarray) -> np.ndarray:
        """Every item's value (``items`` order) from each run's (``runs`` order)."""
        return np.asarray(values).reshape(-1)[self.run_of]

    def _images(self, items: Sequence[int]) -> torch.Tensor:
        """The images of ``items``, ROAD's solved together (a solve's bits do not depend on the batch)."""
        out: list[torch.Tensor] = []
        road: list[tuple[int, torch.Tensor, int]] = []  # (position, removed, noise seed)
        for i in items:
            method, metric, k = self.items[i]
            if method in ("clean", "blurred"):
                out.append(self.x if method == "clean" else self.blurred)
                continue
            mask = self._mask(method, metric, k)
            if metric in ("deletion", "insertion"):
                a, b = (self.blurred, self.x) if metric == "deletion" else (self.x, self.blurred)
                out.append(torch.where(mask, a, b))
            else:
                road.append((len(out), mask, self._noise_seeds[i]))
                out.append(self.x)  # replaced below
        group = max(1, SOLVE_PIXELS // self.hw)
        for g in range(0, len(road), group):
            part = road[g : g + group]
            masks = torch.stack([m for _, m, _ in part])
            filled = linear_fill(self.x.float().expand(len(part), *self.x.shape), masks[:, None])
            for (pos, mask, seed), img in zip(part, filled):
                out[pos] = add_noise(img, mask[None], NOISE, seed).to(self.x.dtype)
        return torch.stack(out)

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
        return FaithfulnessReport(target, target_name, aucs, curves, rank_methods(aucs), forwards, len(self.items), len(self.runs))
