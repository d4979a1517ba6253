"""nbdebug.doctor's checklist in a real JupyterLab: a double-softmax model (its first layer named
with hostile text) shows one row per check with the kernel's statuses, the failed check first under a
prominent "1 failed", overfit_batch failed with a non-blank loss curve and no internal placeholder
("reached_at = -1"), the hostile name stays text, and clicking a row reaches the kernel; every text
node at WCAG AA contrast, and in an 800-px window the advice wraps: nothing is cut."""

from __future__ import annotations

import pytest

from .harness import (
    HOSTILE,
    kernel_json,
    open_and_run,
    run_code_and_wait_text,
    screenshot,
    wait_canvas_nonblank,
    wait_widget,
    write_notebook,
)
from .legibility import clipped, contrast_failures, narrow

pytestmark = pytest.mark.browser


MODEL_CELL = f"""
import torch
import torch.nn.functional as F
from torch import nn

class DoubleSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential()
        self.net.add_module({HOSTILE!r}, nn.Linear(16, 32))
        self.net.add_module("relu", nn.ReLU())
        self.net.add_module("head", nn.Linear(32, 5))

    def forward(self, x):
        return F.softmax(self.net(x), dim=-1)   # the planted bug: cross_entropy applies softmax again

torch.manual_seed(0)
model = DoubleSoftmax()
x, y = torch.randn(32, 16), torch.arange(32) % 5
"""

RUN_CELL = """from nbdebug.doctor import doctor
report = doctor(model, x, y, steps=150)
w = report.widget()
w
"""

INFO = "{'statuses': [[c['name'], c['status']] for c in w.checks], 'failed': report.failed, 'js_error': w.js_error}"


def test_doctor_lab(page, lab) -> None:
    write_notebook(lab.root, "doctor_lab", [MODEL_CELL, RUN_CELL])
    open_and_run(page, lab, "doctor_lab")
    widget = wait_widget(page, "doctor")
    info = kernel_json(page, INFO)
    assert info["failed"] == ["overfit_batch"] and info["js_error"] == ""

    rows = widget.locator(".nbd-check")
    assert rows.count() == 9
    drawn = [[rows.nth(i).get_attribute("data-check"), rows.nth(i).get_attribute("data-status")] for i in range(9)]
    failed_first = [s for s in info["statuses"] if s[1] == "fail"] + [s for s in info["statuses"] if s[1] != "fail"]
    assert drawn == failed_first and drawn[0] == ["overfit_batch", "fail"]
    verdict = widget.locator(".nbd-head .nbd-verdict")
    assert verdict.text_content() == "1 failed"
    assert page.evaluate("document.querySelector('.nbdebug-doctor .nbd-head').firstElementChild.className").startswith("nbd-verdict")
    assert "reached_at" not in (widget.text_content() or "") and "= -1" not in (widget.text_content() or "")
    assert "target reached = never" in widget.locator('.nbd-check[data-check="overfit_batch"] .nbd-evidence').text_content()
    over = widget.locator('.nbd-check[data-check="overfit_batch"]')
    assert over.locator(".nbd-status").text_content() == "✗"
    assert "ln(1 + (C−1)/e)" in (over.locator(".nbd-advice").text_content() or "")
    assert wait_canvas_nonblank(page, '.nbdebug-doctor [data-check="overfit_batch"] canvas.nbd-curve', minimum=50) >= 50

    # The hostile first-layer name is literal evidence text, never parsed.
    flow = widget.locator('.nbd-check[data-check="gradient_flow"] .nbd-evidence')
    assert f"first = net.{HOSTILE}" in flow.locator("span").all_text_contents()
    assert page.locator('img[src="x"]').count() == 0
    assert page.evaluate("window.__pwned") is None

    # A click reaches the kernel through the synced trait.
    widget.locator('.nbd-check[data-check="dead_units"]').click()
    assert "nbd-selected" in (widget.locator('.nbd-check[data-check="dead_units"]').get_attribute("class") or "")
    run_code_and_wait_text(page, "print('selected=' + w.selected)", "selected=dead_units")
    screenshot(page, "doctor-lab", widget)

    checked, bad = contrast_failures(page, ".nbdebug-doctor")
    assert checked > 30 and bad == [], bad[:10]
    assert 0 < narrow(page) <= 800
    checked, cut = clipped(page, ".nbdebug-doctor")
    assert checked > 20 and cut == [], cut[:10]
    screenshot(page, "doctor-800px", widget)
