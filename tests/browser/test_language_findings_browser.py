"""The language views tell their finding in a real JupyterLab at an 800-px-wide notebook (Debian chromium).

One notebook: a tiny GPT-2 with a planted previous-token head (attention), one whose block 3 writes
the answer into the residual stream (logit lens), both from ``tests/unit/planted_language.py``, and a
small CNN with dead channels (feature maps). Checked: the attention header names the planted head,
"outliers only" leaves it alone (and reaches Python), a hovered thumbnail labels its axes with the
tokens; the lens header names the block, its cell is ringed, the colour bar follows the metric, a
header shows its whole token; every text at ≥ 4.5:1 contrast measured from the rendered colours and
nothing clipped, for the three views.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from .harness import (
    canvas_nonblank,
    kernel_json,
    open_and_run,
    run_code_and_wait_text,
    screenshot,
    wait_widget,
    write_notebook,
)
from .readability import clipped, low_contrast, set_notebook_width
from .scrollboxes import hidden_in_scroll

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=window.__pwned=1>"
PLANTED = (Path(__file__).resolve().parent.parent / "unit" / "planted_language.py").read_text().replace(
    "from __future__ import annotations\n", "")

SETUP = PLANTED + f'''
import torch
from torch import nn
%load_ext nbdebug

att_model = previous_token_gpt2(layer=2, head=1)
lens_model = answer_at_block_gpt2(block=3, answer=42)
tok = WordTok()
ids = torch.arange(1, 13)[None]
toks = [f"Ġw{{i}}" for i in range(12)]
toks[4] = {HOSTILE!r}
torch.manual_seed(0)
cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 12, 3, padding=1), nn.ReLU())
with torch.no_grad():
    cnn[2].bias[:3] = -100.0  # three dead channels
'''

CELLS = [
    SETUP,
    "%%nndebug att_model --view attention --tokens toks\nwith torch.no_grad():\n    att_model(ids)",
    "att_w = _nndebug_widget",
    "%%nndebug lens_model --view logitlens --tokenizer tok --lens-topk 4\nwith torch.no_grad():\n    lens_model(ids[:, :8])",
    "lens_w = _nndebug_widget",
    "%%nndebug cnn --view featuremaps --layers 3\nwith torch.no_grad():\n    cnn(torch.randn(1, 3, 16, 16))",
]


def _readable(page, root: str) -> None:  # type: ignore[no-untyped-def]
    """Open the details toggles, then: every text ≥ 4.5:1, nothing clipped."""
    page.evaluate(f"document.querySelectorAll('{root} details').forEach((d) => (d.open = true))")
    assert low_contrast(page, root) == []
    assert clipped(page, root) == []


def test_findings_filter_colour_bar_contrast_at_800px_lab(page, lab) -> None:  # type: ignore[no-untyped-def]
    write_notebook(lab.root, "language_findings", CELLS)
    open_and_run(page, lab, "language_findings")
    assert set_notebook_width(page, 800) == 800

    # -- attention: the header names the planted head, the only one coloured ------------------------
    att = wait_widget(page, "attention")
    finding = kernel_json(page, "att_w.finding")
    assert finding.startswith("1 of 16 heads stands out: L2H1 attends to the previous token (100%")
    assert kernel_json(page, "att_w.headline") == finding
    assert att.locator(".nba-finding").text_content() == finding
    # under the outlined head: the headline's reason, not the selected metric (first-token sink)
    assert att.locator(".nba-head.nba-outlier .nba-val").text_content() == "prev 100%"
    outlier = att.locator(".nba-head.nba-outlier")
    assert outlier.count() == 1 and outlier.get_attribute("data-layer") == "2" and outlier.get_attribute("data-head") == "1"
    assert att.locator(".nba-head").count() == 16
    # hover: the thumbnail again, its axes labelled with the tokens (model text as text)
    outlier.hover()
    peek = att.locator(".nba-peek")
    peek.wait_for(state="visible")
    labels = [f"{t.replace('Ġ', '␣')} [{i}]" for i, t in enumerate([f"Ġw{i}" for i in range(12)])]
    labels[4] = f"{HOSTILE} [4]"
    assert peek.locator(".nba-peek-y").all_text_contents() == labels
    assert peek.locator(".nba-peek-x").all_text_contents() == labels
    assert "attends to the previous token" in peek.locator(".nba-peek-why").text_content()
    assert canvas_nonblank(page, ".nbdebug-attention .nba-peek canvas") > 0
    _readable(page, ".nbdebug-attention")  # with the peek open
    page.mouse.move(0, 0)
    outlier.click()
    page.locator('.nbdebug-attention .nba-detail[data-ready="1"]').wait_for(state="attached")
    assert "stands out for this model: attends to the previous token" in att.locator(".nba-why").text_content()
    _readable(page, ".nbdebug-attention")
    # "outliers only": the planted head's layer alone, and the choice reaches Python
    att.locator("input.nba-outliers-only").check()
    page.wait_for_function("document.querySelectorAll('.nbdebug-attention .nba-head').length === 1")
    assert att.locator(".nba-rowlabel").all_text_contents() == ["L2"] and att.locator(".nba-gap").count() == 3
    run_code_and_wait_text(page, "print('only', att_w.outliers_only)", "only True")
    assert hidden_in_scroll(page, ".nbdebug-attention") == []
    screenshot(page, "language-findings-attention-800", att)

    # -- logit lens: the header names the block, its cell ringed, a colour bar that follows ----------
    lens = wait_widget(page, "logitlens")
    page.locator('.nbdebug-logitlens[data-complete="1"]').wait_for(state="attached")
    lens.scroll_into_view_if_needed()
    cell = kernel_json(page, "lens_w.finding_cell")
    sentence = kernel_json(page, "lens_w.finding")
    assert sentence.startswith("'␣w42' is top-1 from block 3 on (the last 3 of 6 blocks); p ")
    assert lens.locator(".nbl-finding").text_content() == sentence
    ringed = lens.locator("td.nbl-onset")
    assert ringed.count() == 1 and ringed.get_attribute("data-row") == str(cell["from_row"]) == "4"
    assert ringed.text_content() == "␣w42" and ringed.get_attribute("data-pos") == "7"
    bar = lens.locator(".nbl-colourbar")
    assert canvas_nonblank(page, ".nbdebug-logitlens .nbl-colourbar canvas") >= 200  # the colormap's ramp, drawn
    assert bar.locator(".nbd-hticks span").all_text_contents() == ["0%", "50%", "100%"]
    assert "bold, underlined: the top-1 is the position's target" in lens.locator(".nbl-legend-row").text_content()
    lens.locator("select.nbl-metric").select_option("target_rank")
    page.wait_for_function("document.querySelector('.nbdebug-logitlens .nbl-colourbar').dataset.metric === 'target_rank'")
    assert bar.locator(".nbd-hticks span").all_text_contents() == ["≥ #10k", "#1k", "#100", "#10", "#1"]
    boxes = [s.bounding_box() for s in bar.locator(".nbd-hticks span").all()]
    assert all(a["x"] + a["width"] <= b["x"] for a, b in itertools.pairwise(boxes)), boxes  # readable: no overlap
    assert bar.locator(".nbd-htitle").text_content() == "colour: target rank"
    lens.locator("thead th").nth(3).hover()
    tip = lens.locator(".nbl-tip")
    tip.wait_for(state="visible")
    assert tip.text_content() == "position 2: ␣w3\nraw token: Ġw3"
    _readable(page, ".nbdebug-logitlens")
    ringed.hover()
    assert "␣w42" in tip.text_content() and not any(line.split()[-1].startswith("#") for line in tip.text_content().split("\n")[1:5])
    _readable(page, ".nbdebug-logitlens")  # with the cell's tip open
    assert kernel_json(page, "lens_w.metric") == "target_rank"
    screenshot(page, "language-findings-lens-800", lens)

    # -- feature maps: the same bar for contrast and clipping ---------------------------------------
    fm = wait_widget(page, "featuremaps")
    page.wait_for_selector(".nbdebug-featuremaps .nbd-tile canvas")
    assert fm.locator(".nbd-tile.nbd-dead").count() == 3
    # one input: "silent on this input", never "dead" (another input may excite them)
    assert fm.locator(".nbd-headline").text_content() == "3: 3 of 12 channels are silent on this input (every value 0): 0, 1 and 2."
    assert fm.locator(".nbd-info .nbd-flag").text_content() == "3 silent on this input"  # flagged evidence in bold
    fm.locator(".nbd-tile.nbd-dead").first.hover()
    assert fm.locator(".nbd-hover .nbd-flag").text_content() == "(silent on this input: all zero)"
    assert "dead" not in fm.locator(".nbd-headline, .nbd-info, .nbd-hover").all_text_contents().__str__()
    assert hidden_in_scroll(page, ".nbdebug-featuremaps") == []
    _readable(page, ".nbdebug-featuremaps")
    fm.locator(".nbd-tile").nth(5).click()
    _readable(page, ".nbdebug-featuremaps")
    screenshot(page, "language-findings-featuremaps-800", fm)

    assert page.evaluate("window.__pwned") is None
    assert page.locator(".nbdebug-attention img, .nbdebug-logitlens img").count() == 0
