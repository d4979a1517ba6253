"""The CAM family: each method equal to the issue's formula on hand-built models (exact values on a
2×2 map, a numpy reference written from the formulas and pytorch-grad-cam's definitions on a CNN
and on a ViT-style token grid), one forward+backward shared by the gradient methods, the
perturbation methods batched and chunked as the budget says."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nbdebug.inspectors.cams import METHODS, parse_methods
from nbdebug.recorders.gradcam import GradCamRecorder, grad_cam

EPS = 1e-7


def flat_head(a: list[list[list[float]]], w: list[list[float]]) -> tuple[nn.Module, torch.Tensor]:
    """``feat`` (Identity: the CAM layer is the input itself, C×2×2) → flatten → fc (no bias)."""
    model = nn.Sequential()
    model.add_module("feat", nn.Identity())
    model.add_module("flat", nn.Flatten())
    fc = nn.Linear(8, len(w), bias=False)
    with torch.no_grad():
        fc.weight.copy_(torch.tensor(w))
    model.add_module("fc", fc)
    return model.eval(), torch.tensor([a])


def test_exact_values_on_a_two_by_two_map() -> None:
    """A0 = [[1,2],[3,4]], A1 = [[0,1],[1,0]]; for class 0, dy/dA0 = [[1,0],[0,1]], dy/dA1 = [[2,-2],[0,0]]."""
    a = [[[1.0, 2.0], [3.0, 4.0]], [[0.0, 1.0], [1.0, 0.0]]]
    model, x = flat_head(a, [[1, 0, 0, 1, 2, -2, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1]])
    maps, classes, logits, _, _ = grad_cam(model, x, layer="feat", targets=[0], methods="all", reshape="nchw")
    assert classes.tolist() == [[0]] and float(logits[0, 0]) == 3.0
    low = {m: maps.of(m)[1][0, 0] for m in maps.methods}
    assert maps.methods == list(METHODS)
    np.testing.assert_allclose(low["gradcam"], [[0.5, 1.0], [1.5, 2.0]], atol=1e-6)        # w = (0.5, 0)
    np.testing.assert_allclose(low["hirescam"], [[1, 0], [0, 4]], atol=1e-6)              # ReLU([[1,-2],[0,4]])
    np.testing.assert_allclose(low["layercam"], [[1, 0], [0, 4]], atol=1e-6)
    np.testing.assert_allclose(low["xgradcam"], [[0.5, 0], [0.5, 2]], atol=1e-6)          # w = (5/10, -2/2)
    np.testing.assert_allclose(low["gradcam++"], [[1 / 6, 2 / 3], [5 / 6, 2 / 3]], atol=1e-6)  # w = (2/12, 1/3)
    # positions × channels centred: rows ±(1.5, 0.5) and ±(0.5, 0.5); the first right-singular vector is ±(1, 0)
    assert np.allclose(np.abs(low["eigencam"]), [[1.5, 0.5], [0.5, 1.5]], atol=1e-6)
    assert low["eigencam"][0, 0] * low["eigencam"][1, 1] < 0
    # y = 3; channel 0 zeroed: −2, channel 1 zeroed: 5 → w = (5/3, −2/3)
    np.testing.assert_allclose(low["ablationcam"], [[5 / 3, 8 / 3], [13 / 3, 20 / 3]], atol=1e-5)
    # masks: A0 → [[0,1/3],[2/3,1]], A1 → [[0,1],[1,0]]; scores 4 − 2/3 and −2
    w = np.exp([10 / 3, -2.0]) / np.exp([10 / 3, -2.0]).sum()
    np.testing.assert_allclose(low["scorecam"], np.maximum(w[0] * np.array(a[0]) + w[1] * np.array(a[1]), 0), atol=1e-5)
    # the input is 2×2 too: the upsampled maps are the maps
    for m in maps.methods:
        np.testing.assert_allclose(maps.of(m)[0][0, 0], low[m], atol=1e-6)


# -- a numpy reference from the formulas (pytorch-grad-cam's definitions where they match) ------------
def ref_gradient(method: str, A: np.ndarray, g: np.ndarray) -> np.ndarray:
    """One sample, one class: ``A`` C×h×w, ``g`` C×h×w → h×w."""
    if method == "gradcam":
        return np.maximum((g.mean((1, 2))[:, None, None] * A).sum(0), 0)
    if method == "hirescam":
        return np.maximum((g * A).sum(0), 0)
    if method == "layercam":
        return np.maximum((np.maximum(g, 0) * A).sum(0), 0)
    if method == "xgradcam":
        w = (g * A).sum((1, 2)) / (A.sum((1, 2)) + EPS)
        return np.maximum((w[:, None, None] * A).sum(0), 0)
    if method == "gradcam++":
        g2, g3 = g**2, g**3
        denom = 2 * g2 + A.sum((1, 2))[:, None, None] * g3
        alpha = np.where(denom != 0, g2 / np.where(denom != 0, denom, 1), 0)
        w = (alpha * np.maximum(g, 0)).sum((1, 2))
        return np.maximum((w[:, None, None] * A).sum(0), 0)
    raise AssertionError(method)


def ref_eigen(A: np.ndarray) -> np.ndarray:
    """pytorch-grad-cam's get_2d_projection (numpy SVD), before its clipping: equal up to the sign."""
    m = A.reshape(A.shape[0], -1).T
    m = m - m.mean(axis=0)
    _, _, vt = np.linalg.svd(m, full_matrices=True)
    return (m @ vt[0]).reshape(A.shape[1:])


