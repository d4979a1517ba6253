"""The `--view all` dashboard in JupyterLab + chromium: one tabbed widget; clicking a thermometer
row moves the feature grid's and Grad-CAM's layer dropdowns (linked in Python) and the traits change;
its note, tab titles and thermometer are at WCAG AA contrast and nothing is cut in an 800-px window.
Views that do not apply are one quiet line, and create no widget: the page fixture fails the test on
any console error (e.g. "[anywidget] Failed to initialize model")."""

from __future__ import annotations

import pytest

from . import harness
from .harness import (
    cell_output_text,
    open_and_run,
    run_code_and_wait_text,
    screenshot,
    wait_widget,
    write_notebook,
)
from .legibility import clipped, contrast_failures, narrow

pytestmark = pytest.mark.browser

SETUP = """
%load_ext nbdebug
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 12, 3, stride=2, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(12, 6)).eval()
x = torch.rand(2, 3, 16, 16)
"""

LAYER_VALUE = "(sel) => { const s = document.querySelector(sel); return s ? s.value : null; }"


def test_thermometer_click_opens_layer_in_feature_grid_and_gradcam(page, lab) -> None:  # type: ignore[no-untyped-def]
    write_notebook(lab.root, "dashboard", [SETUP, "%%nndebug model --view all\nmodel(x)"])
    open_and_run(page, lab, "dashboard")
    dash = page.locator(".nbdebug-dashboard")
    dash.wait_for(state="attached")
    tabs = dash.locator(".lm-TabBar-tab")
    assert [t.strip() for t in tabs.all_inner_texts()] == ["thermometer", "featuremaps", "gradcam"]
    therm = wait_widget(page, "thermometer")
    fm_sel = ".nbdebug-featuremaps select.nbd-layer"
    cam_sel = ".nbdebug-gradcam select.nbd-layer"
    # the other tabs are rendered too (hidden): their dropdowns show the defaults
    page.wait_for_function(f"(() => {{ const s = document.querySelector('{fm_sel}'); return s && s.value !== ''; }})()")
    page.wait_for_function(f"(() => {{ const s = document.querySelector('{cam_sel}'); return s && s.value === '3'; }})()")  # auto layer
    therm.locator('.nbd-row[data-row="2"]').click()  # rows are the modules "0".."6": the second Conv2d
    page.wait_for_function(f"(() => document.querySelector('{fm_sel}').value === '2')()")
    page.wait_for_function(f"(() => document.querySelector('{cam_sel}').value === '2')()")
    run_code_and_wait_text(
        page,
        "d = _nndebug_widget\nprint('linked', d.views['thermometer'].selected, d.views['featuremaps'].layer, d.views['gradcam'].layer, d.selection)",
        "linked 2 2 2 {'view': 'thermometer', 'layer': '2'}",
    )
    # the feature-map tab shows the new layer: 12 channels of 8×8
    tabs.nth(1).click()
    page.wait_for_function("document.querySelectorAll('.nbdebug-featuremaps .nbd-tile').length === 12")
    assert page.evaluate(LAYER_VALUE, fm_sel) == "2"
    # and from Python: setting the dashboard's selection moves the dropdown back
    run_code_and_wait_text(page, "d.selection = {'view': 'thermometer', 'layer': '0'}\nprint('set', d.views['featuremaps'].layer)", "set 0")
    page.wait_for_function(f"(() => document.querySelector('{fm_sel}').value === '0')()")
    page.wait_for_function("document.querySelectorAll('.nbdebug-featuremaps .nbd-tile').length === 8")
    screenshot(page, "dashboard-lab", dash)
    assert dash.locator(".nbdebug-note").inner_text().startswith("not shown: attention, logitlens (")
    # legibility (issue 22) of the dashboard's own text (the note, the tab titles) and of its thermometer
    tabs.nth(0).click()
    wait_widget(page, "thermometer")
    checked, bad = contrast_failures(page, ".nbdebug-dashboard")
    assert checked > 30 and bad == [], bad[:10]
    assert 0 < narrow(page) <= 800
    checked, cut = clipped(page, ".nbdebug-dashboard")
    assert checked > 20 and cut == [], cut[:10]
    screenshot(page, "dashboard-800px", dash)


LANGUAGE = """
%load_ext nbdebug
import torch, torch.nn as nn
from nbdebug.adapters.offline import tiny_lm
lm = tiny_lm("gpt2")
ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(0))
mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
"""


def test_views_that_do_not_apply_are_one_line_and_create_no_widget(page, lab) -> None:  # type: ignore[no-untyped-def]
    """`--view all` on a language model: no feature-map/Grad-CAM widget is created (before, one was
    created and closed, and JupyterLab logged "[anywidget] Failed to initialize model");
    `--view gradcam` on an MLP: the cell's value and one note line."""
    write_notebook(lab.root, "not_applicable", [LANGUAGE, "%%nndebug lm --view all\nlm(ids).logits.shape[-1]",
                                                 "%%nndebug mlp --view gradcam\nmlp(torch.randn(5, 4)).shape[0]"])
    open_and_run(page, lab, "not_applicable")
    dash = page.locator(".nbdebug-dashboard")
    dash.wait_for(state="attached")
    tabs = dash.locator(".lm-TabBar-tab")
    assert [t.strip() for t in tabs.all_inner_texts()] == ["thermometer", "attention", "logitlens"]
    note = dash.locator(".nbdebug-note").inner_text()
    assert note.startswith("not shown: ") and "featuremaps" in note and "gradcam" in note
    wait_widget(page, "thermometer")
    for i, view in ((1, "attention"), (2, "logitlens")):
        tabs.nth(i).click()
        wait_widget(page, view)
    assert page.locator(".nbdebug-featuremaps, .nbdebug-gradcam").count() == 0
    out = cell_output_text(page, 1)
    assert "64" in out  # the cell's own value
    last = cell_output_text(page, 2)
    assert last.endswith("5") and "not shown: gradcam (" in last and "Traceback" not in last
    assert page.locator(".jp-OutputArea-output .nbdebug-note").count() == 2
    page.nbdebug_errors.check()  # no console error so far (the fixture checks again at the end)


def test_console_errors_fail_the_page_check(browser) -> None:  # type: ignore[no-untyped-def]
    """The harness reports console errors of type error (a widget failing to initialise) next to page errors."""
    context = browser.new_context()
    try:
        pg = context.new_page()
        errors = harness.PageErrors(pg, "notebook")
        pg.set_content("<script>console.error('[anywidget] Failed to initialize model', 'x');"
                       "console.warn('just a warning'); console.error(\"Cannot read properties of undefined (reading 'schema')\");"
                       "console.log('fine');</script>")
        for _ in range(200):  # wait (at most 10 s) on the condition: both errors reported
            if len(errors.console) == 2:
                break
            pg.wait_for_timeout(50)
        assert errors.unexpected() == ["console: [anywidget] Failed to initialize model x"]
        with pytest.raises(AssertionError, match="Failed to initialize model"):
            errors.check()
    finally:
        context.close()
