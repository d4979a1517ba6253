"""Channel ablation from the feature-map grid in a real JupyterLab (Debian chromium): click a channel tile,
shift-click another, "ablate" → the kernel re-runs the first sample with them zeroed and the view shows
the Δ probability of the clean top-1 class, which equals the kernel's own value; class names are hostile
HTML that must show as characters.
"""

from __future__ import annotations

import pytest

from .harness import (
    open_and_run,
    run_code_and_wait_text,
    run_js,
    screenshot,
    wait_widget,
    write_notebook,
)

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=window.__pwned=1>"

SETUP = f'''
import torch, torch.nn as nn
%load_ext nbdebug
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 8, 3, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval()
names = ["{HOSTILE}"] + [f"class {{i}}" for i in range(1, 4)]
x = torch.rand(2, 3, 12, 12)
'''

RUN = """%%nndebug model --view featuremaps --layers 0,2 --class-names names
out = model(x)
"""


def test_ablate_channel_lab(page, lab) -> None:  # type: ignore[no-untyped-def]
    write_notebook(lab.root, "ablate_vision", [SETUP, RUN, "w = _nndebug_widget"])
    open_and_run(page, lab, "ablate_vision")
    view = wait_widget(page, "featuremaps")
    page.locator('.nbdebug-featuremaps[data-ready="1"]').wait_for(state="attached", timeout=120_000)
    tiles = view.locator(".nbd-tile")
    tiles.first.wait_for(timeout=120_000)
    layer = run_js(page, "return document.querySelector('.nbdebug-featuremaps select.nbd-layer').value")
    tiles.nth(1).click()
    tiles.nth(3).click(modifiers=["Shift"])
    panel = view.locator(".nbd-ablate")
    assert panel.get_attribute("data-channels") == "1,3"
    panel.locator(".nbd-ablate-go").click()
    page.locator(".nbdebug-featuremaps .nbd-ablate[data-delta]").wait_for(state="attached", timeout=120_000)
    shown = float(panel.get_attribute("data-delta"))
    assert panel.locator(".nbd-delta").text_content().startswith("Δ p(")
    assert panel.locator(".nbd-cams canvas").count() == 2
    assert run_js(page, "return !!window.__pwned") is False and view.locator("img").count() == 0
    # the click reached the kernel, and the Δ shown is the kernel's value for the same ablation
    run_code_and_wait_text(page, "print('ablations', w.ablations)", "ablations 1")
    run_code_and_wait_text(
        page, f"print('same', abs(w.ablation.ablate({layer!r}, [1, 3])['delta'] - {shown!r}) < 1e-9)", "same True")
    screenshot(page, "ablate-vision-lab", view)
