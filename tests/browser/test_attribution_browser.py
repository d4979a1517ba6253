"""``--view attribution`` in a real JupyterLab: a tiny random GPT-2 and a letter tokenizer whose token 1
is hostile text. The cell's input tokens are drawn as text on diverging colours with AA-readable
text (the hostile token injects nothing); choosing "occlusion" in the method switch reaches the kernel,
which computes it (the widget's ``method`` changes there) and the browser draws its scores; integrated
gradients shows its completeness line. The kernel's headline comes first; every token is drawn in the
kernel's colour for its score on the patching view's scale (the same colour means "toward the answer"
in both views: the strongest push is the patching grid's +1); no scroll box hides content."""

from __future__ import annotations

import pytest

from .harness import HOSTILE, kernel_json, open_and_run, screenshot, wait_widget, write_notebook
from .legibility import contrast_failures
from .scrollboxes import hidden_in_scroll_boxes

pytestmark = pytest.mark.browser

SETUP = f"""
import torch
from nbdebug.adapters.offline import tiny_lm
torch.set_num_threads(1)
model = tiny_lm("gpt2")

class Tok:
    def encode(self, s, add_special_tokens=False):
        return [ord(c) - 97 for c in s.replace(" ", "")]
    def decode(self, ids):
        return "".join({HOSTILE!r} if i == 1 else chr(97 + i) for i in ids)

tok = Tok()
ids = torch.tensor([[0, 1, 7, 4, 11, 14]])
"""

CELLS = ["%load_ext nbdebug", SETUP,
         "%%nndebug model --view attribution --answer d --wrong f --tokenizer tok -o a\nwith torch.no_grad(): out = model(ids)"]
W = ".nbdebug-attribution"


def test_tokens_and_method_switch(page, lab) -> None:  # type: ignore[no-untyped-def]
    write_notebook(lab.root, "attribution_lab", CELLS)
    open_and_run(page, lab, "attribution_lab")
    widget = wait_widget(page, "attribution")
    toks = widget.locator(".nbd-attr-text").all_text_contents()
    assert toks == ["a", HOSTILE, "h", "e", "l", "o"]
    assert page.locator('img[src="x"]').count() == 0 and page.evaluate("window.__pwned") is None
    kernel = kernel_json(page, "{'scores': [float(s) for s in a.scores], 'method': _nndebug_widget.method}")
    shown = [float(s) for s in widget.locator(".nbd-attr-score").all_text_contents()]
    assert kernel["method"] == "grad_x_input"
    assert shown == [pytest.approx(s, rel=0.02, abs=1e-3 * max(abs(x) for x in kernel["scores"])) for s in kernel["scores"]]
    assert widget.locator("polyline.nbd-attr-line").count() == 2  # deletion and random
    n, bad = contrast_failures(page, f"{W} .nbd-attr-tok")
    assert n > 0 and not bad, bad
    # the headline first, as the kernel computed it; the question under it
    head = kernel_json(page, "_nndebug_widget.headline")
    assert widget.locator(".nbd-attr-head").text_content() == head and head
    # each token in the kernel's colour for its score: patching's `diverging` of score / max |score|,
    # so "toward the answer" is the same blue as a patched cell that restores the answer
    rgb = kernel_json(page, "(lambda d, s: [list(d(float(v) / max(abs(s)))) for v in s])("
                            "__import__('nbdebug.widgets.patching', fromlist=['x']).diverging, a.scores)")
    drawn = widget.locator(".nbd-attr-tok").evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")
    assert drawn == ["rgb({}, {}, {})".format(*c) for c in rgb], (drawn, rgb)
    top = max(range(len(kernel["scores"])), key=lambda i: abs(kernel["scores"][i]))
    # the strongest token in the patching grid's colour for effect +1 (restores the answer) or −1
    assert drawn[top] == ("rgb(33, 102, 172)" if kernel["scores"][top] > 0 else "rgb(178, 24, 43)")
    assert widget.locator(".nbd-chart-log").count() == 0 and "x: 0 tokens replaced" in (widget.text_content() or "")
    n, hidden = hidden_in_scroll_boxes(page, W)
    assert n > 10 and hidden == [], hidden[:5]
    # the switch: the kernel computes occlusion and the browser draws it
    widget.locator("select.nbd-attr-method").select_option("occlusion")
    page.wait_for_function(f"document.querySelector('{W} .nbd-attr-head').textContent.includes('occlusion')", timeout=60_000)
    occ = kernel_json(page, "{'method': _nndebug_widget.method, 'scores': [float(s) for s in _nndebug_widget.result.scores]}")
    assert occ["method"] == "occlusion"
    shown = [float(s) for s in widget.locator(".nbd-attr-score").all_text_contents()]
    assert shown == [pytest.approx(s, rel=0.02, abs=1e-3 * max(abs(x) for x in occ["scores"])) for s in occ["scores"]]
    widget.locator("select.nbd-attr-method").select_option("integrated_gradients")
    page.wait_for_function(f"document.querySelector('{W}').textContent.includes('completeness')", timeout=60_000)
    screenshot(page, "attribution_lab", widget)


GEN_CELLS = ["%load_ext nbdebug", SETUP,
             "%%nndebug model --view attribution --answer d --wrong f --tokenizer tok -o a\n"
             "seq = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)"]


def test_pick_a_generated_token(page, lab) -> None:  # type: ignore[no-untyped-def]
    """Over generate(): the generated tokens are listed as text; clicking the third makes it the answer,
    the kernel attributes it over the prompt and the two tokens before it (equal to nbdebug.attribute
    on those ids) and the browser draws those scores."""
    write_notebook(lab.root, "attribution_generate_lab", GEN_CELLS)
    open_and_run(page, lab, "attribution_generate_lab")
    widget = wait_widget(page, "attribution")
    gen = kernel_json(page, "[tok.decode([t]) for t in seq[0, 6:].tolist()]")
    chips = widget.locator("button.nbd-attr-gen")
    assert chips.all_text_contents() == ["--answer", *gen]
    assert page.locator('img[src="x"]').count() == 0 and page.evaluate("window.__pwned") is None
    chips.nth(3).click()  # generated token k = 2
    page.wait_for_function(f"document.querySelector('{W} button.nbd-attr-gen.nbd-attr-picked')?.dataset.index === '2'", timeout=120_000)
    page.wait_for_function(f"document.querySelectorAll('{W} .nbd-attr-score').length === 8", timeout=60_000)
    kernel = kernel_json(page, "{'pick': _nndebug_widget.pick, 'scores': [float(s) for s in _nndebug_widget.result.scores], "
                               "'ref': [float(s) for s in __import__('nbdebug').attribute(model, seq[:, :8], answer=int(seq[0, 8]), wrong=5, tokenizer=tok).scores]}")
    assert kernel["pick"] == 2 and kernel["scores"] == pytest.approx(kernel["ref"], rel=1e-6, abs=1e-9)
    shown = [float(s) for s in widget.locator(".nbd-attr-score").all_text_contents()]
    assert shown == [pytest.approx(s, rel=0.02, abs=1e-3 * max(abs(x) for x in kernel["scores"])) for s in kernel["scores"]]
    assert widget.locator(".nbd-attr-text").all_text_contents() == ["a", HOSTILE, "h", "e", "l", "o", *gen[:2]]
    screenshot(page, "attribution_generate_lab", widget)
