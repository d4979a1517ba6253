"""Attention capture and head metrics: hand-made matrices, equality with output_attentions under eager."""

from __future__ import annotations

import math
from typing import Any

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


# -- issue 9: SDPA kept, budget, generate(), weak model, interrupts, modes ----------------------------
from transformers.generation.utils import GenerationMixin  # noqa: E402

from nbdebug.capture import ModelGoneError  # noqa: E402
from nbdebug.inspectors.attention_qk import KeyRanges, LayerQK, head_probs, key_ranges, summarize_qk  # noqa: E402
from nbdebug.runs.attention_probe import _ACTIVE  # noqa: E402

ORIGINAL_GENERATE = GenerationMixin.generate


def eager_reference(m: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """output_attentions under eager attention, on a copy of the model (the original stays untouched)."""
    import copy

    ref = copy.deepcopy(m)
    ref.set_attn_implementation("eager")
    with torch.no_grad():
        return ref(ids, output_attentions=True).attentions


def clean(m: torch.nn.Module, hooks: int, impl: str = "sdpa") -> None:
    assert hook_count(m) == hooks and m.config._attn_implementation == impl
    assert GenerationMixin.generate is ORIGINAL_GENERATE and "generate" not in vars(type(m))
    assert not any(k in _ACTIVE for k in m.modules())


@pytest.mark.parametrize("T,heads,kv,chunk", [(9, 4, 2, 1 << 20), (150, 4, 4, 4000 * 12), (300, 2, 1, 1 << 24), (512, 2, 2, 1 << 20), (512, 3, 1, 1 << 24)])
def test_chunked_summaries_from_queries_and_keys_equal_head_stats(T: int, heads: int, kv: int, chunk: int) -> None:
    torch.manual_seed(T)
    q, k = torch.randn(heads, T, 8), torch.randn(kv, T, 8)
    for ranges, bidirectional in ((KeyRanges.causal(T), False), (KeyRanges.full(T), True)):
        x = LayerQK(q, k, ranges, 8**-0.5)
        s = q @ k.repeat_interleave(heads // kv, 0).transpose(1, 2) * 8**-0.5
        if not bidirectional:
            s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), -float("inf"))
        p = s.softmax(-1)
        ref, ours = head_stats(p), summarize_qk(x, chunk_bytes=chunk)  # small chunks: rows split
        assert ours["causal"] == ref["causal"] == (not bidirectional)
        for key in ("entropy", "norm_entropy", "col_mass", "diagonal", "prev_token", "max_mass", "thumb_max"):
            np.testing.assert_allclose(ours[key].numpy(), ref[key].numpy(), atol=2e-6, err_msg=key)
        assert (ours["thumb"].int() - ref["thumb"].int()).abs().max() <= 1
        full, stride = head_probs(x, heads - 1, chunk_bytes=chunk)
        assert stride == 1
        np.testing.assert_allclose(full, p[heads - 1].numpy(), atol=1e-6)
        pooled, stride = head_probs(x, 0, 3, T, max_side=32, chunk_bytes=chunk)  # a long head, downsampled
        assert stride == -(-(T - 3) // 32) and pooled.shape[0] == -(-(T - 3) // stride)
        np.testing.assert_allclose(pooled[0, 0], p[0, 3 : 3 + stride, 3 : 3 + stride].mean().item(), atol=1e-6)


def test_key_ranges_from_masks() -> None:
    T = 6
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    window = causal & ~torch.tril(torch.ones(T, T, dtype=torch.bool), -3)  # sliding window of 3
    r = key_ranges(window[None, None], True, T)
    assert isinstance(r, KeyRanges) and r.dense is None and r.lo.tolist() == [0, 0, 0, 1, 2, 3] and r.hi.tolist() == list(range(T))
    additive = torch.zeros(1, 1, T, T).masked_fill(~causal, torch.finfo(torch.float32).min)
    assert isinstance(key_ranges(additive, True, T), KeyRanges) and key_ranges(additive, True, T).is_causal
    holes = causal.clone()
    holes[4, 1] = False  # not an interval: kept dense
    d = key_ranges(holes[None, None], True, T)
    assert isinstance(d, KeyRanges) and d.dense is not None and d.keys().tolist() == [1, 2, 3, 4, 4, 6]
    biased = additive.clone()
    biased[0, 0, 3, 1] = -0.5  # ALiBi-like bias: refused with a reason
    assert "bias" in key_ranges(biased, True, T)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2", "qwen2"])
def test_outputs_unchanged_and_heads_equal_eager(family: str) -> None:
    m = tiny(family)
    impl = m.config._attn_implementation  # gemma2 runs eager (softcapping, sliding window)
    ids = torch.randint(1, 60, (1, 12))
    with torch.no_grad():
        plain = m(ids).logits
    hooks = hook_count(m)
    with AttentionRecorder(m) as rec:
        with torch.no_grad():
            seen = m(ids).logits
    torch.testing.assert_close(seen, plain, rtol=0, atol=0)  # the model's own attention still runs
    clean(m, hooks, impl)
    res = rec.result()
    assert res.path == f"{impl} + query/key probe"
    ref = eager_reference(m, ids)
    for layer in range(2):
        for h in range(2):
            np.testing.assert_allclose(res.head(layer, h), ref[layer][0, h].numpy(), atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_generate_covers_the_final_sequence(family: str) -> None:
    m = tiny(family)
    ids = torch.randint(1, 60, (1, 5))
    calls: list[int] = []
    mine = m.register_forward_hook(lambda *_: calls.append(1))  # the user's own hook counts forwards
    hooks = hook_count(m)
    with AttentionRecorder(m) as rec:
        out = m.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    clean(m, hooks)
    assert len(calls) == 6  # exactly the forwards generate() ran: our extra forward does not call it
    mine.remove()
    res = rec.result()
    assert out.shape == (1, 11) and res.shape == (2, 2, 11)
    assert res.generated == [False] * 5 + [True] * 6
    assert res.notes[0] == "attention of the final 11-token sequence (5 prompt + 6 generated), recomputed in one forward after generate() (your own hooks were not called again)"
    assert res.tokens == [f"#{int(i)}" for i in out[0]]
    ref = eager_reference(m, out)
    for layer in range(2):
        np.testing.assert_allclose(res.head(layer, 1), ref[layer][0, 1].numpy(), atol=1e-5)


def test_decoding_loop_with_cache_and_plain_loop() -> None:
    m = tiny("llama")
    ids = torch.randint(1, 60, (1, 4))
    with AttentionRecorder(m) as rec:
        with torch.no_grad():
            out = m(ids, use_cache=True)
            cache, seq = out.past_key_values, ids
            for _ in range(3):  # greedy decoding by hand, with the KV cache
                nxt = out.logits[:, -1:].argmax(-1)
                seq = torch.cat([seq, nxt], 1)
                out = m(nxt, past_key_values=cache, use_cache=True)
    res = rec.result()
    assert res.shape[2] == 7 and res.generated == [False] * 4 + [True] * 3
    assert "decoding loop" in res.notes[0] and "last sampled token never entered" in res.notes[0]
    np.testing.assert_allclose(res.head(1, 0), eager_reference(m, seq)[1][0, 0].numpy(), atol=1e-5)
    with AttentionRecorder(m) as rec2:  # a plain loop of full forwards: the first call is shown
        for n in (5, 6):
            m(torch.randint(1, 60, (1, n)))
    r2 = rec2.result()
    assert r2.shape[2] == 5 and r2.generated == [] and r2.notes[0] == "the cell ran the model 2 times; the first call is shown"


def test_budget_drops_layers_and_recomputes_them_on_demand() -> None:
    m = tiny("gpt2")
    ids = torch.randint(1, 60, (1, 30))
    ref = eager_reference(m, ids)
    one_layer = 2 * (2 * 30 * 8) * 4 + 16 * 30  # float32 q+k of one layer (2 heads × 30 × 8) + its key ranges
    budget = (one_layer + 2 * 2 * (30 * 4 + 64 * 64)) * 4 // 3 + 8  # room for exactly one layer
    for max_bytes, kept in ((f"{budget}", 1), (0, 0)):
        hooks = hook_count(m)
        with AttentionRecorder(m, max_bytes=max_bytes) as rec:
            m(ids)
        clean(m, hooks)
        res = rec.result()
        assert [x is not None for x in res.detail.layers] == [True] * kept + [False] * (2 - kept)
        assert f"kept queries/keys of {kept} of 2 layers" in res.notes[0] and "did not fit" in res.notes[0]
        for layer in range(2):  # kept or recomputed by running the model again: the same numbers
            np.testing.assert_allclose(res.head(layer, 1), ref[layer][0, 1].numpy(), atol=1e-5)
        np.testing.assert_allclose(res.metrics["prev_token"], [np.diagonal(r[0].numpy(), -1, 1, 2).mean(-1) for r in ref], atol=1e-5)
        clean(m, hooks)


def test_deleted_model_is_collected_and_fetch_says_so() -> None:
    import gc
    import weakref

    from nbdebug.widgets.attention import AttentionWidget

    m = tiny("gpt2")
    with AttentionRecorder(m, max_bytes=0) as rec:
        m(torch.randint(1, 60, (1, 8)))
    w = AttentionWidget(rec.result())
    assert w.handle_request("head", {"layer": 0, "head": 0})  # recomputed while the model lives
    alive = weakref.ref(m)
    del m, rec
    gc.collect()
    assert alive() is None
    sent: list[dict] = []
    w.send = lambda content, buffers=None: sent.append(content)  # type: ignore[method-assign]
    w._handle_request(w, {"type": "request", "id": 7, "method": "head", "params": {"layer": 1, "head": 0}}, [])
    assert sent == [{"type": "response", "id": 7, "ok": False, "error": str(ModelGoneError())}]  # the message as is
    w.close()


@pytest.mark.parametrize("view", ["attention", "logitlens"])
def test_keyboard_interrupt_mid_forward_restores_everything(view: str) -> None:
    from nbdebug.recorders.logitlens import LogitLensRecorder

    m = tiny("llama")
    hooks = hook_count(m)
    fp = fingerprint(m)

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    handle = m.model.layers[1].register_forward_hook(stop)  # the user's hook interrupts mid-forward
    cls = AttentionRecorder if view == "attention" else LogitLensRecorder
    with pytest.raises(KeyboardInterrupt):
        with cls(m) as rec:
            m.generate(torch.randint(1, 60, (1, 4)), max_new_tokens=3, do_sample=False)
    handle.remove()
    clean(m, hooks)
    assert same_fingerprint(fp, fingerprint(m)) == [] and rec.applies() is not None


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "user_hook", "bfloat16", "float16"])
def test_modes(mode: str) -> None:
    m = tiny("llama")
    if mode in ("bfloat16", "float16"):
        m = m.to(getattr(torch, mode))
    ids = torch.randint(1, 60, (1, 10))
    calls: list[int] = []
    handle = m.model.layers[0].self_attn.register_forward_hook(lambda *_: calls.append(1)) if mode == "user_hook" else None
    hooks = hook_count(m)
    ctx = torch.inference_mode() if mode == "inference_mode" else torch.no_grad() if mode == "no_grad" else torch.enable_grad()
    with AttentionRecorder(m) as rec:
        with ctx:
            m(ids)
    clean(m, hooks)
    res = rec.result()
    assert rec.applies() is None and res.shape == (2, 2, 10)
    if handle is not None:
        assert calls == [1] and hook_count(m) == hooks  # the user's hook ran and is still there
        handle.remove()
    ref = eager_reference(m.float(), ids)
    tol = 2e-2 if mode in ("bfloat16", "float16") else 1e-5  # half queries/keys, float32 softmax
    np.testing.assert_allclose(res.head(1, 1), ref[1][0, 1].numpy(), atol=tol)


