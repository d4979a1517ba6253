"""Grad-CAM: equal to captum and to a hand computation; the model is left exactly as it was."""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nbdebug.adapters.vision import SpatialLayer
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.inspectors.gradcam import LayerError, cam_maps, parse_target
from nbdebug.recorders.gradcam import GradCamRecorder, grad_cam
from nbdebug.runs.gradients import probe_pass, target_grads
from nbdebug.testing import ResNetShaped


def small_cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )


def captum_cams(model: nn.Module, layer: nn.Module, x: torch.Tensor, classes: torch.Tensor) -> np.ndarray:
    """captum LayerGradCam + LayerAttribution.interpolate(bilinear), one call per target column. captum is
    imported here, not at collection (~1.2 CPU-s in each xdist worker, most of which never call it)."""
    from captum.attr import LayerAttribution, LayerGradCam

    lgc = LayerGradCam(model, layer)
    out = []
    for k in range(classes.shape[1]):
        a = lgc.attribute(x, target=classes[:, k].tolist(), relu_attributions=True)
        out.append(LayerAttribution.interpolate(a, tuple(x.shape[-2:]), "bilinear")[:, 0].detach())
    return torch.stack(out, dim=1).numpy()


@pytest.mark.parametrize("layer", ["4", "3", "1"])
def test_small_cnn_equals_captum(layer: str) -> None:
    torch.manual_seed(0)
    model = small_cnn().eval()
    x = torch.randn(3, 3, 20, 20)
    maps, classes, _logits, _layers, auto = grad_cam(model, x, layer=layer, topk=4)
    assert not auto and classes.shape == (3, 4)
    ref = captum_cams(model, model.get_submodule(layer), x, classes)
    assert maps.cams.shape == (3, 4, 20, 20)
    assert np.abs(ref).max() > 0  # a real comparison, not zeros against zeros
    np.testing.assert_allclose(maps.cams, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layer", ["layer4", "layer3", "layer2.0", "layer4.1.conv2"])
def test_resnet_shaped_equals_captum(layer: str) -> None:
    torch.manual_seed(1)
    model = ResNetShaped(width=16, classes=20).eval()
    x = torch.randn(2, 3, 64, 64)
    maps, classes, _, _, _ = grad_cam(model, x, layer=layer, topk=3)
    ref = captum_cams(model, model.get_submodule(layer), x, classes)
    assert np.abs(ref).max() > 0
    np.testing.assert_allclose(maps.cams, ref, atol=1e-5, rtol=0)


def test_auto_layer_is_last_spatial_output_before_pooling() -> None:
    torch.manual_seed(1)
    model = ResNetShaped(width=8, classes=5).eval()
    maps, _, _, layers, auto = grad_cam(model, torch.randn(1, 3, 64, 64))
    assert auto and maps.layer == "layer4"
    assert "avgpool" not in [lay.name for lay in layers] and "fc" not in [lay.name for lay in layers]


def hand_model() -> nn.Sequential:
    """1×1 conv A0 = x0 + x1, A1 = x0 − 2·x1; global mean; class0 = A0 − A1, class1 = A0/2 + A1/4."""
    conv = nn.Conv2d(2, 2, 1, bias=False)
    fc = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([[1.0, 1.0], [1.0, -2.0]]).view(2, 2, 1, 1))
        fc.weight.copy_(torch.tensor([[1.0, -1.0], [0.5, 0.25]]))
    return nn.Sequential(conv, nn.AdaptiveAvgPool2d(1), nn.Flatten(), fc)


HAND_X = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]], [[0.0, 1.0], [0.0, -1.0]]]])
# A0 = [[1, 3], [3, 3]], A1 = [[1, 0], [3, 6]]; both means 2.5 → scores: class0 0, class1 1.875.


def test_hand_computation_gradcam() -> None:
    maps, _classes, logits, _, _ = grad_cam(hand_model(), HAND_X, layer="0", targets=[1, 0])
    np.testing.assert_allclose(logits.numpy(), [[0.0, 1.875]], atol=1e-6)
    # dScore/dA = fc weight / 4 (the mean over 2×2) → weights class1 = [1/8, 1/16], class0 = [1/4, −1/4]
    class1 = np.array([[1 / 8 + 1 / 16, 3 / 8], [3 / 8 + 3 / 16, 3 / 8 + 6 / 16]])
    class0 = np.maximum(0.25 * np.array([[0.0, 3.0], [0.0, -3.0]]), 0)  # = [[0, .75], [0, 0]]
    np.testing.assert_allclose(maps.low[0, 0], class1, atol=1e-6)
    np.testing.assert_allclose(maps.low[0, 1], class0, atol=1e-6)
    np.testing.assert_allclose(maps.cams[0], maps.low[0], atol=1e-6)  # 2×2 layer on a 2×2 input


