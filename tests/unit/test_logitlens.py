"""Logit lens: equality with a hand computation (hidden states, the model's final norm, lm_head)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from nbdebug.adapters.offline import tiny_lm
from nbdebug.adapters.transformers import AdapterError, find_parts
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.inspectors.logitlens import lens_stats
from nbdebug.recorders.logitlens import LogitLensRecorder, resolve_target

K = 5


def hand_lens(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """(rows, T, V) log-probabilities: hidden_states[i] → model's final norm → lm_head, by hand.

    HF's last hidden state is already normed for most models, so the last row is the model's
    logits themselves; the other rows go through the final norm module by hand.
    """
    parts = find_parts(model)
    rows = []
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        for h in out.hidden_states[:-1]:
            x = parts.final_norm(h[0])
            if parts.pre_unembed is not None:
                x = parts.pre_unembed(x)
            z = model.get_output_embeddings()(x)
            if parts.softcap:
                z = torch.tanh(z / parts.softcap) * parts.softcap
            rows.append(z)
        rows.append(out.logits[0])
    return torch.log_softmax(torch.stack(rows).float(), -1)


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox", "opt", "gemma", "gemma2", "qwen2"])
def test_lens_equals_hand_computation(family: str) -> None:
    m = tiny_lm(family, vocab=300)
    ids = torch.randint(1, 300, (1, 7))
    fp = fingerprint(m)
    hooks = hook_count(m)
    with LogitLensRecorder(m, lens_topk=K) as rec:
        with torch.no_grad():
            m(ids)
    res = rec.result()
    assert hook_count(m) == hooks and same_fingerprint(fp, fingerprint(m)) == []
    ref = hand_lens(m, ids)
    p = ref.exp()
    assert res.top_ids.shape == (3, 7, K)
    top_p, top_i = p.topk(K, -1)
    np.testing.assert_array_equal(res.top_ids, top_i.numpy())
    np.testing.assert_allclose(res.top_probs, top_p.numpy(), atol=1e-6)
    np.testing.assert_allclose(res.entropy, -(p * ref).sum(-1).numpy(), atol=1e-4)
    kl = (p[-1:] * (ref[-1:] - ref)).sum(-1)
    np.testing.assert_allclose(res.kl, kl.numpy(), atol=1e-4)
    np.testing.assert_allclose(res.kl[-1], 0.0, atol=1e-5)
    # default target: the next input token; at the last position, the model's own top-1
    assert res.targets[:-1].tolist() == ids[0, 1:].tolist() and res.targets[-1] == int(top_i[-1, -1, 0])
    tgt = torch.as_tensor(res.targets)
    tp = p.gather(-1, tgt[None, :, None].expand(3, 7, 1))[..., 0]
    np.testing.assert_allclose(res.target_prob, tp.numpy(), atol=1e-6)
    rank = (p > tp[..., None]).sum(-1)
    np.testing.assert_array_equal(res.target_rank, rank.numpy())
    assert res.target_rank[-1, -1] == 0
    assert "top-1 matches" in res.check


def test_last_row_equals_model_logits_and_first_column_comes_first() -> None:
    m = tiny_lm("llama", vocab=500, layers=3)
    ids = torch.randint(0, 500, (1, 11))
    with LogitLensRecorder(m, lens_topk=K) as rec:
        with torch.no_grad():
            logits = m(ids).logits[0]
    lens = rec.lens()
    assert lens.done.tolist() == [False] * 10 + [True]  # only the last column so far
    res = rec.result()
    assert not res.complete and "1 of 11 positions" in repr(res)  # -o VAR does not force the table
    assert res.top_ids.shape == (4, 11, K) and lens.done.all() and res.complete
    probs = torch.softmax(logits, -1)
    v, i = probs.topk(K, -1)
    np.testing.assert_array_equal(res.top_ids[-1], i.numpy())
    np.testing.assert_allclose(res.top_probs[-1], v.numpy(), atol=1e-6)
    # a clicked cell is one matrix-vector product with the same answer
    ci, cp = lens.cell(3, 4, k=K)
    np.testing.assert_array_equal(ci, i[4].numpy())
    np.testing.assert_allclose(cp, v[4].numpy(), atol=1e-6)


def test_chunking_does_not_change_the_answer() -> None:
    torch.manual_seed(1)
    x = torch.randn(4, 6, 16) * 2
    W = torch.randn(1000, 16)
    b = torch.randn(1000)
    tg = torch.tensor([5, -1, 999, 0, 512, 7])
    small = lens_stats(x, W, b, k=7, targets=tg, chunk=100, budget=10)  # 10 vocabulary chunks
    big = lens_stats(x, W, b, k=7, targets=tg, chunk=1 << 20, budget=1 << 30)
    for key in small:
        np.testing.assert_allclose(small[key].numpy(), big[key].numpy(), atol=1e-5, err_msg=key)
    z = x @ W.T + b
    lp = torch.log_softmax(z, -1)
    np.testing.assert_allclose(small["entropy"].numpy(), -(lp.exp() * lp).sum(-1).numpy(), atol=1e-4)
    assert small["target_rank"][:, 1].tolist() == [-1] * 4 and torch.isnan(small["target_prob"][:, 1]).all()
    np.testing.assert_array_equal(small["target_rank"][:, 0].numpy(), (z[:, 0] > z[:, 0, 5:6]).sum(-1).numpy())


def test_target_token_option_and_tokens() -> None:
    class Tok:
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [ord(c) % 64 for c in text]

        def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
            return [f"t{i}" for i in ids]

        def decode(self, ids: list[int]) -> str:
            return "".join(f"<{i}>" for i in ids)

    assert resolve_target(7, None) == (7, "#7")
    assert resolve_target("#12", None) == (12, "#12")
    assert resolve_target("A", Tok()) == (65 % 64, "'A'")
    assert resolve_target("AB", Tok())[1] == "'AB' (first of 2 tokens)"
    assert resolve_target("#12", Tok()) == (12, "'<12>' (#12)")  # an id is labelled with its text when possible
    assert resolve_target(5, Tok()) == (5, "'<5>' (#5)")
    # a leading space is spelled as every view spells it ('␣Paris', display_token), never ' Paris'
    assert resolve_target("A", type("Sp", (Tok,), {"encode": lambda self, t, add_special_tokens=False: [1]})())[1] == "'A'"
    assert resolve_target(" P", type("One", (Tok,), {"encode": lambda self, t, add_special_tokens=False: [1]})())[1] == "'␣P'"
    assert resolve_target(3, type("Dec", (Tok,), {"decode": lambda self, ids: " Paris"})())[1] == "'␣Paris' (#3)"
    with pytest.raises(ValueError, match="tokenizer"):
        resolve_target("Paris", None)
    m = tiny_lm("gpt2")
    ids = torch.randint(0, 64, (1, 4))
    with LogitLensRecorder(m, tokenizer="tok", target_token="A", user_ns={"tok": Tok()}) as rec:
        with torch.no_grad():
            m(ids)
    res = rec.result()
    assert res.targets.tolist() == [1, 1, 1, 1]
    # --answer is the flag's one name; --target-token (target_token=) stays its alias and wins when both are given
    with LogitLensRecorder(m, tokenizer="tok", answer="A", user_ns={"tok": Tok()}) as rec2, torch.no_grad():
        m(ids)
    assert rec2.result().targets.tolist() == [1, 1, 1, 1]
    with LogitLensRecorder(m, tokenizer="tok", answer="B", target_token="A", user_ns={"tok": Tok()}) as rec3, torch.no_grad():
        m(ids)
    assert rec3.result().targets.tolist() == [1, 1, 1, 1]
    assert res.tokens == [f"t{int(i)}" for i in ids[0]]
    i0 = int(res.top_ids[0, 0, 0])
    assert res.vocab[i0] == f"<{i0}>" and res.top_tokens(0, 0)[0][0] == f"<{i0}>"


def test_encoders_are_refused_with_a_clear_message() -> None:
    with pytest.raises(AdapterError, match="unembed="):
        LogitLensRecorder(tiny_lm("bert"))


def test_batch_item_and_padding() -> None:
    m = tiny_lm("llama", vocab=100)
    ids = torch.randint(0, 100, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    with LogitLensRecorder(m, seq_index=1, lens_topk=3) as rec:
        with torch.no_grad():
            m(input_ids=ids, attention_mask=mask)
    res = rec.result()
    assert res.top_ids.shape == (3, 4, 3)
    with torch.no_grad():
        ref = m(input_ids=ids[1:, 2:]).logits[0].softmax(-1)
    # same final-row predictions as running the unpadded sequence alone (up to padding numerics)
    np.testing.assert_array_equal(res.top_ids[-1, :, 0], ref.argmax(-1).numpy())


def test_tuned_lens_translators() -> None:
    m = tiny_lm("llama", vocab=80)
    ids = torch.randint(0, 80, (1, 5))
    torch.manual_seed(3)
    affine = [torch.nn.Linear(16, 16) for _ in range(2)]  # one per row except the final one

    def tr(lin: torch.nn.Linear):  # type: ignore[no-untyped-def]
        return lambda h: h + lin(h)  # tuned-lens style: residual + learned affine

    with LogitLensRecorder(m, lens_topk=3, translators=[tr(a) for a in affine]) as rec:
        with torch.no_grad():
            m(ids)
    res = rec.result()
    with torch.no_grad():
        hs = m(ids, output_hidden_states=True).hidden_states
        parts = find_parts(m)
        for r in range(2):
            h = hs[r][0] + affine[r](hs[r][0])
            p = torch.softmax(parts.logits(parts.normed(h)), -1)
            np.testing.assert_allclose(res.top_probs[r], p.topk(3, -1).values.numpy(), atol=1e-6)
        _ids, cp = rec.lens().cell(1, 2, k=3)  # a clicked cell uses the translator too
        np.testing.assert_allclose(cp, torch.softmax(parts.logits(parts.normed(hs[1][0, 2] + affine[1](hs[1][0, 2]))), -1).topk(3).values.numpy(), atol=1e-6)
    assert any("tuned lens" in n for n in res.notes)
    with pytest.raises(ValueError, match="translators"):
        with LogitLensRecorder(m, translators=[None]) as rec2:
            with torch.no_grad():
                m(ids)
        rec2.lens()


# -- issue 9: generate(), weak model, budget, half precision, modes ----------------------------------
def test_generate_covers_the_final_sequence() -> None:
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.generate
    m = tiny_lm("gpt2", vocab=300)
    ids = torch.randint(1, 300, (1, 5))
    hooks = hook_count(m)
    with LogitLensRecorder(m, lens_topk=K) as rec:
        out = m.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert hook_count(m) == hooks and GenerationMixin.generate is original
    res = rec.result()
    assert out.shape == (1, 11) and res.top_ids.shape == (3, 11, K)
    assert res.lens.generated == [False] * 5 + [True] * 6
    assert res.notes[0] == "logit lens of the final 11-token sequence (5 prompt + 6 generated), recomputed in one forward after generate() (your own hooks were not called again)"
    ref = hand_lens(m, out).exp()
    np.testing.assert_array_equal(res.top_ids, ref.topk(K, -1).indices.numpy())
    np.testing.assert_allclose(res.top_probs, ref.topk(K, -1).values.numpy(), atol=1e-6)
    # greedy: each generated token is the final row's top-1 at the position before it
    assert res.targets[:-1].tolist() == out[0, 1:].tolist()
    assert (res.top_ids[-1, 4:10, 0] == out[0, 5:].numpy()).all() and "top-1 matches" in res.check


def test_deleted_model_is_collected_and_fetch_says_so() -> None:
    import gc
    import weakref

    from nbdebug.capture import ModelGoneError

    m = tiny_lm("llama", vocab=120)
    with LogitLensRecorder(m, lens_topk=3) as rec:
        with torch.no_grad():
            m(torch.randint(0, 120, (1, 6)))
    w = rec.widget()
    alive = [weakref.ref(x) for x in (m, m.model.norm, m.lm_head.weight)]
    del m, rec
    gc.collect()
    assert [a() for a in alive] == [None] * 3  # neither the widget nor the lens keeps the model, its norm or head alive
    content, _ = w.handle_request("columns", {"start": 5, "end": 6})  # computed before: still answers
    assert content["result"]["positions"] == [5]
    with pytest.raises(ModelGoneError):
        w.handle_request("cell", {"row": 1, "pos": 2})
    sent: list[dict] = []
    w.send = lambda content, buffers=None: sent.append(content)  # type: ignore[method-assign]
    w._handle_request(w, {"type": "request", "id": 3, "method": "columns", "params": {"start": 0, "end": 3}}, [])
    assert sent == [{"type": "response", "id": 3, "ok": False, "error": str(ModelGoneError())}]
    w.close()


def test_budget_keeps_the_last_positions() -> None:
    m = tiny_lm("llama", vocab=100)
    ids = torch.randint(0, 100, (1, 20))
    per_position = 3 * 16 * 4  # 3 rows × d=16 × float32
    with LogitLensRecorder(m, lens_topk=3, max_bytes=per_position * 8) as rec:
        with torch.no_grad():
            m(ids)
    res = rec.result()
    assert res.top_ids.shape == (3, 8, 3) and "last 8 of 20 positions" in " ".join(res.notes)
    ref = hand_lens(m, ids).exp()
    np.testing.assert_array_equal(res.top_ids, ref[:, 12:].topk(3, -1).indices.numpy())
    assert res.targets[:-1].tolist() == ids[0, 13:].tolist()
    with LogitLensRecorder(m, max_bytes=0) as rec0:  # 0 is honoured: one position (the last) is the minimum
        with torch.no_grad():
            m(ids)
    assert rec0.result().top_ids.shape[1] == 1


def test_cell_never_converts_the_whole_unembedding_to_float32() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    m = tiny_lm("llama", vocab=5000).to(torch.bfloat16)
    with LogitLensRecorder(m, lens_topk=3) as rec:
        with torch.no_grad():
            m(torch.randint(0, 5000, (1, 4)))
    lens = rec.lens()
    lens.chunk = 1000
    V, d = lens.weight.shape

    class Biggest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                    Biggest.largest = max(Biggest.largest, t.numel())
            return out

    with Biggest():
        ids, probs = lens.cell(1, 2, k=5)
    assert 0 < Biggest.largest < V * d // 2  # one vocabulary chunk at a time
    with torch.no_grad():
        h = lens.residuals[1][2].float()
        ref = torch.softmax(m.lm_head.weight.float() @ m.model.norm(lens.residuals[1][2][None].to(torch.bfloat16))[0].float(), -1)
    assert ids.tolist() == ref.topk(5).indices.tolist() and h.numel() == d
    np.testing.assert_allclose(probs, ref.topk(5).values.numpy(), atol=1e-5)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "grad", "user_hook", "bfloat16", "float16"])
def test_modes(mode: str) -> None:
    m = tiny_lm("llama", vocab=200)
    if mode in ("bfloat16", "float16"):
        m = m.to(getattr(torch, mode))
    ids = torch.randint(0, 200, (1, 6))
    calls: list[int] = []
    handle = m.model.norm.register_forward_hook(lambda *_: calls.append(1)) if mode == "user_hook" else None
    hooks = hook_count(m)
    ctx = torch.inference_mode() if mode == "inference_mode" else torch.no_grad() if mode == "no_grad" else torch.enable_grad()
    with LogitLensRecorder(m, lens_topk=K) as rec:
        with ctx:
            out = m(ids).logits
    assert hook_count(m) == hooks and rec.applies() is None
    res = rec.result()
    if handle is not None:
        assert len(calls) >= 1  # the user's hook ran (and runs when the lens uses the model's own norm)
        handle.remove()
    assert all(p.grad is None for p in m.parameters()) and (mode != "grad" or out.requires_grad)
    tol = 2e-2 if mode in ("bfloat16", "float16") else 1e-6  # half logits by hand vs float32 accumulation
    np.testing.assert_allclose(res.top_probs[:, :, 0], hand_lens(m, ids).exp().max(-1).values.numpy(), atol=tol)
    if tol < 1e-3:
        np.testing.assert_allclose(res.top_probs, hand_lens(m, ids).exp().topk(K, -1).values.numpy(), atol=tol)


def test_applies_without_a_call() -> None:
    m = tiny_lm("gpt2")
    with LogitLensRecorder(m) as rec:
        pass
    assert rec.applies() == "the cell did not run the model: nothing to show"
    with pytest.raises(ValueError, match="lens-topk"):
        LogitLensRecorder(m, lens_topk=0)


def test_a_forward_that_raises_is_a_one_line_reason() -> None:
    m = tiny_lm("llama")

    def boom(*_: object) -> None:
        raise RuntimeError("user hook failed")

    handle = m.model.layers[1].register_forward_hook(boom)  # registered first: runs before our hook
    with pytest.raises(RuntimeError, match="user hook failed"):
        with LogitLensRecorder(m) as rec:
            with torch.no_grad():
                m(torch.randint(0, 64, (1, 4)))
    handle.remove()
    assert rec.applies() == "the model raised (or was interrupted) during its forward, after 1 of 2 blocks: no complete residual stream to show"


def test_failed_replay_keeps_the_first_call_and_says_so() -> None:
    m = tiny_lm("llama", vocab=300)
    ids = torch.randint(1, 300, (1, 4))
    ref = hand_lens(m, ids).exp()
    original = m.forward

    def forward(*args: object, **kwargs: object) -> object:  # a long sequence that does not fit
        x = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(x, torch.Tensor) and x.shape[1] > 4:
            raise RuntimeError(f"{x.shape[1]} tokens do not fit")
        return original(*args, **kwargs)

    m.forward = forward  # type: ignore[method-assign]
    with LogitLensRecorder(m, lens_topk=K) as rec:
        with torch.no_grad():
            out = m(ids, use_cache=True)
            for _ in range(2):  # a decoding loop with the KV cache: the 6-token final forward fails
                out = m(out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
    del m.forward
    assert rec.applies() is None
    res = rec.result()
    assert res.notes[0] == ("the cell generated tokens, but the forward on the final sequence failed "
                            "(RuntimeError: 6 tokens do not fit); the first call is shown")
    assert res.top_ids.shape[1] == 4 and res.lens.generated == []
    np.testing.assert_array_equal(res.top_ids, ref.topk(K, -1).indices.numpy())
