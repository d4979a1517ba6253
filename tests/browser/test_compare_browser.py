"""``nbdebug.compare`` in a real JupyterLab: the digits MLP trained at lr=3.0 and at lr=0.1 from the same
weights and batches, overlaid by step. The headline states each run's outcome (lr=3.0 spikes, lr=0.1 ends
lower), the divergence is said of lr=3.0 (the run that went wrong) and only it is red, the loss is on a log
axis when it spans more than 10×, the row where the runs differ most is shown first; the values under the pointer are the kernel's;
choosing a row and a statistic in the selects reaches the kernel, which sends that series back (drawn,
its divergence said); a hostile run label stays text; all text at WCAG AA contrast; nothing cut in an
800-px window."""

from __future__ import annotations

import pytest

from .harness import (
    HOSTILE,
    kernel_json,
    open_and_run,
    run_code_and_wait_text,
    screenshot,
    wait_widget,
    write_notebook,
)
from .legibility import clipped, contrast_failures, narrow
from .scrollboxes import hidden_in_scroll_boxes

pytestmark = pytest.mark.browser

SETUP = """
import torch, torch.nn as nn, torch.nn.functional as F
import nbdebug
from sklearn.datasets import load_digits
torch.set_num_threads(1)
digits = load_digits()
X = torch.tensor(digits.data, dtype=torch.float32) / 16.0
Y = torch.tensor(digits.target)
batches = torch.randint(0, len(X), (60, 64), generator=torch.Generator().manual_seed(0))

def mlp(lr):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    return net, torch.optim.SGD(net.parameters(), lr=lr)

net, opt = mlp(3.0)
"""

LOOP = """%%nndebug net -o {out}
for idx in batches:
    loss = F.cross_entropy(net(X[idx]), Y[idx])
    opt.zero_grad(); loss.backward(); opt.step()
"""

CELLS = ["%load_ext nbdebug", SETUP, LOOP.format(out="fast"), "net, opt = mlp(0.1)", LOOP.format(out="slow"),
         f"w = nbdebug.compare(fast, slow, labels=['lr=3.0', {HOSTILE!r}])\nw"]
W = ".nbdebug-compare"


def test_compare_two_learning_rates(page, lab) -> None:  # type: ignore[no-untyped-def]
    write_notebook(lab.root, "compare_lab", CELLS)
    open_and_run(page, lab, "compare_lab")
    widget = wait_widget(page, "compare")
    info = kernel_json(page, "{'div': w.divergence['loss'], 'headline': w.headline, 'fast': fast.series('loss').tolist(),"
                             " 'slow': slow.series('loss').tolist(), 'js_error': w.js_error, 'wrong': [o['wrong'] for o in w.outcomes],"
                             " 'text': w.divergence['loss_text'], 'log': w.loss_log, 'row': w.row, 'colours': w.colours}")
    (d,) = info["div"]
    assert info["fast"][0] == info["slow"][0]  # same weights and batch: same loss at step 1
    # lr=3.0 spikes (its loss rises above 1.5× its start), lr=0.1 does not: the headline says each run's
    # outcome, the divergence is said of lr=3.0, only lr=3.0 is red
    assert info["wrong"] == [True, False] and max(info["fast"]) > 1.5 * info["fast"][0]
    head = widget.locator(".nbd-cmp-summary").text_content() or ""
    assert head == info["headline"].replace("`", "") and head.startswith("lr=3.0 spikes to ") and f"; {HOSTILE} ends at " in head
    assert "diverges" not in head and f"lr=3.0 leaves {HOSTILE} at step {d['step']}" in info["text"].replace("`", "")
    strokes = [widget.locator(".nbd-chart").first.locator(f"path.nbd-cmp-run-{k}").evaluate("e => getComputedStyle(e).stroke")
               for k in range(2)]
    assert strokes[0] == "rgb(214, 39, 40)" and strokes[1] != strokes[0], strokes  # red: the run that went wrong only
    # log scale when the loss spans more than 10×; the row where the runs differ most is shown first
    assert widget.locator(".nbd-chart svg").first.get_attribute("data-scale") == ("log" if info["log"] else "linear")
    assert info["row"] and widget.locator(".nbd-cmp-row").input_value() == info["row"]
    assert widget.locator(".nbd-cmp-legend-item").all_text_contents() == ["lr=3.0", HOSTILE]
    assert page.locator('img[src="x"]').count() == 0 and page.evaluate("window.__pwned") is None
    loss = widget.locator(".nbd-chart").first
    assert loss.locator("path.nbd-chart-line").count() == 2
    assert loss.locator(".nbd-mark-diverge").get_attribute("data-step") == str(d["step"])
    assert (widget.locator(".nbd-cmp-loss-diverge").text_content() or "") == info["text"].replace("`", "")
    # the values under the pointer: both runs' losses at that step, as the kernel has them
    box = loss.locator("svg.nbd-chart-svg").bounding_box()
    page.mouse.move(box["x"] + (2 + (5 - 1) / 59 * 596) / 600 * box["width"], box["y"] + box["height"] / 2)
    page.wait_for_function(f"document.querySelector('{W} .nbd-chart').dataset.hover === '5'")
    text = loss.locator(".nbd-chart-readout").text_content() or ""
    a, b = (float(part.rsplit(" ", 1)[1]) for part in text.removeprefix("step 5: ").split(" · "))
    assert (a, b) == (pytest.approx(info["fast"][4], rel=1e-3), pytest.approx(info["slow"][4], rel=1e-3)), text
    page.mouse.move(0, 0)
    # a row and a statistic: the kernel computes that series and its divergence, the browser draws it
    # (one at a time: ipywidgets holds a change back while the kernel works on the previous one, so each
    # waits for the kernel's answer, the series it sends back, before the next)
    series = widget.locator(".nbd-cmp-series")
    widget.locator("select.nbd-cmp-row").select_option("3")
    series.locator("path.nbd-chart-line").first.wait_for()
    before = series.locator("path.nbd-chart-line").first.get_attribute("d")
    widget.locator("select.nbd-cmp-field").select_option("dead_unit_frac")
    page.wait_for_function("(d) => document.querySelector('.nbdebug-compare .nbd-cmp-series path.nbd-chart-line')"
                           ".getAttribute('d') !== d", arg=before)
    run_code_and_wait_text(page, "print('chose', w.row, w.field)", "chose 3 dead_unit_frac")
    series.locator(".nbd-cmp-series-title", has_text="dead_unit_frac of 3").wait_for()
    assert series.locator("path.nbd-chart-line").count() == 2
    div = kernel_json(page, "w.divergence['series']")
    text = series.locator(".nbd-cmp-series-diverge").text_content() or ""
    assert (f"at step {div[0]['step']}" in text) if div[0] else ("stays within" in text), (text, div)
    screenshot(page, "compare-lab", widget)
    checked, bad = contrast_failures(page, W)
    assert checked > 20 and bad == [], bad[:10]
    assert 0 < narrow(page) <= 800
    checked, cut = clipped(page, W)
    assert checked > 10 and cut == [], cut[:10]
    checked, hidden = hidden_in_scroll_boxes(page, W)
    assert checked > 10 and hidden == [], hidden[:5]
    screenshot(page, "compare-800px", widget)
    assert kernel_json(page, "w.js_error") == ""
