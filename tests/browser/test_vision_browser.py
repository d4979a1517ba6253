"""Vision views in JupyterLab + chromium: the feature grid draws and enlarges; the Grad-CAM opacity
slider repaints without any kernel message and its final value reaches Python; switching class
changes the heatmap."""

from __future__ import annotations

from typing import Any

import pytest

from .harness import (
    canvas_nonblank,
    kernel_json,
    open_and_run,
    run_code_and_wait_text,
    screenshot,
    wait_canvas_nonblank,
    wait_widget,
    write_notebook,
)
from .scrollboxes import hidden_in_scroll

pytestmark = pytest.mark.browser

SETUP = """
%load_ext nbdebug
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 12, 3, stride=2, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(12, 6)).eval()
yy, xx = torch.meshgrid(torch.linspace(0, 1, 32), torch.linspace(0, 1, 32), indexing="ij")
x = torch.stack([xx, yy, (xx - yy).abs()])[None].repeat(2, 1, 1, 1)
x[1] = x[1].flip(-1)
names = [f"<img src=x onerror=window.__pwned={i}> class {i}" for i in range(6)]
"""

CHECKSUM = """(sel) => {
    const c = document.querySelector(sel);
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let h = 0;
    for (let i = 0; i < d.length; i++) h = (h * 31 + d[i]) >>> 0;
    return h;
}"""


def comm_frames(page: Any) -> list[int]:
    """Count of websocket frames the page sent that carry a comm message (kept up to date)."""
    sent: list[int] = [0]

    def on_ws(ws: Any) -> None:
        def on_frame(payload: Any) -> None:
            data = payload if isinstance(payload, (bytes, bytearray)) else str(payload).encode()
            if b"comm_msg" in data:
                sent[0] += 1

        ws.on("framesent", on_frame)

    page.on("websocket", on_ws)
    return sent


def test_feature_grid_draws_and_enlarges(page, lab) -> None:  # type: ignore[no-untyped-def]
    write_notebook(lab.root, "vision_fm", [SETUP, "%%nndebug model --view featuremaps --layers 0,2\nmodel(x)"])
    open_and_run(page, lab, "vision_fm")
    root = wait_widget(page, "featuremaps")
    page.wait_for_selector(".nbdebug-featuremaps .nbd-tile canvas")
    assert root.locator(".nbd-tile").count() == 8  # opens on the first layer asked for, "0" (8 channels)
    w = page.evaluate("document.querySelector('.nbdebug-featuremaps .nbd-tile canvas').width")
    assert w == 32
    headline = kernel_json(page, "_nndebug_widget.headline")
    assert headline.startswith("`0`: ") and "dead" not in headline
    # one grammar: the backticked layer as a code span (no literal backticks on screen)
    assert root.locator(".nbd-headline").text_content() == headline.replace("`", "")
    assert root.locator(".nbd-headline code").first.text_content() == "0"
    for ch in (0, 5):
        assert wait_canvas_nonblank(page, f'.nbdebug-featuremaps .nbd-tile[data-channel="{ch}"] canvas', minimum=20) >= 20
    root.locator('.nbd-tile[data-channel="5"]').click()
    big = root.locator('.nbd-big.nbd-open[data-channel="5"]')
    big.wait_for(state="visible")
    assert canvas_nonblank(page, ".nbdebug-featuremaps .nbd-big canvas.nbd-map") > 100
    run_code_and_wait_text(page, "print('selected', _nndebug_widget.selected)", "selected 5")
    # another layer is fetched on demand: 12 channels; the headline follows it
    root.locator("select.nbd-layer").select_option("2")
    page.wait_for_function("document.querySelectorAll('.nbdebug-featuremaps .nbd-tile').length === 12")
    page.wait_for_function("document.querySelector('.nbdebug-featuremaps .nbd-headline').textContent.startsWith('2: ')")
    assert hidden_in_scroll(page, ".nbdebug-featuremaps") == []
    screenshot(page, "vision-featuremaps", root)


def test_gradcam_slider_is_local_and_syncs_back(page, lab) -> None:  # type: ignore[no-untyped-def]
    _gradcam_roundtrip(page, lab, "vision_cam")


def test_gradcam_in_notebook7(page, nb7) -> None:  # type: ignore[no-untyped-def]
    _gradcam_roundtrip(page, nb7, "vision_cam_nb7")


