"""The vision views through %%nndebug in a fresh InteractiveShell, and their widgets' requests."""

from __future__ import annotations

import numpy as np
import pytest
from IPython.core.error import UsageError

from nbdebug.capture import hook_count
from nbdebug.inspectors.featuremaps import FeatureMapsResult
from nbdebug.inspectors.gradcam import GradCamResult
from nbdebug.widgets._transport import decode_array
from nbdebug.widgets.featuremaps import FeatureMapsWidget
from nbdebug.widgets.gradcam import GradCamWidget, cam_to_u8

SETUP = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 6)).eval()
names = {i: f"<b>class {i}</b>" for i in range(6)}
x = torch.rand(2, 3, 16, 16)
"""


@pytest.fixture
def sh(shell):  # type: ignore[no-untyped-def]
    assert shell.run_cell(SETUP).success
    return shell


def arrays_of(content: dict, buffers: list) -> dict[str, np.ndarray]:
    return {k: decode_array({"view": buffers[m["buffer"]], "dtype": m["dtype"], "shape": m["shape"]}) for k, m in content["arrays"].items()}


def test_gradcam_magic_under_no_grad(sh) -> None:  # type: ignore[no-untyped-def]
    res = sh.run_cell("%%nndebug model --view gradcam --topk 3 --class-names names --colormap magma -o cam\nwith torch.no_grad():\n    y = model(x)")
    assert res.success, res.error_in_exec
    ns = sh.user_ns
    cam, w = ns["cam"], ns["_nndebug_widget"]
    assert isinstance(cam, GradCamResult) and isinstance(w, GradCamWidget)
    assert cam.layer == "4" and w.auto_layer == "4" and w.colormap == "magma"
    assert w.classes[0][0]["name"] == names_top(ns, 0)  # class names as plain strings, not markup
    assert any("torch.no_grad" in n for n in w.notes)
    assert hook_count(ns["model"]) == 0
    content, buffers = w.handle_request("view", {"sample": 1, "layer": "4"})
    arrays = arrays_of(content, buffers)
    assert arrays["cams"].shape == (3, 16, 16) and arrays["cams"].dtype == np.uint8
    assert arrays["image"].shape == (16, 16, 3)
    u8, peak = cam_to_u8(cam.cams[1])
    np.testing.assert_array_equal(arrays["cams"], u8)
    np.testing.assert_allclose(arrays["peak"], peak)
    # another layer is computed on demand for the same classes
    content, buffers = w.handle_request("view", {"sample": 0, "layer": "1"})
    assert content["result"]["layer"] == "1" and "1" in cam.maps
    assert arrays_of(content, buffers)["cams"].shape == (3, 16, 16)
    html = w.fallback_html()
    assert "<b>class" not in html and "&lt;b&gt;class" in html  # escaped in the static fallback


def names_top(ns: dict, sample: int) -> str:

    idx = int(ns["model"](ns["x"]).argmax(1)[sample])
    return ns["names"][idx] if isinstance(ns["names"], dict) else str(idx)


def test_gradcam_magic_options(sh) -> None:  # type: ignore[no-untyped-def]
    res = sh.run_cell("%%nndebug model --view gradcam --layer 3 --target 2 --method gradcam++ --sample 1 --image-mean 0.5 --image-std 0.5\nmodel(x)")
    assert res.success, res.error_in_exec
    w = sh.user_ns["_nndebug_widget"]
    cam = sh.user_ns["_nndebug"]
    assert w.layer == "3" and w.auto_layer == "" and w.method == "gradcam++" and w.sample == 1
    assert cam.classes.tolist() == [[2], [2]]
    assert "you passed" in cam.image_note


def test_gradcam_magic_bad_layer_is_reported(sh, capsys) -> None:  # type: ignore[no-untyped-def]
    res = sh.run_cell("%%nndebug model --view gradcam --layer 7\nmodel(x)")
    assert res.success  # the user's cell is not broken by a view that cannot be built
    said = capsys.readouterr()
    shown = [str(d.get("text/plain", "")) + str(d.get("text/html", "")) for d in sh.displayed]
    text = said.out + said.err + "".join(shown)  # one short note, with the layers that would qualify
    assert "'7'" in text and "qualify" in text and "4" in text


def test_featuremaps_magic(sh) -> None:  # type: ignore[no-untyped-def]
    res = sh.run_cell("%%nndebug model --view featuremaps --layers 0,3,7 --sort max --norm shared -o fm\nmodel(x)")
    assert res.success, res.error_in_exec
    fm, w = sh.user_ns["fm"], sh.user_ns["_nndebug_widget"]
    assert isinstance(fm, FeatureMapsResult) and isinstance(w, FeatureMapsWidget)
    assert fm.names() == ["0", "3"] and w.sort == "max" and w.norm == "shared" and w.batch == 2
    assert any("7 [2, 6]" in n for n in w.notes)
    content, buffers = w.handle_request("page", {"layer": "3", "sample": 1, "sort": "max"})
    arrays = arrays_of(content, buffers)
    assert arrays["pixels"].shape == (16, 8, 8)
    assert content["result"]["total"] == 16


def test_both_views_at_once(sh) -> None:  # type: ignore[no-untyped-def]
    res = sh.run_cell("%%nndebug model --view featuremaps,gradcam\nmodel(x)")
    assert res.success, res.error_in_exec
    ws = sh.user_ns["_nndebug_widget"]
    assert [type(w).__name__ for w in ws] == ["FeatureMapsWidget", "GradCamWidget"]


def test_unknown_method_is_a_usage_error(sh) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError):
        sh.run_cell("%%nndebug model --view gradcam --method nope\nmodel(x)", store_history=False).raise_error()


def test_gradcam_unknown_layer_is_a_usage_error_before_the_cell_runs(sh) -> None:  # type: ignore[no-untyped-def]
    from IPython.core.error import UsageError

    sh.user_ns["ran"] = False
    res = sh.run_cell("%%nndebug model --view gradcam --layer nope\nran = True")
    assert isinstance(res.error_in_exec, UsageError) and "no layer named 'nope'" in str(res.error_in_exec)
    assert sh.user_ns["ran"] is False


def test_featuremaps_opens_on_the_deepest_spatial_layer(sh) -> None:  # type: ignore[no-untyped-def]
    sh.run_cell("pad = nn.Sequential(nn.ReflectionPad2d(1), *list(model))")
    res = sh.run_cell("%%nndebug pad --view featuremaps\npad(x)")
    assert res.success, res.error_in_exec
    w = sh.user_ns["_nndebug_widget"]
    assert w.layers[0]["name"] == "0" and w.layer == "5"  # not the padding: the last map before pooling
    assert "ReflectionPad" not in w.layer


SHARED = """
class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.act = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 6, 3, padding=1), nn.ReLU()
        self.fc = nn.Linear(6, 3)
    def forward(self, x):
        return self.fc(self.act(self.c2(self.act(self.c1(x)))).mean((2, 3)))
