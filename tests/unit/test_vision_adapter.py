"""Vision adapter: spatial layouts (NCHW, NHWC, ViT token grids), reshapes, input de-normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nbdebug.adapters.vision import (
    GridInfo,
    deepest,
    detect_normalisation,
    find_image,
    image_for_display,
    infer_grid,
    parse_floats,
    spatial_layers,
    to_nchw,
)
from nbdebug.capture import hook_count
from nbdebug.capture.probe import OutputProbe


@pytest.mark.parametrize(
    ("shape", "input_hw", "expected"),
    [
        ((2, 64, 56, 56), None, GridInfo("nchw", 56, 56, 64)),
        ((2, 7, 7, 768), None, GridInfo("nhwc", 7, 7, 768)),  # torchvision Swin / ConvNeXt-style
        ((2, 197, 768), (224, 224), GridInfo("tokens", 14, 14, 768, 1)),  # ViT: CLS
        ((2, 198, 192), (224, 224), GridInfo("tokens", 14, 14, 192, 2)),  # DeiT: CLS + distillation
        ((2, 201, 384), (224, 224), GridInfo("tokens", 14, 14, 384, 5)),  # CLS + 4 registers
        ((2, 49, 768), (224, 224), GridInfo("tokens", 7, 7, 768, 0)),  # Swin stage output, no CLS
        ((1, 1 + 12 * 24, 64), (192, 384), GridInfo("tokens", 12, 24, 64, 1)),  # wide image
        ((2, 8, 4, 6), (32, 48), GridInfo("nchw", 4, 6, 8)),  # ratio decides
    ],
)
def test_infer_grid(shape, input_hw, expected) -> None:  # type: ignore[no-untyped-def]
    assert infer_grid(shape, input_hw=input_hw) == expected


@pytest.mark.parametrize("shape", [(2, 10), (2, 512, 1, 1), (2, 197, 768), (2, 5, 7, 3, 3)])
def test_non_spatial_outputs(shape) -> None:  # type: ignore[no-untyped-def]
    # (2, 197, 768) without an image size is a plain sequence, not a grid
    assert infer_grid(shape) is None


def test_patch_grid_from_config_wins_over_guessing() -> None:
    assert infer_grid((1, 50, 8), input_hw=(224, 224), grid_hw=(7, 7)) == GridInfo("tokens", 7, 7, 8, 1)


def test_forced_reshapes_and_errors() -> None:
    assert infer_grid((2, 5, 5, 5), reshape="nhwc") == GridInfo("nhwc", 5, 5, 5)
    assert infer_grid((2, 20, 8), reshape="tokens:4:4x4") == GridInfo("tokens", 4, 4, 8, 4)
    assert infer_grid((2, 18, 8), reshape="tokens:2") == GridInfo("tokens", 4, 4, 8, 2)
    with pytest.raises(ValueError, match="does not fit"):
        infer_grid((2, 20, 8), reshape="tokens:1:4x4")
    with pytest.raises(ValueError, match="unknown reshape"):
        infer_grid((2, 20, 8), reshape="hwc")


def test_to_nchw_tokens_and_channels_last_exact() -> None:
    c, h, w = 3, 2, 4
    grid_vals = torch.arange(2 * c * h * w, dtype=torch.float32).reshape(2, c, h, w)
    tokens = grid_vals.flatten(2).transpose(1, 2)  # B×(h·w)×C, row-major patches
    cls = torch.full((2, 1, c), -1.0)
    out = to_nchw(torch.cat([cls, tokens], 1), GridInfo("tokens", h, w, c, 1))
    assert torch.equal(out, grid_vals)
    assert torch.equal(to_nchw(grid_vals.permute(0, 2, 3, 1), GridInfo("nhwc", h, w, c)), grid_vals)
    # leading dims (a K×B gradient stack) are kept
    stacked = torch.stack([torch.cat([cls, tokens], 1)] * 3)
    assert torch.equal(to_nchw(stacked, GridInfo("tokens", h, w, c, 1)), torch.stack([grid_vals] * 3))
    assert to_nchw(grid_vals, GridInfo("custom", 0, 0, 0), reshape=lambda t: t * 2).equal(grid_vals * 2)


def pixels() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (2, 3, 6, 5), generator=g).float()


@pytest.mark.parametrize(
    ("transform", "name"),
    [
        (lambda p: p / 255, "0–1"),
        (lambda p: p, "0–255"),
        (lambda p: (p / 255 - 0.5) / 0.5, "mean=std=0.5"),
        (lambda p: (p / 255 - torch.tensor([0.485, 0.456, 0.406])[:, None, None]) / torch.tensor([0.229, 0.224, 0.225])[:, None, None], "ImageNet"),
    ],
)
def test_detected_normalisation_recovers_the_pixels(transform, name) -> None:  # type: ignore[no-untyped-def]
    p = pixels()
    found = detect_normalisation(transform(p))
    assert found is not None and found[2].startswith(name)
    img, how = image_for_display(transform(p))
    assert name in how
    assert img.shape == (2, 6, 5, 3) and img.dtype == np.uint8
    assert np.abs(img.astype(int) - p.permute(0, 2, 3, 1).numpy().astype(int)).max() <= 1


def test_explicit_mean_std_and_min_max_fallback() -> None:
    p = pixels()
    mean, std = (0.3, 0.3, 0.3), (0.1, 0.1, 0.1)
    x = (p / 255 - 0.3) / 0.1
    img, how = image_for_display(x, mean, std)
    assert "you passed" in how
    assert np.abs(img.astype(int) - p.permute(0, 2, 3, 1).numpy().astype(int)).max() <= 1
    weird = torch.randn(1, 3, 4, 4) * 50 + 1000
    img, how = image_for_display(weird)
    assert "min-max" in how and img.min() == 0 and img.max() == 255


def test_channels_last_and_gray_images() -> None:
    p = pixels()
    img, _ = image_for_display((p / 255).permute(0, 2, 3, 1))
    assert img.shape == (2, 6, 5, 3)
    gray, _ = image_for_display(p[:, :1] / 255)
    assert gray.shape == (2, 6, 5, 3) and np.array_equal(gray[..., 0], gray[..., 2])


def test_find_image_prefers_pixel_values() -> None:
    x = torch.zeros(1, 3, 4, 4)
    assert find_image((), {"pixel_values": x, "other": torch.ones(1, 3, 4, 4)}) is x
    assert find_image((torch.zeros(3), x), {}) is x
    assert find_image((torch.zeros(2, 5),), {}) is None


def _spatial(probe: OutputProbe) -> list:  # type: ignore[type-arg]
    return spatial_layers(probe.records, probe.calls, input_hw=None)


def test_output_probe_keeps_copies_and_names_repeated_calls() -> None:
    act = torch.nn.ReLU(inplace=True)
    conv = torch.nn.Conv2d(1, 2, 1)
    model = torch.nn.Sequential(conv, act)
    with torch.no_grad():
        conv.weight.fill_(-1.0)
        conv.bias.zero_()
    with OutputProbe(model, keep=lambda n, t: True) as probe:
        model(torch.ones(1, 1, 3, 3))
    # the conv output was -1 before the in-place ReLU zeroed it; the copy keeps -1
    assert torch.equal(probe.tensors["0"], -torch.ones(1, 2, 3, 3))
    assert [lay.name for lay in _spatial(probe)] == ["0", "1"]
    assert hook_count(model) == 0
    shared = torch.nn.ReLU()

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = shared

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(self.act(x) - 1)

    m = Twice()
    with OutputProbe(m, keep=lambda n, t: True) as probe:
        m(torch.ones(1, 2, 3, 3))
        m(torch.ones(1, 2, 3, 3))  # a second step is not described
    # one name per module call, as in the thermometer: first call unsuffixed, then #2
    assert [(lay.name, lay.call, lay.calls) for lay in _spatial(probe)] == [("act", 0, 2), ("act#2", 1, 2)]
    assert set(probe.tensors) == {"act", "act#2"} and probe.steps == 2
    assert torch.equal(probe.tensors["act#2"], torch.zeros(1, 2, 3, 3))


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recomputation_adds_no_layers(reentrant: bool) -> None:
    from torch.utils.checkpoint import checkpoint

    class Ckpt(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU())
            self.head = torch.nn.Conv2d(4, 2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(checkpoint(self.block, x, use_reentrant=reentrant))

    m = Ckpt()
    x = torch.randn(1, 3, 6, 6, requires_grad=True)
    with OutputProbe(m) as probe:
        m(x).sum().backward()  # backward recomputes `block` inside the probe
    assert [r.name for r in probe.records] == ["block.0", "block.1", "block", "head"]
    assert m.block[0].weight.grad is not None


def test_deepest_spatial_layer() -> None:
    model = torch.nn.Sequential(torch.nn.ZeroPad2d(1), torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2))
    with OutputProbe(model) as probe:
        model(torch.randn(1, 3, 8, 8))
    layers = _spatial(probe)
    assert [lay.name for lay in layers] == ["0", "1", "2"]  # the 1×1 pool has no grid
    assert deepest(layers).name == "2" and deepest([]) is None


def test_logits_of_every_output_shape() -> None:
    from transformers.modeling_outputs import CausalLMOutputWithPast, ImageClassifierOutput

    from nbdebug.adapters.outputs import class_scores, logits_of

    cls, lm = torch.randn(2, 5), torch.randn(2, 4, 9)
    assert logits_of(cls) is cls and logits_of(lm) is lm
    assert logits_of(ImageClassifierOutput(logits=cls)) is cls
    assert logits_of(CausalLMOutputWithPast(logits=lm), ndim=3) is lm
    assert logits_of({"hidden": lm, "logits": cls}) is cls  # the logits key wins over the first tensor
    assert logits_of((cls, torch.zeros(()))) is cls and logits_of([lm, "cache"], ndim=3) is lm
    assert logits_of(lm, ndim=2) is None and logits_of(cls, ndim=(2, 3)) is cls and logits_of("text") is None
    assert class_scores((cls,)) is cls
    with pytest.raises(ValueError, match=r"not class scores .*\[2, 4, 9\]"):
        class_scores(CausalLMOutputWithPast(logits=lm))


def test_parse_floats_reads_mean_and_std_as_written() -> None:
    assert parse_floats(None) is None and parse_floats("") is None
    assert parse_floats("0.485, 0.456,0.406") == [0.485, 0.456, 0.406]
    assert parse_floats(0) == [0.0] and parse_floats(0.5) == [0.5]  # 0 is a value
    assert parse_floats((1, 2)) == [1.0, 2.0]
    with pytest.raises(ValueError):
        parse_floats("0.5,abc")


def test_logits_of_a_tuple_with_the_loss_first() -> None:
    """HF ``return_dict=False`` with labels: ``(loss, logits, past)``; the rank picks the logits."""
    from nbdebug.adapters.outputs import logits_of

    loss, logits = torch.tensor(1.5), torch.randn(2, 5, 11)
    assert logits_of((loss, logits, (torch.zeros(2, 5, 4),)), ndim=3) is logits
    assert logits_of((loss, logits)) is loss  # without a rank: the first tensor, as documented
    assert logits_of((loss,), ndim=3) is None
