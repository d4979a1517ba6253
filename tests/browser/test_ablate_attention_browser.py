"""The attention view's ablation in a real JupyterLab (Debian chromium): click a head, shift-click a
second, "ablate (zero)" runs the prompt again in the kernel with both heads zeroed, and the Δ metric
the view shows is the kernel's value; the top-5 and lens tables show hostile tokens as text.

A tiny random Llama (GQA, no downloads); a tokenizer stand-in whose tokens are hostile HTML.
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

model = tiny_lm("llama", vocab=64, layers=3, heads=4, d=32)
tok = Tok()
x = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(1))
'''

RUN = """%%nndebug model --view attention --answer w4 --wrong w6 --tokenizer tok
with torch.no_grad():
    out = model(x)
"""


def test_ablate_a_head_in_the_attention_view(page, lab) -> None:  # type: ignore[no-untyped-def]
    write_notebook(lab.root, "ablate_attention", [SETUP, RUN, "w = _nndebug_widget"])
    open_and_run(page, lab, "ablate_attention")
    view = wait_widget(page, "attention")
    view.locator('.nba-head[data-layer="1"][data-head="2"]').click()
    view.locator('.nba-head[data-layer="2"][data-head="0"]').click(modifiers=["Shift"])
    view.locator(".nba-detail[data-ready='1'] button.nba-action", has_text="ablate (zero)").click()
    page.locator(".nbdebug-attention .nba-ablate[data-state='done']").wait_for(state="attached", timeout=60_000)
    panel = view.locator(".nba-ablate")
    shown = float(panel.locator(".nba-delta").get_attribute("data-value"))
    text = panel.locator(".nba-delta").text_content()
    assert text.startswith("Δ ") and text[2] in "+−±"
    # the click reached the kernel: it ran that ablation there, on both heads
    run_code_and_wait_text(page, "print('ablated', w.ablate_clicks, w.ablated)", "ablated 1 [[1, 2], [2, 0]]")
    want = kernel_json(page, "w.handle_request('ablate', {'kind': 'heads', 'targets': [{'layer': 1, 'units': [2]}, {'layer': 2, 'units': [0]}], 'mode': 'zero'})[0]['result']['metric']['delta']")
    assert shown == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert abs(float(text[2:].replace("−", "-").replace("±", ""))) == pytest.approx(abs(want), rel=1e-3)
    assert panel.locator(".nba-ablate-top tr").count() == 1 + 5
    assert panel.locator(".nba-ablate-lens tr").count() == 1 + 3 + 1  # header, embed + 2 blocks, output
    assert run_js(page, "return !!window.__pwned") is False and view.locator("img").count() == 0
    screenshot(page, "ablate-attention-lab", view)
