"""Grad-CAM and feature maps in the modes real cells run (issue 9): a pending backward in training
mode, no_grad / inference_mode, half precision, the user's own hooks, loops, checkpointing, a
deleted model, views that do not apply. Each compares with a reference computed without nbdebug."""

from __future__ import annotations

import copy
import gc
import warnings
import weakref
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from nbdebug.capture import fingerprint, hook_count, preserve_buffers, same_fingerprint
from nbdebug.capture.weak import MODEL_GONE, ModelGoneError
from nbdebug.recorders.featuremaps import FeatureMapsRecorder
from nbdebug.recorders.gradcam import GradCamRecorder, grad_cam


def bn_cnn(momentum: float | None = 0.1) -> nn.Sequential:
    """Two conv+BN blocks; ``momentum=None`` makes BN read ``num_batches_tracked``."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8, momentum=momentum), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16, momentum=momentum), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )


def versions(model: nn.Module) -> dict[str, int]:
    return {n: b._version for n, b in model.named_buffers()}


# -- 2. a pending backward after Grad-CAM ------------------------------------------------------
@pytest.mark.parametrize("momentum", [0.1, None])
def test_users_pending_backward_after_gradcam_in_training_mode(momentum: float | None) -> None:
    torch.manual_seed(0)
    model = bn_cnn(momentum).train()
    twin = copy.deepcopy(model)
    x = torch.randn(4, 3, 12, 12)
    rec = GradCamRecorder(model, cam_topk=2)
    with rec:
        out = model(x)
    after_cell, before = fingerprint(model), versions(model)
    res = rec.result()
    assert rec.session is not None
    rec.session.maps_for("2")  # another layer on demand: one more forward of nbdebug's own
    assert res.cams.max() > 0 and "2" in res.maps
    assert versions(model) == before  # the buffers BN saved for backward were never touched
    assert same_fingerprint(after_cell, fingerprint(model)) == []
    out.sum().backward()  # raised "modified by an inplace operation" before the fix
    ref = twin(x)
    ref.sum().backward()
    assert torch.equal(out, ref)
    for (n, p), (_, q) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), n
    for (n, b), (_, c) in zip(model.named_buffers(), twin.named_buffers(), strict=True):
        assert torch.equal(b, c), n  # running stats and num_batches_tracked: one update, the cell's
    assert hook_count(model) == 0 and model.training


class Counter(nn.Module):
    """Counts its calls in a buffer, in place (like BN's num_batches_tracked)."""

    def __init__(self, buf: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("n", buf)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n.add_(1)
        return x * self.n


def test_preserve_buffers_runs_on_clones_shared_buffers_stay_shared() -> None:
    shared = torch.zeros(())
    model = nn.Sequential(Counter(shared), Counter(shared))
    v = shared._version
    with preserve_buffers(model):
        y = model(torch.ones(2))
        assert model[0].n is model[1].n and model[0].n is not shared  # one clone for a shared buffer
    assert torch.equal(y, torch.full((2,), 2.0))  # 1 * 1, then * 2: the clone counted both calls
    assert model[0].n is shared and model[1].n is shared and float(shared) == 0.0 and shared._version == v


def test_preserve_buffers_restores_a_buffer_mutated_behind_the_modules_back() -> None:
    class Sneaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("b", torch.ones(3))
            self.alias = [self.b]  # a reference of its own, outside _buffers

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.alias[0].mul_(5)
            return x

    m = Sneaky()
    with preserve_buffers(m):
        m(torch.zeros(1))
    assert torch.equal(m.b, torch.ones(3)) and m.b is m.alias[0]


# -- grad modes, precision, the user's hooks, loops ----------------------------------------------
def small_cnn() -> nn.Sequential:
    torch.manual_seed(1)
    return bn_cnn().eval()


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_gradcam_and_featuremaps_under_no_grad_and_inference_mode(mode: str) -> None:
    model = small_cnn()
    x = torch.randn(2, 3, 12, 12)
    ref, classes, *_ = grad_cam(model, x, layer="3", topk=3)
    before = fingerprint(model)
    cam, fm = GradCamRecorder(model, gradcam_layer="3", cam_topk=3), FeatureMapsRecorder(model)
    ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with cam, fm, ctx:
        model(x)
    res = cam.result()
    assert res.classes.tolist() == classes.tolist()
    np.testing.assert_allclose(res.cams, ref.cams, atol=1e-6)
    assert any(f"torch.{mode}" in n for n in res.notes)
    maps = fm.result()
    assert fm.applies() is None and torch.equal(maps["3"].data, model[3](model[:3](x)).detach())
    assert same_fingerprint(before, fingerprint(model)) == [] and hook_count(model) == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models_on_cpu(dtype: torch.dtype) -> None:
    model = small_cnn()
    x = torch.rand(2, 3, 12, 12)
    ref, classes, *_ = grad_cam(model, x, layer="3", topk=2)
    half = copy.deepcopy(model).to(dtype)
    cam, fm = GradCamRecorder(half, gradcam_layer="3", target=",".join(str(int(c)) for c in classes[0])), FeatureMapsRecorder(half)
    with cam, fm, torch.no_grad():
        half(x.to(dtype))
    res = cam.result()
    assert res.cams.dtype == np.float32 and res.classes[0].tolist() == classes[0].tolist()
    # the same CAM as the float32 model, up to half-precision rounding
    np.testing.assert_allclose(res.cams[0], ref.cams[0], atol=0.05 * float(ref.cams[0].max()))
    layer = fm.result()["3"]
    assert layer.data.dtype == dtype and fm.result().stats("3", 0).hi.dtype == np.float32
    assert hook_count(half) == 0


def test_users_own_hooks_are_kept_and_not_called_by_nbdebugs_own_passes() -> None:
    model = small_cnn()
    x = torch.randn(1, 3, 12, 12)
    ref, *_ = grad_cam(model, x, layer="3", topk=2)  # before any hook
    seen: list[tuple[int, ...]] = []
    handles = [model[4].register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape))),
               model[0].register_forward_pre_hook(lambda m, i: seen.append(("pre",)))]  # type: ignore[arg-type]
    try:
        rec = GradCamRecorder(model, gradcam_layer="3", cam_topk=2)
        with rec:
            model(x)
        res = rec.result()
        assert rec.session is not None
        rec.session.maps_for("0")  # and an on-demand layer
        assert seen == [("pre",), (1, 16, 6, 6)]  # the cell's call only: the hooks saw what they would have
        np.testing.assert_allclose(res.cams, ref.cams, atol=1e-6)
        assert any("did not call your 2 hook(s)" in n for n in res.notes)
        assert hook_count(model) == 2  # the user's hooks are kept, ours are gone
        model(x)
        assert len(seen) == 4  # and still called afterwards
    finally:
        for h in handles:
            h.remove()


