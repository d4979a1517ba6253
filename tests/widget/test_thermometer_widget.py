"""The thermometer widget without a browser: binary state, on-demand histograms, safe fallback."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ipywidgets.widgets.widget import _remove_buffers
from torch import nn

from nbdebug.capture.session import Capture
from nbdebug.inspectors.thermometer import COLUMNS
from nbdebug.widgets._transport import decode_array, encode_array
from nbdebug.widgets.thermometer import ThermometerWidget

HOSTILE = "<img src=x onerror=alert(1)>"


def make_widget(**capture_kw) -> tuple[ThermometerWidget, nn.Module]:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 16), nn.ReLU())
    m.add_module(HOSTILE, nn.Identity())
    with Capture(m, **capture_kw) as cap:
        m(torch.randn(64, 4)).sum().backward()
    return ThermometerWidget.from_capture(cap.result), m


def test_encode_decode_roundtrip_and_dtypes() -> None:
    for arr, wire in [
        (np.arange(6, dtype=np.float64).reshape(2, 3), "float32"),
        (np.array([1, -2], dtype=np.int64), "int32"),
        (np.array([True, False]), "uint8"),
        (torch.tensor([1.5, 2.5], dtype=torch.bfloat16), "float32"),
        (torch.arange(4.0, requires_grad=True) * 2, "float32"),
        (np.zeros((0, 3), dtype=np.float32), "float32"),
    ]:
        enc = encode_array(arr)
        assert enc["dtype"] == wire
        back = decode_array(enc)
        ref = arr.detach().float().numpy() if isinstance(arr, torch.Tensor) else arr
        np.testing.assert_array_equal(back, np.asarray(ref).astype(wire))
    with pytest.raises(OverflowError):
        encode_array(np.array([2**40]))
    with pytest.raises(TypeError):
        encode_array(np.array(["a"]))


def test_state_is_binary_and_small() -> None:
    w, _ = make_widget()
    _state, paths, buffers = _remove_buffers(w.get_state())
    assert ["stats", "view"] in paths  # the stats table travels as one binary buffer
    stats = decode_array(w.stats)
    assert stats.shape == (3, len(COLUMNS)) and stats.dtype == np.float32
    assert w.columns == list(COLUMNS)
    np.testing.assert_allclose(stats[:, COLUMNS.index("mean")], w.report.column("mean").astype(np.float32))
    # No per-layer samples or histograms in the synced state: only names, stats, diagnoses.
    assert sum(len(bytes(b)) for b in buffers) == 3 * len(COLUMNS) * 4
    assert [layer["name"] for layer in w.layers] == ["0", "1", HOSTILE]


def test_histogram_fetch_on_demand_matches_numpy() -> None:
    w, _ = make_widget(sample_size=100_000)
    body, buffers = w.handle_request("histogram", {"row": 1})
    res = body["result"]
    assert res["exact"] and res["total"] == 64 * 16 and res["name"] == "1"
    counts = np.frombuffer(bytes(buffers[body["arrays"]["counts"]["buffer"]]), dtype=np.float32)
    edges = np.frombuffer(bytes(buffers[body["arrays"]["edges"]["buffer"]]), dtype=np.float32)
    assert counts.shape == (32,) and edges.shape == (33,)
    assert counts.sum() == 64 * 16
    sample = w.capture.layers[1].sample
    ref, ref_edges = np.histogram(sample, bins=32, range=(sample.min(), sample.max()))
    np.testing.assert_array_equal(counts, ref)
    np.testing.assert_allclose(edges, ref_edges, rtol=1e-6)
    with pytest.raises(IndexError):
        w.handle_request("histogram", {"row": 99})
    with pytest.raises(KeyError, match="unknown request"):
        w.handle_request("nope", {})


def test_exact_histograms_when_requested() -> None:
    w, _ = make_widget(histograms=True, sample_size=16)
    body, buffers = w.handle_request("histogram", {"row": 0})
    assert body["result"]["exact"] and body["result"]["sampled"] == 64 * 16
    counts = np.frombuffer(bytes(buffers[0]), dtype=np.float32)
    assert counts.sum() == 64 * 16


def test_request_errors_go_back_as_data() -> None:
    w, _ = make_widget()
    sent: list[tuple] = []
    w.send = lambda content, buffers=None: sent.append((content, buffers))  # type: ignore[method-assign]
    w._handle_request(w, {"type": "request", "id": "a", "method": "histogram", "params": {"row": 7}}, [])
    assert sent[0][0]["ok"] is False and "IndexError" in sent[0][0]["error"] and sent[0][0]["id"] == "a"
    w._handle_request(w, {"type": "request", "id": "b", "method": "histogram", "params": {"row": 0}}, [])
    assert sent[1][0]["ok"] is True and len(sent[1][1]) == 2


def test_fallback_escapes_model_text_and_repr_is_cheap() -> None:
    w, _ = make_widget()
    html = w.fallback_html()
    assert HOSTILE not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert repr(w).startswith("ThermometerWidget(") and len(repr(w)) < 200
    bundle, _ = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and bundle["text/html"] == html


def test_selected_is_validated() -> None:
    w, _ = make_widget()
    w.selected = "1"
    with pytest.raises(Exception, match="no row named"):
        w.selected = "nope"


def test_magic_cell_raising_in_the_model_shows_where(shell) -> None:  # type: ignore[no-untyped-def]
    setup = (
        "import torch\nfrom torch import nn\nfrom nbdebug.capture import hook_count\n"
        "model = nn.Sequential()\nmodel.add_module('conv', nn.Conv2d(3, 8, 3))\n"
        "model.add_module('flat', nn.Flatten())\nmodel.add_module('head', nn.Linear(512, 10))\n"
        "x = torch.randn(4, 3, 12, 12)"
    )
    assert shell.run_cell(setup).success
    res = shell.run_cell("%%nndebug model --view thermometer\nmodel(x)")
    assert isinstance(res.error_in_exec, RuntimeError)
    assert "mat1 and mat2 shapes cannot be multiplied (4x800 and 512x10)" in str(res.error_in_exec)
    w = shell.user_ns["_nndebug_widget"]
    assert w.raised["module"] == "head" and w.raised["inputs"] == ["4×800 float32 cpu, from `flat`"]
    shown = [d for d in shell.displayed if "text/html" in d]
    assert shown, "the view is shown under a cell that raised"
    page = shown[-1]["text/html"]
    assert "raised in <code>head</code> (Linear)" in page
    assert "`head` expects 512 input features, got 800 from `flat` (8×10×10)" in page
    assert "no problems found" not in page
    assert shell.run_cell("assert hook_count(model) == 0").success
    w.close()


class _LateBranch(nn.Module):
    """A ReLU net whose ``late`` layer runs only from step 3 on (its values are first kept there)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act, self.late = nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.act(self.fc(x))
        return self.late(y) if self.calls >= 3 else y


