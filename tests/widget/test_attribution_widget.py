"""The attribution view: `%%nndebug model --view attribution --answer --wrong --tokenizer -o a` gives
nbdebug.attribute's result on the cell's input ids, the widget's method switch answers from the
kernel (equal to nbdebug.attribute), the static snapshot escapes tokens, bad options are usage errors
before the cell runs, and the model is left as found."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import nbdebug
from nbdebug.adapters.offline import tiny_lm
from nbdebug.attribution import Attribution
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.recorders.attribution import AttributionRecorder
from nbdebug.widgets.attribution import AttributionWidget

HOSTILE = "<img src=x onerror=alert(1)>"


class Tok:
    """Token i is the letter chr(97 + i); id 1 decodes to a hostile string."""

    def encode(self, s: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) - 97 for c in s.replace(" ", "")]

    def decode(self, ids: list[int]) -> str:
        return "".join(HOSTILE if i == 1 else chr(97 + i) for i in ids)


IDS = torch.tensor([[0, 1, 7, 4, 11, 14]])


def test_magic_view_result_switch_and_hygiene(shell: Any) -> None:
    m = tiny_lm("gpt2")
    shell.user_ns.update(model=m, ids=IDS, tok=Tok(), torch=torch)
    fp, hooks = fingerprint(m), hook_count(m)
    res = shell.run_cell("%%nndebug model --view attribution --answer d --wrong f --tokenizer tok -o a\n"
                         "with torch.no_grad(): out = model(ids)")
    assert res.success, res.error_in_exec
    a = shell.user_ns["a"]
    ref = nbdebug.attribute(m, IDS, answer=3, wrong=5, method="grad_x_input")
    assert isinstance(a, Attribution) and a.method == "grad_x_input" and a.tokens[1] == HOSTILE
    np.testing.assert_allclose(a.scores, ref.scores, rtol=1e-6)
    w = shell.user_ns["_nndebug_widget"]
    assert isinstance(w, AttributionWidget) and w.data["tokens"][1] == HOSTILE
    # the method switch: answered in the kernel, equal to the Python API, the widget's method follows
    content, _ = w.handle_request("attribution", {"method": "integrated_gradients", "steps": 16, "fix_first": False})
    ig = nbdebug.attribute(m, IDS, answer=3, wrong=5, method="integrated_gradients", steps=16)
    np.testing.assert_allclose(content["result"]["scores"], ig.scores, rtol=1e-6)
    assert content["result"]["delta"] == pytest.approx(ig.delta) and w.method == "integrated_gradients"
    content, _ = w.handle_request("attribution", {"method": "occlusion"})
    np.testing.assert_allclose(content["result"]["scores"], nbdebug.attribute(m, IDS, answer=3, wrong=5, method="occlusion").scores, rtol=1e-6)
    html = w.fallback_html()
    assert HOSTILE not in html and "&lt;img" in html
    assert same_fingerprint(fp, fingerprint(m)) == [] and hook_count(m) == hooks


def test_pick_a_generated_token_as_the_answer(shell: Any) -> None:
    """Over ``generate()``: the widget lists the generated tokens; picking the k-th attributes that token
    over the prompt and the k tokens generated before it, equal to ``nbdebug.attribute`` on those ids
    with that answer id; the default stays ``--answer`` over the prompt; the model is left as found."""
    m = tiny_lm("gpt2")
    shell.user_ns.update(model=m, ids=IDS, tok=Tok(), torch=torch)
    fp, hooks = fingerprint(m), hook_count(m)
    res = shell.run_cell("%%nndebug model --view attribution --answer d --wrong f --tokenizer tok -o a\n"
                         "seq = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)")
    assert res.success, res.error_in_exec
    seq = shell.user_ns["seq"]
    gen = seq[0, IDS.shape[1]:].tolist()
    assert len(gen) == 4
    w = shell.user_ns["_nndebug_widget"]
    assert w.generated == [Tok().decode([t]) for t in gen] and w.pick == -1
    np.testing.assert_allclose(shell.user_ns["a"].scores, nbdebug.attribute(m, IDS, answer=3, wrong=5).scores, rtol=1e-6)
    for k in (0, 2, 3):
        content, _ = w.handle_request("attribution", {"method": "grad_x_input", "steps": 64, "fix_first": False, "pick": k})
        ref = nbdebug.attribute(m, seq[:, :IDS.shape[1] + k], answer=gen[k], wrong=5, tokenizer=Tok(), method="grad_x_input")
        np.testing.assert_allclose(content["result"]["scores"], ref.scores, rtol=1e-6)
        assert content["result"]["tokens"] == ref.tokens and len(ref.tokens) == IDS.shape[1] + k
        assert content["result"]["label"] == ref.label and w.pick == k
    # the method switch keeps the pick (no pick in the request: the view's current one)
    content, _ = w.handle_request("attribution", {"method": "occlusion"})
    ref = nbdebug.attribute(m, seq[:, :IDS.shape[1] + 3], answer=gen[3], wrong=5, tokenizer=Tok(), method="occlusion")
    np.testing.assert_allclose(content["result"]["scores"], ref.scores, rtol=1e-6)
    content, _ = w.handle_request("attribution", {"method": "grad_x_input", "pick": -1})  # back to --answer
    np.testing.assert_allclose(content["result"]["scores"], nbdebug.attribute(m, IDS, answer=3, wrong=5).scores, rtol=1e-6)
    with pytest.raises(ValueError, match="4 new tokens"):
        w.handle_request("attribution", {"method": "grad_x_input", "pick": 4})
    assert ("attribution", {"method": "grad_x_input", "steps": 64, "fix_first": False, "pick": 2}) in w.export_requests()
    assert same_fingerprint(fp, fingerprint(m)) == [] and hook_count(m) == hooks


def test_no_generated_tokens_without_a_generation(shell: Any) -> None:
    m = tiny_lm("gpt2")
    shell.user_ns.update(model=m, ids=IDS, tok=Tok(), torch=torch)
    assert shell.run_cell("%%nndebug model --view attribution --answer d --tokenizer tok\nout = model(ids)").success
    w = shell.user_ns["_nndebug_widget"]
    assert w.generated == [] and all("pick" not in p for _, p in w.export_requests())


def test_magic_options_ids_and_usage_errors(shell: Any) -> None:
    from IPython.core.error import UsageError

    m = tiny_lm("gpt2")
    shell.user_ns.update(model=m, ids=IDS, tok=Tok(), torch=torch)
    res = shell.run_cell("%%nndebug model --view attribution --answer #3 --attr-method integrated_gradients --steps 8 --fix-first -o a\n"
                         "model(ids)")
    assert res.success, res.error_in_exec
    a = shell.user_ns["a"]
    assert a.method == "integrated_gradients" and a.steps == 8 and a.scores[0] == 0.0 and a.label == "log p('3')"
    for cell, msg in [("--answer de --tokenizer tok", "2 tokens"), ("--answer d --attr-method shap", "invalid choice"),
                      ("--wrong f --tokenizer tok", "--wrong needs --answer")]:
        res = shell.run_cell(f"%%nndebug model --view attribution {cell}\nran = 1")
        assert isinstance(res.error_in_exec, UsageError), (cell, res.error_in_exec)
        assert msg in str(res.error_in_exec)


def test_recorder_padding_generate_and_not_applicable() -> None:
    m = tiny_lm("gpt2")
    # a padded batch: row 1 without its padding is the prompt
    ids = torch.tensor([[2, 3, 4, 5], [0, 0, 6, 7]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    with AttributionRecorder(m, answer=3, wrong=5, seq_index=1) as rec:
        m(input_ids=ids, attention_mask=mask)
    assert rec.result().ids == [6, 7]
    # generate(): the prompt is the input
    prompt = torch.tensor([[2, 3, 4]])
    with AttributionRecorder(m, answer=9) as rec:
        m.generate(prompt, max_new_tokens=2, do_sample=False, pad_token_id=0)
    got = rec.result()
    assert got.ids == [2, 3, 4] and got.label == "log p('9')"
    with AttributionRecorder(m, answer=3) as rec:
        pass
    assert rec.applies() == "the cell did not call the model"
    with AttributionRecorder(m, answer=3) as rec:
        m(inputs_embeds=torch.zeros(1, 3, 16))
    assert "token ids" in str(rec.applies())
    # view="all" never starts an attribution nobody asked for: it needs --answer, as patching --corrupt
    from nbdebug.api import Debug

    dbg = Debug(m, view="all")
    with dbg:
        m(prompt)
    assert "attribution" not in dbg.results and "attribution" not in dbg.skipped
    assert "logitlens" in dbg.results  # the views that need nothing more did run
    # asked for by name without --answer: a one-line note, nothing raised
    dbg = Debug(m, view=["logitlens", "attribution"])
    with dbg:
        m(prompt)
    assert "attribution" not in dbg.results and "--answer" in dbg.skipped["attribution"]


def test_widget_without_session_and_export() -> None:
    m = tiny_lm("gpt2")
    a = nbdebug.attribute(m, IDS, answer=3, wrong=5, tokenizer=Tok(), method="integrated_gradients", steps=4)
    w = AttributionWidget(a)
    assert w.steps == 4 and w.fix_first is False and w.method == "integrated_gradients"
    content, _ = w.handle_request("attribution", {"method": "integrated_gradients"})
    assert content["result"]["scores"] == [float(s) for s in a.scores]
    with pytest.raises(ValueError, match="only integrated_gradients"):
        w.handle_request("attribution", {"method": "occlusion"})
    page = w.export_html()
    assert "nbdebug attribution" in page and "integrated_gradients" in page
    assert ("NOT converged" in w.fallback_html()) == (not a.converged)


def test_a_worse_than_random_attribution_leads_with_that_and_offers_the_next_method() -> None:
    """Planted: gradient × input with a deletion area (0.283) worse than random orders' (0.061). The
    widget's headline (synced, first in the static snapshot) says the scores cannot be read and offers
    integrated gradients with the first token kept; its healthy twin names the strongest token; the
    tokens are coloured on the patching view's scale (blue: toward the answer)."""
    from nbdebug.widgets.attribution import diverging_rgb
    from nbdebug.widgets.patching import NEGATIVE, POSITIVE

    def result(deletion: float) -> Attribution:
        return Attribution(scores=np.array([0.2, 1.5, -0.8]), tokens=["The", " Eiffel", HOSTILE], ids=[1, 2, 3],
                           method="grad_x_input", metric=2.86, label="logit[' Paris'] - logit[' Rome']",
                           faithfulness={"deletion": deletion, "random": 0.061},
                           curves={"deletion": np.array([1.0, 0.6, 0.3, 0.0]), "random": np.array([1.0, 0.3, 0.1, 0.0])})

    w = AttributionWidget(result(0.283))
    try:
        assert w.headline.startswith("gradient × input is no better than random here") and "0.283 vs random 0.061" in w.headline
        assert w.advice == {"method": "integrated_gradients", "fix_first": True,
                            "text": "integrated gradients with the first token kept in the baseline"}
        assert w.data["headline"] == w.headline and w.data["advice"] == w.advice
        page = w.fallback_html()
        assert page.index("no better than random") < page.index("<span") and HOSTILE not in page
        assert "background:rgb(33, 102, 172)" in page  # the strongest push toward the answer: the patching view's +1
    finally:
        w.close()
    w = AttributionWidget(result(0.01))
    try:
        assert w.headline.startswith("'␣Eiffel' pushes logit[' Paris'] - logit[' Rome'] up most (+1.50)") and w.advice is None
    finally:
        w.close()
    assert diverging_rgb(1.0) == POSITIVE and diverging_rgb(-1.0) == NEGATIVE and diverging_rgb(float("nan")) == (255, 255, 255)
