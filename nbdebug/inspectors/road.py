"""ROAD's noisy linear imputation (Rong et al. 2022), the expensive part of ``--faithfulness`` (pure).

Each removed pixel becomes the weighted mean of its 8 neighbours inside the image (1/6 for edges,
1/12 for corners), all removed pixels solved jointly, plus Gaussian noise of σ = 0.01. The system
(Rong et al. solve it with a sparse direct solver) is solved here by conjugate gradients
preconditioned by a multigrid V-cycle, in float32, one system per image and channel, each until its
residual is below ``tol`` of its right-hand side. :func:`linear_fill` is the solve (noise-free: one
solve serves every image that removes the same pixels), :func:`add_noise` the noise of one image
(its own seed), :func:`impute` both.

The solver works in buffers allocated once per call and updated in place: every float operation is
the one the straightforward form does, in the same order (``tests/unit/test_road_fast.py`` keeps that
form and checks the two bit for bit), without allocating a fresh image-sized tensor for each step
(on 224×224 images that was half of the solve's time).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["add_noise", "impute", "linear_fill"]

_DENSE = 256  # the coarsest level of the imputation is solved exactly up to this many pixels
_CORNER, _EDGE = 1 / 12, 1 / 6


def _neighbours(x: torch.Tensor) -> torch.Tensor:
    """The 8-neighbour weighted sum of ``x`` (…×H×W): 1/6 for edges, 1/12 for corners, 0 outside."""
    p = F.pad(x, (1, 1, 1, 1))
    corners = p[..., :-2, :-2] + p[..., :-2, 2:] + p[..., 2:, :-2] + p[..., 2:, 2:]
    edges = p[..., 1:-1, :-2] + p[..., 1:-1, 2:] + p[..., :-2, 1:-1] + p[..., 2:, 1:-1]
    return corners * _CORNER + edges * _EDGE


def _pool(m: torch.Tensor) -> torch.Tensor:
    """The next coarser grid's removed pixels: those whose 2×2 block is all removed."""
    return 1 - F.max_pool2d(1 - m, 2, ceil_mode=True)


