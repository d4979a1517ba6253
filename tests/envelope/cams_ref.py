"""The ``cams`` column's content by hand, on the TinyCNN at ``relu#2`` (the shared ``relu``'s second
call): no nbdebug function is used.

- the maps: plain forward hooks catch ``A`` (B×C×h×w) and ``torch.autograd.grad`` gives ``g = dy_c/dA``
  for the top ``K`` classes; then the formulas (Grad-CAM ``ReLU(Σ_k mean_hw(g_k) A_k)``, Grad-CAM++,
  HiResCAM, XGrad-CAM, LayerCAM), EigenCAM (the centred activation projected on its first
  right-singular vector), AblationCAM (one forward per zeroed channel, a hook) and Score-CAM (one
  forward per masked input);
- faithfulness (sample 0, its top class): deletion / insertion curves, one forward per perturbed
  image, the blur by ``scipy.ndimage.gaussian_filter`` (σ = 5, radius 5, mirrored edges); ROAD with
  the imputation as a dense linear solve and no noise (so equal to nbdebug's noisy one only to the
  noise's effect, :data:`ROAD_TOL`);
- sanity: the layers after ``relu#2`` with parameters (``fc``) re-initialised with ``torch.nn.init``
  as ``nn.Linear`` does, seeded, and Spearman's ρ (:func:`spearman`: average ranks of ties, Pearson
  of the ranks; scipy is not imported: 10 s on a busy machine).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from . import models as M

EPS = 1e-7
GRADIENT = ("gradcam", "gradcam++", "hirescam", "xgradcam", "layercam")
#: the methods, in the view's order
METHODS = (*GRADIENT, "eigencam", "ablationcam", "scorecam")
STEPS = 20
ROAD = [round(0.1 * k, 1) for k in range(1, 10)]
#: nbdebug's ROAD adds noise of σ = 0.01 to the imputed pixels (and solves to 1e-3): its AUCs equal the
#: noiseless dense solve's to this (absolute, probabilities; measured ≤ 6e-6, the methods' AUCs differ by ~3e-3)
ROAD_TOL = 1e-4
#: deletion and insertion AUCs (the same images, one forward each): measured ≤ 5e-9
CURVE_TOL = 1e-6
#: the seed nbdebug's sanity check documents for the i-th layer after the CAM layer (call order)
SANITY_SEED = 1000


def _second_call(model: nn.Module, store: dict[str, torch.Tensor], replace: Any = None) -> Any:
    """A forward hook on the shared ``relu``: keeps (and optionally replaces) its second call's output."""
    calls = [0]

    def hook(_m: nn.Module, _a: Any, out: torch.Tensor) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            out = replace(out) if replace is not None else out
            store["A"] = out
            return out
        return None

    return model.relu.register_forward_hook(hook)


