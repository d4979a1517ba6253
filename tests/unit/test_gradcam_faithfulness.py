"""--faithfulness: deletion / insertion / ROAD on hand-built cases with known answers (a model that
ignores the right half of the image), ROAD's imputation equal to the linear system Rong et al. solve,
the curves equal to one forward per perturbed image, the user's RNG and model untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from nbdebug.adapters.vision import GridInfo
from nbdebug.cams.checks import faithfulness
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.inspectors.faithfulness import (
    FRACTIONS,
    METRICS,
    Plan,
    auc,
    blur,
    impute,
    rank_methods,
)
from nbdebug.inspectors.gradcam import CamMaps
from nbdebug.recorders.gradcam import GradCamRecorder
from tests.envelope.cams_ref import dense_impute  # Rong et al.'s imputation as a dense solve

H = W = 12
#: ROAD's curves against the noiseless dense imputation: the σ = 0.01 noise and the 1e-3 solve move
#: the probabilities by less than this (measured ≤ 8.3e-4 here; the curves span 0.4)
ROAD_NOISE = 2e-3


class OneByOne(nn.Module):
    """1×1 conv → ReLU → linear on pooled features; subclasses say which pixels are pooled."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.act = nn.ReLU()
        self.fc = nn.Linear(4, 3)