shared = Shared().eval()
"""


def test_a_module_called_twice_has_one_name_per_call_everywhere(sh) -> None:  # type: ignore[no-untyped-def]
    assert sh.run_cell(SHARED).success
    res = sh.run_cell("%%nndebug shared --view gradcam --layer act#2 -o cam\nshared(x)")
    assert res.success, res.error_in_exec
    w, cam = sh.user_ns["_nndebug_widget"], sh.user_ns["cam"]
    assert cam.layer == "act#2" and w.layer == "act#2"
    assert [n for n in w.layers if n.startswith("act")] == ["act", "act#2"]  # never act#0 / act#1
    content, _ = w.handle_request("view", {"layer": "act"})
    assert content["result"]["layer"] == "act" and set(cam.maps) == {"act", "act#2"}
    content, _ = w.handle_request("view", {"layer": "act#1"})  # "#1" is accepted for the first call
    assert content["result"]["layer"] == "act" and set(cam.maps) == {"act", "act#2"}
    res = sh.run_cell("%%nndebug shared --view featuremaps -o fm\nshared(x)")
    assert res.success, res.error_in_exec
    fm, w = sh.user_ns["fm"], sh.user_ns["_nndebug_widget"]
    assert fm.names() == ["c1", "act", "c2", "act#2"] and w.layer == "act#2"


def test_gradcam_magic_every_method_faithfulness_and_sanity(sh) -> None:  # type: ignore[no-untyped-def]
    """`--method all --faithfulness --sanity`: every method's CAMs in one fetch (uint8), the curves in
    another (float32), the ranking and the sanity flags synced as small plain data, the snapshot
    escaped."""
    from nbdebug.inspectors.cams import METHODS

    res = sh.run_cell("%%nndebug model --view gradcam --topk 2 --method all --faithfulness --sanity --class-names names -o cam\n"
                      "with torch.no_grad():\n    model(x)")
    assert res.success, res.error_in_exec
    cam, w = sh.user_ns["cam"], sh.user_ns["_nndebug_widget"]
    assert w.methods == list(METHODS) and w.method == "gradcam" and cam.methods == list(METHODS)
    content, buffers = w.handle_request("view", {"sample": 1, "layer": "4", "method": "eigencam"})
    arrays = arrays_of(content, buffers)
    assert content["result"]["method"] == "eigencam" and content["result"]["methods"] == list(METHODS)
    assert arrays["all_cams"].shape == (8, 2, 16, 16) and arrays["all_cams"].dtype == np.uint8
    assert arrays["all_peak"].shape == (8, 2)
    for i, m in enumerate(METHODS):
        u8, _peak = cam_to_u8(cam.cam(m)[1])
        np.testing.assert_array_equal(arrays["all_cams"][i], u8)
    np.testing.assert_array_equal(arrays["cams"], arrays["all_cams"][METHODS.index("eigencam")])
    content, buffers = w.handle_request("curves", {})
    curves = arrays_of(content, buffers)
    assert content["result"]["methods"] == list(METHODS) and curves["curves"].shape == (8, 4, 21)
    assert curves["curves"].dtype == np.float32 and np.isnan(curves["curves"][:, 2:, 10:]).all()  # ROAD: 10 points
    np.testing.assert_allclose(curves["curves"][0, 0], cam.faithfulness_report.curves["gradcam"]["deletion"])
    # the panel's order: methods passing the sanity check first (then by score), tied methods sharing a rank
    assert w.faithfulness["ranking"] == [r["method"] for r in w.ranks]
    assert sorted(w.faithfulness["ranking"]) == sorted(cam.faithfulness_report.ranking)
    failed = [r["failed"] for r in w.ranks]
    assert failed == sorted(failed) and any(failed)  # every failing method after every passing one
    assert all(r["failed"] == next(s["flagged"] for s in w.sanity if s["method"] == r["method"]) for r in w.ranks)
    best = [r["method"] for r in w.ranks if r["rank"] == 1]
    assert not w.ranks[0]["failed"] and all(m in w.headline for m in best) and "pass the sanity check" in w.headline
    assert w.faithfulness["target_name"].startswith("<b>class")  # plain text; the browser shows it as text
    assert {s["method"] for s in w.sanity} == set(METHODS)
    eig = next(s for s in w.sanity if s["method"] == "eigencam")
    assert eig["rho"] == 1.0 and eig["flagged"] and eig["cascade"] == [["7", 1.0]]
    html = w.fallback_html()
    assert html.index(best[0]) < html.index("<img") and "fails sanity" in html
    assert "faithfulness for &lt;b&gt;class" in html and "<b>class" not in html
    assert "does not depend on the class decision" in html
    assert "methods=8" in repr(w)


def test_gradcam_curves_without_faithfulness_is_an_error(sh) -> None:  # type: ignore[no-untyped-def]
    res = sh.run_cell("%%nndebug model --view gradcam\nmodel(x)")
    assert res.success, res.error_in_exec
    w = sh.user_ns["_nndebug_widget"]
    assert w.faithfulness == {} and w.sanity == [] and w.methods == ["gradcam"]
    content, _buffers = w.handle_request("view", {"sample": 0})
    assert "all_cams" not in content["arrays"]
    with pytest.raises(ValueError, match="--faithfulness"):
        w.handle_request("curves", {})


def test_the_differ_note_names_the_optimizer_step(sh) -> None:  # type: ignore[no-untyped-def]
    cell = ("%%nndebug model --view gradcam -o cam\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.5)\n"
            "for _ in range(3):\n"
            "    opt.zero_grad(); model(x).sum().backward(); opt.step()")
    res = sh.run_cell(cell)
    assert res.success, res.error_in_exec
    notes = sh.user_ns["cam"].notes
    said = [n for n in notes if "differ" in n]
    assert said and "optimizer step" in said[0] and "dropout" not in said[0], notes