def test_hand_computation_gradcam_plus_plus() -> None:
    maps, _, _, _, _ = grad_cam(hand_model(), HAND_X, layer="0", targets=1, method="gradcam++")
    # constant gradient g = [1/8, 1/16], ΣA = [10, 10]: alpha = 1/(2 + 10 g), weight = 4 · relu(g) · alpha
    g = np.array([1 / 8, 1 / 16])
    w = 4 * g / (2 + 10 * g)
    a0 = np.array([[1.0, 3.0], [3.0, 3.0]])
    a1 = np.array([[1.0, 0.0], [3.0, 6.0]])
    np.testing.assert_allclose(maps.low[0, 0], np.maximum(w[0] * a0 + w[1] * a1, 0), atol=1e-6)


def test_topk_at_once_equals_one_class_at_a_time() -> None:
    torch.manual_seed(2)
    model = small_cnn().eval()
    x = torch.randn(2, 3, 16, 16)
    maps, classes, _, _, _ = grad_cam(model, x, layer="3", topk=5)
    for k in range(5):
        col = classes[:, k]
        single = [grad_cam(model, x[i : i + 1], layer="3", targets=int(col[i]))[0].cams[0, 0] for i in range(2)]
        np.testing.assert_allclose(maps.cams[:, k], np.stack(single), atol=1e-6)
    # top-k order really is the order of the scores
    logits = model(x).detach()
    assert torch.equal(classes, logits.topk(5, dim=1).indices)


def test_model_state_untouched_in_training_mode_with_grads_and_frozen_params() -> None:
    torch.manual_seed(3)
    model = nn.Sequential(small_cnn()[:5], nn.Dropout(0.0), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).train()
    x = torch.randn(4, 3, 16, 16)
    model(x).sum().backward()  # .grad filled by the user
    model[0][0].bias.requires_grad_(False)  # a frozen parameter stays frozen
    before = fingerprint(model)
    for method in ("gradcam", "gradcam++"):
        grad_cam(model, x, layer="0.3", topk=3, method=method)
    assert same_fingerprint(before, fingerprint(model)) == []
    assert model.training and hook_count(model) == 0


def test_recorder_under_no_grad_reruns_and_says_so() -> None:
    torch.manual_seed(4)
    model = small_cnn().train()
    x = torch.rand(2, 3, 16, 16)
    rec = GradCamRecorder(model, cam_topk=2)
    with rec, torch.no_grad():
        out = model(x)
    after_cell = fingerprint(model)  # the cell's own forward moved BN stats; nbdebug's must not
    res = rec.result()
    assert same_fingerprint(after_cell, fingerprint(model)) == []
    assert not out.requires_grad and res.cams.shape == (2, 2, 16, 16) and res.cams.max() > 0
    assert any("torch.no_grad" in n for n in res.notes)
    assert any("training mode" in n for n in res.notes)
    assert res.layer == "4" and res.auto_layer
    assert hook_count(model) == 0


def test_recorder_in_a_training_cell_leaves_grads_to_the_user() -> None:
    torch.manual_seed(5)
    model = small_cnn().eval()
    x = torch.randn(2, 3, 16, 16)
    rec = GradCamRecorder(model, gradcam_layer="3", target="7")
    with rec:
        loss = model(x).sum()
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    res = rec.result()
    assert res.classes.tolist() == [[7], [7]]
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, grads[n])
    ref = captum_cams(model, model[3], x, torch.tensor([[7], [7]]))
    np.testing.assert_allclose(res.cams, ref, atol=1e-5)


def test_layer_without_spatial_output_lists_the_ones_that_qualify() -> None:
    model = small_cnn().eval()
    with pytest.raises(LayerError) as err:
        grad_cam(model, torch.randn(1, 3, 8, 8), layer="7")
    msg = str(err.value)
    assert "'7'" in msg and "qualify" in msg and "4" in msg and "0" in msg


class HFStyle(nn.Module):
    """Returns an HF ImageClassifierOutput, or a (logits, features) tuple."""

    def __init__(self, tuple_output: bool = False) -> None:
        super().__init__()
        self.body = small_cnn()
        self.tuple_output = tuple_output

    def forward(self, pixel_values: torch.Tensor):  # type: ignore[no-untyped-def]
        from transformers.modeling_outputs import ImageClassifierOutput

        logits = self.body(pixel_values)
        return (logits, pixel_values.mean()) if self.tuple_output else ImageClassifierOutput(logits=logits)