def test_applies_says_why_not() -> None:
    m = tiny("gpt2")
    with AttentionRecorder(m) as rec:
        pass
    assert rec.applies() == "the cell did not run the model: nothing to show"
    with AttentionRecorder(m, seq_index=0) as rec2:  # 0 is honoured (not "or default")
        m(torch.randint(1, 60, (2, 4)))
    assert rec2.applies() is None and rec2.batch_index == 0


def test_sliding_window_summaries_match_the_masked_probabilities() -> None:
    T, W = 320, 40
    torch.manual_seed(2)
    q, k = torch.randn(2, T, 8), torch.randn(2, T, 8)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= i) & (j > i - W)
    ranges = key_ranges(allowed[None, None], True, T)
    assert isinstance(ranges, KeyRanges) and ranges.dense is None and ranges.is_causal
    p = (q @ k.transpose(1, 2) * 0.3).masked_fill(~allowed, -float("inf")).softmax(-1)
    ref, ours = head_stats(p), summarize_qk(LayerQK(q, k, ranges, 0.3), chunk_bytes=1 << 20)  # blocks skip unseen keys
    for key in ("entropy", "col_mass", "diagonal", "prev_token", "max_mass", "thumb_max"):
        np.testing.assert_allclose(ours[key].numpy(), ref[key].numpy(), atol=2e-6, err_msg=key)
    np.testing.assert_allclose(ours["norm_entropy"].numpy(), (-(torch.special.xlogy(p, p)).sum(-1)[:, 1:] / allowed.sum(-1)[1:].float().log()).mean(-1).numpy(), atol=2e-6)
    np.testing.assert_allclose(head_probs(LayerQK(q, k, ranges, 0.3), 1, 100, 200, chunk_bytes=1 << 16)[0], p[1, 100:200, 100:200].numpy(), atol=1e-6)