class SmallCNN(nn.Module):
    """conv → relu (the CAM layer) → conv → flatten → fc: gradients vary over positions."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, padding=1)
        self.act = nn.ReLU()
        self.conv2 = nn.Conv2d(5, 4, 2, stride=2)
        self.fc = nn.Linear(4 * 3 * 3, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.conv2(self.act(self.conv(x)))).flatten(1))


def activation_and_grads(model: nn.Module, module: nn.Module, x: torch.Tensor, classes: torch.Tensor) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    store: dict[str, torch.Tensor] = {}
    h = module.register_forward_hook(lambda m, i, o: store.__setitem__("a", o))
    try:
        logits = model(x)
    finally:
        h.remove()
    a = store["a"]
    g = np.stack([np.stack([torch.autograd.grad(logits[b, int(classes[b, k])], a, retain_graph=True)[0][b].detach().numpy()
                            for k in range(classes.shape[1])]) for b in range(x.shape[0])])
    model.zero_grad(set_to_none=True)
    return a.detach().numpy(), g, logits.detach()


def ref_ablation(model: nn.Module, module: nn.Module, x: torch.Tensor, A: torch.Tensor, b: int, cls: list[int], dim: int) -> np.ndarray:
    """One forward per channel, the layer's output of sample ``b`` with that channel zeroed (a hook)."""
    C = A.shape[dim]
    with torch.no_grad():
        y = model(x[b : b + 1])[0, cls].numpy()
        drops = []
        for k in range(C):
            def swap(m: nn.Module, i: object, o: torch.Tensor, k: int = k) -> torch.Tensor:
                o = o.clone()
                o.select(dim, k).zero_()
                return o
            h = module.register_forward_hook(swap)
            try:
                drops.append(model(x[b : b + 1])[0, cls].numpy())
            finally:
                h.remove()
    return (y[None, :] - np.stack(drops)) / y[None, :]  # C×K


def ref_score(model: nn.Module, x: torch.Tensor, A: np.ndarray, b: int, cls: list[int]) -> np.ndarray:
    """Masks as pytorch-grad-cam's ScoreCAM builds them (UpsamplingBilinear2d, min-max + 1e-8), one forward each."""
    up = nn.UpsamplingBilinear2d(size=tuple(x.shape[-2:]))(torch.from_numpy(A[None]))[0]
    flat = up.reshape(up.shape[0], -1)
    up = (up - flat.min(1).values[:, None, None]) / (flat.max(1).values - flat.min(1).values + 1e-8)[:, None, None]
    with torch.no_grad():
        scores = np.stack([model(x[b : b + 1] * up[c][None, None])[0, cls].numpy() for c in range(up.shape[0])])
    return np.exp(scores - scores.max(0)) / np.exp(scores - scores.max(0)).sum(0)  # softmax over channels, C×K


