"""The CAM methods panel (``--view gradcam --method … --faithfulness --sanity``) in a real JupyterLab, on
a tiny random CNN where the naive panel is wrong on each count (issue 27, item 3):

- eigencam (the first principal component of the activations: it ignores the class decision, ρ 1.00 in
  the sanity check) has the **best** faithfulness score, so "methods best first" would rank it first;
- gradcam, hirescam and xgradcam give the same map on a conv layer followed by global average pooling
  (the same deletion/insertion areas), so ranking them 1, 2, 3 would rank noise.

The panel must put the sanity check before the rank (eigencam greyed, after every passing method), show
the three look-alikes as one rank ("1=", with whom in the title), and lead with one verdict line naming
the most faithful methods that pass (the kernel's ``headline``), shown once. Class names are hostile
text; every text at AA contrast; no scroll box hides content.
"""

from __future__ import annotations

import pytest

from .harness import HOSTILE, kernel_json, open_and_run, screenshot, wait_widget, write_notebook
from .legibility import contrast_failures
from .scrollboxes import hidden_in_scroll_boxes

pytestmark = pytest.mark.browser

SETUP = f"""
import torch
from torch import nn
torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4)).eval()
x = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
classes = ["cat", "dog", {HOSTILE!r}, "car"]
"""

RUN = """%%nndebug net --view gradcam --method gradcam,hirescam,xgradcam,eigencam --faithfulness --sanity --class-names classes -o cams
with torch.no_grad():
    net(x)
"""
W = ".nbdebug-gradcam"


def test_cam_panel_sanity_before_rank_ties_and_one_verdict(page, lab) -> None:  # type: ignore[no-untyped-def]
    write_notebook(lab.root, "cam_panel", ["%load_ext nbdebug", SETUP, RUN, "w = _nndebug_widget"])
    open_and_run(page, lab, "cam_panel")
    cams = wait_widget(page, "gradcam")
    page.wait_for_selector(f"{W}[data-curves='1']", timeout=120_000)
    k = kernel_json(page, "{'headline': w.headline, 'ranks': w.ranks, 'rho': {s['method']: s['rho'] for s in w.sanity}}")
    score = {r["method"]: r["score"] for r in k["ranks"]}
    # the planted situation holds: eigencam fails the sanity check and has the best score of all
    assert k["rho"]["eigencam"] >= 0.9 and all(k["rho"][m] < 0.9 for m in ("gradcam", "hirescam", "xgradcam"))
    assert score["eigencam"] > score["gradcam"] == score["hirescam"] == score["xgradcam"], score

    # sanity before rank: the passing methods first, eigencam last and greyed
    rows = cams.locator("table.nbd-rank tr[data-method]")
    order = [rows.nth(i).get_attribute("data-method") for i in range(rows.count())]
    assert order[-1] == "eigencam" and sorted(order[:3]) == ["gradcam", "hirescam", "xgradcam"], order
    failed = ["nbd-failed" in (rows.nth(i).get_attribute("class") or "") for i in range(rows.count())]
    assert failed == [False, False, False, True]
    grey = rows.nth(3).locator("td").first.evaluate("e => getComputedStyle(e).color")
    assert grey == "rgb(89, 89, 89)", grey  # greyed (#595959: still 7:1 on white)
    assert "fails sanity" in (rows.nth(3).text_content() or "")
    # ties as ties: one shared rank "1=", the title naming the others; eigencam ranks 4 (after three)
    ranks = [rows.nth(i).locator("td").first.text_content() for i in range(4)]
    assert ranks == ["1=", "1=", "1=", "4"], ranks
    title = rows.nth(0).locator("td").first.get_attribute("title") or ""
    assert title.startswith("tied with ") and all(m in title for m in order[1:3]), title

    # one verdict line, first, as the kernel computed it; it names the passing trio and the failure
    heads = cams.locator(".nbd-headline")
    assert heads.count() == 1 and heads.first.is_visible()
    assert cams.locator(":scope > :not(style)").first.get_attribute("class") == "nbd-headline"
    assert heads.first.text_content() == k["headline"].replace("`", "")
    assert k["headline"].startswith("gradcam, hirescam and xgradcam (the same pixel order: tied) are the most faithful")
    assert "eigencam fails it" in k["headline"]
    # the sanity table flags eigencam only
    flagged = cams.locator(".nbd-sanity tr.nbd-flagged")
    assert [flagged.nth(i).get_attribute("data-method") for i in range(flagged.count())] == ["eigencam"]

    assert page.locator('img[src="x"]').count() == 0 and page.evaluate("window.__pwned") is None
    n, bad = contrast_failures(page, W)
    assert n > 20 and bad == [], bad[:5]
    n, hidden = hidden_in_scroll_boxes(page, W)
    assert n > 20 and hidden == [], hidden[:5]
    screenshot(page, "cam-panel", cams)