def test_generate_with_left_padding_shows_the_real_tokens() -> None:
    m = tiny("llama")
    ids = torch.randint(1, 60, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0  # item 1 is left-padded: 4 real prompt tokens
    with AttentionRecorder(m, seq_index=1) as rec:
        out = m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0)
    res = rec.result()
    real = out[1, 2:][None]  # what item 1 really is: 4 prompt + 3 generated tokens
    assert res.shape[2] == 7 and res.generated == [False] * 4 + [True] * 3
    assert res.tokens == [f"#{int(i)}" for i in real[0]]
    np.testing.assert_allclose(res.head(1, 1), eager_reference(m, real)[1][0, 1].numpy(), atol=1e-5)


# -- review fixes: one shared replay, first call kept when it fails, suspend_hooks(keep=) -------------
def limited(m: torch.nn.Module, longest: int) -> list[int]:
    """Make ``m`` raise on inputs longer than ``longest`` tokens (like a long sequence running out of
    memory); returns the list of input lengths of every forward it runs."""
    seen: list[int] = []
    original = m.forward

    def forward(*args: object, **kwargs: object) -> object:
        ids = kwargs.get("input_ids", args[0] if args else None)
        n = int(ids.shape[1]) if isinstance(ids, torch.Tensor) else -1
        seen.append(n)
        if n > longest:
            raise RuntimeError(f"{n} tokens do not fit")
        return original(*args, **kwargs)

    m.forward = forward  # type: ignore[method-assign]
    return seen


