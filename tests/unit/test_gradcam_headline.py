"""The single-method Grad-CAM view's headline: the class by name (or "class 285", never a bare id
passed off as a name), its probability written as every view writes it (fmt_p: "79%", not "0.79"),
how much of the image the map points at, and "shows nothing" when the map is empty."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from nbdebug.inspectors.events import fmt_p
from nbdebug.inspectors.gradcam import class_label, overlay_headline
from nbdebug.recorders.gradcam import GradCamRecorder
from nbdebug.widgets._snapshot import code_html


def test_the_sentence_on_a_hand_made_map() -> None:
    cam = np.zeros((8, 8), np.float32)
    cam[:4, :4] = 1.0  # a quarter at the peak
    cam[4:, :4] = 0.49  # just under half: not counted
    got = overlay_headline("gradcam", "layer4", cam, name="tabby", index=281, prob=0.791, rank=0)
    assert got == "gradcam on `layer4` for 'tabby' (#1, p 79%): 25% of the image is at half the map's peak or more."
    # no names given: the id is said to be one, not quoted as if it were a name
    assert class_label("285", 285) == "class 285" and class_label("285", 7) == "'285'"
    got = overlay_headline("gradcam", "layer4", cam, name="285", index=285, prob=0.0004, rank=2)
    assert got.startswith("gradcam on `layer4` for class 285 (#3, p <0.1%): ")


def test_an_empty_map_says_so_instead_of_a_share() -> None:
    zero = np.zeros((4, 4), np.float32)
    got = overlay_headline("gradcam", "vit.layernorm", zero, name="cat", index=3, prob=0.5, rank=0, zero_grad=True,
                           note="the scores do not depend on vit.layernorm's grid positions (gradient is zero)")
    assert got == ("gradcam on `vit.layernorm` shows nothing for 'cat' (#1, p 50%): the scores do not depend on "
                   "vit.layernorm's grid positions (gradient is zero).")
    assert "of the image" not in overlay_headline("gradcam", "c", zero, name="cat", index=3, prob=0.5, rank=0)


def _cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5)).eval()


def test_widget_headline_follows_the_class_and_names_it() -> None:
    model = _cnn()
    names = ["ant", "bee", "cat", "dog", "eel"]
    rec = GradCamRecorder(model, cam_topk=3, class_names=names)
    x = torch.rand(1, 3, 16, 16)
    with rec:
        model(x)
    w = rec.widget()
    res = rec.result()
    with torch.no_grad():
        probs = torch.softmax(model(x), -1)[0]
    top = probs.argsort(descending=True)[:3].tolist()
    assert [c["index"] for c in w.classes[0]] == top
    cam = res.cams[0, 0]
    share = fmt_p(float(np.mean(cam >= 0.5 * cam.max())))
    assert w.headline == (f"gradcam on `{res.layer}` for {names[top[0]]!r} (#1, p {fmt_p(float(probs[top[0]]))}): "
                          f"{share} of the image is at half the map's peak or more.")
    w.class_rank = 2  # the browser's class dropdown
    assert w.headline.startswith(f"gradcam on `{res.layer}` for {names[top[2]]!r} (#3, p {fmt_p(float(probs[top[2]]))}): ")
    html = w.fallback_html()
    assert html.index(code_html(w.headline)) < html.index("<img") and "`" not in html  # `layer` as <code>
    assert f"{names[top[0]]!r} ({fmt_p(float(probs[top[0]]))})".replace("'", "&#x27;") in html


def test_widget_without_names_says_class_n() -> None:
    model = _cnn()
    rec = GradCamRecorder(model, cam_topk=1)
    with rec:
        model(torch.rand(1, 3, 16, 16))
    w = rec.widget()
    idx = w.classes[0][0]["index"]
    assert f" for class {idx} (#1, p " in w.headline and f"'{idx}'" not in w.headline
