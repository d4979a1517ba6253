"""Small widgets of every view, built without a notebook, with hostile model text (shared by the
snapshot tests and the exported-HTML browser test)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

HOSTILE = "<img src=x onerror=alert(1)>"
#: Widgets hold their model weakly (a deleted model is collected): the builders keep theirs alive here,
#: as a notebook variable would.
MODELS: list[nn.Module] = []


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 6)).eval()
    m.add_module(HOSTILE, nn.Identity())  # a hostile layer name, after the classifier
    return m


def thermometer() -> Any:
    from nbdebug.capture.session import Capture
    from nbdebug.widgets.thermometer import ThermometerWidget

    m = _cnn()
    MODELS.append(m)
    with Capture(m) as cap:
        m(torch.rand(2, 3, 16, 16)).sum().backward()
    return ThermometerWidget.from_capture(cap.result)


def featuremaps() -> Any:
    from nbdebug.recorders.featuremaps import FeatureMapsRecorder

    m = _cnn()
    MODELS.append(m)
    with FeatureMapsRecorder(m) as rec:
        m(torch.rand(2, 3, 16, 16))
    return rec.widget()


def gradcam() -> Any:
    from nbdebug.recorders.gradcam import GradCamRecorder

    m = _cnn()
    MODELS.append(m)
    names = {i: f"{HOSTILE} class {i}" for i in range(6)}
    with GradCamRecorder(m, class_names=names, cam_topk=3) as rec:
        m(torch.rand(2, 3, 16, 16))
    return rec.widget()


def attention() -> Any:
    from nbdebug.adapters.offline import tiny_lm
    from nbdebug.recorders.attention import AttentionRecorder

    torch.manual_seed(0)
    m = tiny_lm("gpt2")
    MODELS.append(m)
    toks = ["A", HOSTILE, "Ġb", "Ċ", "c", "d", "e", "f"]
    with AttentionRecorder(m, tokens=toks) as rec:
        m(torch.randint(1, 60, (1, 8)))
    return rec.widget()


def logitlens() -> Any:
    from nbdebug.adapters.offline import tiny_lm
    from nbdebug.recorders.logitlens import LogitLensRecorder

    torch.manual_seed(0)
    m = tiny_lm("llama", vocab=200, layers=3)
    MODELS.append(m)
    toks = ["A", HOSTILE, "b", "c", "d", "e", "f", "g", "h"]
    with LogitLensRecorder(m, lens_topk=4, tokens=toks) as rec, torch.no_grad():
        m(torch.randint(0, 200, (1, 9)))
    return rec.widget()


BUILDERS = {"thermometer": thermometer, "featuremaps": featuremaps, "gradcam": gradcam, "attention": attention,
            "logitlens": logitlens}
