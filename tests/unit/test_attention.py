"""Attention capture and head metrics: hand-made matrices, equality with output_attentions under eager."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from nbdebug.adapters.offline import tiny_lm as tiny
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.inspectors.attention import display_token, from_attentions, head_stats, quantize_head
from nbdebug.recorders.attention import AttentionRecorder


def test_metrics_on_hand_made_heads() -> None:
    T = 4
    prev = torch.zeros(T, T)
    prev[0, 0] = 1
    for i in range(1, T):
        prev[i, i - 1] = 1  # pure previous-token head
    sink = torch.zeros(T, T)
    sink[:, 0] = 1  # everything on token 0
    uniform = torch.tril(torch.ones(T, T))
    uniform = uniform / uniform.sum(-1, keepdim=True)  # uniform over the visible keys
    st = head_stats(torch.stack([prev, sink, uniform]))
    assert st["causal"] is True
    # rows 1..3 count (row 0 of a causal head can only see token 0)
    np.testing.assert_allclose(st["prev_token"].numpy(), [1.0, 1 / 3, (1 / 2 + 1 / 3 + 1 / 4) / 3], atol=1e-6)
    np.testing.assert_allclose(st["diagonal"].numpy(), [0.0, 0.0, (1 / 2 + 1 / 3 + 1 / 4) / 3], atol=1e-6)
    np.testing.assert_allclose(st["col_mass"][1].numpy(), [1, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(st["col_mass"][0].numpy(), [1 / 3, 1 / 3, 1 / 3, 0], atol=1e-6)
    ent = (math.log(2) + math.log(3) + math.log(4)) / 3
    np.testing.assert_allclose(st["entropy"].numpy(), [0, 0, ent], atol=1e-6)
    np.testing.assert_allclose(st["norm_entropy"].numpy(), [0, 0, 1], atol=1e-6)
    # bidirectional: every row counts
    full = torch.full((1, T, T), 1 / T)
    st2 = head_stats(full)
    assert st2["causal"] is False
    np.testing.assert_allclose(st2["norm_entropy"].numpy(), [1.0], atol=1e-6)
    np.testing.assert_allclose(st2["prev_token"].numpy(), [1 / T], atol=1e-6)


def test_result_flags_summary_and_sep() -> None:
    T = 6
    cls_head = torch.zeros(T, T)
    cls_head[:, 0] = 0.8
    cls_head[:, 1] = 0.2
    sep_head = torch.zeros(T, T)
    sep_head[:, T - 1] = 0.9
    sep_head[:, 2] = 0.1
    spread = torch.full((T, T), 1 / T)
    att = torch.stack([cls_head, sep_head, spread])[None, None]  # (L=1, B=1, H=3, T, T)
    toks = ["[CLS]", "a", "<img src=x onerror=alert(1)>", "b", "c", "[SEP]"]
    res = from_attentions(tuple(att), toks)
    assert res.shape == (1, 3, T)
    np.testing.assert_allclose(res.metrics["first_mass"][0], [0.8, 0.0, 1 / T], atol=1e-3)
    np.testing.assert_allclose(res.metrics["sep_mass"][0], [0.0, 0.9, 1 / T], atol=1e-3)
    assert res.flags[0].tolist() == [1, 2, 4]
    assert res.summary == "1 of 3 heads put > 50% on [CLS]; 1 on [SEP]; 1 near-uniform"
    assert res.sink_heads() == [(0, 0)]
    assert res.display[2] == "<img src=x onerror=alert(1)>"  # text is kept as characters
    np.testing.assert_allclose(res.head(0, 0), cls_head.numpy(), atol=1e-3)


def test_thumbnails_are_downsampled_for_long_sequences() -> None:
    T = 300
    p = torch.softmax(torch.randn(2, T, T), -1)
    st = head_stats(p, thumb=64)
    assert st["thumb"].shape == (2, 64, 64) and st["thumb"].dtype == torch.uint8
    assert int(st["thumb"].max()) == 255  # scaled by each head's max
    small = head_stats(p[:, :10, :10] / p[:, :10, :10].sum(-1, keepdim=True), thumb=64)
    assert small["thumb"].shape == (2, 10, 10)


def test_quantize_is_sqrt_encoded() -> None:
    q = quantize_head(np.array([[0.0, 0.01, 0.25, 1.0]]))
    assert q.tolist() == [[0, 26, 128, 255]]


def test_display_token_markers() -> None:
    assert display_token("ĠParis") == "␣Paris"
    assert display_token("▁the") == "␣the"
    assert display_token("Ċ") == "↵"
    assert display_token("<0x0A>") == "↵"
    assert display_token("a\x00b") == "a\\x00b"
    assert display_token("") == "∅"
    assert display_token(" Paris") == "␣Paris" and display_token("  ") == "␣␣"
    assert display_token("<a b> ") == "<a b>␣"


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox", "opt", "gemma", "bert", "distilbert"])
def test_capture_equals_output_attentions_and_restores_sdpa(family: str) -> None:
    m = tiny(family)
    assert m.config._attn_implementation == "sdpa"
    ids = torch.randint(1, 60, (2, 9))
    fp = fingerprint(m)
    hooks = hook_count(m)
    with AttentionRecorder(m, seq_index=1) as rec:
        m(ids)
    res = rec.result()
    assert m.config._attn_implementation == "sdpa"  # restored
    assert hook_count(m) == hooks and same_fingerprint(fp, fingerprint(m)) == []
    assert res.path == "sdpa + query/key probe" and res.attention is None  # SDPA kept, no T×T tensors held
    m.set_attn_implementation("eager")
    with torch.no_grad():
        ref = m(ids, output_attentions=True).attentions
    assert res.shape == (2, 2, 9)
    for layer in range(2):
        for h in range(2):
            np.testing.assert_allclose(res.head(layer, h), ref[layer][1, h].numpy(), atol=1e-5)
        np.testing.assert_allclose(res.metrics["prev_token"][layer], np.diagonal(ref[layer][1].numpy(), -1, 1, 2).mean(-1), atol=1e-5)
    assert res.causal == (family not in ("bert", "distilbert"))
    assert res.tokens == [f"#{int(i)}" for i in ids[1]]


def test_tokens_from_user_namespace_and_only_first_call() -> None:
    m = tiny("gpt2")
    ids = torch.randint(1, 60, (1, 5))
    toks = ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
    with AttentionRecorder(m, tokens="toks", user_ns={"toks": toks}) as rec:
        m(ids)
        m(torch.randint(1, 60, (1, 7)))  # a second call is ignored
    res = rec.result()
    assert res.shape == (2, 2, 5) and res.tokens == toks and res.display[1] == "␣capital"
    assert any("2 times" in n for n in res.notes)
    with pytest.raises(ValueError, match="nope"):
        AttentionRecorder(m, tokens="nope", user_ns={})


def test_padding_is_removed() -> None:
    m = tiny("bert")
    ids = torch.randint(1, 60, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    with AttentionRecorder(m, seq_index=1) as rec:
        m(input_ids=ids, attention_mask=mask)
    res = rec.result()
    assert res.shape == (2, 2, 4)
    np.testing.assert_allclose(res.head(0, 1).sum(-1), 1.0, atol=1e-5)
    m.set_attn_implementation("eager")
    with torch.no_grad():
        ref = m(input_ids=ids[1:, :4], output_attentions=True).attentions
    for h in range(2):
        np.testing.assert_allclose(res.head(0, h), ref[0][0, h].numpy(), atol=1e-5)


def test_hooks_removed_after_exception() -> None:
    m = tiny("llama")
    hooks = hook_count(m)
    with pytest.raises(ValueError):
        with AttentionRecorder(m):
            raise ValueError("cell failed")
    assert hook_count(m) == hooks and m.config._attn_implementation == "sdpa"
