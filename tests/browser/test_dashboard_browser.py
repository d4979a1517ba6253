"""The `--view all` dashboard in JupyterLab + chromium: one tabbed widget; clicking a thermometer
row moves the feature grid's and Grad-CAM's layer dropdowns (linked in Python) and the traits change."""

from __future__ import annotations

import pytest

from .harness import open_and_run, run_code_and_wait_text, screenshot, wait_widget, write_notebook

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
    page.wait_for_function(f"(() => {{ const s = document.querySelector('{fm_sel}'); return s && s.value === '0'; }})()")
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
