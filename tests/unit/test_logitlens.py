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
    with pytest.raises(ValueError, match="tokenizer"):
        resolve_target("Paris", None)
    m = tiny_lm("gpt2")
    ids = torch.randint(0, 64, (1, 4))
    with LogitLensRecorder(m, tokenizer="tok", target_token="A", user_ns={"tok": Tok()}) as rec:
        with torch.no_grad():
            m(ids)
    res = rec.result()
    assert res.targets.tolist() == [1, 1, 1, 1]
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