class LeftHalf(OneByOne):
    """Class scores from the left half of the image only (columns < W/2): the right half is ignored."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.conv(x))
        return self.fc(h[..., : W // 2].mean((2, 3)))


def column_map(left_first: bool) -> np.ndarray:
    """A saliency map that ranks pixels by column: the left half first, or the right half first."""
    cols = np.arange(W, dtype=np.float32)[None, :].repeat(H, 0) + np.arange(H, dtype=np.float32)[:, None] * 0.01
    return (W - cols if left_first else cols).astype(np.float32)


def maps_of(named: dict[str, np.ndarray]) -> CamMaps:
    by = {m: (v[None, None], v[None, None]) for m, v in named.items()}
    first = next(iter(by.values()))
    return CamMaps("act", GridInfo("nchw", H, W, 4), first[0], first[1], False, "", by)


@pytest.fixture
def left_half() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = LeftHalf().eval()
    with torch.no_grad():
        model.fc.weight.mul_(8)
    return model, torch.randn(1, 3, H, W) * 2


def prob(model: nn.Module, x: torch.Tensor, c: int) -> float:
    with torch.no_grad():
        return float(torch.softmax(model(x[None] if x.dim() == 3 else x), 1)[0, c])


def test_a_model_that_ignores_half_the_image(left_half: tuple[nn.Module, torch.Tensor]) -> None:
    model, x = left_half
    c = int(model(x).argmax())
    maps = maps_of({"left": column_map(True), "right": column_map(False)})
    before, rng = fingerprint(model), torch.get_rng_state()
    rep = faithfulness(model, (x,), {}, maps, torch.tensor([[c]]), max_bytes=2**30)
    assert same_fingerprint(before, fingerprint(model)) == [] and hook_count(model) == 0
    assert torch.equal(rng, torch.get_rng_state())
    clean, blurred = prob(model, x, c), prob(model, blur(x[0]), c)
    right, left = rep.curves["right"], rep.curves["left"]
    # deleting (inserting, imputing) the ignored right half first changes nothing until half the pixels are gone
    np.testing.assert_allclose(right["deletion"][:11], clean, atol=1e-6)
    np.testing.assert_allclose(right["insertion"][:11], blurred, atol=1e-6)
    np.testing.assert_allclose(right["road_morf"][:6], clean, atol=1e-6)   # up to 50 % removed
    np.testing.assert_allclose(left["road_lerf"][:6], clean, atol=1e-6)    # the least relevant 50 % are the right half
    np.testing.assert_allclose(left["deletion"][[0, -1]], [clean, blurred], atol=1e-6)
    np.testing.assert_allclose(left["insertion"][[0, -1]], [blurred, clean], atol=1e-6)
    assert abs(clean - blurred) > 0.1  # the test can fail: the blur matters to this model
    # the map that points at the half the model uses is the faithful one, by every metric
    a = rep.auc
    assert a["left"]["deletion"] < a["right"]["deletion"] and a["left"]["insertion"] > a["right"]["insertion"]
    assert a["left"]["road_morf"] < a["right"]["road_morf"] and a["left"]["road_lerf"] > a["right"]["road_lerf"]
    assert rep.ranking == ["left", "right"] and rep.target == c
    for m in ("left", "right"):
        for metric in METRICS:
            assert a[m][metric] == pytest.approx(auc(FRACTIONS[metric], rep.curves[m][metric]))


def hand_blur(x: torch.Tensor, sigma: float = 5.0, radius: int = 5) -> torch.Tensor:
    """C×H×W: Gaussian σ = 5 over 11×11, mirrored edges (``np.pad`` reflect), as a sum of shifted copies."""
    r = np.arange(-radius, radius + 1, dtype=np.float64)
    k = np.exp(-(r**2) / (2 * sigma**2))
    k /= k.sum()
    img = x.double().numpy()
    h, w = img.shape[-2:]
    xp = np.pad(img, ((0, 0), (radius, radius), (radius, radius)), mode="reflect")
    return torch.from_numpy(sum(k[i] * k[j] * xp[:, i : i + h, j : j + w] for i in range(2 * radius + 1)
                                for j in range(2 * radius + 1))).float()


def top(sal: np.ndarray, n: int, least: bool = False) -> torch.Tensor:
    """H×W bool: the ``n`` most (or least) salient pixels, ties in raster order."""
    order = np.argsort(-sal.ravel(), kind="stable")
    mask = np.zeros(sal.size, dtype=bool)
    mask[order[sal.size - n:] if least else order[:n]] = True
    return torch.from_numpy(mask.reshape(sal.shape))


def hand_curves(model: nn.Module, x: torch.Tensor, sal: np.ndarray, c: int) -> dict[str, np.ndarray]:
    """Deletion and insertion by hand (k/20 of the pixels, k = 0 … 20, one forward per image) and
    ROAD with the dense imputation and no noise."""
    xb = hand_blur(x)
    n = [round(k * sal.size / 20) for k in range(21)]
    road = [round(f * sal.size) for f in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)]

    def imputed(mask: torch.Tensor) -> torch.Tensor:
        return dense_impute(x, mask)

    return {"deletion": np.array([prob(model, torch.where(top(sal, k), xb, x), c) for k in n]),
            "insertion": np.array([prob(model, torch.where(top(sal, k), x, xb), c) for k in n]),
            "road_morf": np.array([prob(model, x, c)] + [prob(model, imputed(top(sal, k)), c) for k in road]),
            "road_lerf": np.array([prob(model, x, c)] + [prob(model, imputed(top(sal, k, least=True)), c) for k in road])}


def test_the_curves_equal_one_forward_per_image_whatever_the_chunks(left_half: tuple[nn.Module, torch.Tensor]) -> None:
    """Every curve equals a hand one (blur, ranking, one forward per image); ROAD's noise (σ = 0.01)
    is left out of the hand imputation, so ROAD equals it to the noise's effect only, and exactly
    (1e-6) between chunkings."""
    model, x = left_half
    maps = maps_of({"a": np.random.default_rng(0).random((H, W), dtype=np.float32), "b": column_map(True)})
    one = faithfulness(model, (x,), {}, maps, torch.tensor([[1]]), max_bytes=1)  # one image per forward
    many = faithfulness(model, (x,), {}, maps, torch.tensor([[1]]), max_bytes=2**30)
    assert one.forwards == one.images == 2 + 2 * (19 + 19 + 9 + 9) and many.forwards == 1
    for m in ("a", "b"):
        ref = hand_curves(model, x[0], maps.of(m)[0][0, 0], 1)
        for metric in ("deletion", "insertion"):
            np.testing.assert_allclose(one.curves[m][metric], ref[metric], atol=1e-6, err_msg=(m, metric))
            np.testing.assert_allclose(many.curves[m][metric], ref[metric], atol=1e-5, err_msg=(m, metric))
        for metric in ("road_morf", "road_lerf"):
            np.testing.assert_allclose(one.curves[m][metric], ref[metric], atol=ROAD_NOISE, err_msg=(m, metric))
            np.testing.assert_allclose(many.curves[m][metric], one.curves[m][metric], atol=1e-6, err_msg=(m, metric))


def test_deletion_and_insertion_images_replace_exactly_the_top_pixels() -> None:
    x = torch.randn(3, H, W)
    sal = torch.randn(H, W)
    plan = Plan(x, {"m": sal})
    order = torch.argsort(sal.flatten(), descending=True, stable=True)
    for i, (_method, metric, k) in enumerate(plan.items):
        if metric not in ("deletion", "insertion"):
            continue
        img = plan.batch(i, i + 1)[0]
        n = round(k / 20 * H * W)
        top = torch.zeros(H * W, dtype=torch.bool)
        top[order[:n]] = True
        top = top.reshape(H, W)
        inside, outside = (plan.blurred, x) if metric == "deletion" else (x, plan.blurred)
        assert torch.equal(img[:, top], inside[:, top]) and torch.equal(img[:, ~top], outside[:, ~top])


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_road_imputation_solves_the_linear_system(fraction: float) -> None:
    rng = np.random.default_rng(1)
    img = rng.normal(size=(3, 20, 24)).astype(np.float32)
    sal = torch.nn.functional.interpolate(torch.rand(1, 1, 3, 3, generator=torch.Generator().manual_seed(2)), size=(20, 24),
                                          mode="bilinear")[0, 0]
    removed = torch.zeros(20 * 24, dtype=torch.bool)
    removed[torch.argsort(sal.flatten(), descending=True)[: int(fraction * 480)]] = True
    removed = removed.reshape(20, 24)
    ref = dense_impute(torch.from_numpy(img), removed).double().numpy()
    exact = impute(torch.from_numpy(img)[None], removed[None], noise=0, tol=1e-6)[0].numpy()
    np.testing.assert_allclose(exact, ref, atol=2e-5)
    default = impute(torch.from_numpy(img)[None], removed[None], noise=0)[0].numpy()  # tol 1e-3: well below the noise
    assert np.abs(default - ref).max() < 5e-3
    rng_state = torch.get_rng_state()
    g = torch.Generator().manual_seed(0)
    noisy = impute(torch.from_numpy(img)[None], removed[None], generator=g, tol=1e-6)[0].numpy()
    assert torch.equal(rng_state, torch.get_rng_state())  # the user's stream did not move
    diff = (noisy - exact)[:, removed.numpy()]
    assert 0.008 < diff.std() < 0.012 and np.abs((noisy - exact)[:, ~removed.numpy()]).max() == 0


def test_auc_and_ranking() -> None:
    assert auc(np.array([0, 0.5, 1]), np.array([1, 0.5, 0])) == pytest.approx(0.5)
    assert auc(np.array([0, 0.1, 0.9]), np.array([1, 1, 1])) == pytest.approx(1.0)  # divided by the range: the mean height
    a = {"x": dict(deletion=0.5, insertion=0.5, road_morf=0.5, road_lerf=0.5),
         "y": dict(deletion=0.1, insertion=0.9, road_morf=0.5, road_lerf=0.5)}
    assert rank_methods(a) == ["y", "x"]


def test_recorder_faithfulness_every_method(left_half: tuple[nn.Module, torch.Tensor]) -> None:
    model, x = left_half
    rec = GradCamRecorder(model, cam_method="gradcam,eigencam,ablationcam", faithfulness=True, cam_topk=2)
    with rec, torch.no_grad():
        model(x)
    res = rec.result()
    assert set(res.faithfulness) == {"gradcam", "eigencam", "ablationcam"}
    assert all(set(v) == set(METRICS) for v in res.faithfulness.values())
    rep = res.faithfulness_report
    assert rep.target == int(res.classes[0, 0]) and rep.ranking[0] in res.faithfulness
    assert any(n.startswith("faithfulness:") and n.endswith("batched forwards") for n in res.notes)
    # no second order on screen: the panel ranks (sanity before score, ties as ties); a note saying
    # "best first: eigencam, ..." under it contradicted a sanity-checked table (issue 27)
    assert not any("best first" in n for n in res.notes)
    # sample 0, first target: the same as calling it directly on the result's maps
    direct = faithfulness(model, (x,), {}, res.maps[res.layer], torch.as_tensor(res.classes), max_bytes=2**30)
    assert direct.auc == rep.auc


class Pooled(OneByOne):
    """conv → ReLU → mean over the whole image: the gradient at the CAM layer is the same at every pixel,
    so HiResCAM's map (gradient ⊙ activation) is Grad-CAM's (mean gradient × activation)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize("methods", ["gradcam,hirescam", "gradcam"])