@pytest.mark.parametrize("tuple_output", [False, True])
def test_hf_outputs_and_tuples_work_without_wrappers(tuple_output: bool) -> None:
    torch.manual_seed(6)
    wrapped = HFStyle(tuple_output).eval()
    x = torch.randn(2, 3, 16, 16)
    maps, classes, _, _, _ = grad_cam(wrapped, (), {"pixel_values": x}, layer="body.4", topk=2)
    ref = captum_cams(wrapped.body, wrapped.body[4], x, classes)
    np.testing.assert_allclose(maps.cams, ref, atol=1e-5)


def test_class_names_and_named_targets() -> None:
    torch.manual_seed(7)
    model = small_cnn().eval()
    names = [f"thing{i}" for i in range(10)]
    rec = GradCamRecorder(model, target="thing3,5", class_names=names)
    with rec:
        model(torch.rand(1, 3, 12, 12))
    res = rec.result()
    assert res.classes.tolist() == [[3, 5]] and res.class_names == [["thing3", "thing5"]]
    with pytest.raises(ValueError, match="no class named"):
        grad_cam(model, torch.rand(1, 3, 12, 12), targets="nope", class_names=names)


def test_shared_module_called_twice_uses_the_requested_call() -> None:
    torch.manual_seed(8)

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2, self.act = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 6, 3, padding=1), nn.SiLU()
            self.fc = nn.Linear(6, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.act(self.c2(self.act(self.c1(x)))).mean((2, 3)))

    model = Shared().eval()
    x = torch.randn(1, 3, 8, 8)
    maps, classes, _, layers, auto = grad_cam(model, x)
    # one name per module call, as in the thermometer: the first call unsuffixed, then #2
    assert auto and maps.layer == "act#2" and {"act", "act#2"} <= {lay.name for lay in layers}
    # reference: the same computation by hand on the second call's output
    a = model.act(model.c2(model.act(model.c1(x)))).detach().requires_grad_(True)
    score = model.fc(a.mean((2, 3)))[0, classes[0, 0]]
    (g,) = torch.autograd.grad(score, a)
    ref = F.relu((g.mean((2, 3), keepdim=True) * a).sum(1))
    np.testing.assert_allclose(maps.cams[0, 0], ref[0].detach().numpy(), atol=1e-6)
    first, *_ = grad_cam(model, x, layer="act", targets=int(classes[0, 0]))
    assert first.layer == "act" and first.low.shape[-2:] == (8, 8) and not np.allclose(first.cams, maps.cams[:, :1])
    second, *_ = grad_cam(model, x, layer="act#2", targets=int(classes[0, 0]))
    np.testing.assert_allclose(second.cams, maps.cams[:, :1], atol=1e-6)
    # "act#1" is accepted for the first call too, and reported under its one name
    one, *_ = grad_cam(model, x, layer="act#1", targets=int(classes[0, 0]))
    assert one.layer == "act"
    np.testing.assert_allclose(one.cams, first.cams, atol=1e-6)


def tiny_vit():  # type: ignore[no-untyped-def]
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, num_labels=5, id2label={i: f"label{i}" for i in range(5)},
                    label2id={f"label{i}": i for i in range(5)})
    return ViTForImageClassification(cfg).eval()


def test_tiny_hf_vit_reshape_and_auto_layer() -> None:
    model = tiny_vit()
    x = torch.randn(2, 3, 32, 32)
    rec = GradCamRecorder(model, cam_topk=3)
    before = fingerprint(model)
    with rec, torch.no_grad():
        model(pixel_values=x)
    res = rec.result()
    assert same_fingerprint(before, fingerprint(model)) == []
    # the final norm only feeds the CLS token, so the auto layer is the last block's input norm
    last = model.config.num_hidden_layers - 1
    assert res.layer.endswith(f"{last}.layernorm_before"), res.layer
    grid = res.maps[res.layer].grid
    assert (grid.layout, grid.height, grid.width, grid.extra_tokens) == ("tokens", 4, 4, 1)
    assert res.cams.shape == (2, 3, 32, 32) and res.cams.max() > 0
    assert res.class_names[0][0].startswith("label")
    # reference: hand Grad-CAM on the tokens of that layer, CLS dropped, 16 patches as 4×4
    module = model.get_submodule(res.layer)
    store = {}
    handle = module.register_forward_hook(lambda m, i, o: store.__setitem__("a", o))
    try:
        logits = model(pixel_values=x).logits
    finally:
        handle.remove()
    a = store["a"]
    for b in range(2):
        for k in range(3):
            (g,) = torch.autograd.grad(logits[b, int(res.classes[b, k])], a, retain_graph=True)
            act = a[b, 1:].reshape(4, 4, -1).permute(2, 0, 1)
            gg = g[b, 1:].reshape(4, 4, -1).permute(2, 0, 1)
            cam = F.relu((gg.mean((1, 2))[:, None, None] * act).sum(0))
            up = F.interpolate(cam[None, None], size=(32, 32), mode="bilinear", align_corners=False)[0, 0]
            np.testing.assert_allclose(res.cams[b, k], up.detach().numpy(), atol=1e-5)
    model.zero_grad(set_to_none=True)


