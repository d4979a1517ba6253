"""Issue 22 on the thermometer in a real JupyterLab, on the digits MLP trained at lr=3.0 (no --loss: the
loss is what .backward() ran on): the header is the finding (root cause first) while the loop runs and
at the end; the ranked findings say each piece of advice once; the update-ratio chip says "high" (the header carries the verdict);
the loss curve sits above the step slider with ticks at the events, the value under the pointer, a
log-scale toggle and a click that moves the slider (reaching the kernel); every text node is at WCAG AA
contrast (measured from the rendered colours); in an 800-px window nothing is cut."""

from __future__ import annotations

import pytest

from .harness import (
    KERNEL_IDLE_MS,
    kernel_json,
    open_and_run,
    open_notebook,
    run_code_and_wait_text,
    run_js,
    screenshot,
    wait_widget,
    write_notebook,
)
from .legibility import clipped, contrast_failures, narrow

pytestmark = pytest.mark.browser

SETUP = """
import time
import torch, torch.nn as nn, torch.nn.functional as F
from sklearn.datasets import load_digits
torch.set_num_threads(1)
digits = load_digits()
X = torch.tensor(digits.data, dtype=torch.float32) / 16.0
Y = torch.tensor(digits.target)
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.SGD(net.parameters(), lr=3.0)
batches = torch.randint(0, len(X), (100, 64), generator=torch.Generator().manual_seed(0))
"""


def loop(pause: float = 0.0) -> str:
    return f"""%%nndebug net -o run
for idx in batches:
    loss = F.cross_entropy(net(X[idx]), Y[idx])
    opt.zero_grad(); loss.backward(); opt.step()
    time.sleep({pause})
"""


CELLS = ["%load_ext nbdebug", SETUP, loop()]
W = ".nbdebug-thermometer"


def _hover_step(page, widget, step: int, first: int, last: int) -> None:
    """Move the pointer over the loss curve at ``step`` (the chart maps steps linearly onto its width)."""
    box = widget.locator(".nbd-loss svg.nbd-chart-svg").bounding_box()
    x = box["x"] + (2 + (step - first) / (last - first) * 596) / 600 * box["width"]
    page.mouse.move(x, box["y"] + box["height"] / 2)