def _gradcam_roundtrip(page: Any, server: Any, name: str) -> None:
    sent = comm_frames(page)
    write_notebook(server.root, name, [SETUP, "%%nndebug model --view gradcam --topk 3 --class-names names\nwith torch.no_grad():\n    model(x)"])
    open_and_run(page, server, name)
    root = wait_widget(page, "gradcam")
    sel = ".nbdebug-gradcam canvas.nbd-overlay"
    wait_canvas_nonblank(page, sel, minimum=50)
    before = page.evaluate(CHECKSUM, sel)
    frames = sent[0]
    # move the slider: 'input' events only (what dragging fires); nothing may reach the kernel
    for v in ("0.2", "0.6", "0.9"):
        page.evaluate("(v) => { const s = document.querySelector('.nbdebug-gradcam input.nbd-opacity'); s.value = v; s.dispatchEvent(new Event('input', {bubbles: true})); }", v)
    after = page.evaluate(CHECKSUM, sel)
    assert after != before
    page.wait_for_timeout(500)
    assert sent[0] == frames, "moving the slider sent a comm message"
    assert root.locator(".nbd-opacity-value").text_content() == "0.90"
    # release: one sync of the final value
    page.evaluate("() => document.querySelector('.nbdebug-gradcam input.nbd-opacity').dispatchEvent(new Event('change', {bubbles: true}))")
    run_code_and_wait_text(page, "print('opacity', _nndebug_widget.opacity)", "opacity 0.9")
    # switching class repaints with another CAM (and syncs class_rank)
    shown = page.evaluate(CHECKSUM, sel)
    root.locator("select.nbd-class").select_option("1")
    page.wait_for_function("(args) => (" + CHECKSUM + ")(args) !== " + str(shown), arg=sel)
    run_code_and_wait_text(page, "print('rank', _nndebug_widget.class_rank)", "rank 1")
    # class names are text, never markup
    labels = root.locator("select.nbd-class option").all_text_contents()
    assert len(labels) == 3 and all("<img src=x onerror=window.__pwned=" in t for t in labels)
    assert root.locator("img").count() == 0 and page.evaluate("window.__pwned") is None
    # the headline (single method) follows the class, first in the view, its name as text
    page.wait_for_function("document.querySelector('.nbdebug-gradcam .nbd-headline').textContent.includes('(#2, p ')")
    assert root.locator(".nbd-headline").text_content() == kernel_json(page, "_nndebug_widget.headline").replace("`", "")
    assert hidden_in_scroll(page, ".nbdebug-gradcam") == []
    screenshot(page, f"vision-gradcam-{server.app}", root)


def test_gradcam_methods_switch_and_faithfulness_curves(page, lab) -> None:  # type: ignore[no-untyped-def]
    """`--method all --faithfulness --sanity`: eight small multiples draw; clicking one repaints the large
    overlay without a kernel message and reaches Python as `method`; the ranking and one chart per
    metric (a line per method) draw; EigenCAM is flagged by the sanity check."""
    sent = comm_frames(page)
    code = ("%%nndebug model --view gradcam --topk 2 --method all --faithfulness --sanity --class-names names\n"
            "with torch.no_grad():\n    model(x)")
    write_notebook(lab.root, "vision_methods", [SETUP, code])
    open_and_run(page, lab, "vision_methods")
    root = wait_widget(page, "gradcam")
    sel = ".nbdebug-gradcam canvas.nbd-overlay"
    wait_canvas_nonblank(page, sel, minimum=50)
    page.wait_for_selector(".nbdebug-gradcam[data-curves='1']")
    assert root.locator("button.nbd-method").count() == 8
    for m in ("gradcam", "eigencam", "scorecam"):
        assert wait_canvas_nonblank(page, f".nbdebug-gradcam canvas.nbd-thumb[data-method='{m}']", minimum=20) >= 20
    shown = page.evaluate(CHECKSUM, sel)
    frames = sent[0]
    root.locator("button.nbd-method[data-method='layercam']").click()
    page.wait_for_function("(args) => (" + CHECKSUM + ")(args) !== " + str(shown), arg=sel)
    assert root.locator("canvas.nbd-overlay").get_attribute("data-method") == "layercam"
    page.wait_for_timeout(300)
    assert sent[0] - frames == 1, "the switch sent more than the `method` sync (a request to the kernel?)"
    run_code_and_wait_text(page, "print('method', _nndebug_widget.method)", "method layercam")
    # the faithfulness panel: every method ranked, four charts of eight lines
    assert root.locator("table.nbd-rank tr[data-method]").count() == 8
    charts = root.locator("svg.nbd-curve")
    assert charts.count() == 4
    for i in range(4):
        lines = charts.nth(i).locator("polyline")
        assert lines.count() == 8
        assert all(len((lines.nth(j).get_attribute("points") or "").split()) >= 10 for j in range(8))
    focused = root.locator("svg.nbd-curve[data-metric='deletion'] polyline[data-method='layercam']")
    assert focused.get_attribute("stroke-width") == "2.5"
    flagged = root.locator(".nbd-sanity tr.nbd-flagged[data-method='eigencam'] .nbd-flag")
    assert flagged.text_content() == "does not depend on the class decision"
    assert root.locator("img").count() == 0 and page.evaluate("window.__pwned") is None
    screenshot(page, "vision-gradcam-methods-lab", root)