def test_a_hook_that_changes_the_output_is_reported() -> None:
    model = small_cnn()
    x = torch.randn(1, 3, 12, 12)
    handle = model[5].register_forward_hook(lambda m, i, o: o * 2)
    try:
        rec = GradCamRecorder(model, gradcam_layer="3", cam_topk=1)
        with rec:
            model(x)
        res = rec.result()
    finally:
        handle.remove()
    assert any("differ from your cell's" in n for n in res.notes) and any("did not call your 1 hook" in n for n in res.notes)


def test_loop_explains_the_first_call_and_says_so() -> None:
    model = small_cnn()
    xs = [torch.randn(1, 3, 12, 12) for _ in range(3)]
    cam, fm = GradCamRecorder(model, cam_topk=1), FeatureMapsRecorder(model)
    with cam, fm:
        for x in xs:
            model(x)
    res = cam.result()
    first, *_ = grad_cam(model, xs[0], topk=1)
    np.testing.assert_allclose(res.cams, first.cams, atol=1e-6)
    assert any("3 times; the first call is explained" in n for n in res.notes)
    maps = fm.result()
    assert torch.equal(maps["0"].data, model[0](xs[0]).detach()) and "0#2" not in maps.layers
    assert any("3 times; the first call is shown" in n for n in maps.notes)


