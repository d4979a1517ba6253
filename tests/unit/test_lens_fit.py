"""nbdebug.lens: the shortcut fit equals the least-squares solution computed apart; the tuned fit starts
at the identity (= the logit lens) and lowers the KL; save/load, tuned-lens's and a Jacobian lens's
files equal the formula applied by hand; the model is left as found (no_grad callers, Ctrl-C, offload)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import nbdebug
from nbdebug.adapters.offline import tiny_lm
from nbdebug.adapters.transformers import find_parts
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.lens import FittedLens, fit_lens, load_lens, resolve_lens
from nbdebug.lens.collect import residual_batches, token_sequences
from nbdebug.lens.quality import row_kl

V, D, L = 200, 32, 3


def peaked() -> torch.nn.Module:
    """A tiny Llama whose weights are scaled up: layers change the prediction (random init alone gives
    near-uniform outputs, where every lens agrees)."""
    m = tiny_lm("llama", vocab=V, layers=L, d=D)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" not in name:
                p.mul_(4.0)
    return m


def text(n: int = 3000, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


def hand_logits(m: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return m.lm_head(m.model.norm(h)).float()


def test_shortcut_equals_least_squares_computed_apart() -> None:
    m = peaked()
    lens = fit_lens(m, None, text(), kind="shortcut", max_tokens=1024, seq_len=64, holdout=0, progress=False)
    assert lens.kind == "shortcut" and lens.blocks == L and lens.A.shape == (L, D, D)
    seqs = token_sequences(text(), None, seq_len=64, max_tokens=1024)
    rows = torch.cat(list(residual_batches(m, find_parts(m), seqs)), 1).double()  # (L + 1, n, d)
    y = rows[-1] / rows[-1].pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    for r in range(L):
        X = torch.cat([rows[r], torch.ones(rows.shape[1], 1, dtype=torch.float64)], 1).numpy()
        G = X.T @ X
        G += np.eye(D + 1) * 1e-4 * np.diag(G)[:D].mean()
        W = np.linalg.solve(G, X.T @ y.numpy())
        np.testing.assert_allclose(lens.A[r].numpy(), W[:D].T, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(lens.c[r].numpy(), W[D], rtol=1e-3, atol=1e-4)


def test_logits_follow_the_formula_and_rows() -> None:
    m = peaked()
    lens = fit_lens(m, None, text(), kind="shortcut", max_tokens=1024, seq_len=64, holdout=0, progress=False)
    ids = text(9, seed=3)[None]
    with torch.no_grad():
        hs = m(ids, output_hidden_states=True).hidden_states
    for block in range(L - 1):
        h = hs[block + 1][0]
        torch.testing.assert_close(lens.logits(block, h), hand_logits(m, h @ lens.A[block + 1].T + lens.c[block + 1]),
                                   rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lens.logits(-1, hs[0][0]), hand_logits(m, hs[0][0] @ lens.A[0].T + lens.c[0]), rtol=1e-5, atol=1e-5)
    with pytest.raises(IndexError, match="blocks -1"):
        lens.logits(L, hs[0][0])


def test_tuned_starts_at_the_identity_and_lowers_the_kl() -> None:
    m = peaked()
    still = fit_lens(m, None, text(), kind="tuned", max_tokens=1024, seq_len=64, holdout=0, steps=0, init="identity", progress=False)
    assert torch.equal(still.A, torch.eye(D).repeat(L, 1, 1)) and not still.c.any()  # 0 steps: the logit lens itself
    lens = fit_lens(m, None, text(), kind="tuned", max_tokens=2048, seq_len=64, holdout=512, steps=60, init="identity",
                    vocab=None, lr=3e-3, progress=False)
    assert lens.info["steps"] == 60 and lens.info["train_kl_last"] < 0.8 * lens.info["train_kl_first"]
    q = lens.quality
    assert q["tokens"] > 0 and len(q["lens"]) == L + 1 and q["lens"][-1] == 0.0
    assert np.mean(q["lens"][:-1]) < 0.8 * np.mean(q["logit"][:-1])  # held out: better than the logit lens


def test_sgd_training_lowers_the_kl_and_needs_a_learning_rate() -> None:
    """``optimizer="sgd"`` (Nesterov, the paper's) trains: the training KL falls from the identity, and
    the held-out KL beats the logit lens; without ``lr=`` it is refused (no default scale for SGD)."""
    m = peaked()
    lens = fit_lens(m, None, text(), kind="tuned", max_tokens=2048, seq_len=64, holdout=512, steps=60, init="identity",
                    vocab=None, optimizer="sgd", lr=0.05, progress=False)
    assert lens.info["optimizer"] == "sgd" and lens.info["train_kl_last"] < 0.9 * lens.info["train_kl_first"]
    assert np.mean(lens.quality["lens"][:-1]) < 0.8 * np.mean(lens.quality["logit"][:-1])
    with pytest.raises(ValueError, match="explicit lr"):
        fit_lens(m, None, text(), kind="tuned", optimizer="sgd", progress=False)


def test_a_tuned_row_never_ends_worse_than_its_least_squares_start() -> None:
    """From the shortcut start, a row whose trained translator is worse on the held-apart positions keeps
    its start. Planted: Adam at lr 10 wrecks every row, so every row must be back at least squares
    exactly (a missing or inverted comparison leaves wrecked rows)."""
    m = peaked()
    lens = fit_lens(m, None, text(), kind="tuned", max_tokens=2048, seq_len=64, holdout=0, steps=5, lr=10.0, vocab=None,
                    progress=False)
    assert lens.start is not None and lens.info["val_positions"] > 0
    assert lens.info["rows_kept_start"] == list(range(L))
    assert torch.equal(lens.A, lens.start.A) and torch.equal(lens.c, lens.start.c)


def test_whitened_training_maps_back_to_the_same_translator() -> None:
    """The tuned training runs on whitened residuals (``y = ((h − mu) P) M + c'``) and maps the result back
    to ``A h + c``. Planted: with a learning rate of 0 nothing moves, so the lens must equal its start to
    float precision (a wrong back-map: ``P`` on the wrong side, the ``mu`` term dropped, fails); the
    whitener itself is checked against a covariance computed apart (``P Σ P ≈ I``)."""
    m = peaked()
    lens = fit_lens(m, None, text(), kind="tuned", max_tokens=2048, seq_len=64, holdout=0, steps=3, lr=0.0, vocab=None, whiten=True,
                    progress=False)
    assert lens.start is not None and lens.info["steps"] == 3 and lens.info["whiten"] is True
    torch.testing.assert_close(lens.A, lens.start.A, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(lens.c, lens.start.c, rtol=1e-4, atol=1e-4)
    from nbdebug.lens.fit import _Gram

    seqs = token_sequences(text(), None, seq_len=64, max_tokens=1024)
    rows = torch.cat(list(residual_batches(m, find_parts(m), seqs)), 1)
    g = _Gram(L, D)
    g.add(rows)
    mu, P, _ = g.whitener(ridge=0.0)
    for r in range(L):
        x = rows[r].double()
        cov = torch.cov(x.T, correction=0)
        torch.testing.assert_close(mu[r].double(), x.mean(0), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(P[r].double() @ cov @ P[r].double(), torch.eye(D, dtype=torch.float64), rtol=0, atol=2e-3)


def test_quality_equals_hand_kl() -> None:
    m = peaked()
    lens = fit_lens(m, None, text(), kind="shortcut", max_tokens=512, seq_len=64, holdout=0, progress=False)
    seqs = token_sequences(text(200, seed=5), None, seq_len=64, max_tokens=128)
    rows = next(residual_batches(m, find_parts(m), seqs))
    kl = row_kl(lens, find_parts(m), rows)
    logp_f = torch.log_softmax(hand_logits(m, rows[-1]), -1)
    for r in range(L):
        logq = torch.log_softmax(hand_logits(m, rows[r] @ lens.A[r].T + lens.c[r]), -1)
        torch.testing.assert_close(kl[r], (logp_f.exp() * (logp_f - logq)).sum(-1), rtol=1e-4, atol=1e-5)


def model_state(m: torch.nn.Module) -> dict[str, Any]:
    return {"fp": fingerprint(m), "hooks": hook_count(m), "grads": [p.grad is None for p in m.parameters()],
            "modes": [x.training for x in m.modules()], "rng": torch.get_rng_state()}


def assert_untouched(m: torch.nn.Module, before: dict[str, Any]) -> None:
    after = model_state(m)
    assert same_fingerprint(before["fp"], after["fp"]) == []
    assert after["hooks"] == before["hooks"] and after["grads"] == before["grads"] and after["modes"] == before["modes"]
    assert torch.equal(after["rng"], before["rng"])


@pytest.mark.parametrize("caller", ["plain", "no_grad", "inference_mode"])
def test_tuned_fit_leaves_the_model_as_found(caller: str) -> None:
    m = peaked()
    m.train()
    m.model.layers[1].eval()  # a mixed mode, restored as it was
    before = model_state(m)
    ctx = {"plain": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[caller]
    with ctx():
        lens = fit_lens(m, None, text(), kind="tuned", max_tokens=512, seq_len=64, holdout=128, steps=3, vocab=64,
                        init="identity", progress=False)
    assert lens.info["steps"] == 3 and not torch.equal(lens.A, fit_lens(m, None, text(), kind="shortcut", max_tokens=512,
                                                                        seq_len=64, holdout=0, progress=False).A)
    assert_untouched(m, before)


@pytest.mark.parametrize("when", [1, 5])  # during the forward pass over the text; during the training
def test_ctrl_c_during_a_fit_leaves_the_model_as_found(when: int) -> None:
    m = peaked()
    before = model_state(m)

    def stop(done: int, total: int) -> None:
        if done == when:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit_lens(m, None, text(), kind="tuned", max_tokens=256, seq_len=64, holdout=0, steps=10, vocab=64, progress=stop)
    assert_untouched(m, before)


def test_save_load_round_trip_and_wrong_model(tmp_path: Any) -> None:
    m = peaked()
    lens = fit_lens(m, None, text(), kind="tuned", max_tokens=512, seq_len=64, holdout=128, steps=2, vocab=64, progress=False)
    back = load_lens(lens.save(tmp_path / "l"), m)
    assert back.kind == "tuned" and back.quality == lens.quality
    h = torch.randn(5, D)
    torch.testing.assert_close(back.logits(0, h), lens.logits(0, h), rtol=0, atol=0)
    with pytest.raises(ValueError, match="3 blocks; the model has 2"):
        load_lens(tmp_path / "l", tiny_lm("llama", vocab=V, layers=2, d=D))
    with pytest.raises(FileNotFoundError, match="holds no lens"):
        load_lens(tmp_path, m)


def test_tuned_lens_published_format_equals_the_paper_formula(tmp_path: Any) -> None:
    """A folder written exactly as tuned-lens's ``TunedLens.save`` writes it; translator ``i`` reads
    ``hidden_states[i]`` as ``h + W_i h + b_i``, then the final norm and the unembedding."""
    m = peaked()
    g = torch.Generator().manual_seed(7)
    state = {}
    for i in range(L):
        state[f"{i}.weight"] = torch.randn(D, D, generator=g) * 0.1
        state[f"{i}.bias"] = torch.randn(D, generator=g) * 0.1
    folder = tmp_path / "tl"
    folder.mkdir()
    torch.save(state, folder / "params.pt")
    (folder / "config.json").write_text(json.dumps({"base_model_name_or_path": "tiny", "d_model": D, "num_hidden_layers": L,
                                                    "bias": True, "base_model_revision": None, "unembed_hash": None,
                                                    "lens_type": "linear_tuned_lens"}))
    lens = load_lens(folder, m)
    assert lens.kind == "tuned"
    ids = text(7, seed=2)[None]
    with torch.no_grad():
        hs = m(ids, output_hidden_states=True).hidden_states
    for i in range(L):
        h = hs[i][0]
        want = hand_logits(m, h + h @ state[f"{i}.weight"].T + state[f"{i}.bias"])
        torch.testing.assert_close(lens.logits(i - 1, h), want, rtol=1e-5, atol=1e-5)


def test_jacobian_lens_file_equals_jlens_readout_by_hand(tmp_path: Any) -> None:
    """A file written exactly as Anthropic's ``jlens`` ``JacobianLens.save`` writes it (``torch.save`` of
    ``{"J": {layer: fp16 (d, d)}, "n_prompts", "source_layers", "d_model"}``, found as ``lens.pt``), read
    as ``jlens`` reads it: ``J_l`` applies to the output of block ``l`` (a forward hook on
    ``model.layers[l]``, as its ActivationRecorder), ``residual @ J_l.T``, then the final norm and
    ``lm_head``. Catches: ``J_l`` put on the block's input (off by one row), ``h @ J`` (no transpose),
    a missing layer read as anything but the identity."""
    m = peaked()
    g = torch.Generator().manual_seed(3)
    J = {0: (torch.eye(D) + 0.3 * torch.randn(D, D, generator=g)).half(), 1: (0.3 * torch.randn(D, D, generator=g)).half()}
    folder = tmp_path / "jl"
    folder.mkdir()
    torch.save({"J": J, "n_prompts": 12, "source_layers": sorted(J), "d_model": D}, folder / "lens.pt")
    ids = text(9, seed=4)[None]
    seen: dict[int, torch.Tensor] = {}
    handles = [m.model.layers[i].register_forward_hook(
        lambda mod, inp, out, i=i: seen.__setitem__(i, (out if torch.is_tensor(out) else out[0]).detach()))
        for i in range(L)]
    try:
        with torch.no_grad():
            emb = m.model.embed_tokens(ids)[0]
            m(ids)
    finally:
        for h in handles:
            h.remove()
    for lens in (load_lens(folder, m), load_lens(folder / "lens.pt", m)):
        assert lens.kind == "jacobian" and lens.info["rows_without_matrix"] == [0] and lens.info["n_prompts"] == 12
        for layer, Jl in J.items():
            h = seen[layer][0]
            torch.testing.assert_close(lens.logits(layer, h), hand_logits(m, h @ Jl.float().T), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lens.logits(-1, emb), hand_logits(m, emb), rtol=1e-5, atol=1e-5)  # no matrix: as is
    torch.save({"step": 3, "sums": {}}, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match="not a Jacobian lens file"):
        load_lens(tmp_path / "ckpt.pt", m)
    torch.save({"J": {5: torch.eye(D)}, "n_prompts": 1, "source_layers": [5], "d_model": D}, tmp_path / "big.pt")
    with pytest.raises(ValueError, match="the model has 3 blocks"):
        load_lens(tmp_path / "big.pt", m)


def test_offloaded_model_fits_the_same_lens(tmp_path: Any) -> None:
    pytest.importorskip("accelerate")
    from nbdebug.testing import offloaded_llama

    m, ref = offloaded_llama(tmp_path, layers=2, hidden=64, vocab=512)
    ids = torch.randint(1, 512, (800,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        m(ids[None, :8])  # accelerate's first forward (see test_offload.state)
    before = {"fp": fingerprint(m), "hooks": hook_count(m)}
    a = fit_lens(m, None, ids, kind="tuned", max_tokens=256, seq_len=64, holdout=64, steps=2, vocab=64, progress=False)
    b = fit_lens(ref, None, ids, kind="tuned", max_tokens=256, seq_len=64, holdout=64, steps=2, vocab=64, progress=False)
    torch.testing.assert_close(a.A, b.A, rtol=1e-4, atol=1e-5)
    h = torch.randn(3, 64)
    torch.testing.assert_close(a.logits(0, h), b.logits(0, h), rtol=1e-4, atol=1e-4)
    assert m.lm_head.weight.device.type == "meta"
    assert same_fingerprint(before["fp"], fingerprint(m)) == [] and hook_count(m) == before["hooks"]


def test_resolve_lens_names() -> None:
    m = peaked()
    lens = fit_lens(m, None, text(), kind="shortcut", max_tokens=256, seq_len=64, holdout=0, progress=False)
    assert resolve_lens(None, m) == (None, None, False) and resolve_lens("logit", m) == (None, None, False)
    assert resolve_lens("mine", m, user_ns={"mine": lens}) == (lens, None, True)
    assert resolve_lens("shortcut", m, user_ns={"x": lens}) == (lens, None, True)  # the notebook's lens of that kind
    assert resolve_lens("mine,logit", m, user_ns={"mine": lens})[:2] == (lens, None)
    with pytest.raises(ValueError, match="logit, tuned, shortcut"):
        resolve_lens("nonsense", m)
    with pytest.raises(ValueError, match="fit_lens"):
        resolve_lens("tuned", m)  # none in the notebook, no tokenizer to fit one
    with pytest.raises(ValueError, match="kind="):
        fit_lens(m, None, text(), kind="logit")
    assert nbdebug.fit_lens is fit_lens and nbdebug.load_lens is load_lens and isinstance(lens, FittedLens)


@pytest.mark.parametrize("max_elems", [1, 10**9])
def test_chunked_kl_equals_autograd_reference(max_elems: int) -> None:
    """The tuned training's KL (computed a few rows at a time, its gradient ``(q − p) U / n`` formed in
    the forward pass) equals the plain autograd KL through log_softmax, value and gradient, whatever the
    chunk. Catches a gradient with the wrong sign or scale, a missing log-sum-exp, a chunk boundary bug."""
    from nbdebug.lens.fit import _head
    from nbdebug.lens.kl import head_kl

    m = peaked()
    parts = find_parts(m)
    U, b = _head(parts)
    g = torch.Generator().manual_seed(5)
    y = (torch.randn(L, 6, D, generator=g) * 3).requires_grad_(True)
    logp = torch.log_softmax(torch.randn(6, V, generator=g) * 2, -1)
    got = head_kl(parts, y, logp, U, b, max_elems=max_elems)
    (gy,) = torch.autograd.grad(got, y)
    y2 = y.detach().clone().requires_grad_(True)
    logq = torch.log_softmax(parts.normed(y2).float() @ U.T, -1)
    want = (logp.exp() * (logp - logq)).sum(-1).mean(-1).sum()
    (wy,) = torch.autograd.grad(want, y2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gy, wy, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("max_elems", "biased", "softcap"), [(1, False, None), (10**9, True, None), (10**9, True, 5.0)])
def test_kl_rows_equals_the_plain_kl_per_row(max_elems: int, biased: bool, softcap: float | None) -> None:
    """The keep-the-better check's KL (one log-sum-exp per position, ``Σ p z`` as ``x·(pU) + p·b``, rows
    batched and chunked) equals the plain ``Σ p (log p − log_softmax(z))`` through the model's own norm and
    head, per row and per translator, with and without a bias or a softcap, whatever the chunk.
    Catches a dropped ``−H(p)`` or ``p·b`` term, a sign error, rows mixed up at a chunk boundary."""
    from nbdebug.lens.kl import kl_rows

    m = peaked()
    parts = find_parts(m)
    parts.softcap = softcap
    g = torch.Generator().manual_seed(7)
    held = torch.randn(L + 1, 9, D, generator=g) * 2
    b = torch.randn(V, generator=g) if biased else None
    U = m.lm_head.weight.detach().float()
    pairs = [(torch.eye(D).repeat(L, 1, 1) + 0.3 * torch.randn(L, D, D, generator=g), torch.randn(L, D, generator=g))
             for _ in range(2)]

    def logits(h: torch.Tensor) -> torch.Tensor:
        z = hand_logits(m, h) + (0 if b is None else b)
        return z if softcap is None else torch.tanh(z / softcap) * softcap

    logp = torch.log_softmax(logits(held[-1]), -1)
    got = kl_rows(parts, held, pairs, U, b, max_elems=max_elems)
    for (A, c), row in zip(pairs, got, strict=True):
        want = torch.stack([(logp.exp() * (logp - torch.log_softmax(logits(held[r] @ A[r].T + c[r]), -1))).sum(-1).mean()
                            for r in range(L)])
        torch.testing.assert_close(row, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got[0], got[1])  # two translators, two answers: not one row read twice


def test_tuned_fit_equals_the_fit_with_the_plain_kl(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole tuned fit with the fast keep-the-better KL equals the same fit whose check is the plain
    per-row formula (the straightforward path it replaced): same translators, same rows kept."""
    import nbdebug.lens.fit as fit_mod
    from nbdebug.lens.kl import kl_row

    def plain(parts: Any, held: torch.Tensor, pairs: Any, U: torch.Tensor, bias: Any) -> list[torch.Tensor]:
        logp = torch.log_softmax(hand_logits(m, held[-1]), -1)
        return [torch.tensor([kl_row(parts, held[r] @ A[r].T + c[r], logp, U, bias) for r in range(A.shape[0])])
                for A, c in pairs]

    m = peaked()
    kw: dict[str, Any] = dict(kind="tuned", max_tokens=2048, seq_len=64, holdout=0, steps=8, lr=3e-2, vocab=None,
                              progress=False)
    fast = fit_lens(m, None, text(), **kw)
    monkeypatch.setattr(fit_mod, "kl_rows", plain)
    slow = fit_lens(m, None, text(), **kw)
    assert fast.info["rows_kept_start"] == slow.info["rows_kept_start"]
    torch.testing.assert_close(fast.A, slow.A, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fast.c, slow.c, rtol=1e-4, atol=1e-5)