def gradient_map(method: str, A: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """One sample, one class: ``A``, ``g`` C×h×w → h×w (float64)."""
    A, g = A.double(), g.double()
    if method == "gradcam":
        w = g.mean((1, 2))
    elif method == "hirescam":
        return torch.relu((g * A).sum(0))
    elif method == "layercam":
        return torch.relu((torch.relu(g) * A).sum(0))
    elif method == "xgradcam":
        w = (g * A).sum((1, 2)) / (A.sum((1, 2)) + EPS)
    else:  # gradcam++
        g2, g3 = g**2, g**3
        den = 2 * g2 + A.sum((1, 2))[:, None, None] * g3
        alpha = torch.where(den != 0, g2 / torch.where(den != 0, den, torch.ones_like(den)), torch.zeros_like(den))
        w = (alpha * torch.relu(g)).sum((1, 2))
    return torch.relu((w[:, None, None] * A).sum(0))


def eigen_map(A: torch.Tensor) -> torch.Tensor:
    """One sample: positions × channels, centred, projected on the first right-singular vector (h×w)."""
    c, h, w = A.shape
    m = A.float().reshape(c, h * w).T
    m = m - m.mean(0, keepdim=True)
    _, _, vh = torch.linalg.svd(m, full_matrices=False)
    return (m @ vh[0]).reshape(h, w).double()


def _logits(model: nn.Module, x: torch.Tensor, replace: Any = None) -> torch.Tensor:
    h = _second_call(model, {}, replace) if replace is not None else None
    try:
        with torch.no_grad():
            return model(x).double()
    finally:
        if h is not None:
            h.remove()


def ablation_weights(model: nn.Module, x: torch.Tensor, A: torch.Tensor, cls: list[int]) -> torch.Tensor:
    """One sample ``x`` (1×…): ``(y − y with channel c zeroed) / y`` per channel and class (C×K)."""
    y = _logits(model, x)[0, cls]
    rows = []
    for c in range(A.shape[0]):
        def zero(out: torch.Tensor, c: int = c) -> torch.Tensor:
            out = out.clone()
            out[:, c] = 0
            return out
        rows.append((y - _logits(model, x, zero)[0, cls]) / y)
    return torch.stack(rows)


def score_weights(model: nn.Module, x: torch.Tensor, A: torch.Tensor, cls: list[int]) -> torch.Tensor:
    """One sample: softmax over channels of the class logits of ``x`` times each channel's map,
    upsampled (bilinear, corners aligned) and min-max normalised (C×K)."""
    up = nn.functional.interpolate(A[:, None].float(), size=tuple(x.shape[-2:]), mode="bilinear", align_corners=True)
    lo = up.flatten(1).min(1).values[:, None, None, None]
    hi = up.flatten(1).max(1).values[:, None, None, None]
    masks = (up - lo) / (hi - lo + 1e-8)
    scores = torch.stack([_logits(model, x * masks[c][None])[0, cls] for c in range(A.shape[0])])
    return torch.softmax(scores, dim=0)


def maps(model: nn.Module, x: torch.Tensor, k: int) -> tuple[dict[str, np.ndarray], torch.Tensor]:
    """method → B×K×h×w (float64) at the layer's resolution, for each sample's top ``k`` classes
    (largest first); the classes B×K."""
    classes = _logits(model, x).argsort(dim=1, descending=True)[:, :k]
    return maps_for(model, x, classes), classes


# -- faithfulness -------------------------------------------------------------------------------------
def blur(x: torch.Tensor, sigma: float = 5.0, radius: int = 5) -> torch.Tensor:
    """C×H×W, Gaussian σ = 5 over 11×11 (radius 5), mirrored at the edges (``np.pad`` reflect), per
    channel: a sum of shifted copies, in numpy."""
    r = np.arange(-radius, radius + 1, dtype=np.float64)
    k = np.exp(-(r**2) / (2 * sigma**2))
    k /= k.sum()
    img = x.double().numpy()
    h, w = img.shape[-2:]
    xp = np.pad(img, ((0, 0), (radius, radius), (radius, radius)), mode="reflect")
    out = sum(k[i] * k[j] * xp[:, i : i + h, j : j + w] for i in range(len(k)) for j in range(len(k)))
    return torch.from_numpy(out).float()


def prob(model: nn.Module, imgs: list[torch.Tensor], target: int) -> np.ndarray:
    """The target's softmax probability, one forward per image."""
    return np.array([float(torch.softmax(_logits(model, im[None]), 1)[0, target]) for im in imgs])


def order(sal: np.ndarray) -> np.ndarray:
    """Pixels most salient first, ties in raster order."""
    return np.argsort(-sal.ravel(), kind="stable")


def top_mask(sal: np.ndarray, n: int, least: bool = False) -> torch.Tensor:
    o = order(sal)
    idx = o[len(o) - n:] if least else o[:n]
    mask = np.zeros(sal.size, dtype=bool)
    mask[idx] = True
    return torch.from_numpy(mask.reshape(sal.shape))


def deletion_insertion(model: nn.Module, x: torch.Tensor, sal: np.ndarray, target: int) -> tuple[np.ndarray, np.ndarray]:
    """The curves at k/20 of the pixels, k = 0 … 20: the top pixels blurred (deletion), or the top
    pixels of ``x`` put into the blurred image (insertion)."""
    xb = blur(x)
    n = [round(k * sal.size / STEPS) for k in range(STEPS + 1)]
    dele = prob(model, [torch.where(top_mask(sal, k), xb, x) for k in n], target)
    ins = prob(model, [torch.where(top_mask(sal, k), x, xb) for k in n], target)
    return dele, ins


def dense_impute(x: torch.Tensor, removed: torch.Tensor) -> torch.Tensor:
    """Each removed pixel the weighted mean of its neighbours inside the image (1/6 edge, 1/12
    corner), all removed pixels solved jointly (a dense solve), per channel; no noise."""
    img = x.double().numpy()
    rem = removed.numpy()
    h, w = rem.shape
    where = np.argwhere(rem)
    idx = -np.ones((h, w), dtype=int)
    idx[rem] = np.arange(len(where))
    a = np.zeros((len(where), len(where)))
    b = np.zeros((len(where), img.shape[0]))
    for n, (i, j) in enumerate(where):
        for di in (-1, 0, 1):
            for dj in (-1, 0, 1):
                if (di, dj) == (0, 0) or not (0 <= i + di < h and 0 <= j + dj < w):
                    continue
                wt = 1 / 12 if di and dj else 1 / 6
                a[n, n] += wt
                if rem[i + di, j + dj]:
                    a[n, idx[i + di, j + dj]] -= wt
                else:
                    b[n] += wt * img[:, i + di, j + dj]
    out = img.copy()
    out[:, rem] = np.linalg.solve(a, b).T
    return torch.from_numpy(out).float()


def road(model: nn.Module, x: torch.Tensor, sal: np.ndarray, target: int, least: bool) -> np.ndarray:
    """ROAD: the most (or least) relevant 0 %, 10 % … 90 % removed and imputed."""
    imgs = [x] + [dense_impute(x, top_mask(sal, round(f * sal.size), least)) for f in ROAD]
    return prob(model, imgs, target)


def auc(values: np.ndarray, fractions: list[float]) -> float:
    """Trapezoid over the fractions, divided by their range (the curve's mean height)."""
    f = np.asarray(fractions, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    return float(((v[1:] + v[:-1]) / 2 * np.diff(f)).sum() / (f[-1] - f[0]))


def faithfulness(model: nn.Module, x: torch.Tensor, sal: np.ndarray, target: int) -> dict[str, float]:
    """metric → AUC for one map ``sal`` (H×W) of image ``x`` (C×H×W)."""
    dele, ins = deletion_insertion(model, x, sal, target)
    steps = [k / STEPS for k in range(STEPS + 1)]
    return {"deletion": auc(dele, steps), "insertion": auc(ins, steps),
            "road_morf": auc(road(model, x, sal, target, False), [0.0, *ROAD]),
            "road_lerf": auc(road(model, x, sal, target, True), [0.0, *ROAD])}


# -- sanity -------------------------------------------------------------------------------------------
def reinit_linear(lin: nn.Linear, seed: int) -> None:
    """``nn.Linear``'s own initialisation, written with ``torch.nn.init``, from ``seed`` (the caller's
    random stream forked, so it does not move)."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        nn.init.kaiming_uniform_(lin.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(lin.weight.shape[1])
        nn.init.uniform_(lin.bias, -bound, bound)


def sanity(model: nn.Module, x: torch.Tensor, k: int, base: dict[str, np.ndarray], classes: torch.Tensor) -> dict[str, float]:
    """method → Spearman ρ of sample 0's first map with the same map on a copy whose ``fc`` (the
    one layer with parameters after relu#2) is re-initialised; the classes stay the original run's."""
    copy_ = copy.deepcopy(model)
    reinit_linear(copy_.fc, SANITY_SEED)
    again = maps_for(copy_, x, classes)
    return {m: spearman(base[m][0, 0], again[m][0, 0]) for m in METHODS}


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's correlation of the ranks (ties: their average rank)."""
    def ranks(v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64).ravel()
        s = np.sort(v)
        return (np.searchsorted(s, v, "left") + np.searchsorted(s, v, "right") - 1) / 2.0

    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def maps_for(model: nn.Module, x: torch.Tensor, classes: torch.Tensor) -> dict[str, np.ndarray]:
    """:func:`maps` for given classes (the sanity check explains the original run's classes)."""
    store: dict[str, torch.Tensor] = {}
    h = _second_call(model, store)
    try:
        with torch.enable_grad():
            logits = model(x)
            a = store["A"]
            g = torch.stack([torch.stack([torch.autograd.grad(logits[b, int(c)], a, retain_graph=True)[0][b] for c in classes[b]])
                             for b in range(x.shape[0])])
    finally:
        h.remove()
    A, g = a.detach(), g.detach()
    k = classes.shape[1]
    out: dict[str, np.ndarray] = {}
    for m in GRADIENT:
        out[m] = torch.stack([torch.stack([gradient_map(m, A[b], g[b, j]) for j in range(k)]) for b in range(x.shape[0])]).numpy()
    out["eigencam"] = torch.stack([eigen_map(A[b]).expand(k, *A.shape[-2:]) for b in range(x.shape[0])]).numpy()
    for m, fn in (("ablationcam", ablation_weights), ("scorecam", score_weights)):
        out[m] = torch.stack([torch.relu(torch.einsum("ck,chw->khw", fn(model, x[b : b + 1], A[b], classes[b].tolist()).double(),
                                                      A[b].double())) for b in range(x.shape[0])]).numpy()
    return out


def content(model: nn.Module, k: int = 2) -> dict[str, np.ndarray]:
    """The cams column's content (``causal.view_content``'s keys) by hand, for ``M.image()``."""
    x = M.image().to(next(model.parameters()).dtype)
    low, classes = maps(model, x, k)
    out: dict[str, np.ndarray] = {f"low[{m}]": low[m] for m in METHODS}
    target = int(classes[0, 0])
    for m in METHODS:
        f = faithfulness(model, x[0].float(), low[m][0, 0], target)  # relu#2 is at the input's 8×8: no upsampling
        out[f"faith[{m}]"] = np.array([f[key] for key in sorted(f)])
    rho = sanity(model, x, k, low, classes)
    out["sanity"] = np.array([rho[m] for m in METHODS])
    return out


def equal(got: dict[str, Any], want: dict[str, np.ndarray], tol: float = 1e-5) -> None:
    """Maps and ρ to ``tol`` × their scale; faithfulness AUCs (deletion, insertion, road_lerf,
    road_morf: ``view_content``'s sorted order) to :data:`CURVE_TOL` and :data:`ROAD_TOL`."""
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for k, w in want.items():
        g = np.asarray(got[k], dtype=np.float64)
        if k.startswith("faith["):
            np.testing.assert_allclose(g[:2], w[:2], atol=CURVE_TOL, rtol=0, err_msg=f"{k} deletion, insertion")
            np.testing.assert_allclose(g[2:], w[2:], atol=ROAD_TOL, rtol=0, err_msg=f"{k} road_lerf, road_morf")
        else:
            np.testing.assert_allclose(g, w, atol=tol * max(float(np.abs(w).max()), 1e-3), rtol=0, err_msg=k)
