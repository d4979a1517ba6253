"""ROAD's in-place solver and the faithfulness plan's shared images against straightforward references.

- :func:`nbdebug.inspectors.road.linear_fill` works in place; :func:`_reference_fill` below is the
  straightforward form it replaced (a fresh tensor per step): the two must agree bit for bit on
  single images of every path of the multigrid (dense coarsest grid, Jacobi coarsest grid, odd sizes).
- :class:`~nbdebug.inspectors.faithfulness.Plan` runs each distinct perturbed image once: every item's
  image rebuilt from its run equals the image built for the item alone, and the runs are exactly the
  distinct (metric family, perturbed pixels) pairs, counted by hand.
- ROAD's noise is seeded by the removed pixels: methods whose maps rank the pixels alike get the same
  ROAD images and scores; an image is the same bits in any chunk; different pixels draw different noise.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nbdebug.cams.checks import faithfulness
from nbdebug.inspectors.faithfulness import FRACTIONS, METRICS, Plan
from nbdebug.inspectors.road import add_noise, linear_fill
from nbdebug.runs.perturb import chunk_size
from tests.unit.test_gradcam_faithfulness import H, LeftHalf, W, column_map, maps_of


def _neighbours(x: torch.Tensor) -> torch.Tensor:
    p = F.pad(x, (1, 1, 1, 1))
    corners = p[..., :-2, :-2] + p[..., :-2, 2:] + p[..., 2:, :-2] + p[..., 2:, 2:]
    edges = p[..., 1:-1, :-2] + p[..., 1:-1, 2:] + p[..., :-2, 1:-1] + p[..., 2:, 1:-1]
    return corners * (1 / 12) + edges * (1 / 6)


class _RefLevel:
    """The multigrid level as first written (nbdebug b5d8f40), one image at a time."""

    def __init__(self, m: torch.Tensor) -> None:
        self.m = m
        h, w = m.shape[-2:]
        self.diag = _neighbours(torch.ones(1, 1, h, w))
        self.inv = 0.8 / self.diag
        self.coarse = _RefLevel(1 - F.max_pool2d(1 - m, 2, ceil_mode=True)) if min(h, w) > 8 else None
        self.dense = None
        if self.coarse is None and h * w <= 256:
            n = h * w
            eye = torch.eye(n).reshape(1, n, h, w)
            a = self.op(eye).reshape(1, n, n).transpose(1, 2) + torch.diag_embed(1 - m.reshape(1, n))
            self.dense = torch.linalg.pinv(a.clone())

    def op(self, v: torch.Tensor) -> torch.Tensor:
        return self.m * (self.diag * v - _neighbours(self.m * v))

    def vcycle(self, r: torch.Tensor) -> torch.Tensor:
        if self.dense is not None:
            n, c, h, w = r.shape
            return torch.einsum("nij,ncj->nci", self.dense, r.reshape(n, c, h * w).clone()).reshape(r.shape) * self.m
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


def _reference_fill(img: torch.Tensor, removed: torch.Tensor, tol: float = 1e-3, iters: int = 200) -> torch.Tensor:
    """Preconditioned CG as first written: a fresh tensor per step (1×C×H×W, removed 1×1×H×W)."""
    m = removed.float()
    level = _RefLevel(m)
    b = m * _neighbours(img * (1 - m))
    x, r = torch.zeros_like(img), b.clone()

    def dot(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return (u * v).sum(dim=(-2, -1), keepdim=True)

    z = level.vcycle(r)
    p, rz = z, dot(r, z)
    stop = tol**2 * dot(b, b)
    for _ in range(iters):
        active = dot(r, r) > stop
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


def _blob_mask(h: int, w: int, fraction: float, seed: int) -> torch.Tensor:
    """The top ``fraction`` of a smooth random map: the connected regions a CAM removes."""
    sal = F.interpolate(torch.rand(1, 1, 4, 4, generator=torch.Generator().manual_seed(seed)), size=(h, w), mode="bilinear")
    m = torch.zeros(h * w, dtype=torch.bool)
    m[torch.argsort(sal.flatten(), descending=True, stable=True)[: round(fraction * h * w)]] = True
    return m.reshape(1, 1, h, w)


# 16×16: a dense 8×8 coarsest grid; 37×45: odd sizes at every level; 8×40: a Jacobi coarsest grid (320 > 256 pixels)
@pytest.mark.parametrize("shape", [(16, 16), (37, 45), (8, 40), (64, 64)])
@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_in_place_solver_is_the_straightforward_one_bit_for_bit(shape: tuple[int, int], fraction: float) -> None:
    img = torch.randn(1, 3, *shape, generator=torch.Generator().manual_seed(3))
    removed = _blob_mask(*shape, fraction, seed=4)
    fast, ref = linear_fill(img, removed), _reference_fill(img, removed)
    assert torch.equal(fast, ref), (fast - ref).abs().max()
    assert torch.equal(fast[~removed.expand_as(img)], img[~removed.expand_as(img)])  # kept pixels untouched


def test_a_solve_is_the_same_bits_alone_or_batched() -> None:
    img = torch.randn(1, 3, 40, 40, generator=torch.Generator().manual_seed(5))
    masks = torch.cat([_blob_mask(40, 40, f, seed=s) for s, f in enumerate((0.2, 0.5, 0.8))])
    together = linear_fill(img.expand(3, -1, -1, -1), masks)
    alone = torch.cat([linear_fill(img, masks[i : i + 1]) for i in range(3)])
    assert torch.equal(together, alone)


def _maps(h: int, w: int) -> dict[str, torch.Tensor]:
    """a; 3a + 1 (the same ranking: every image shared with a); b (another ranking); a with its top
    pixel moved last (the same ranking except at the ends: some images shared, some not)."""
    g = torch.Generator().manual_seed(6)
    a = F.interpolate(torch.rand(1, 1, 3, 3, generator=g), size=(h, w), mode="bilinear")[0, 0] + torch.arange(h * w).reshape(h, w) * 1e-6
    b = torch.rand(h, w, generator=g)
    c = a.clone()
    c.view(-1)[a.flatten().argmax()] = a.min() - 1
    return {"a": a, "scaled": 3 * a + 1, "b": b, "moved": c}


def _mask_of(order: torch.Tensor, hw: int, metric: str, k: int, shape: tuple[int, int]) -> torch.Tensor:
    n = round(float(FRACTIONS[metric][k]) * hw)
    m = torch.zeros(hw, dtype=torch.bool)
    m[order[-n:] if metric == "road_lerf" and n else order[:n]] = True
    return m.reshape(shape)


def test_each_distinct_image_runs_once_and_every_item_gets_its_own_image() -> None:
    h = w = 16
    x = torch.randn(3, h, w, generator=torch.Generator().manual_seed(7))
    maps = _maps(h, w)
    plan = Plan(x, maps)
    # by hand: the (family, pixels) pairs of every method's non-shared points
    distinct: set[tuple[str, bytes]] = set()
    for v in maps.values():
        order = torch.argsort(v.flatten(), descending=True, stable=True)
        for metric in METRICS:
            for k in range(len(FRACTIONS[metric])):
                if (metric, k) in plan_shared_points():
                    continue
                family = metric if metric in ("deletion", "insertion") else "road"
                distinct.add((family, _mask_of(order, h * w, metric, k, (h, w)).numpy().tobytes()))
    assert len(plan.runs) == 2 + len(distinct) < len(plan.items)
    runs = plan.build(0, len(plan.runs))
    for i in range(len(plan.items)):
        assert torch.equal(runs[plan.run_of[i]], plan.batch(i, i + 1)[0]), plan.items[i]
    # the run values spread back: each item gets its run's value
    assert np.array_equal(plan.spread(np.arange(len(plan.runs))), np.asarray(plan.run_of))


def plan_shared_points() -> set[tuple[str, int]]:
    """The points every method shares (the clean and the fully blurred image)."""
    return {("deletion", 0), ("deletion", 20), ("insertion", 0), ("insertion", 20), ("road_morf", 0), ("road_lerf", 0)}


def test_road_images_depend_on_the_removed_pixels_only() -> None:
    h = w = 16
    x = torch.randn(3, h, w, generator=torch.Generator().manual_seed(8))
    maps = _maps(h, w)
    state = torch.get_rng_state()
    plan, again = Plan(x, maps), Plan(x, dict(reversed(list(maps.items()))))  # other item indices
    assert torch.equal(state, torch.get_rng_state())  # the user's stream did not move
    index = {item: i for i, item in enumerate(plan.items)}
    other = {item: i for i, item in enumerate(again.items)}
    noises = []
    for metric in ("road_morf", "road_lerf"):
        for k in range(1, len(FRACTIONS[metric])):
            img_a = plan.batch(index[("a", metric, k)], index[("a", metric, k)] + 1)[0]
            # the same pixels: the same image, for another method and at another index
            assert torch.equal(img_a, plan.batch(index[("scaled", metric, k)], index[("scaled", metric, k)] + 1)[0])
            assert torch.equal(img_a, again.batch(other[("a", metric, k)], other[("a", metric, k)] + 1)[0])
            removed = _mask_of(torch.argsort(maps["a"].flatten(), descending=True, stable=True), h * w, metric, k, (h, w))
            noises.append((img_a - linear_fill(x[None], removed[None, None])[0])[:, removed])
    # other pixels draw other noise, of σ 0.01
    assert all(not torch.equal(a[:, :5], b[:, :5]) for a, b in itertools.pairwise(noises))
    assert 0.008 < torch.cat([n.flatten() for n in noises]).std() < 0.012
    # another seed: other noise on the same pixels
    seeded = Plan(x, maps, seed=1)
    i = index[("a", "road_morf", 5)]
    assert not torch.equal(plan.batch(i, i + 1), seeded.batch(i, i + 1))


def test_chunked_runs_are_the_unchunked_bits() -> None:
    h = w = 16
    x = torch.randn(3, h, w, generator=torch.Generator().manual_seed(9))
    plan = Plan(x, _maps(h, w))
    whole = plan.build(0, len(plan.runs))
    for chunk in (1, 3, 7):
        parts = torch.cat([plan.build(i, min(i + chunk, len(plan.runs))) for i in range(0, len(plan.runs), chunk)])
        assert torch.equal(parts, whole), chunk


def test_add_noise_is_seeded_and_only_on_removed_pixels() -> None:
    filled = torch.zeros(3, 6, 6)
    removed = torch.zeros(1, 6, 6, dtype=torch.bool)
    removed[0, :3] = True
    a, b = add_noise(filled, removed, 0.01, 5), add_noise(filled, removed, 0.01, 5)
    assert torch.equal(a, b) and not torch.equal(a, add_noise(filled, removed, 0.01, 6))
    assert bool((a[:, 3:] == 0).all()) and bool((a[:, :3] != 0).all())


def test_methods_that_rank_the_pixels_alike_get_the_same_scores() -> None:
    """Through ``--faithfulness``: three maps with one ranking (a, 2a, a + 1) get equal areas on every
    metric, ROAD included (its noise no longer follows the item's index), a fourth map other areas;
    one image per forward or all at once, the same areas."""
    torch.manual_seed(0)
    model = LeftHalf().eval()
    x = torch.randn(1, 3, H, W) * 2
    a = np.random.default_rng(1).random((H, W), dtype=np.float32)
    maps = maps_of({"a": a, "double": 2 * a, "shifted": a + 1, "left": column_map(True)})
    one = faithfulness(model, (x,), {}, maps, torch.tensor([[1]]), max_bytes=1)
    many = faithfulness(model, (x,), {}, maps, torch.tensor([[1]]), max_bytes=2**30)
    per_method = 19 + 19 + 9 + 9
    assert one.images == 2 + 4 * per_method and one.distinct == one.forwards == 2 + 2 * per_method
    for rep in (one, many):
        for metric in METRICS:
            assert rep.auc["a"][metric] == rep.auc["double"][metric] == rep.auc["shifted"][metric], metric
            assert np.array_equal(rep.curves["a"][metric], rep.curves["shifted"][metric])
        assert rep.auc["left"]["road_morf"] != rep.auc["a"]["road_morf"]
    for m in maps.methods:
        for metric in METRICS:
            np.testing.assert_allclose(one.curves[m][metric], many.curves[m][metric], atol=1e-6, err_msg=(m, metric))


def test_cpu_chunks_hold_a_cache_sized_batch() -> None:
    """A 3×224×224 float image (602,112 bytes) runs 4 at a time on the CPU (2.5 MB of inputs), however
    much memory ``--max-bytes`` allows; a tighter ``--max-bytes`` still wins; a huge input runs alone."""
    image = 3 * 224 * 224 * 4
    assert chunk_size(2**30, 32 * image, 262) == 55  # memory alone
    assert chunk_size(2**30, 32 * image, 262, cpu_input_bytes=image) == 4
    assert chunk_size(2 * 32 * image, 32 * image, 262, cpu_input_bytes=image) == 2
    assert chunk_size(2**30, 32 * image, 3, cpu_input_bytes=image) == 3
    assert chunk_size(2**30, 32, 262, cpu_input_bytes=10**8) == 1
    assert chunk_size(2**30, 32 * 12, 262, cpu_input_bytes=12) == 262  # small inputs: one batch
