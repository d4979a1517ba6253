"""DoctorWidget: traits mirror the report (JSON-safe evidence, the overfit curve as float32 bytes),
the static fallback is escaped and script-free, a report displays as the widget in a shell, and
neither holds the user's model."""

from __future__ import annotations

import gc
import json
import math
import weakref

import numpy as np
import torch
import torch.nn.functional as F
from snapshot_models import HOSTILE  # tests/widget is on sys.path
from torch import nn

from nbdebug.doctor import doctor
from nbdebug.inspectors.doctor import CheckResult, DoctorReport, softmax_floor
from nbdebug.widgets.doctor import MAX_LIST, DoctorWidget


class DoubleSoftmax(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.net(x), dim=-1)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(20, 16, generator=g), torch.arange(20) % 5


def test_traits_mirror_the_report() -> None:
    x, y = data()
    report = doctor(DoubleSoftmax(), x, y, steps=60)
    w = DoctorWidget(report)
    try:
        assert [c["name"] for c in w.checks] == list(report.checks)
        assert [c["status"] for c in w.checks] == [c.status for c in report.checks.values()]
        assert [c["advice"] for c in w.checks] == [c.advice for c in report.checks.values()]
        over = report.checks["overfit_batch"]
        np.testing.assert_array_equal(np.frombuffer(w.curve, dtype=np.float32), np.asarray(over.evidence["curve"], dtype=np.float32))
        assert "curve" not in dict(next(c for c in w.checks if c["name"] == "overfit_batch")["evidence"])
        assert w.curve_target == over.evidence["target"]
        assert w.curve_floor == softmax_floor(5) == over.evidence["softmax_floor"]
        assert w.kind == "classification" and w.classes == 5 and w.selected == ""
        json.dumps(w.checks, allow_nan=False)  # the synced JSON is valid (no NaN literals)
        assert repr(w) == f"DoctorWidget(checks=9, failed={report.failed})"
        assert w.headline == report.headline and w.headline.startswith("overfit_batch failed: the loss only fell to")
        assert report.failed == ["overfit_batch"]
    finally:
        w.close()


def test_nonfinite_and_long_evidence_are_json_safe() -> None:
    report = DoctorReport({"nonfinite": CheckResult("fail", {"loss": math.nan, "hi": math.inf, "rows": list(range(30)),
                                                              "ok": True, "n": np.int64(3)}, "x")})
    w = DoctorWidget(report)
    try:
        ev = dict(w.checks[0]["evidence"])
        assert ev["loss"] == "NaN" and ev["hi"] == "inf" and ev["ok"] is True and ev["n"] == 3
        assert ev["rows"] == [*range(MAX_LIST), f"… {30 - MAX_LIST} more"]
        assert w.curve == b"" and w.curve_target is None and w.curve_floor is None
        json.dumps(w.checks, allow_nan=False)
    finally:
        w.close()


def test_fallback_is_static_escaped_and_draws_the_curve() -> None:
    report = DoctorReport({"dead_units": CheckResult("fail", {"worst_layer": HOSTILE}, f"dead units in `{HOSTILE}`"),
                           "overfit_batch": CheckResult("fail", {"curve": [2.0, 1.0, 0.5], "target": 0.1}, "fit")},
                          kind="classification", classes=3, notes=[HOSTILE])
    w = DoctorWidget(report)
    try:
        page = w.fallback_html()
        assert HOSTILE not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
        assert "<script" not in page and page.count("<tr>") == 3
        assert "<polyline" in page and "points='0.0,0.0 120.0,30.0 240.0,45.0'" in page
        bundle, _ = w._repr_mimebundle_()
        assert bundle["text/html"] == page and "application/vnd.jupyter.widget-view+json" in bundle
    finally:
        w.close()


def test_report_displays_as_the_widget_in_a_shell(shell) -> None:  # type: ignore[no-untyped-def]
    shell.user_ns["data"] = data
    shell.user_ns["DoubleSoftmax"] = DoubleSoftmax
    assert shell.run_cell("from nbdebug.doctor import doctor\nx, y = data()\nmodel = DoubleSoftmax()").success
    res = shell.run_cell("report = doctor(model, x, y, steps=30)\nreport")
    assert res.success, res.error_in_exec
    out = res.result
    assert out is shell.user_ns["report"]
    shown, _ = shell.display_formatter.format(out)
    assert "application/vnd.jupyter.widget-view+json" in shown
    assert "nbdebug-doctor-static" in shown["text/html"] and "overfit_batch" in shown["text/html"]
    assert shown["text/plain"] == repr(out) and "✗ overfit_batch" in shown["text/plain"]
    # the report and its widget hold no reference to the model
    ref = weakref.ref(shell.user_ns["model"])
    w = shell.user_ns["report"].widget()
    try:
        assert shell.run_cell("del model").success
        gc.collect()
        assert ref() is None
    finally:
        w.close()


def test_save_html_runs_offline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    x, y = data()
    w = DoctorWidget(doctor(DoubleSoftmax(), x, y, steps=10))
    try:
        page = w.save_html(tmp_path / "doctor.html").read_text(encoding="utf-8")
        assert "nbdebug-doctor" in page and "overfit_batch" in page
    finally:
        w.close()