# -- 7. checkpointing: no recomputation layers, the same CAMs -----------------------------------
class Ckpt(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.block = nn.Sequential(nn.Conv2d(6, 8, 3, padding=1), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.block, self.stem(x), use_reentrant=self.reentrant))


@pytest.mark.parametrize("layer", ["stem", "block.0"])  # before the checkpointed segment, inside it
@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_model_in_a_training_cell(reentrant: bool, layer: str) -> None:
    model = Ckpt(reentrant).train()
    x = torch.randn(2, 3, 8, 8)
    cam, fm = GradCamRecorder(model, gradcam_layer=layer, cam_topk=2), FeatureMapsRecorder(model)
    with cam, fm:
        model(x).sum().backward()  # backward recomputes `block` while the views still watch
    after_cell = fingerprint(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing of checkpoint's leaks from nbdebug's own passes
        res = cam.result()
    assert same_fingerprint(after_cell, fingerprint(model)) == []
    plain = Ckpt(reentrant).eval()
    plain.load_state_dict(model.state_dict())
    plain.forward = lambda x: plain.head(plain.block(plain.stem(x)))  # type: ignore[method-assign]
    ref, *_ = grad_cam(plain, x, layer=layer, targets=res.classes[0].tolist())
    assert ref.cams.max() > 0
    np.testing.assert_allclose(res.cams[0], ref.cams[0], atol=1e-6)
    assert res.layers == ["stem", "block.0", "block.1", "block"]  # no block.0#2 from the recomputation
    assert list(fm.result().layers) == ["stem", "block.0", "block.1"]  # (leaves by default)
    assert hook_count(model) == 0 and model.stem.weight.grad is not None


def test_hf_gradient_checkpointing_gives_the_same_layers_and_cams() -> None:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, num_labels=5)
    model = ViTForImageClassification(cfg).train()
    twin = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # renamed in recent transformers
        model.gradient_checkpointing_enable()
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    x = torch.randn(2, 3, 32, 32)
    cam, fm = GradCamRecorder(model, cam_topk=2), FeatureMapsRecorder(model)
    with cam, fm:
        model(pixel_values=x).logits.sum().backward()
    after_cell = fingerprint(model)
    res = cam.result()
    ref = GradCamRecorder(twin, cam_topk=2)
    with ref:
        twin(pixel_values=x)
    expected = ref.result()
    assert res.layers == expected.layers and res.layer == expected.layer
    assert list(fm.result().layers) == [n for n in expected.layers if n in fm.result().layers]
    np.testing.assert_allclose(res.cams, expected.cams, atol=1e-6)
    assert expected.cams.max() > 0
    assert same_fingerprint(after_cell, fingerprint(model)) == [] and hook_count(model) == 0


# -- 4. a deleted model is collected; an on-demand fetch says so ---------------------------------
def test_deleted_model_is_collected_and_a_fetch_answers_with_the_message() -> None:
    model = small_cnn()
    rec = GradCamRecorder(model, gradcam_layer="3")
    fm = FeatureMapsRecorder(model)
    with rec, fm:
        out = model(torch.randn(1, 3, 12, 12))
    cam_widget, fm_widget = rec.widget(), fm.widget()
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None  # recorders, sessions, results and widgets held it weakly
    assert out.grad_fn is not None  # (the user's output graph does not hold the module either)
    sent: list[dict[str, Any]] = []
    cam_widget.send = lambda msg, buffers=None: sent.append(msg)  # type: ignore[method-assign]
    cam_widget._handle_request(cam_widget, {"type": "request", "id": 7, "method": "view", "params": {"layer": "0"}}, [])
    assert len(sent) == 1 and sent[0]["ok"] is False and sent[0]["error"].endswith(MODEL_GONE)
    # what was computed already is still served, and the feature maps need no model
    content, _ = cam_widget.handle_request("view", {"layer": "3"})
    assert content["result"]["layer"] == "3"
    fm_widget.handle_request("page", {"layer": "0"})
    with pytest.raises(ModelGoneError):
        rec.model  # noqa: B018