def test_failed_replay_keeps_the_first_call_and_says_so() -> None:
    m = tiny("llama")
    ids = torch.randint(1, 60, (1, 4))
    ref = eager_reference(m, ids)
    seen = limited(m, 4)
    with AttentionRecorder(m) as rec:
        with torch.no_grad():
            out = m(ids, use_cache=True)
            for _ in range(3):  # a decoding loop with the KV cache; the final sequence (7 tokens) fails
                out = m(out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
    assert seen == [4, 1, 1, 1, 7]
    assert rec.applies() is None
    res = rec.result()
    assert res.shape == (2, 2, 4) and res.generated == []
    assert res.notes[0] == ("the cell generated tokens, but the forward on the final sequence failed "
                            "(RuntimeError: 7 tokens do not fit); the first call is shown")
    np.testing.assert_allclose(res.head(1, 1), ref[1][0, 1].numpy(), atol=1e-5)  # the prompt's own heads
    with AttentionRecorder(m) as rec2:  # generate(): no first call of the cell's own to fall back on
        m.generate(torch.randint(1, 60, (1, 3)), max_new_tokens=3, do_sample=False)
    del m.forward
    assert rec2.applies() == ("the cell generated tokens, but the forward on the final sequence failed "
                              "(RuntimeError: 6 tokens do not fit): nothing to show")


@pytest.mark.parametrize("order", ["attention first", "lens first"])
def test_one_forward_on_the_final_sequence_serves_both_language_views(order: str) -> None:
    from contextlib import ExitStack

    from nbdebug.recorders.logitlens import LogitLensRecorder
    from nbdebug.runs.replay import _GROUPS

    m = tiny("llama")
    ids = torch.randint(1, 60, (1, 5))
    hooks = hook_count(m)
    seen = limited(m, 100)
    recs = [AttentionRecorder(m), LogitLensRecorder(m)]
    with ExitStack() as stack:  # exits in reverse order: the last entered runs the shared forward
        for r in recs if order == "attention first" else recs[::-1]:
            stack.enter_context(r)
        out = m.generate(ids, max_new_tokens=4, do_sample=False)
    assert seen == [5, 1, 1, 1, 9]  # generate()'s four forwards and ONE of ours for both views
    del m.forward  # the test's counter
    clean(m, hooks)
    assert m not in _GROUPS
    att, lens = recs[0].result(), recs[1].result()
    assert att.shape == (2, 2, 9) and att.generated == [False] * 5 + [True] * 4
    assert lens.lens.generated == att.generated and lens.top_ids.shape[1] == 9
    assert "final 9-token sequence" in att.notes[0] and "final 9-token sequence" in lens.notes[0]
    np.testing.assert_allclose(att.head(1, 0), eager_reference(m, out)[1][0, 0].numpy(), atol=1e-5)
    with torch.no_grad():
        logits = m(out).logits[0, -1]
    assert int(lens.top_ids[-1, -1, 0]) == int(logits.argmax())


def test_suspend_hooks_keeps_the_given_hook_sets_and_removals_stick() -> None:
    from nbdebug.capture import HookSet
    from nbdebug.capture.state import suspend_hooks

    lin = torch.nn.Linear(2, 2)
    calls: list[str] = []
    user = lin.register_forward_hook(lambda *_: calls.append("user"))
    gone = lin.register_forward_hook(lambda *_: calls.append("gone"))
    with HookSet() as ours, HookSet() as other:
        ours.forward(lin, lambda *_: calls.append("ours"))
        other.forward(lin, lambda *_: calls.append("other view"))
        with suspend_hooks(lin, keep=[ours]):
            gone.remove()  # removed while set aside: stays removed
            lin(torch.ones(1, 2))
        assert calls == ["ours"]
        lin(torch.ones(1, 2))
        assert calls == ["ours", "user", "ours", "other view"]
    user.remove()
    assert hook_count(lin) == 0


def test_probe_leaves_transformers_registries_and_sub_configs_as_they_were() -> None:
    import copy

    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    from nbdebug.adapters.transformers import eager_attention
    from nbdebug.runs.attention_probe import probe_attention

    attn, masks = dict(AttentionInterface._global_mapping), dict(AttentionMaskInterface._global_mapping)
    m = tiny("llama")
    m.model.config = copy.deepcopy(m.config)  # a sub-model with its own config and implementation
    m.model.config._attn_implementation_internal = "eager"
    ids = torch.randint(1, 60, (1, 6))
    g = tiny("gpt2")
    with AttentionRecorder(m) as rec, AttentionRecorder(g) as other:
        assert "nbdebug_probe_sdpa" in AttentionInterface._global_mapping
        m(ids)
    q = tiny("qwen2")
    with probe_attention(m, {}):  # nested probes of two models: registered until the last one exits
        with probe_attention(q, {}):
            pass
        assert "nbdebug_probe_sdpa" in AttentionInterface._global_mapping
    assert rec.applies() is None and other.applies() is not None  # the other model never ran
    assert dict(AttentionInterface._global_mapping) == attn and dict(AttentionMaskInterface._global_mapping) == masks
    assert not any(k.startswith("nbdebug_") for k in [*attn, *masks])
    assert m.config._attn_implementation == "sdpa" and m.model.config._attn_implementation == "eager"
    m.model.config._attn_implementation_internal = "flex_attention"
    with eager_attention(m) as path:
        assert path == "eager (switched from sdpa)" and m.config._attn_implementation == "eager"
    assert m.config._attn_implementation == "sdpa" and m.model.config._attn_implementation == "flex_attention"


def half_budget(layers: int, T: int, heads: int = 2, kv: int = 1, dh: int = 8) -> int:
    """--max-bytes where float32 queries/keys of every layer do not fit but float16 ones do."""
    n = (heads + kv) * T * dh
    need = layers * (n * 2 + 16 * T) * 6 // 5 + layers * heads * (T * 4 + 64 * 64)
    assert layers * (n * 4 + 16 * T) > need - layers * heads * (T * 4 + 64 * 64)
    return need * 4 // 3 + 8


def test_float16_copies_of_huge_keys_do_not_overflow() -> None:
    m = tiny("llama")
    with torch.no_grad():
        for layer in m.model.layers:  # keys far beyond float16's 65504, queries small
            layer.self_attn.k_proj.weight.mul_(1e6)
            layer.self_attn.q_proj.weight.mul_(1e-6)
    ids = torch.randint(1, 60, (1, 12))
    with AttentionRecorder(m, max_bytes=half_budget(2, 12)) as rec:
        with torch.no_grad():
            m(ids)
    res = rec.result()
    kept = res.detail.layers
    assert all(x is not None and x.k.dtype == torch.float16 and x.scale is not None for x in kept)
    assert float(kept[0].k.float().abs().max()) <= 2**14 and torch.isfinite(kept[0].k).all()
    assert float(kept[0].scale) > 1  # the keys were beyond float16's range
    ref = eager_reference(m, ids)
    for layer in range(2):
        np.testing.assert_allclose(res.head(layer, 1), ref[layer][0, 1].numpy(), atol=1e-2)
        assert not np.isnan(res.metrics["entropy"][layer]).any()


@pytest.mark.parametrize("budget", ["half", "none"])
def test_host_reads_during_the_forward_do_not_grow_with_layers(budget: str) -> None:
    from test_capture_syncs import DispatchSpy, count_host_syncs

    T = 40
    counts = []
    for layers in (2, 6):
        m = tiny_lm_layers(layers)
        ids = torch.randint(1, 60, (1, T))
        with AttentionRecorder(m, max_bytes=half_budget(layers, T) if budget == "half" else 0) as rec:
            spy = DispatchSpy()
            with count_host_syncs() as py, spy, torch.no_grad():
                m(ids)
            counts.append((dict(py), dict(spy.syncs)))
        res = rec.result()
        dtypes = {x.q.dtype for x in res.detail.layers if x is not None}
        assert dtypes == ({torch.float16} if budget == "half" else set())  # kept as float16 / summarised
        assert res.metrics["entropy"].shape == (layers, 2)
    assert counts[0] == counts[1], counts  # per mask / per forward, never per layer


def tiny_lm_layers(layers: int) -> torch.nn.Module:
    from nbdebug.adapters.offline import tiny_lm

    return tiny_lm("llama", layers=layers)


def test_model_call_keeps_no_kv_cache_and_output_only_when_asked() -> None:
    import gc
    import weakref

    from nbdebug.capture import ModelCall
    from nbdebug.capture.inputs import CACHE_KWARGS

    m = tiny("llama")
    ids = torch.randint(1, 60, (1, 4))
    caches: list[weakref.ref] = []
    def note_cache(_m: object, _a: object, kw: dict) -> None:
        for key in CACHE_KWARGS:  # generate() passes `cache` since transformers 5.24, `past_key_values` before
            if kw.get(key) is not None:
                caches.append(weakref.ref(kw[key]))

    handle = m.register_forward_pre_hook(note_cache, with_kwargs=True)
    with ModelCall(m, watch_generate=True, keep_output=False) as lang, ModelCall(m) as cam:
        m.generate(ids, max_new_tokens=3, do_sample=False)
    handle.remove()
    assert lang.generated and lang.calls == cam.calls == 3
    assert not set(CACHE_KWARGS) & (set(lang.kwargs) | set(cam.kwargs))
    assert lang.output is None and cam.output is not None  # Grad-CAM's default: the output is kept
    del cam
    gc.collect()
    assert caches and all(r() is None for r in caches)  # nothing of ours holds generate()'s KV cache
    assert torch.equal(lang.final_sequence()[0][0, :4], ids[0])


def test_rerun_stops_after_the_layer_and_keeps_the_last_one() -> None:
    m = tiny_lm_layers(3)
    ids = torch.randint(1, 60, (1, 10))
    ref = eager_reference(m, ids)
    ran: list[int] = []

    def counted(f: Any, i: int) -> Any:
        def forward(*a: Any, **k: Any) -> Any:
            ran.append(i)
            return f(*a, **k)

        return forward

    for i, block in enumerate(m.model.layers):  # counts each block's forwards (not a hook: ours run too)
        block.forward = counted(block.forward, i)
    budget = (3 * 2 * (10 * 4 + 64 * 64) + 700) * 4 // 3 + 4  # one float16 layer (640 bytes) kept
    with AttentionRecorder(m, max_bytes=budget) as rec:
        m(ids)
    res = rec.result()
    kept = [x is not None for x in res.detail.layers]
    assert kept == [True, False, False] and ran == [0, 1, 2]
    ran.clear()
    for h in (0, 1, 0):  # one forward for every head of layer 1, stopped after layer 1
        np.testing.assert_allclose(res.head(1, h), ref[1][0, h].numpy(), atol=1e-5)
    assert ran == [0, 1]
    np.testing.assert_allclose(res.head(2, 1), ref[2][0, 1].numpy(), atol=1e-5)
    np.testing.assert_allclose(res.head(1, 1), ref[1][0, 1].numpy(), atol=1e-5)
    assert ran == [0, 1, 0, 1, 2, 0, 1]  # only the last re-run layer is kept
    for block in m.model.layers:
        del block.forward
    assert hook_count(m) == 0 and m.config._attn_implementation == "sdpa"


def test_model_call_drops_a_kv_cache_under_either_name_and_keeps_a_models_own_cache_argument() -> None:
    """transformers 5.24 renamed generate()'s cache keyword to ``cache``; a model's own ``cache``
    argument that is not a KV cache is the user's input and stays."""
    from nbdebug.capture import ModelCall
    from nbdebug.capture.inputs import _cache_length, without_cache

    class Own(torch.nn.Module):
        def forward(self, x: torch.Tensor, cache: torch.Tensor | None = None) -> torch.Tensor:
            return x if cache is None else x + cache

    m, x, mine = Own(), torch.ones(2), torch.full((2,), 3.0)
    with ModelCall(m) as call:
        m(x, cache=mine)
    assert call.kwargs is not None and call.kwargs["cache"] is mine
    legacy = ((torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2)),)
    for key in ("cache", "past_key_values"):
        assert without_cache({"input_ids": x, key: legacy}) == {"input_ids": x}
        assert _cache_length({key: legacy}) == 5
    assert _cache_length({"cache": mine}) == 0
