"""Steering in the logit-lens view in a real JupyterLab (Debian chromium): moving the strength slider
re-runs the cell's input steered in the kernel and the lens re-renders with the kernel's steered
values; "show original" switches back.

A tiny random Llama (no downloads) and a random steering vector large enough to change the top-1
tokens; a tokenizer stand-in whose tokens are hostile HTML: they must show as characters.
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
import torch
from nbdebug.adapters.offline import tiny_lm
%load_ext nbdebug

class Tok:
    """Token text that would execute if the view used innerHTML."""
    def decode(self, ids):
        return "{HOSTILE}" if ids[0] % 5 == 0 else f" w{{ids[0]}}"

model = tiny_lm("llama", vocab=64, layers=3, heads=2, d=16)
tok = Tok()
x = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(1))
v = torch.randn(16, generator=torch.Generator().manual_seed(3)) * 4
'''

RUN = """%%nndebug model --view logitlens --steer v --tokenizer tok
with torch.inference_mode():
    out = model(x)
"""

TOP_ROW = ("return [...document.querySelectorAll('.nbdebug-logitlens .nbl-wrap tbody tr:first-child td')]"
           ".map(td => td.textContent)")


def test_steer_lens_lab(page, lab) -> None:  # type: ignore[no-untyped-def]
    write_notebook(lab.root, "steer_lens", [SETUP, RUN, "w = _nndebug_widget"])
    open_and_run(page, lab, "steer_lens")
    view = wait_widget(page, "logitlens")
    assert view.locator(".nbl-steer-layer").input_value() == "model.layers.1"  # the middle block
    page.locator('.nbdebug-logitlens[data-complete="1"]').wait_for(state="attached", timeout=60_000)
    before = run_js(page, TOP_ROW)

    # move the slider: the kernel runs the steered input and the table shows its lens
    run_js(page, "const s = document.querySelector('.nbdebug-logitlens .nbl-steer-slider');"
                 "for (const v of ['2', '4', '6']) { s.value = v; s.dispatchEvent(new Event('input', {bubbles: true})); }")
    page.locator('.nbdebug-logitlens[data-steer="model.layers.1:6"][data-showing="steered"][data-complete="1"]').wait_for(
        state="attached", timeout=60_000)
    after = run_js(page, TOP_ROW)
    assert after != before and len(after) == 6
    # what the table shows is the kernel's steered lens (final row, every position)
    run_code_and_wait_text(
        page, "L = w.steering.lens('model.layers.1', 6.0)\n"
              "ids = L.columns(range(6))['top_ids'][-1, :, 0].tolist()\n"
              "from nbdebug.inspectors.attention import display_token\n"
              f"print('steered', [display_token(L.vocab[i]) for i in ids] == {after!r})",
        "steered True")
    run_code_and_wait_text(page, "print('runs', w.steer_runs)", "runs 1")  # three moves, one debounced request
    tops = view.locator(".nbl-steer-steered td:not(.nbl-steer-p)")
    assert tops.count() == 5

    # "show original" switches back to the cell's own lens
    view.locator(".nbl-steer-original").check()
    page.locator('.nbdebug-logitlens[data-showing="original"]').wait_for(state="attached", timeout=30_000)
    assert run_js(page, TOP_ROW) == before
    assert run_js(page, "return !!window.__pwned") is False and view.locator("img").count() == 0
    screenshot(page, "steer-lens-lab", view)
