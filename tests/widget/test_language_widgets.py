"""Attention and logit-lens widgets: payloads, on-demand requests, and the `%%nndebug` magic."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import traitlets

pytest.importorskip("transformers")

from nbdebug.adapters.offline import tiny_lm
from nbdebug.capture import fingerprint, same_fingerprint
from nbdebug.recorders.attention import AttentionRecorder
from nbdebug.recorders.logitlens import LogitLensRecorder
from nbdebug.widgets._transport import decode_array
from nbdebug.widgets.attention import AttentionWidget, head_view, model_view
from nbdebug.widgets.logitlens import LogitLensWidget

HOSTILE = "<img src=x onerror=alert(1)>"


def unpack(content: dict, buffers: list) -> dict[str, np.ndarray]:
    return {
        name: np.frombuffer(bytes(buffers[m["buffer"]]), dtype=m["dtype"]).reshape(m["shape"])
        for name, m in content["arrays"].items()
    }


def test_attention_widget_payload_and_head_request() -> None:
    m = tiny_lm("gpt2")
    ids = torch.randint(1, 60, (1, 8))
    toks = ["A", HOSTILE, "Ġb", "Ċ", "c", "d", "e", "f"]
    with AttentionRecorder(m, tokens=toks) as rec:
        m(ids)
    w = rec.widget()
    assert isinstance(w, AttentionWidget) and w.n_layers == 2 and w.n_heads == 2 and w.seq_len == 8
    assert w.tokens[1] == HOSTILE and w.tokens[2] == "␣b" and w.tokens[3] == "↵"
    assert decode_array(w.thumbs).shape == (2, 2, 8, 8)
    metrics = decode_array(w.metrics)
    assert metrics.shape == (len(w.metric_names), 2, 2)
    np.testing.assert_allclose(metrics[w.metric_names.index("prev_token")], rec.result().metrics["prev_token"])
    content, buffers = w.handle_request("head", {"layer": 1, "head": 0})
    arr = unpack(content, buffers)["attn"]
    assert arr.dtype == np.uint8 and arr.shape == (8, 8)
    decoded = (arr.astype(np.float32) / 255) ** 2
    np.testing.assert_allclose(decoded, rec.result().head(1, 0), atol=0.01)
    assert content["result"]["encoding"] == "sqrt" and content["result"]["name"] == "transformer.h.1.attn"
    with pytest.raises(IndexError):
        w.handle_request("head", {"layer": 5, "head": 0})
    w.selected = [[1, 1]]
    with pytest.raises(Exception, match="no head"):
        w.selected = [[2, 0]]
    assert HOSTILE not in w.fallback_html() and "AttentionWidget(2 layers" in repr(w)


def test_bertviz_style_call() -> None:
    m = tiny_lm("bert")
    m.set_attn_implementation("eager")
    ids = torch.randint(1, 60, (1, 6))
    with torch.no_grad():
        att = m(ids, output_attentions=True).attentions
    toks = ["[CLS]", "a", "b", "c", "d", "[SEP]"]
    w = head_view(att, toks, layer=1, heads=[0, 1])
    assert w.selected == [[1, 0], [1, 1]] and w.result.path == "given attention tensors"
    np.testing.assert_allclose(w.result.head(0, 1), att[0][0, 1].numpy(), atol=1e-3)
    assert model_view(att, toks).summary.endswith("on [SEP]") or "[CLS]" in model_view(att, toks).summary


def test_attention_initial_payload_is_small_at_512_tokens() -> None:
    # 12 layers × 12 heads × 512 tokens: thumbnails + metrics only, well under 2 MB.
    att = torch.softmax(torch.randn(12, 1, 12, 512, 512), -1)
    w = model_view(att, [f"t{i}" for i in range(512)])
    state = w.get_state()
    nbytes = sum(len(bytes(v["view"])) for v in (state["thumbs"], state["metrics"], state["flags"]))
    assert decode_array(w.thumbs).shape == (12, 12, 64, 64)
    assert nbytes < 2 * 2**20
    content, buffers = w.handle_request("head", {"layer": 11, "head": 11})
    assert unpack(content, buffers)["attn"].shape == (512, 512)


def test_lens_widget_first_column_then_columns_on_demand() -> None:
    m = tiny_lm("llama", vocab=200, layers=3)
    ids = torch.randint(0, 200, (1, 9))
    with LogitLensRecorder(m, lens_topk=4) as rec:
        with torch.no_grad():
            m(ids)
    w = rec.widget()
    assert isinstance(w, LogitLensWidget) and w.n_rows == 4 and w.n_pos == 9 and w.k == 4
    assert w.initial["positions"] == [8]
    first = {k: decode_array(v) for k, v in w.initial["arrays"].items()}
    assert first["top_ids"].shape == (4, 1, 4)
    assert rec.lens().done.sum() == 1  # nothing else computed before the browser asks
    assert all(str(int(i)) in w.vocab for i in first["top_ids"].ravel())
    content, buffers = w.handle_request("columns", {"start": 0, "end": 8})
    cols = unpack(content, buffers)
    assert content["result"]["positions"] == list(range(8)) and cols["top_ids"].shape == (4, 8, 4)
    res = rec.result()
    np.testing.assert_array_equal(cols["top_ids"], res.top_ids[:, :8])
    np.testing.assert_allclose(cols["kl"], res.kl[:, :8], atol=1e-6)
    content, buffers = w.handle_request("cell", {"row": 2, "pos": 3, "k": 6})
    cell = unpack(content, buffers)
    np.testing.assert_array_equal(cell["ids"][:4], res.top_ids[2, 3])
    assert len(content["result"]["vocab"]) == 6
    w.metric = "kl"
    with pytest.raises(traitlets.TraitError):
        w.metric = "nonsense"


def test_magic_attention_and_logitlens(shell) -> None:  # type: ignore[no-untyped-def]
    m = tiny_lm("gpt2", vocab=64)
    ids = torch.randint(1, 60, (1, 7))
    toks = ["The", HOSTILE, "Ġof", "ĠFrance", "Ġis", "Ċ", "x"]
    shell.user_ns.update(model=m, ids=ids, toks=toks, torch=torch)
    fp = fingerprint(m)
    res = shell.run_cell("%%nndebug model --view attention --tokens toks -o att\nout = model(ids)")
    assert res.success, res.error_in_exec
    att = shell.user_ns["att"]
    assert att.tokens == toks and att.shape == (2, 2, 7) and att.path == "sdpa + query/key probe"
    assert m.config._attn_implementation == "sdpa"
    res = shell.run_cell("%%nndebug model --view logitlens --tokens toks --target-token 5 --lens-topk 3 -o lens\nwith torch.no_grad(): model(ids)")
    assert res.success, res.error_in_exec
    lens = shell.user_ns["lens"]
    assert lens.targets.tolist() == [5] * 7 and lens.top_ids.shape == (3, 7, 3)
    assert same_fingerprint(fp, fingerprint(m)) == []
    widgets = [type(shell.user_ns["_nndebug_widget"]).__name__]
    assert widgets == ["LogitLensWidget"]
    res = shell.run_cell("%%nndebug model --view attention,logitlens\nwith torch.no_grad(): model(ids)")
    assert res.success, res.error_in_exec
    assert [type(w).__name__ for w in shell.user_ns["_nndebug_widget"]] == ["AttentionWidget", "LogitLensWidget"]


def test_lens_on_encoder_is_a_note_and_bad_option_a_usage_error(shell) -> None:  # type: ignore[no-untyped-def]
    from IPython.core.error import UsageError

    from nbdebug.api import Debug

    bert = tiny_lm("bert")
    shell.user_ns.update(bert=bert, ids=torch.randint(1, 60, (1, 5)))
    res = shell.run_cell("%%nndebug bert --view logitlens\nran = bert(ids)")
    assert res.success and "ran" in shell.user_ns  # the cell ran; the view is a note, not an error
    why = Debug(bert, view="logitlens").skipped["logitlens"]
    assert "encoder" in why
    res = shell.run_cell("%%nndebug bert --view attention --tokenizer missing\nbert(ids)")
    assert isinstance(res.error_in_exec, UsageError) and "no variable named 'missing'" in str(res.error_in_exec)


def test_1024_tokens_work_end_to_end() -> None:
    m = tiny_lm("gpt2", vocab=64, layers=2, heads=2, d=16)
    ids = torch.randint(0, 64, (1, 1024))
    with AttentionRecorder(m) as att, LogitLensRecorder(m, lens_topk=3) as lens:
        with torch.no_grad():
            m(ids)
    w = att.widget()
    assert decode_array(w.thumbs).shape == (2, 2, 64, 64) and w.seq_len == 1024
    content, buffers = w.handle_request("head", {"layer": 1, "head": 1})
    head = unpack(content, buffers)["attn"]
    assert head.shape == (1024, 1024) and (head[0, 1:] == 0).all()  # causal: row 0 sees only token 0
    lw = lens.widget()
    assert lw.pos_range == [1024 - 48, 1024] and lw.initial["positions"] == [1023]
    content, buffers = lw.handle_request("columns", {"start": 976, "end": 1023})
    assert unpack(content, buffers)["top_ids"].shape == (3, 47, 3)
    assert lens.lens().done.sum() == 48  # only what was asked for


def test_generate_through_the_magic_marks_generated_tokens(shell) -> None:  # type: ignore[no-untyped-def]
    m = tiny_lm("gpt2", vocab=64)
    ids = torch.randint(1, 60, (1, 5))
    shell.user_ns.update(model=m, ids=ids, torch=torch)
    res = shell.run_cell("%%nndebug model --view attention,logitlens --max-bytes 1MB\n"
                         "out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)")
    assert res.success, res.error_in_exec
    assert shell.user_ns["out"].shape == (1, 11)  # the cell's own result is untouched
    att, lens = shell.user_ns["_nndebug_widget"]
    assert att.generated == lens.generated == [0] * 5 + [1] * 6
    assert att.seq_len == 11 and lens.n_pos == 11
    assert any("final 11-token sequence" in n for n in att.notes) and any("final 11-token sequence" in n for n in lens.notes)
    assert "6 generated tokens in purple italics" in att.fallback_html()  # saved notebooks mark them too
    assert lens.fallback_html().count("(generated)") == 6
    assert m.config._attn_implementation == "sdpa"


def test_long_head_is_served_pooled_or_by_range() -> None:
    m = tiny_lm("gpt2", vocab=64, layers=2, heads=2, d=16)
    ids = torch.randint(0, 64, (1, 2048))
    with AttentionRecorder(m, max_bytes="1MB") as rec:
        with torch.no_grad():
            m(ids)
    w = rec.widget()
    assert w.full_side == 1024 and w.seq_len == 2048
    content, buffers = w.handle_request("head", {"layer": 1, "head": 0})  # the whole head: pooled 2×2
    whole = unpack(content, buffers)["attn"]
    assert whole.shape == (1024, 1024) and content["result"]["stride"] == 2
    content, buffers = w.handle_request("head", {"layer": 1, "head": 0, "start": 1900, "end": 2028})
    part = unpack(content, buffers)["attn"]
    assert part.shape == (128, 128) and content["result"]["stride"] == 1 and content["result"]["start"] == 1900
    exact = rec.result().detail.head(1, 0, 1900, 2028)[0]
    np.testing.assert_allclose((part.astype(np.float32) / 255) ** 2, exact, atol=0.01)
    mean = exact[:2, :2].mean()
    content, buffers = w.handle_request("head", {"layer": 1, "head": 0, "start": 1900, "end": 2028, "max_side": 64})
    np.testing.assert_allclose((unpack(content, buffers)["attn"][0, 0] / 255) ** 2, mean, atol=0.01)
    # the exported page precomputes what the view asks first above 1024 tokens: the first 128 tokens
    assert w.export_requests()[0] == ("head", {"layer": 0, "head": 0, "start": 0, "end": 128})