def test_texts_at_the_report_step_and_over_the_run_and_where_histograms_were_kept() -> None:
    """``report_step`` names the step summary/notes/diagnoses describe; ``run_texts`` is the whole-run
    report; a histogram's answer names the step its values were kept at (the row's first call)."""
    from nbdebug.inspectors.thermometer import diagnose

    torch.manual_seed(0)
    m = _LateBranch()
    with Capture(m, sample_size=100_000) as cap:
        for _ in range(5):
            m(torch.randn(16, 4)).sum().backward()
    res = cap.result
    w = ThermometerWidget.from_capture(res)
    assert w.report_step == 5 and w.summary.startswith("step 5: ")
    assert any(n.startswith("table and flags at step 5 of 5 (5 kept steps)") for n in w.notes)  # step_texts.ts rewrites it
    run = diagnose(res, step="run")
    assert w.run_texts["summary"] == run.summary and w.run_texts["notes"] == run.notes
    assert [d["message"] for d in w.run_texts["diagnoses"]] == [d.message for d in run.diagnoses]
    assert w.histogram_note == ""
    names = [r.name for r in res.layers]
    ans = {n: w.handle_request("histogram", {"row": names.index(n)}) for n in ("act", "late")}
    assert (ans["act"][0]["result"]["first_step"], ans["act"][0]["result"]["last_step"]) == (1, 1)
    assert (ans["late"][0]["result"]["first_step"], ans["late"][0]["result"]["last_step"]) == (3, 3)
    # over several steps the bins span the kept sample (the first call), not the run's min/max
    body, buffers = ans["late"]
    sample = res.layers[names.index("late")].sample
    edges = np.frombuffer(bytes(buffers[body["arrays"]["edges"]["buffer"]]), dtype=np.float32)
    assert edges[0] == np.float32(sample.min()) and edges[-1] == np.float32(sample.max())
    counts = np.frombuffer(bytes(buffers[body["arrays"]["counts"]["buffer"]]), dtype=np.float32)
    np.testing.assert_array_equal(counts, np.histogram(sample.astype(np.float64), bins=32, range=(float(sample.min()), float(sample.max())))[0])
    # a single call: no history, the texts are the report's own
    single, _ = make_widget()
    assert single.report_step == 0 and single.run_texts == {}
    body, _ = single.handle_request("histogram", {"row": 0})
    assert (body["result"]["first_step"], body["result"]["last_step"]) == (1, 1)


def test_view_widgets_keep_their_class_and_still_sync_anywidgets_traits() -> None:
    """anywidget gives every new widget ``_anywidget_id`` (and ``_esm`` unless the class has that trait);
    adding a trait makes traitlets create a class per instance (~0.3 ms in the cell's time). The view
    classes hold both as class traits, so no class is created, and the synced state still has them."""
    import importlib
    import pkgutil

    import traitlets

    import nbdebug.widgets
    from nbdebug.inspectors.thermometer import Thresholds
    from nbdebug.widgets._base import STATIC, NBWidget

    for mod in pkgutil.iter_modules(nbdebug.widgets.__path__):
        importlib.import_module(f"nbdebug.widgets.{mod.name}")
    views = [c for c in _subclasses(NBWidget) if c.__dict__.get("_view_name_")]
    assert ThermometerWidget in views and len(views) >= 5
    for cls in views:
        if (STATIC / f"{cls._view_name_}.js").exists():
            assert isinstance(cls.__dict__["_esm"], traitlets.Unicode)
            assert cls.__dict__["_anywidget_id"].default_value == f"{cls.__module__}.{cls.__name__}"
    w = ThermometerWidget.waiting(Thresholds())
    try:
        assert type(w) is ThermometerWidget
        state = w.get_state()
        assert state["_anywidget_id"] == "nbdebug.widgets.thermometer.ThermometerWidget"
        assert state["_esm"] == ThermometerWidget.__dict__["_esm"].default_value and state["_esm"]
        assert {"_esm", "_anywidget_id"} <= set(w.keys)
    finally:
        w.close()

    class Renamed(ThermometerWidget):  # a subclass without a view name: anywidget's own id for it
        pass

    r = Renamed.waiting(Thresholds())
    try:
        assert r.get_state()["_anywidget_id"].endswith(".Renamed")
        assert r.get_state()["_esm"] == state["_esm"]
    finally:
        r.close()


def _subclasses(cls: type) -> list[type]:
    out = []
    for c in cls.__subclasses__():
        out += [c, *_subclasses(c)]
    return out