# -- applies() ---------------------------------------------------------------------------------
def test_applies_says_why_a_view_has_nothing_to_show() -> None:
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    cam, fm = GradCamRecorder(mlp), FeatureMapsRecorder(mlp)
    with cam, fm:
        mlp(torch.randn(2, 4))
    assert "no layer has a spatial output" in (cam.applies() or "")
    assert fm.applies() == "no captured layer has a spatial output"

    cnn = small_cnn()
    cam, fm = GradCamRecorder(cnn), FeatureMapsRecorder(cnn)
    with cam, fm:
        pass
    assert "never called" in (cam.applies() or "") and "never called" in (fm.applies() or "")

    seg = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())  # a dense output, not class scores
    cam, fm = GradCamRecorder(seg), FeatureMapsRecorder(seg, max_bytes=0)
    with cam, fm:
        seg(torch.randn(1, 3, 8, 8))
    assert "not class scores" in (cam.applies() or "") and "[1, 4, 8, 8]" in (cam.applies() or "")
    assert "memory budget" in (fm.applies() or "")  # 0 bytes honoured: nothing kept

    cnn = small_cnn()
    cam, fm = GradCamRecorder(cnn), FeatureMapsRecorder(cnn)
    with cam, fm:
        cnn(torch.randn(1, 3, 12, 12))
    assert cam.applies() is None and fm.applies() is None


def test_a_cell_that_raises_inside_the_model() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(512, 10))
    cam, fm = GradCamRecorder(model), FeatureMapsRecorder(model)
    x = torch.randn(2, 3, 10, 10)  # flattens to 400 features, not 512
    with pytest.raises(RuntimeError, match="cannot be multiplied"), cam, fm:
        model(x)
    assert "raised during its first call" in (cam.applies() or "")
    assert fm.applies() is None and list(fm.result().layers) == ["0", "1"]  # what ran before is shown
    assert any("raised during its first call" in n for n in fm.result().notes)
    assert hook_count(model) == 0


def test_integer_and_bool_outputs_are_not_layers() -> None:
    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4, 3)
            self.mask, self.argmax = Gt(), Argmax()

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.conv(x)
            h = h.masked_fill(self.mask(h), 0.0)
            logits = self.fc(h.mean((2, 3)))
            return logits, self.argmax(logits)

    torch.manual_seed(3)
    model = Masked()
    x = torch.randn(2, 3, 6, 6)
    cam, fm = GradCamRecorder(model, cam_topk=2), FeatureMapsRecorder(model)
    with cam, fm:
        model(x)
    res = cam.result()
    assert res.layers == ["conv"] and res.layer == "conv" and list(fm.result().layers) == ["conv"]
    ref, *_ = grad_cam(model, x, layer="conv", targets=res.classes[0].tolist())
    np.testing.assert_allclose(res.cams[0], ref.cams[0], atol=1e-6)


class Gt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x > 1e3  # a bool map, all False


class Argmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.argmax(dim=1)


def test_compiled_model_keeps_its_own_layer_names() -> None:
    model = small_cnn()
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(2, 3, 12, 12)
    cam, fm = GradCamRecorder(compiled, gradcam_layer="3", cam_topk=2), FeatureMapsRecorder(compiled)
    with cam, fm:
        compiled(x)
    res = cam.result()
    ref, *_ = grad_cam(model, x, layer="3", targets=res.classes[0].tolist())
    assert "3" in res.layers and not any(n.startswith("_orig_mod") for n in res.layers)
    np.testing.assert_allclose(res.cams[0], ref.cams[0], atol=1e-5)
    assert list(fm.result().layers)[:2] == ["0", "1"] and hook_count(compiled) == 0