def test_digits_lr3_header_loss_curve_contrast_and_narrow_layout(page, lab) -> None:  # type: ignore[no-untyped-def]
    write_notebook(lab.root, "findings_lab", CELLS)
    open_and_run(page, lab, "findings_lab")
    widget = wait_widget(page, "thermometer")
    info = kernel_json(page, "{'headline': _nndebug_widget.headline, 'n': len(_nndebug_widget.findings),"
                             " 'loss': run.series('loss').tolist(), 'events': sorted({e.step for e in _nndebug_widget.report.events"
                             " if e.code != 'update_ratio'}), 'js_error': _nndebug_widget.js_error,"
                             " 'root': _nndebug_widget.findings[0]['step'] if _nndebug_widget.findings else None}")
    # the header is the finding, root cause first, and it is the view's first line
    head = widget.locator(".nbd-finding").text_content() or ""
    assert head == info["headline"].replace("`", "") and head.startswith("learning rate too high: update ratio "), head
    assert "`1` dead from step" in info["headline"] and "`3` from step" in info["headline"]
    assert page.evaluate(f"document.querySelector('{W} > style').nextElementSibling.className") == "nbd-finding"
    assert widget.locator(".nbd-findings > li").count() == info["n"] == 3
    # each piece of advice once, in the whole view (findings, timeline, flags at the step)
    advice = [t.strip() for t in widget.locator(".nbd-suggestion").all_text_contents()]
    assert advice and len(advice) == len(set(advice)), advice
    assert (widget.text_content() or "").count("Karpathy") <= 1
    # the head's update ratio at step 100 (0.015) is flagged as too high, not "update ratio"
    chips = widget.locator('.nbd-row:has(.nbd-name:text-is("4")) .nbd-chip').all_text_contents()
    assert chips == ["update high"], chips
    assert widget.locator(".nbd-legend-item.nbd-absent:visible").count() == 0  # inactive chips are hidden
    assert widget.locator(".nbd-head > div").nth(7).text_content().startswith("‖∂L/∂out‖")

    # the loss curve sits above the slider, with ticks at the events
    y_loss = widget.locator(".nbd-loss").bounding_box()["y"]
    y_slider = widget.locator(".nbd-slider-row").bounding_box()["y"]
    assert y_loss < y_slider
    marks = {int(m) for m in widget.locator(".nbd-loss .nbd-chart-mark").evaluate_all("ms => ms.map((m) => m.getAttribute('data-step'))")}
    assert set(info["events"]) <= marks, (info["events"], marks)
    # and one red tick at the header's root cause, at its step
    root = widget.locator(".nbd-loss .nbd-mark-root")
    assert root.count() == 1 and int(root.get_attribute("data-step")) == info["root"], (root.count(), info["root"])
    # the value under the pointer reaches the DOM: the kernel's loss at that step
    _hover_step(page, widget, 10, 1, 100)
    label = widget.locator(".nbd-loss-label")
    page.wait_for_function(f"document.querySelector('{W} .nbd-chart').dataset.hover === '10'")
    text = label.text_content() or ""
    assert text.startswith("loss ") and text.endswith(" at step 10"), text
    assert float(text.split()[1]) == pytest.approx(info["loss"][9], rel=1e-3)
    # the log-scale toggle redraws the curve on log10
    d_linear = widget.locator(".nbd-loss path.nbd-chart-line").get_attribute("d")
    widget.locator(".nbd-loss input.nbd-chart-log").check()
    assert widget.locator(".nbd-loss svg.nbd-chart-svg").get_attribute("data-scale") == "log"
    assert widget.locator(".nbd-loss path.nbd-chart-line").get_attribute("d") != d_linear
    # a click on the curve moves the slider there, and the kernel hears it
    _hover_step(page, widget, 10, 1, 100)
    page.mouse.down()
    page.mouse.up()
    widget.locator(".nbd-step-label", has_text="step 10 of 100").wait_for()
    run_code_and_wait_text(page, "print('step=', _nndebug_widget.step)", "step= 10")
    page.mouse.move(0, 0)
    screenshot(page, "findings-digits-lr3-lab", widget)

    # contrast of every text node, from the rendered colours
    checked, bad = contrast_failures(page, W)
    assert checked > 100 and bad == [], bad[:10]
    # an 800-px window: nothing cut
    width = narrow(page)
    assert 0 < width <= 800
    checked, cut = clipped(page, W)
    assert checked > 50 and cut == [], cut[:10]
    screenshot(page, "findings-digits-lr3-800px", widget)
    assert kernel_json(page, "_nndebug_widget.js_error") == ""


WATCH = """
    window.__heads = [];
    const cells = app.shell.currentWidget.content.widgets;
    window.__headTimer = setInterval(() => {
        const f = document.querySelector('.nbdebug-thermometer[data-ready="1"] .nbd-finding');
        const s = document.querySelector('.nbdebug-thermometer[data-ready="1"] .nbd-summary');
        if (!f) return;
        const seen = { finding: f.textContent, summary: s ? s.textContent : '', busy: cells[2].model.executionCount === null };
        const last = window.__heads[window.__heads.length - 1];
        if (!last || last.finding !== seen.finding || last.busy !== seen.busy) window.__heads.push(seen);
    }, 50);
    return true;
"""


def test_the_finding_is_the_header_while_the_loop_runs(page, lab) -> None:  # type: ignore[no-untyped-def]
    write_notebook(lab.root, "findings_live", ["%load_ext nbdebug", SETUP, loop(pause=0.06)])
    open_notebook(page, lab, "findings_live")
    run_js(page, WATCH)
    run_js(page, "app.commands.execute('notebook:run-all-cells'); return true;")
    wait_widget(page, "thermometer")
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.content.widgets[2].model.executionCount !== null",
                           timeout=KERNEL_IDLE_MS)
    seen = page.evaluate("clearInterval(window.__headTimer), window.__heads")
    live = [s for s in seen if s["busy"] and s["finding"].startswith("learning rate too high: update ratio ")]
    assert live, seen  # the root cause was the header before the cell ended
    assert all(s["summary"].startswith("running: ") for s in live if s["summary"]), live
    final = kernel_json(page, "_nndebug_widget.headline")
    widget = wait_widget(page, "thermometer")
    widget.locator(".nbd-finding", has_text=final.replace("`", "")).wait_for()
