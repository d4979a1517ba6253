"""Feature maps: exact channel statistics, the uint8 encoding, paging/sorting, and the recorder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.inspectors.featuremaps import channel_stats, encode_page, page_size, quantise
from nbdebug.recorders.featuremaps import FeatureMapsRecorder
from nbdebug.widgets._transport import decode_array
from nbdebug.widgets.featuremaps import FeatureMapsWidget


def hand_maps() -> torch.Tensor:
    return torch.tensor([
        [[0.0, 1.0], [2.0, 3.0]],  # mean 1.5, max 3, 1/4 zeros
        [[0.0, 0.0], [0.0, 0.0]],  # dead
        [[-2.0, 0.0], [0.0, 6.0]],  # mean 1, max 6, 1/2 zeros
    ])


def test_channel_stats_exact() -> None:
    st = channel_stats(hand_maps())
    np.testing.assert_array_equal(st.lo, [0, 0, -2])
    np.testing.assert_array_equal(st.hi, [3, 0, 6])
    np.testing.assert_array_equal(st.mean, [1.5, 0, 1])
    np.testing.assert_array_equal(st.sparsity, [0.25, 1.0, 0.5])
    assert st.dead.tolist() == [False, True, False]


def test_quantise_exact_and_constant_channels() -> None:
    x = hand_maps()
    st = channel_stats(x)
    q = quantise(x, torch.from_numpy(st.lo), torch.from_numpy(st.hi))
    assert q.dtype == np.uint8
    np.testing.assert_array_equal(q[0], [[0, 85], [170, 255]])
    np.testing.assert_array_equal(q[1], [[0, 0], [0, 0]])
    np.testing.assert_array_equal(q[2], [[0, 64], [64, 255]])  # (0 + 2) / 8 · 255 = 63.75 → 64
    # de-quantised values are within half a step of the originals
    back = st.lo[:, None, None] + q / 255.0 * (st.hi - st.lo)[:, None, None]
    assert np.abs(back - x.numpy()).max() <= (st.hi - st.lo).max() / 255 / 2 + 1e-6


@pytest.mark.parametrize(("order", "expected"), [("index", [0, 1, 2]), ("mean", [0, 2, 1]), ("max", [2, 0, 1]), ("sparsity", [1, 2, 0])])
def test_sorting(order: str, expected: list[int]) -> None:
    page = encode_page(hand_maps(), order=order)
    assert page.channels.tolist() == expected
    # pixels follow the channel order
    full = encode_page(hand_maps())
    np.testing.assert_array_equal(page.pixels, full.pixels[expected])


def test_paging_large_channel_counts() -> None:
    torch.manual_seed(0)
    x = torch.randn(2048, 14, 14)
    size = page_size(2048, 14, 14)
    assert size == 256  # capped; never all 2048 at once
    assert page_size(64, 56, 56) == 64  # ResNet layer1: one page
    assert page_size(64, 224, 224) == (1 << 20) // (224 * 224) == 20
    seen = []
    for start in range(0, 2048, size):
        p = encode_page(x, order="max", start=start, count=size)
        assert p.pixels.nbytes <= size * 14 * 14  # one byte per pixel
        seen.extend(p.channels.tolist())
    assert sorted(seen) == list(range(2048))
    maxima = x.amax(dim=(1, 2)).numpy()
    assert np.all(np.diff(maxima[seen]) <= 0)  # descending across pages


def conv_net() -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(4, 6, 3, stride=2, padding=1),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 2))
    with torch.no_grad():
        net[0].bias[1] = -100.0  # channel 1 dies after the ReLU
    return net


def test_recorder_captures_copies_and_leaves_the_model_alone() -> None:
    net = conv_net().train()
    x = torch.randn(3, 3, 8, 8)
    before = fingerprint(net)
    rec = FeatureMapsRecorder(net)
    with rec:
        out = net(x)
    out.sum().backward()
    res = rec.result()
    assert list(res.layers) == ["0", "1", "2"] and res.batch == 3
    # the conv output is kept before the in-place ReLU overwrote it
    conv_out = net[0](x).detach()
    assert torch.equal(res["0"].maps(1), conv_out[1])
    assert (res["0"].maps(0) < 0).any()
    assert res["1"].data.min() >= 0
    st = res.stats("1", 0)
    assert st.dead.tolist() == [False, True, False, False]
    assert any("no spatial output" in n and "5 [3, 2]" in n for n in res.notes)
    assert hook_count(net) == 0
    after = fingerprint(net)
    diff = same_fingerprint(before, after)
    assert all(d.startswith("grads[") for d in diff)  # only the user's own backward changed .grad


def test_recorder_layer_filter_budget_and_sample_limit() -> None:
    net = conv_net()
    rec = FeatureMapsRecorder(net, layers=["0", "2"], max_bytes=3 * 4 * 8 * 8 * 4 + 10, max_samples=3)
    with rec:
        net(torch.randn(5, 3, 8, 8))
    res = rec.result()
    assert list(res.layers) == ["0"]  # layer 2 did not fit the budget
    assert any("memory budget" in n for n in res.notes)
    assert any("first 3 of 5" in n for n in res.notes)


def test_widget_page_request_roundtrip() -> None:
    net = conv_net()
    rec = FeatureMapsRecorder(net)
    with rec:
        net(torch.randn(2, 3, 8, 8))
    w = rec.widget()
    assert isinstance(w, FeatureMapsWidget) and [lay["name"] for lay in w.layers] == ["0", "1", "2"]
    content, buffers = w.handle_request("page", {"layer": "1", "sample": 1, "sort": "mean"})
    meta = content["arrays"]
    arrays = {k: decode_array({"view": buffers[m["buffer"]], "dtype": m["dtype"], "shape": m["shape"]}) for k, m in meta.items()}
    res = rec.result()
    expected = encode_page(res["1"].maps(1), order="mean")
    np.testing.assert_array_equal(arrays["pixels"], expected.pixels)
    np.testing.assert_array_equal(arrays["channels"], expected.channels)
    assert content["result"]["dead"] == 1 and arrays["dead"].sum() == 1
    assert arrays["pixels"].nbytes == 4 * 8 * 8  # one byte per pixel
    with pytest.raises(KeyError, match="no captured layer"):
        w.handle_request("page", {"layer": "nope"})
    assert "Tensor" not in repr(w)


def test_vit_tokens_become_grids() -> None:
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    model = ViTModel(ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)).eval()
    rec = FeatureMapsRecorder(model, layers="re:.*layernorm_before")
    with rec, torch.no_grad():
        model(pixel_values=torch.randn(1, 3, 32, 32))
    (layer,) = rec.result().layers.values()
    assert layer.maps(0).shape == (16, 4, 4) and layer.grid.extra_tokens == 1


def test_opens_on_the_deepest_spatial_layer_not_the_padding() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.ZeroPad2d(1), nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1),
                        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 2))
    rec = FeatureMapsRecorder(net)
    with rec:
        net(torch.randn(1, 3, 8, 8))
    res = rec.result()
    assert list(res.layers) == ["0", "1", "2", "3", "4"]
    assert res.default_layer == "4"  # the last spatial output before pooling, where Grad-CAM looks first
    assert rec.widget().layer == "4"
    # with the deep layers filtered out, the deepest one kept
    rec = FeatureMapsRecorder(net, layers=["0", "1"])
    with rec:
        net(torch.randn(1, 3, 8, 8))
    assert rec.result().default_layer == "0"  # the first one asked for (test_featuremaps_headline.py)


def test_shared_module_calls_are_named_like_the_thermometer() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.act = nn.Conv2d(2, 2, 1), nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(self.conv(self.act(x - 0.5)))

    net = Twice()
    rec = FeatureMapsRecorder(net)
    x = torch.rand(1, 2, 4, 4)
    with rec:
        net(x)
    res = rec.result()
    assert list(res.layers) == ["act", "conv", "act#2"] and res.default_layer == "act#2"
    assert torch.equal(res["act"].data, torch.relu(x - 0.5))
    w = rec.widget()
    assert [lay["name"] for lay in w.layers] == ["act", "conv", "act#2"]
    content, _ = w.handle_request("page", {"layer": "act#2"})
    assert content["result"]["layer"] == "act#2"


@pytest.mark.parametrize(("max_bytes", "kept"), [("4KB", ["0", "1"]), (4096, ["0", "1"]), ("1 KiB", ["2"]), (0, []),
                                                 ("64MB", ["0", "1", "2"])])
def test_max_bytes_accepts_units_honours_zero_and_says_what_was_dropped(max_bytes: object, kept: list[str]) -> None:
    net = conv_net()  # spatial outputs 0 and 1: 2×4×8×8 float32 = 2048 B each; 2: 2×6×4×4 = 768 B
    rec = FeatureMapsRecorder(net, max_bytes=max_bytes)
    with rec:
        net(torch.randn(2, 3, 8, 8))
    res = rec.result()
    assert list(res.layers) == kept
    limit = {"4KB": 4096, 4096: 4096, "1 KiB": 1024, 0: 0, "64MB": 1 << 26}[max_bytes]  # type: ignore[index]
    assert rec.probe.kept_bytes == sum(lay.data.numel() * 4 for lay in res.layers.values()) <= limit
    dropped = [n for n in res.notes if "memory budget" in n]
    missing = [n for n in ["0", "1", "2"] if n not in kept]
    if not missing:
        assert dropped == [] and rec.applies() is None
    else:  # the pool's 1×1 output is never copied: it is not a map
        assert len(dropped) == 1 and f"{len(missing)} layer output(s) not kept ({', '.join(missing)}" in dropped[0]
        assert (rec.applies() is None) == bool(kept)
