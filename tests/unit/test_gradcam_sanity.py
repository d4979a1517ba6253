"""--sanity: Spearman between each map and the map of a copy whose layers after the CAM layer are
re-initialised, from the output down; a head-independent map (EigenCAM) is flagged, a map that
follows the head is not; the user's model, hooks and random stream are untouched."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from nbdebug.adapters.vision import SpatialLayer
from nbdebug.cams.checks import layers_after, reinitialise, sanity
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.inspectors.sanity import THRESHOLD, cascade_steps, ranks, spearman
from nbdebug.recorders.gradcam import GradCamRecorder, grad_cam


class TwoHeads(nn.Module):
    """conv → relu (the CAM layer) → pool → fc1 → relu → fc2."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc1 = nn.Linear(24, 8)
        self.act2 = nn.ReLU()
        self.fc2 = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act2(self.fc1(self.pool(self.act(self.conv(x))).flatten(1))))


def spearmanr(a: np.ndarray, b: np.ndarray) -> object:
    """scipy's, imported when a test calls it, not at collection (~1.3 CPU-s in each xdist worker)."""
    from scipy.stats import spearmanr as scipy_spearmanr

    return scipy_spearmanr(a, b)


def seeded_init(lin: nn.Linear, seed: int) -> None:
    """``nn.Linear``'s initialisation written with ``torch.nn.init``, from ``seed``."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        nn.init.kaiming_uniform_(lin.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(lin.weight.shape[1])
        nn.init.uniform_(lin.bias, -bound, bound)


def hand_gradcam(model: TwoHeads, x: torch.Tensor, c: int) -> np.ndarray:
    """Grad-CAM at ``act`` for sample 0 and class ``c``: ReLU(Σ_k mean_hw(∂y_c/∂A_k) A_k), A caught by a hook."""
    store: dict[str, torch.Tensor] = {}
    h = model.act.register_forward_hook(lambda _m, _a, out: store.__setitem__("A", out))
    try:
        with torch.enable_grad():
            y = model(x)
            (g,) = torch.autograd.grad(y[0, c], store["A"])
    finally:
        h.remove()
    A = store["A"].detach()[0].double()
    return torch.relu((g[0].double().mean((1, 2))[:, None, None] * A).sum(0)).numpy()


def test_spearman_equals_scipy_with_ties() -> None:
    rng = np.random.default_rng(0)
    for _ in range(5):
        a = rng.integers(0, 5, size=(6, 7)).astype(float)
        b = a + rng.normal(size=a.shape)
        np.testing.assert_allclose(spearman(a, b), spearmanr(a.ravel(), b.ravel()).statistic, atol=1e-12)
    np.testing.assert_allclose(ranks(np.array([3.0, 1.0, 3.0, 2.0])), [2.5, 0.0, 2.5, 1.0])
    assert np.isnan(spearman(np.zeros(4), np.arange(4))) and spearman(np.ones(4), np.ones(4)) == 1.0


def test_cascade_steps_from_the_output_down() -> None:
    assert cascade_steps(["a", "b", "c"]) == [["c"], ["b"], ["a"]]
    groups = cascade_steps([f"l{i}" for i in range(30)], steps=12)
    assert len(groups) == 12 and groups[0][0] == "l29" and groups[-1][-1] == "l0"
    assert [n for g in groups for n in g] == [f"l{i}" for i in range(29, -1, -1)]


def test_eigencam_is_flagged_and_gradcam_follows_the_head() -> None:
    torch.manual_seed(0)
    model = TwoHeads().eval()
    x = torch.randn(1, 3, 8, 8)
    user_hook_calls = [0]
    model.fc1.register_forward_hook(lambda *a: user_hook_calls.__setitem__(0, user_hook_calls[0] + 1))
    before, hooks, rng = fingerprint(model), hook_count(model), torch.get_rng_state()
    rec = GradCamRecorder(model, gradcam_layer="act", cam_method="gradcam,eigencam,hirescam", sanity=True, cam_topk=2)
    with rec, torch.no_grad():
        model(x)
    assert user_hook_calls[0] == 1
    res = rec.result()
    assert user_hook_calls[0] == 1  # the copy's passes did not call the user's hook
    assert same_fingerprint(before, fingerprint(model)) == [] and hook_count(model) == hooks
    assert torch.equal(rng, torch.get_rng_state())
    assert res.layer == "act" and set(res.sanity) == {"gradcam", "eigencam", "hirescam"}
    assert res.sanity["eigencam"] == 1.0  # it cannot depend on the class: the activation is the same
    assert res.sanity["gradcam"] < THRESHOLD
    assert [name for name, _ in res.sanity_cascade["gradcam"]] == ["fc2", "fc1"]
    assert res.sanity_cascade["gradcam"][-1][1] == res.sanity["gradcam"]
    assert any("eigencam's map does not depend on the class decision" in n for n in res.notes)
    assert not any("gradcam's map does not depend" in n for n in res.notes)
    # the reference by hand: a copy, fc2 then fc1 re-initialised as nn.Linear does with torch.nn.init
    # (seeds 1000 + the layer's index after act in call order, as documented), Grad-CAM by hooks and
    # autograd.grad, ρ by scipy
    layer = next(lay for lay in rec.session.layers if lay.name == "act")  # type: ignore[union-attr]
    ref = copy.deepcopy(model)
    ref.fc1._forward_hooks.clear()
    c = int(res.classes[0, 0])
    low = res.low("gradcam")[0, 0]
    np.testing.assert_allclose(low, hand_gradcam(model, x, c), atol=1e-6)
    seeded_init(ref.fc2, seed=1000 + 1)
    step1 = hand_gradcam(ref, x, c)
    seeded_init(ref.fc1, seed=1000 + 0)
    step2 = hand_gradcam(ref, x, c)
    assert res.sanity_cascade["gradcam"][0][1] == pytest.approx(spearmanr(low.ravel(), step1.ravel()).statistic, abs=1e-6)
    assert res.sanity["gradcam"] == pytest.approx(spearmanr(low.ravel(), step2.ravel()).statistic, abs=1e-6)
    assert layer.module == "act"


def test_layers_after_leave_out_ancestors_and_modules_that_ran_before() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.ReLU()
            self.conv1 = nn.Conv2d(4, 4, 1)
            self.gain = nn.Parameter(torch.ones(1))  # an ancestor of the CAM layer with a parameter of its own

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv1(self.act(x)) * self.gain

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv0 = nn.Conv2d(3, 4, 1)
            self.norm = nn.BatchNorm2d(4)  # called before and after the CAM layer
            self.block = Block()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.norm(self.block(self.norm(self.conv0(x)))).mean((2, 3)))

    model = Shared().eval()
    from nbdebug.runs.gradients import probe_pass

    calls = [(r.module, r.call) for r in probe_pass(model, (torch.randn(1, 3, 4, 4),), {}).records]
    assert calls == [("conv0", 0), ("norm", 0), ("block.act", 0), ("block.conv1", 0), ("block", 0), ("norm", 1), ("fc", 0)]
    act = SpatialLayer("block.act", "block.act", 0, 1, (), None, 2, "ReLU")  # type: ignore[arg-type]
    assert layers_after(model, act, calls) == ["block.conv1", "fc"]


def test_nothing_after_the_layer_is_a_note() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    maps, classes, *_ = grad_cam(model, torch.randn(1, 3, 4, 4), layer="1", topk=1)
    rep = sanity(model, (torch.randn(1, 3, 4, 4),), {}, SpatialLayer("1", "1", 0, 1, (), None, 1, "ReLU"), maps, classes,  # type: ignore[arg-type]
                 max_bytes=2**30)
    assert rep.rho == {} and "nothing to re-initialise" in rep.notes[0]


def test_reinitialise_draws_from_a_forked_stream() -> None:
    lin = nn.Linear(4, 3)
    custom = nn.Module()
    custom.w = nn.Parameter(torch.full((50,), 2.0) + torch.arange(50.0) * 0.1)
    rng = torch.get_rng_state()
    w0 = lin.weight.detach().clone()
    reinitialise(lin, seed=1)
    reinitialise(custom, seed=1)
    assert torch.equal(rng, torch.get_rng_state())
    assert not torch.equal(w0, lin.weight)
    again = nn.Linear(4, 3)
    reinitialise(again, seed=1)
    assert torch.equal(again.weight, lin.weight)  # seeded: the same draw each time
    assert abs(float(custom.w.detach().mean()) - 4.45) < 1.0  # around the parameter's own mean and spread