class _Level:
    """One grid of the multigrid preconditioner: ``op(v) = m ⊙ (diag ⊙ v − neighbours(m ⊙ v))`` on the
    removed pixels ``m`` (N×1×H×W, 1 = removed) for ``c`` channels; the coarsest grid is inverted
    exactly. Holds its work buffers (a zero-bordered copy for the neighbours, two scratch images)."""

    def __init__(self, m: torch.Tensor, c: int) -> None:
        self.m = m
        n, (h, w) = m.shape[0], m.shape[-2:]
        self.h, self.w = h, w
        self.diag = _neighbours(torch.ones(1, 1, h, w, dtype=m.dtype, device=m.device))
        self.inv = 0.8 / self.diag  # damped Jacobi
        self.coarse = _Level(_pool(m), c) if min(h, w) > 8 else None
        self.dense: torch.Tensor | None = None
        self.padded = torch.zeros(n, c, h + 2, w + 2, dtype=m.dtype, device=m.device)
        self.nb = torch.empty(n, c, h, w, dtype=m.dtype, device=m.device)
        self.tmp = torch.empty_like(self.nb)
        if self.coarse is None and h * w <= _DENSE:
            k = h * w
            eye = torch.eye(k, dtype=m.dtype, device=m.device).reshape(1, k, h, w)
            cols = m * (self.diag * eye - _neighbours(m * eye))  # N×k×h×w: column j is op(e_j)
            a = cols.reshape(n, k, k).transpose(1, 2) + torch.diag_embed(1 - m.reshape(n, k))
            self.dense = torch.cat([torch.linalg.pinv(a[i : i + 1].clone()) for i in range(n)])  # one by one: see vcycle

    def op(self, v: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out = m ⊙ (diag ⊙ v − neighbours(m ⊙ v))`` (``out`` must not be ``v``); returns ``out``."""
        p, nb, t = self.padded, self.nb, self.tmp
        torch.mul(self.m, v, out=p[..., 1:-1, 1:-1])  # the border stays 0: F.pad's zeros
        torch.add(p[..., :-2, :-2], p[..., :-2, 2:], out=nb).add_(p[..., 2:, :-2]).add_(p[..., 2:, 2:]).mul_(_CORNER)
        torch.add(p[..., 1:-1, :-2], p[..., 1:-1, 2:], out=t).add_(p[..., :-2, 1:-1]).add_(p[..., 2:, 1:-1]).mul_(_EDGE)
        nb.add_(t)
        return torch.mul(self.diag, v, out=out).sub_(nb).mul_(self.m)

    def vcycle(self, r: torch.Tensor) -> torch.Tensor:
        """An approximate solve of ``op(e) = r`` (symmetric: one Jacobi sweep before and after the
        coarse correction, restriction the transpose of prolongation), the preconditioner of CG; a
        new tensor."""
        if self.dense is not None:
            # image by image, each in memory of its own: BLAS's last bit moves with the batch and the alignment
            n, c, h, w = r.shape
            flat = r.reshape(n, c, h * w)
            one = [torch.einsum("nij,ncj->nci", self.dense[i : i + 1].clone(), flat[i : i + 1].clone()) for i in range(n)]
            return torch.cat(one).reshape(r.shape) * self.m
        if self.coarse is None:
            e = self.inv * r * self.m
            for _ in range(20):
                e = e + self.inv * (r - self.op(e, torch.empty_like(e))) * self.m
            return e
        h, w = self.h, self.w
        e = torch.mul(self.inv, r).mul_(self.m)
        res = torch.sub(r, self.op(e, torch.empty_like(e))).mul_(self.m)
        if h % 2 or w % 2:
            res = F.pad(res, (0, w % 2, 0, h % 2))
        ec = self.coarse.vcycle(F.avg_pool2d(res, 2).mul_(4).mul_(self.coarse.m))
        up = F.interpolate(ec, scale_factor=2, mode="nearest")[..., :h, :w]
        spare = res[..., :h, :w]  # res is read: its storage is free
        e.add_(torch.mul(up, self.m, out=spare))
        fix = self.op(e, spare)
        return e.add_(torch.sub(r, fix, out=fix).mul_(self.inv).mul_(self.m))


def _dot(u: torch.Tensor, v: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    """Per image and channel ``Σ_hw u v`` (keepdim), the product written into ``buf``."""
    return torch.mul(u, v, out=buf).sum(dim=(-2, -1), keepdim=True)


def _ratio(num: torch.Tensor, den: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    """``num / den`` where ``ok`` (and ``den > 0``), else 0."""
    return torch.where(ok & (den > 0), num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(den))


def linear_fill(img: torch.Tensor, removed: torch.Tensor, *, tol: float = 1e-3, iters: int = 200) -> torch.Tensor:
    """The linear imputation of ``img`` (N×C×H×W, float) at ``removed`` (N×1×H×W bool), without noise:
    each system until its residual is below ``tol`` of its right-hand side (a converged system stops
    moving, so an image's result is the same alone or in any batch)."""
    m = removed.to(img.dtype)
    level = _Level(m, int(img.shape[1]))
    b = m * _neighbours(img * (1 - m))
    x = torch.zeros_like(img)
    r = b.clone()
    buf, ap = torch.empty_like(img), torch.empty_like(img)
    z = level.vcycle(r)
    p, rz = z, _dot(r, z, buf)
    stop = tol**2 * _dot(b, b, buf)
    for _ in range(iters):
        active = _dot(r, r, buf) > stop
        if not bool(active.any()):
            break
        level.op(p, ap)
        alpha = _ratio(rz, _dot(p, ap, buf), active)
        x.add_(torch.mul(alpha, p, out=buf))
        r.sub_(torch.mul(alpha, ap, out=buf))
        z = level.vcycle(r)
        rz_new = _dot(r, z, buf)
        beta = _ratio(rz_new, rz, torch.ones_like(active))
        p = z.add_(torch.mul(beta, p, out=buf))  # z + β p, in z's storage (z is not used again)
        rz = rz_new
    return torch.where(removed, x, img)


def add_noise(filled: torch.Tensor, removed: torch.Tensor, noise: float, seed: int) -> torch.Tensor:
    """One image's noise: ``filled`` (C×H×W) plus ``noise`` × N(0, 1) at ``removed`` (1×H×W or H×W),
    drawn on the CPU from a generator seeded ``seed`` (the user's random stream is not used)."""
    eps = torch.randn(filled.shape, generator=torch.Generator().manual_seed(int(seed)))
    return torch.where(removed, filled + noise * eps.to(filled.device), filled)


def impute(img: torch.Tensor, removed: torch.Tensor, *, noise: float = 0.01, generator: torch.Generator | None = None,
           seeds: Sequence[int] | None = None, tol: float = 1e-3, iters: int = 200) -> torch.Tensor:
    """ROAD's noisy linear imputation of ``img`` (N×C×H×W) at the ``removed`` pixels (N×H×W bool):
    :func:`linear_fill` (float32, a relative residual ``tol``: about 0.2 % of the image's range, well
    below the noise) plus ``noise`` × N(0, 1) on the removed pixels, drawn from ``generator`` (default:
    one seeded 0) or, with ``seeds``, image ``i``'s from a generator seeded ``seeds[i]``
    (:func:`add_noise`: the same image whatever else is in the batch); the user's random stream is not used."""
    rem = removed.unsqueeze(1).bool()
    out = linear_fill(img.float(), rem, tol=tol, iters=iters)
    if noise and seeds is not None:
        out = torch.stack([add_noise(o, r, noise, s) for o, r, s in zip(out, rem, seeds)])
    elif noise:
        eps = torch.randn(out.shape, generator=generator if generator is not None else torch.Generator().manual_seed(0))
        out = torch.where(rem, out + noise * eps.to(out.device), out)
    return out.to(img.dtype)
