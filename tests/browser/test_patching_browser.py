"""The patching view in a real JupyterLab (Debian chromium): the kernel's headline first, the grid draws
every row (no scroll box hides any), each cell in the kernel's colour for its effect (the attribution
view's scale: blue toward the answer), numbers only where |effect| ≥ 0.05, rows named for what they are;
a click runs that patch in the kernel and its top-5 next tokens (with the answer's p and rank) appear
beside the clean and corrupt runs', one sentence about the clicked cell, with the three runs'
logit-lens columns (per block: top-1 token and p(answer)), as the kernel computed them.

A tiny random GPT-2 (no downloads); a tokenizer stand-in whose tokens are hostile HTML: they must
show as characters.
"""

from __future__ import annotations

import pytest

from .harness import (
    kernel_json,
    open_and_run,
    run_code_and_wait_text,
    run_js,
    screenshot,
    wait_widget,
    write_notebook,
)
from .legibility import contrast_failures
from .scrollboxes import hidden_in_scroll_boxes

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=window.__pwned=1>"

SETUP = f'''
import torch
from nbdebug.adapters.offline import tiny_lm
%load_ext nbdebug

class Tok:
    """Token text that would execute if the view used innerHTML."""
    def decode(self, ids):
        return "{HOSTILE}" if ids[0] % 2 else f" w{{ids[0]}}"
    def encode(self, text, add_special_tokens=False):
        return [int(text.strip().lstrip("w"))]

model = tiny_lm("gpt2", vocab=64, layers=3, heads=2, d=16)
tok = Tok()
x = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(1))
x2 = x.clone(); x2[0, 2] = (x2[0, 2] + 7) % 64
'''

RUN = """%%nndebug model --view patching --corrupt x2 --answer w3 --wrong w4 --tokenizer tok -o g
with torch.no_grad():
    out = model(x)
"""


def test_patching_lab(page, lab) -> None:  # type: ignore[no-untyped-def]
    write_notebook(lab.root, "patching", [SETUP, RUN, "w = _nndebug_widget"])
    open_and_run(page, lab, "patching")
    view = wait_widget(page, "patching")
    cells = view.locator(".nbp-cell")
    assert cells.count() == 3 * 6  # resid: 3 blocks × 6 positions
    # identical activations (nothing to patch): the positions before the change, and block 0's input
    # (the embeddings) everywhere but at the changed token
    assert view.locator(".nbp-cell.nbp-same").count() == 2 + 2 + 5
    colours = run_js(page, "return [...document.querySelectorAll('.nbdebug-patching .nbp-cell:not(.nbp-same)')]"
                           ".map(c => getComputedStyle(c).backgroundColor)")
    assert len(colours) == 9 and any(c != "rgb(255, 255, 255)" for c in colours)  # drew the scale, not blank
    assert run_js(page, "return !!window.__pwned") is False and view.locator("img").count() == 0
    # the kernel's headline first; rows named for what they are
    k = kernel_json(page, "{'headline': w.headline, 'labels': w.row_labels, 'effect': [[None if v != v else float(v) "
                          "for v in r] for r in w.grid.effect], 'same': w.grid.identical.tolist(), "
                          "'rgb': [[list(__import__('nbdebug.widgets.patching', fromlist=['x']).diverging(float(v))) for v in r] "
                          "for r in w.grid.effect]}")
    assert view.locator(".nbd-headline").first.text_content() == k["headline"] and "restore" in k["headline"]
    assert view.locator(".nbp-rowlabel").all_text_contents()[1:] == ["block 0 input", "block 1 input", "block 2 input"]
    # each cell in the kernel's colour for its effect (the same scale as the attribution view), its number
    # printed only where |effect| ≥ 0.05
    drawn = run_js(page, "return [...document.querySelectorAll('.nbdebug-patching .nbp-cell')].map(c => "
                         "[+c.dataset.row, +c.dataset.col, getComputedStyle(c).backgroundColor, c.textContent])")
    for r, c, bg, text in drawn:
        if k["same"][r][c]:
            assert text == "="
            continue
        assert bg == "rgb({}, {}, {})".format(*k["rgb"][r][c]), (r, c, bg, k["rgb"][r][c])
        e = k["effect"][r][c]
        assert text == (f"{e:.2f}" if abs(e) >= 0.05 else ""), (r, c, text, e)
    n, hidden = hidden_in_scroll_boxes(page, ".nbdebug-patching")
    assert n > 20 and hidden == [], hidden[:5]

    target = view.locator('.nbp-cell[data-row="1"][data-col="2"]')
    target.hover()
    assert "effect" in view.locator(".nbp-tip").text_content()
    target.click()
    page.locator('.nbdebug-patching[data-clicked="1,2"]').wait_for(state="attached", timeout=60_000)
    tables = view.locator(".nbp-top")
    assert tables.count() == 3 and "patched" in tables.nth(2).locator("h4").text_content()
    assert tables.nth(2).locator("tr:not(.nbp-answer)").count() == 5
    # the answer's p and rank under every top-5; one sentence about the clicked cell (the tip line)
    answers = [t.locator("tr.nbp-answer").text_content() or "" for t in tables.all()]
    assert len(answers) == 3 and all(a.startswith("answer ") and " · rank " in a for a in answers), answers
    assert "measured exactly" in (view.locator(".nbp-tip").text_content() or "")
    assert "measured exactly" not in (view.locator(".nbp-status").text_content() or "")  # said once, not twice
    # the click reached the kernel: it ran that patch there, and its top-5 is what the view shows
    want = run_code_and_wait_text(page, "print('clicks', w.clicks, w.selected)", "clicks 1 [1, 2]")
    assert "clicks 1 [1, 2]" in want
    shown = [t.strip() for t in tables.nth(2).locator("tr:not(.nbp-answer) td:not(.nbp-p)").all_text_contents()]
    run_code_and_wait_text(
        page, "print('tops', [t['token'] for t in w.handle_request('cell', {'row': 1, 'col': 2})[0]['result']['patched']] "
              f"== {shown!r})", "tops True")
    # the patched run's lens column beside the clean and corrupt ones: one row per block (final first)
    lens = view.locator(".nbp-lens")
    lens.wait_for(state="visible", timeout=60_000)
    assert lens.locator("tbody tr").count() == 4  # embeddings + 3 blocks
    patched_col = [t.strip() for t in lens.locator("td.nbp-lens-patched").all_text_contents()]
    clean_col = [t.strip() for t in lens.locator("td.nbp-lens-clean").all_text_contents()]
    assert len(patched_col) == 4 and len(clean_col) == 4
    run_code_and_wait_text(
        page, "print('lens', [e['token'].strip() for e in reversed(w.handle_request('cell', {'row': 1, 'col': 2})[0]['result']"
              f"['lens']['patched'])] == {patched_col!r})", "lens True")
    assert run_js(page, "return !!window.__pwned") is False and view.locator("img").count() == 0
    n, bad = contrast_failures(page, ".nbdebug-patching")
    assert n > 20 and bad == [], bad[:5]
    n, hidden = hidden_in_scroll_boxes(page, ".nbdebug-patching")
    assert hidden == [], hidden[:5]
    screenshot(page, "patching-lab", view)
