"""Attention viewer and logit-lens table in a real JupyterLab / Notebook 7 (Debian chromium).

The notebook runs a tiny random GPT-2 (no downloads) under ``%%nndebug --view attention,logitlens``
with a tokenizer stand-in whose tokens are hostile HTML: they must show as characters.
"""

from __future__ import annotations

import pytest

from .harness import (
    canvas_nonblank,
    open_and_run,
    run_code_and_wait_text,
    screenshot,
    wait_canvas_nonblank,
    wait_widget,
    write_notebook,
)

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=window.__pwned=1>"

SETUP = f'''
import torch
from nbdebug.adapters.offline import tiny_lm
%load_ext nbdebug

class Tok:
    """Token text that would execute if any view used innerHTML."""
    def convert_ids_to_tokens(self, ids):
        return ["{HOSTILE}" if i % 2 else f"Ġw{{i}}" for i in ids]
    def decode(self, ids):
        return "".join("<b>bold</b>" if i % 3 == 0 else f" v{{i}}" for i in ids)
    def encode(self, text, add_special_tokens=False):
        return [5]

model = tiny_lm("gpt2", vocab=64, layers=2, heads=2, d=16)
tok = Tok()
ids = torch.arange(1, 11)[None]
'''

RUN = """%%nndebug model --view attention,logitlens --tokenizer tok --lens-topk 4
with torch.no_grad():
    model(ids)
"""


def _check_language_views(page, server, name: str) -> None:
    write_notebook(server.root, name, [SETUP, RUN, "att_w, lens_w = _nndebug_widget"])
    open_and_run(page, server, name)

    # -- attention: grid of 2 × 2 thumbnails, summary, hostile tokens as text --------------------
    att = wait_widget(page, "attention")
    assert att.locator(".nba-head").count() == 4
    assert "heads put > 50% on" in att.locator(".nba-summary").first.text_content()
    assert "sdpa + query/key probe" in att.locator(".nba-path").text_content()  # the model keeps SDPA
    assert canvas_nonblank(page, '.nbdebug-attention .nba-head[data-layer="1"][data-head="0"] canvas') > 0
    att.locator('.nba-head[data-layer="1"][data-head="0"]').click()
    detail = page.locator('.nbdebug-attention .nba-detail[data-ready="1"]')
    detail.wait_for(state="attached")
    wait_canvas_nonblank(page, ".nbdebug-attention .nba-matrix", minimum=10)
    toks = detail.locator(".nba-left .nba-tok")
    assert toks.count() == 10
    assert toks.nth(0).text_content() == HOSTILE and toks.nth(1).text_content() == "␣w2"
    toks.nth(5).hover()
    assert "attends to" in detail.locator(".nba-status").text_content()
    assert detail.locator(".nba-tok.nba-hot").count() == 1
    run_code_and_wait_text(page, "print('selected', att_w.selected)", "selected [[1, 0]]")

    # -- logit lens: headers are token text, cells fetched on demand, hover top-k, pin a cell ----
    page.locator(".nbdebug-dashboard .lm-TabBar-tab", has_text="logitlens").click()  # views share one tabbed dashboard
    lens = wait_widget(page, "logitlens")
    page.locator('.nbdebug-logitlens[data-complete="1"]').wait_for(state="attached")
    headers = lens.locator("table:not(.nbl-bylayer) thead th")
    assert headers.count() == 11 and headers.nth(1).text_content() == HOSTILE
    assert lens.locator("table:not(.nbl-bylayer) tbody tr").count() == 3  # embed + 2 blocks
    cells = lens.locator("table:not(.nbl-bylayer) tbody td")
    assert cells.count() == 30 and lens.locator("td.nbl-pending").count() == 0
    assert all(c in ("<b>bold</b>",) or c.startswith("␣v") for c in cells.all_text_contents())
    cells.nth(3).hover()
    tip = lens.locator(".nbl-tip")
    tip.wait_for(state="visible")
    lines = tip.text_content().split("\n")
    assert len(lines) >= 1 + 4 and "%" in lines[1]
    cells.nth(3).click()
    page.locator('.nbdebug-logitlens .nbl-pins[data-ready="1"] .nbl-pin').wait_for(state="attached")
    run_code_and_wait_text(page, "print('pinned', lens_w.pinned)", "pinned [[2, 3]]")
    lens.locator("select.nbl-metric").select_option("entropy")
    run_code_and_wait_text(page, "print('metric', lens_w.metric)", "metric entropy")

    assert page.evaluate("window.__pwned") is None
    assert page.locator(".nbdebug-attention img, .nbdebug-logitlens img, .nbdebug-logitlens b").count() == 0
    screenshot(page, f"language-{server.app}")


def test_language_views_lab(page, lab) -> None:
    _check_language_views(page, lab, "language_lab")


def test_language_views_notebook7(page, nb7) -> None:
    _check_language_views(page, nb7, "language_nb7")


LONG = """%%nndebug model --view attention,logitlens
with torch.no_grad():
    model(torch.randint(0, 64, (1, 1024)))
"""


def test_1024_tokens_lab(page, lab) -> None:
    """1024 tokens: thumbnails drawn, a head's 1024×1024 matrix fetched, a token range narrowed."""
    write_notebook(lab.root, "language_long", [SETUP, LONG, "att_w, lens_w = _nndebug_widget"])
    open_and_run(page, lab, "language_long")
    att = wait_widget(page, "attention")
    assert "1024 tokens" in att.locator(".nba-path").text_content()
    assert canvas_nonblank(page, '.nbdebug-attention .nba-head[data-layer="0"][data-head="1"] canvas') > 0
    att.locator('.nba-head[data-layer="0"][data-head="1"]').click()
    detail = page.locator('.nbdebug-attention .nba-detail[data-ready="1"]')
    detail.wait_for(state="attached")
    assert detail.locator(".nba-left .nba-tok").count() == 128  # default range: the first 128 tokens
    detail.locator("input.nba-start").fill("1000")
    detail.locator("input.nba-start").dispatch_event("change")
    run_code_and_wait_text(page, "print('range', att_w.token_range)", "range [1000, 128]")
    # start beyond end: the view falls back to a valid range instead of drawing nothing
    detail.locator("input.nba-end").fill("1024")
    detail.locator("input.nba-end").dispatch_event("change")
    run_code_and_wait_text(page, "print('range', att_w.token_range)", "range [1000, 1024]")
    page.wait_for_function(
        "document.querySelectorAll('.nbdebug-attention .nba-detail[data-ready=\"1\"] .nba-left .nba-tok').length === 24"
    )
    wait_canvas_nonblank(page, ".nbdebug-attention .nba-matrix", minimum=10)
    page.locator(".nbdebug-dashboard .lm-TabBar-tab", has_text="logitlens").click()  # views share one tabbed dashboard
    lens = wait_widget(page, "logitlens")
    page.locator('.nbdebug-logitlens[data-complete="1"]').wait_for(state="attached")
    assert lens.locator("table:not(.nbl-bylayer) thead th").count() == 49  # the last 48 positions, computed on demand
    screenshot(page, "language-long-lab")