def test_vit_layer_after_last_attention_is_flagged_zero() -> None:
    model = tiny_vit()
    maps, *_ = grad_cam(model, (), {"pixel_values": torch.randn(1, 3, 32, 32)}, layer="vit.layernorm")
    assert maps.zero_grad and "class token" in maps.note and maps.cams.max() == 0


class TokenNet(nn.Module):
    """Conv patches → tokens (B×16×C, no class token) → per-token linear → mean → classes."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 8, 4, stride=4)
        self.proj = nn.Linear(8, 8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        return self.fc(torch.tanh(self.proj(tokens)).mean(1))


def test_reshape_escape_hatch_matches_the_detected_grid() -> None:
    torch.manual_seed(9)
    model = TokenNet().eval()
    x = torch.randn(2, 3, 16, 16)
    auto, *_ = grad_cam(model, x, layer="proj", topk=2)
    assert (auto.grid.layout, auto.grid.height, auto.grid.width, auto.grid.extra_tokens) == ("tokens", 4, 4, 0)
    by_string, *_ = grad_cam(model, x, layer="proj", topk=2, reshape="tokens:0:4x4")
    by_callable, *_ = grad_cam(model, x, layer="proj", topk=2, reshape=lambda t: t.transpose(-1, -2).unflatten(-1, (4, 4)))
    assert auto.cams.max() > 0
    np.testing.assert_allclose(by_string.cams, auto.cams, atol=1e-6)
    np.testing.assert_allclose(by_callable.cams, auto.cams, atol=1e-6)
    # a wrong grid is refused instead of silently scrambling the map
    with pytest.raises(ValueError, match="does not fit"):
        grad_cam(model, x, layer="proj", reshape="tokens:1:4x4")


def test_hf_backbone_whose_pooled_output_feeds_the_head() -> None:
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    cfg = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=4)
    model = ResNetForImageClassification(cfg).eval()
    x = torch.randn(1, 3, 64, 64)
    # `resnet` returns last_hidden_state first, but the head reads pooler_output: zero gradient,
    # so the auto choice moves to the encoder's feature map (the pooler's input)
    maps, classes, _, _, auto = grad_cam(model, (), {"pixel_values": x}, topk=2)
    assert auto and maps.layer == "resnet.encoder" and not maps.zero_grad
    # reference by hand (captum cannot take a ModelOutput as the layer output)
    store = {}
    handle = model.resnet.encoder.register_forward_hook(lambda m, i, o: store.__setitem__("a", o.last_hidden_state))
    try:
        logits = model(pixel_values=x).logits
    finally:
        handle.remove()
    a = store["a"]
    for k in range(2):
        (g,) = torch.autograd.grad(logits[0, int(classes[0, k])], a, retain_graph=True)
        cam = F.relu((g.mean((2, 3), keepdim=True) * a).sum(1, keepdim=True))
        up = F.interpolate(cam, size=(64, 64), mode="bilinear", align_corners=False)[0, 0]
        np.testing.assert_allclose(maps.cams[0, k], up.detach().numpy(), atol=1e-5)
    model.zero_grad(set_to_none=True)


# -- the split: passes in runs/gradients.py, CAM math in the inspector -------------------------
HAND_A = torch.tensor([[[[1.0, 3.0], [3.0, 3.0]], [[1.0, 0.0], [3.0, 6.0]]]])  # hand_model's conv output on HAND_X


def test_cam_maps_is_the_hand_computation_without_a_model() -> None:
    # gradients of hand_model's class1 and class0 w.r.t. its conv output: fc weight / 4, constant over the grid
    grads = torch.tensor([1 / 8, 1 / 16, 1 / 4, -1 / 4]).view(2, 1, 2, 1, 1).expand(2, 1, 2, 2, 2)
    layer = SpatialLayer("0", "0", 0, 1, (), None, 0, "")  # type: ignore[arg-type]  # grid from the shape
    maps = cam_maps(layer, HAND_A, grads, output_hw=(2, 2))
    ref, *_ = grad_cam(hand_model(), HAND_X, layer="0", targets=[1, 0])
    assert maps.grid.layout == "nchw" and not maps.zero_grad and maps.note == ""
    np.testing.assert_allclose(maps.low[0, 0], [[1 / 8 + 1 / 16, 3 / 8], [3 / 8 + 3 / 16, 3 / 8 + 6 / 16]], atol=1e-6)
    np.testing.assert_allclose(maps.low[0, 1], [[0.0, 0.75], [0.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(maps.cams, ref.cams, atol=1e-6)
    zero = cam_maps(layer, HAND_A, torch.zeros(2, 1, 2, 2, 2))
    assert zero.zero_grad and "gradient is zero" in zero.note and not zero.low.any()
    with pytest.raises(LayerError, match="no spatial output"):
        cam_maps(SpatialLayer("fc", "fc", 0, 1, (), None, 0, ""), torch.ones(1, 2), torch.ones(1, 1, 2))  # type: ignore[arg-type]


def test_target_grads_and_probe_pass_leave_the_model_and_the_users_hooks_alone() -> None:
    model = hand_model().train()
    calls: list[str] = []
    handle = model[0].register_forward_hook(lambda *_: calls.append("user"))
    try:
        before = fingerprint(model)
        act, grads = target_grads(model, (HAND_X,), {}, "0", None, lambda out: out[:, [1, 0]])
        assert torch.equal(act, HAND_A) and not act.requires_grad and grads.shape == (2, 1, 2, 2, 2)
        expected = torch.tensor([1 / 8, 1 / 16, 1 / 4, -1 / 4]).view(2, 1, 2, 1, 1).expand(2, 1, 2, 2, 2)
        torch.testing.assert_close(grads, expected)
        pr = probe_pass(model, (HAND_X,), {})
        assert [(r.name, tuple(r.shape)) for r in pr.records][:2] == [("0", (1, 2, 2, 2)), ("1", (1, 2, 1, 1))]
        assert calls == [] and hook_count(model) == 1  # the user's hook: set aside, not removed
        assert same_fingerprint(before, fingerprint(model)) == [] and model.training
    finally:
        handle.remove()
    assert hook_count(model) == 0


def test_inspectors_hold_no_hooks_and_run_no_passes() -> None:
    """ARCHITECTURE.md: inspectors are pure computation; the passes live in capture/ (and recorders run them)."""
    import nbdebug.inspectors as pkg

    root = Path(pkg.__file__).parent
    banned_modules = {"gradients", "hooks", "probe", "state", "replay", "attention_probe", "inputs"}  # (session: its result types)
    banned_names = {"HookSet", "layer_pass", "preserve_buffers", "suspend_hooks", "OutputProbe", "Capture", "ModelCall"}
    found = set()
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {f"{path.name}: {node.module}" for part in node.module.split(".") if part in banned_modules}
                found |= {f"{path.name}: {a.name}" for a in node.names if a.name in banned_names | banned_modules}
            if isinstance(node, ast.Attribute) and node.attr.startswith("register_") and "hook" in node.attr:
                found.add(f"{path.name}: .{node.attr}")
    assert found == set()
    import nbdebug.inspectors.gradcam as inspector

    assert not {"grad_cam", "compute_cams", "probe", "infer_grid_for"} & set(vars(inspector))


def test_parse_target_as_written() -> None:
    assert [parse_target(v) for v in (None, "", " TopK ", "auto")] == ["topk"] * 4
    assert parse_target("3") == 3 and parse_target("-1") == -1 and parse_target("tabby") == "tabby"
    assert parse_target("3, tabby,") == [3, "tabby"] and parse_target([1, 2]) == [1, 2]


CALLS: list[int] = []


class Counted(nn.Sequential):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        CALLS.append(1)
        return super().forward(x)


@pytest.mark.parametrize("interrupted", [True, False])
def test_after_ctrl_c_the_recorder_runs_no_pass_of_its_own(interrupted: bool) -> None:
    model = Counted(*hand_model())
    CALLS.clear()
    rec = GradCamRecorder(model)
    x = HAND_X.clone()
    with pytest.raises(KeyboardInterrupt) if interrupted else contextlib.nullcontext():
        with rec:
            model(x)
            if interrupted:
                raise KeyboardInterrupt
    assert len(CALLS) == 1
    if interrupted:
        assert rec.applies() == ("the cell was interrupted; Grad-CAM would need a new forward and backward "
                                 "— re-run the cell to see it")
        assert len(CALLS) == 1
    else:  # the same cell not interrupted: the view applies and runs its own forward
        assert rec.applies() is None
        assert rec.result().layer == "0" and len(CALLS) == 2
