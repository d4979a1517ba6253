"""A cell that raises inside the model: the thermometer names the module, shows its inputs next to
its parameters and says what does not fit; the user's exception propagates unchanged."""

from __future__ import annotations

import traceback

import pytest
import torch
from torch import nn

from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.capture.errors import ErrorSite, ParamInfo, TensorInfo
from nbdebug.capture.session import Capture
from nbdebug.inspectors.thermometer import diagnose, explain_error
from nbdebug.widgets.thermometer import ThermometerWidget


def beginner_cnn() -> nn.Sequential:
    torch.manual_seed(0)
    m = nn.Sequential()
    m.add_module("conv", nn.Conv2d(3, 8, 3))
    m.add_module("relu", nn.ReLU())
    m.add_module("flat", nn.Flatten())
    m.add_module("head", nn.Linear(512, 10))
    return m


def capture_raising(m: nn.Module, x: torch.Tensor) -> tuple[BaseException, object]:
    before = fingerprint(m)
    plain = None
    try:
        m(x)
    except Exception as e:  # what the cell raises without nbdebug
        plain = e
    with pytest.raises(type(plain)) as info:
        with Capture(m) as cap:
            m(x)
    assert str(info.value) == str(plain)  # the same exception, unchanged
    assert same_fingerprint(before, fingerprint(m)) == [] and hook_count(m) == 0
    return info.value, cap.result


def test_shape_mismatch_names_the_module_and_the_producer() -> None:
    m = beginner_cnn()
    exc, res = capture_raising(m, torch.randn(4, 3, 12, 12))
    assert "mat1 and mat2 shapes cannot be multiplied (4x800 and 512x10)" in str(exc)
    # the traceback still ends in the user's module, not in nbdebug
    assert "nbdebug" not in traceback.extract_tb(exc.__traceback__)[-1].filename
    site = res.error
    assert site is not None and (site.module, site.type) == ("head", "Linear")
    assert site.inputs == (TensorInfo((4, 800), "float32", "cpu", "flat", (4, 8, 10, 10)),)
    assert [(p.name, p.shape) for p in site.params] == [("weight", (10, 512)), ("bias", (10,))]
    assert site.config["in_features"] == 512 and site.error.startswith("RuntimeError: mat1 and mat2")
    assert [r.name for r in res.layers] == ["conv", "relu", "flat"]
    rep = diagnose(res)
    assert rep.error is not None
    assert rep.error.problems == ["`head` expects 512 input features, got 800 from `flat` (8×10×10)"]
    assert rep.summary == "3 layers ran, then `head` (Linear) raised RuntimeError: `head` expects 512 input features, got 800 from `flat` (8×10×10)"
    assert rep.error.inputs == ["4×800 float32 cpu, from `flat`"]
    assert rep.error.params == ["weight 10×512 float32 cpu", "bias 10 float32 cpu"]
    assert rep.diagnoses[0].code == "raised" and "no problems found" not in rep.summary


def test_dtype_mismatch() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    _, res = capture_raising(m, torch.randn(2, 4, dtype=torch.float64))
    rep = diagnose(res)
    assert res.error.module == "0" and res.error.inputs[0].dtype == "float64"
    assert rep.error.problems == ["`0` has float32 parameters, got a float64 input: convert it with .to(torch.float32)"]


def test_conv_channel_mismatch_from_a_previous_layer() -> None:
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(16, 4, 3))
    _, res = capture_raising(m, torch.randn(2, 3, 9, 9))
    assert explain_error(res.error) == ["`1` expects 16 input channels, got 8 from `0` (2×8×7×7)"]


def test_nested_module_is_the_innermost_that_was_running() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(x) + x

    m = nn.Sequential(nn.Linear(4, 5), Block())
    _, res = capture_raising(m, torch.randn(2, 4))
    assert (res.error.module, res.error.type) == ("1.norm", "LayerNorm")
    assert explain_error(res.error) == ["`1.norm` normalises over the last dims 6, got an input ending in 5 from `0`"]


def test_device_mismatch_message_from_metadata() -> None:
    site = ErrorSite(
        module="head", type="Linear", error="RuntimeError: Expected all tensors to be on the same device",
        inputs=(TensorInfo((4, 512), "float32", "cpu", "flat", (4, 8, 8, 8)),),
        params=(ParamInfo("weight", (10, 512), "float32", "cuda:0"), ParamInfo("bias", (10,), "float32", "cuda:0")),
        config={"in_features": 512, "out_features": 10},
    )
    assert explain_error(site) == [
        "`head`'s parameters are on cuda:0, got an input on cpu from `flat`: move it with .to('cuda:0')"
    ]


def test_meta_device_model_reports_the_device() -> None:
    m = nn.Sequential(nn.Linear(4, 4, device="meta"))
    with pytest.raises(RuntimeError, match="meta"):
        with Capture(m) as cap:
            m(torch.randn(2, 4))
    assert cap.result.error.params[0].device == "meta" and cap.result.error.inputs[0].device == "cpu"
    assert explain_error(cap.result.error) == [
        "`0`'s parameters are on the meta device (never loaded): materialise them (.to_empty(device=...) and load the weights)"
    ]


def test_raising_outside_the_model_and_keyboard_interrupt() -> None:
    m = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(ValueError):
        with Capture(m) as cap:
            m(torch.randn(1, 2))
            raise ValueError("bad target")
    assert cap.result.error is None and cap.result.raised == "ValueError: bad target"
    assert diagnose(cap.result).summary == "1 layer ran; the cell raised ValueError: bad target outside the model's modules"


def test_widget_shows_the_error_card_and_the_fallback_escapes_it() -> None:
    m = beginner_cnn()
    _, res = capture_raising(m, torch.randn(4, 3, 12, 12))
    w = ThermometerWidget.from_capture(res)
    assert w.raised["module"] == "head" and w.raised["problems"] == [
        "`head` expects 512 input features, got 800 from `flat` (8×10×10)"
    ]
    assert w.raised["params"] == ["weight 10×512 float32 cpu", "bias 10 float32 cpu"]
    page = w.fallback_html()
    assert 'class="nbd-raised"' in page and "raised in <code>head</code> (Linear)" in page
    assert "`head` expects 512 input features, got 800 from `flat` (8×10×10)" in page
    ok = nn.Sequential(nn.Linear(2, 2))
    with Capture(ok) as cap:
        ok(torch.randn(1, 2))
    w2 = ThermometerWidget.from_capture(cap.result)
    assert w2.raised == {} and "nbd-raised" not in w2.fallback_html()
    w.close()
    w2.close()


def test_our_failure_never_replaces_the_users_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    real, calls = Capture._assemble, []

    def flaky(cap):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("bug in nbdebug")
        return real(cap)

    monkeypatch.setattr(Capture, "_assemble", flaky)
    m = beginner_cnn()
    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        with Capture(m) as cap:
            m(torch.randn(4, 3, 12, 12))
    assert hook_count(m) == 0 and cap.result.layers == []
    assert cap.result.notes[-1] == "nbdebug could not summarise what ran before the error: ZeroDivisionError: bug in nbdebug"
    with pytest.raises(ZeroDivisionError):  # without a user exception, our bug is not hidden
        calls.clear()
        with Capture(m):
            m[0](torch.randn(1, 3, 5, 5))