def test_every_method_equals_the_reference_on_a_cnn() -> None:
    torch.manual_seed(3)
    model = SmallCNN().eval()
    x = torch.randn(2, 3, 6, 6)
    maps, classes, _, _, _ = grad_cam(model, x, layer="act", topk=3, methods="all")
    A, g, _ = activation_and_grads(model, model.act, x, classes)
    for b in range(2):
        cls = classes[b].tolist()
        abl = ref_ablation(model, model.act, x, torch.from_numpy(A), b, cls, dim=1)
        sc = ref_score(model, x, A[b], b, cls)
        for k in range(3):
            for m in ("gradcam", "gradcam++", "hirescam", "xgradcam", "layercam"):
                np.testing.assert_allclose(maps.of(m)[1][b, k], ref_gradient(m, A[b], g[b, k]), atol=1e-5, err_msg=m)
            np.testing.assert_allclose(maps.of("ablationcam")[1][b, k], np.maximum((abl[:, k, None, None] * A[b]).sum(0), 0),
                                       atol=1e-4, rtol=1e-4)
            np.testing.assert_allclose(maps.of("scorecam")[1][b, k], np.maximum((sc[:, k, None, None] * A[b]).sum(0), 0),
                                       atol=1e-4, rtol=1e-4)
            eig = maps.of("eigencam")[1][b, k]
            ref = ref_eigen(A[b])
            assert np.allclose(eig, ref, atol=1e-4) or np.allclose(eig, -ref, atol=1e-4)
        for m in METHODS:
            assert maps.of(m)[1][b].max() > 0 or m == "eigencam", m
            up = F.interpolate(torch.from_numpy(maps.of(m)[1]), size=(6, 6), mode="bilinear", align_corners=False)
            np.testing.assert_allclose(maps.of(m)[0], up.numpy(), atol=1e-6)
    assert len({maps.of(m)[1].tobytes() for m in METHODS}) == 8  # eight different maps, not one eight times