def test_suspend_hooks_sets_only_the_users_hooks_aside() -> None:
    from nbdebug.capture.state import suspend_hooks, user_hook_count

    conv = nn.utils.parametrizations.weight_norm(nn.Conv2d(3, 4, 3))  # parametrized: no hook
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated in favour of the parametrization
        legacy = torch.nn.utils.weight_norm(nn.Linear(4, 2))  # weight norm as a library pre-hook
    model = nn.Sequential(conv, nn.ReLU(), legacy)
    calls: list[str] = []
    model[1].register_forward_hook(lambda m, i, o: calls.append("user"))
    table = legacy._forward_pre_hooks
    assert user_hook_count(model) == 1 and len(table) == 1
    with suspend_hooks(model):
        assert len(legacy._forward_pre_hooks) == 1 and len(model[1]._forward_hooks) == 0
        with torch.no_grad():
            legacy.weight_v.mul_(2)  # the library hook recomputes .weight from weight_g/weight_v
            y = legacy(torch.ones(1, 4))
        assert torch.allclose(y, torch.ones(1, 4) @ legacy.weight.T + legacy.bias)
    assert calls == [] and legacy._forward_pre_hooks is table and len(model[1]._forward_hooks) == 1


# -- 9. one memory policy: Grad-CAM keeps other layers' CAMs within --max-bytes ----------------
def test_gradcam_keeps_other_layers_within_max_bytes_and_recomputes_the_rest() -> None:
    torch.manual_seed(0)
    model = bn_cnn().eval()
    x = torch.randn(2, 3, 12, 12)
    unbounded = GradCamRecorder(model, cam_topk=2)
    with unbounded:
        model(x)
    unbounded.result()
    ref = {name: unbounded.session.maps_for(name).cams.copy() for name in ("2", "5", "0")}  # type: ignore[union-attr]
    rec = GradCamRecorder(model, cam_topk=2, max_bytes="0")
    with rec:
        model(x)
    res = rec.result()
    session = rec.session
    assert session is not None and session.pinned == res.layer == "5"
    assert any("--max-bytes budget of 0 B" in n for n in res.notes), res.notes
    for name in ("2", "0"):  # computed on demand, equal to the unbounded ones, not kept
        np.testing.assert_array_equal(session.maps_for(name).cams, ref[name])
        assert name not in session.maps and name in session.dropped
    assert list(session.maps) == ["5"] and session.kept_bytes() == 0
    np.testing.assert_array_equal(session.maps_for("5").cams, ref["5"])
    one = max(session.cam_bytes(unbounded.session.maps_for(n)) for n in ("2", "0"))  # type: ignore[union-attr]
    roomy = GradCamRecorder(model, cam_topk=2, max_bytes=one)  # room for one more layer than the shown one
    with roomy:
        model(x)
    roomy.result()
    s2 = roomy.session
    assert s2 is not None
    s2.maps_for("2"), s2.maps_for("0")
    assert list(s2.maps) == ["5", "0"] and s2.dropped == {"2"} and s2.kept_bytes() <= one


def test_gradcam_on_a_language_model_interrupted_after_its_forward_says_what_the_model_is() -> None:
    """Ctrl-C after the forward: the reason is the model's (no spatial layer), not the interruption."""
    from nbdebug.adapters.offline import tiny_lm

    m = tiny_lm("gpt2")
    rec = GradCamRecorder(m)
    with pytest.raises(KeyboardInterrupt), rec:
        m(torch.randint(1, 60, (1, 6)))
        raise KeyboardInterrupt
    assert rec.applies() == "no layer has a spatial output (B×C×H×W, B×H×W×C or a token grid)"
    cnn = bn_cnn().eval()
    rec = GradCamRecorder(cnn)
    with pytest.raises(KeyboardInterrupt), rec:
        cnn(torch.randn(1, 3, 8, 8))
        raise KeyboardInterrupt
    assert rec.applies() is not None and rec.applies().startswith("the cell was interrupted")