def test_the_note_counts_the_images_two_methods_share(methods: str) -> None:
    """Two methods whose maps are equal perturb the same pixels at every point: each of the second's images
    is the first's, run once, and the note says how many; one method alone shares nothing and the note says
    nothing of it (planted: every image counted as shared, or the count said when nothing is shared)."""
    torch.manual_seed(0)
    model = Pooled().eval()
    rec = GradCamRecorder(model, cam_method=methods, faithfulness=True, cam_topk=1)
    with rec, torch.no_grad():
        model(torch.randn(1, 3, H, W))
    res = rec.result()
    rep = res.faithfulness_report
    per_method = (rep.images - 2) // len(res.faithfulness)
    shared = rep.images - rep.distinct
    assert shared == (per_method if "," in methods else 0)
    if shared:
        np.testing.assert_allclose(res.maps[res.layer].of("hirescam")[0], res.maps[res.layer].of("gradcam")[0], rtol=1e-5)  # equal but for rounding
        assert res.faithfulness["gradcam"] == res.faithfulness["hirescam"]  # the same images, the same scores
    said = f" ({shared} the same image as another method's: run once)" if shared else ""
    want = f"faithfulness: {rep.images} perturbed images of sample 0 for {rep.target_name}{said} in {rep.forwards} batched forwards"
    assert want in res.notes, res.notes