class ToyViT(nn.Module):
    """4×4 image → four 2×2 patches → tokens (a class token first) → ``block`` (the CAM layer, B×5×6) → fc on every token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(12, 6)
        self.cls = nn.Parameter(torch.randn(1, 1, 6))
        self.block = nn.Linear(6, 6)
        self.fc = nn.Linear(5 * 6, 4)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        b = pixel_values.shape[0]
        patches = pixel_values.unfold(2, 2, 2).unfold(3, 2, 2).permute(0, 2, 3, 1, 4, 5).reshape(b, 4, 12)
        t = torch.cat([self.cls.expand(b, -1, -1), self.embed(patches)], dim=1)
        return self.fc(torch.tanh(self.block(t)).flatten(1))


def test_every_method_on_a_vit_token_grid() -> None:
    torch.manual_seed(5)
    model = ToyViT().eval()
    x = torch.randn(2, 3, 4, 4)
    rec = GradCamRecorder(model, gradcam_layer="block", cam_topk=2, cam_method="all")
    with rec, torch.no_grad():
        model(pixel_values=x)
    res = rec.result()
    grid = res.maps["block"].grid
    assert (grid.layout, grid.height, grid.width, grid.extra_tokens) == ("tokens", 2, 2, 1)
    assert res.methods == list(METHODS)
    store: dict[str, torch.Tensor] = {}
    h = model.block.register_forward_hook(lambda m, i, o: store.__setitem__("a", o))
    try:
        logits = model(pixel_values=x)
    finally:
        h.remove()
    a = store["a"]
    for b in range(2):
        cls = res.classes[b].tolist()
        A = a[b, 1:].reshape(2, 2, 6).permute(2, 0, 1).detach().numpy()
        abl = ref_ablation(lambda z: model(pixel_values=z), model.block, x, a, b, cls, dim=2)  # every token's channel k zeroed
        sc = ref_score(lambda z: model(pixel_values=z), x, A, b, cls)
        for k in range(2):
            (g,) = torch.autograd.grad(logits[b, cls[k]], a, retain_graph=True)
            G = g[b, 1:].reshape(2, 2, 6).permute(2, 0, 1).numpy()
            for m in ("gradcam", "gradcam++", "hirescam", "xgradcam", "layercam"):
                np.testing.assert_allclose(res.low(m)[b, k], ref_gradient(m, A, G), atol=1e-5, err_msg=m)
            np.testing.assert_allclose(res.low("ablationcam")[b, k], np.maximum((abl[:, k, None, None] * A).sum(0), 0), atol=1e-5, rtol=1e-4)
            np.testing.assert_allclose(res.low("scorecam")[b, k], np.maximum((sc[:, k, None, None] * A).sum(0), 0), atol=1e-5, rtol=1e-4)
            eig, ref = res.low("eigencam")[b, k], ref_eigen(A)
            assert np.allclose(eig, ref, atol=1e-4) or np.allclose(eig, -ref, atol=1e-4)
        assert res.cam("gradcam").shape == (2, 2, 4, 4)
    model.zero_grad(set_to_none=True)


def test_gradient_methods_share_one_forward_and_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six gradient/activation methods: one forward of the model, one batched backward."""
    import nbdebug.runs.gradients as gradients

    torch.manual_seed(0)
    calls = {"fwd": 0, "bwd": 0}

    class Count(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls["fwd"] += 1
            return x

    real = gradients.class_grads

    def counted(*args: object) -> torch.Tensor:
        calls["bwd"] += 1
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(gradients, "class_grads", counted)
    wrapped = nn.Sequential(Count(), SmallCNN()).eval()
    maps, *_ = grad_cam(wrapped, torch.randn(1, 3, 6, 6), layer="1.act", topk=2,
                        methods="gradcam,gradcam++,hirescam,xgradcam,layercam,eigencam")
    assert calls == {"fwd": 1, "bwd": 1}
    assert len(maps.methods) == 6


def test_perturbation_methods_run_in_chunks_under_the_budget_and_say_so() -> None:
    torch.manual_seed(1)
    model = SmallCNN().eval()
    x = torch.randn(1, 3, 6, 6)
    seen: list[int] = []

    class Batch(nn.Module):
        def forward(self, z: torch.Tensor) -> torch.Tensor:
            seen.append(int(z.shape[0]))
            return z

    wrapped = nn.Sequential(Batch(), model).eval()
    big, *_ = grad_cam(wrapped, x, layer="1.act", topk=1, methods="scorecam")
    n_big = list(seen)
    seen.clear()
    small, *_ = grad_cam(wrapped, x, layer="1.act", topk=1, methods="scorecam", max_bytes=3 * 108 * 4)
    # 5 channels: one forward of 5 masked inputs, or one at a time (a copy is estimated at 32× the image's 432 bytes)
    assert n_big[1:] == [5], n_big
    assert seen[1:] == [1, 1, 1, 1, 1], seen
    np.testing.assert_allclose(small.of("scorecam")[1], big.of("scorecam")[1], atol=1e-6)
    assert any("chunks of 1" in n and "max-bytes" in n for n in small.notes), small.notes
    assert not big.notes


def test_parse_methods_as_written() -> None:
    assert parse_methods(None) == ["gradcam"]
    assert parse_methods("all") == list(METHODS)
    assert parse_methods("Grad-CAM++, eigencam,gradcampp, score_cam") == ["gradcam++", "eigencam", "scorecam"]
    assert parse_methods(["layercam", "all"])[:2] == ["layercam", "gradcam"]
    with pytest.raises(ValueError, match=r"unknown CAM method 'nope'.*scorecam"):
        parse_methods("gradcam,nope")
    with pytest.raises(ValueError, match="unknown CAM method"):
        GradCamRecorder(nn.Sequential(nn.Conv2d(3, 2, 1)), cam_method="fullgrad")
