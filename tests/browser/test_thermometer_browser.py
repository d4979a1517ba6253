"""The thermometer in a real JupyterLab and Notebook 7: rows, flags, histogram on click, the
click reaching the kernel, and a hostile layer name staying text.

The model is hand-built so the expected rows are known: 8 leaf modules called once each, and
``relu2`` is dead because ``conv2``'s bias is -10 (its inputs are ReLU outputs, its weights are
small, so every pre-activation is negative).
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

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

pytestmark = pytest.mark.browser

EXPECTED_NAMES = ["conv1", "relu1", "conv2", "relu2", HOSTILE, "pool", "flat", "fc"]
DEAD = "relu2"

MODEL_CELL = f"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential()
model.add_module("conv1", nn.Conv2d(3, 8, 3, padding=1))
model.add_module("relu1", nn.ReLU())
model.add_module("conv2", nn.Conv2d(8, 8, 3, padding=1))
model.add_module("relu2", nn.ReLU())
model.add_module({HOSTILE!r}, nn.Identity())
model.add_module("pool", nn.AdaptiveAvgPool2d(2))
model.add_module("flat", nn.Flatten())
model.add_module("fc", nn.Linear(32, 4))
with torch.no_grad():
    model.conv2.bias.fill_(-10.0)  # relu2 sees only negative inputs: dead
x = torch.randn(2, 3, 16, 16)
"""

RUN_CELL = """%%nndebug model --view thermometer -o therm
loss = model(x).sum(); loss.backward()
"""

CELLS = ["%load_ext nbdebug", MODEL_CELL, RUN_CELL]
HIST = ".nbdebug-thermometer canvas.nbdebug-histogram"

# What the kernel says about the widget it displayed (the magic keeps it as _nndebug_widget).
WIDGET_INFO = (
    "{'names': [l['name'] for l in _nndebug_widget.layers],"
    " 'flags': {l['name']: l['flags'] for l in _nndebug_widget.layers if l['flags']},"
    " 'same_as_o': therm is _nndebug, 'js_error': _nndebug_widget.js_error}"
)


def _check_rows(widget, info) -> None:
    """Rows drawn = rows captured, in execution order, and exactly the flagged ones flagged."""
    assert info["names"] == EXPECTED_NAMES
    assert info["flags"] == {DEAD: ["dead"]}
    rows = widget.locator(".nbd-row")
    assert rows.count() == len(info["names"])
    assert rows.locator(".nbd-name").all_text_contents() == info["names"]
    flagged = widget.locator(".nbd-row.nbd-flagged")
    assert flagged.count() == 1
    dead = widget.locator(f'.nbd-row[data-row="{info["names"].index(DEAD)}"]')
    assert "nbd-flagged" in (dead.get_attribute("class") or "")
    assert dead.locator(".nbd-chip").all_text_contents() == ["dead"]


def _select(page, widget, name: str, names: list[str]) -> int:
    """Click the row of ``name``; wait for its histogram; return the drawn pixel count."""
    widget.locator(f'.nbd-row[data-row="{names.index(name)}"]').click()
    detail = widget.locator(".nbd-detail")
    detail.locator(".nbd-detail-title code").filter(has_text=name).wait_for()
    widget.locator('.nbd-detail[data-histogram="ready"]').wait_for()
    return wait_canvas_nonblank(page, HIST, minimum=1)


def test_thermometer_lab(page, lab) -> None:
    write_notebook(lab.root, "thermometer_lab", CELLS)
    open_and_run(page, lab, "thermometer_lab")
    widget = wait_widget(page, "thermometer")
    info = kernel_json(page, WIDGET_INFO)
    assert info["same_as_o"] is True
    _check_rows(widget, info)
    names = info["names"]

    # The hostile name is literal text everywhere it is shown; nothing got parsed as HTML.
    hostile_row = widget.locator(f'.nbd-row[data-row="{names.index(HOSTILE)}"]')
    assert hostile_row.locator(".nbd-name").text_content() == HOSTILE
    _select(page, widget, HOSTILE, names)
    assert widget.locator(".nbd-detail-title code").text_content() == HOSTILE

    # A live layer spreads over many bins; the dead one is a single bar at 0 (32 bins over
    # 360×120 px: one bar is at most ~12 px wide), so the canvas reflects the fetched data.
    wide = _select(page, widget, "conv1", names)
    narrow = _select(page, widget, DEAD, names)
    assert 0 < narrow <= 12 * 120 < wide, (narrow, wide)

    # The click reached the kernel: a later cell sees the synced trait.
    run_code_and_wait_text(
        page, "print('selected=' + _nndebug_widget.selected)", f"selected={DEAD}"
    )

    assert widget.locator("img").count() == 0
    assert page.locator('img[src="x"]').count() == 0
    assert page.evaluate("window.__pwned") is None
    screenshot(page, "thermometer-lab", widget)

    # "flagged only" hides the healthy rows and syncs back too.
    widget.locator("input.nbd-only").check()
    expect(widget.locator(".nbd-row:visible")).to_have_count(1)
    assert widget.locator(".nbd-row:visible .nbd-name").text_content() == DEAD
    run_code_and_wait_text(page, "print('only=', _nndebug_widget.flagged_only)", "only= True")
    assert kernel_json(page, "_nndebug_widget.js_error") == ""


def test_thermometer_notebook7(page, nb7) -> None:
    write_notebook(nb7.root, "thermometer_nb7", CELLS)
    open_and_run(page, nb7, "thermometer_nb7")
    widget = wait_widget(page, "thermometer")
    info = kernel_json(page, WIDGET_INFO)
    _check_rows(widget, info)
    assert widget.locator("img").count() == 0
    assert page.evaluate("window.__pwned") is None
    screenshot(page, "thermometer-nb7")
    assert info["js_error"] == ""
