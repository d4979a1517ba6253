"""The logit-lens view under a fitted lens (``lens=``): the table equals the saved translators applied
by hand (1e-5), the compared lens's top-1 and the by-layer strip are the data under them, the headline
names where the answer becomes top-1 under each lens, steering reads through the same lens, hooks go."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from test_lens_fit import D, L, V, hand_logits, peaked, text  # tests/unit is on sys.path

from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.inspectors.lens_finding import row_label
from nbdebug.lens import fit_lens, load_lens
from nbdebug.recorders.logitlens import LogitLensRecorder

K = 5


def hand_rows(m: torch.nn.Module, ids: torch.Tensor, lens: Any) -> torch.Tensor:
    """(rows, T, V) log-probabilities: hidden_states[r] through translator r (none for the last block's
    output, which is read before the final norm: the block's output captured by a hook)."""
    with torch.no_grad():
        hs = m(ids, output_hidden_states=True).hidden_states
        rows = []
        for r in range(L):
            h = hs[r][0]
            rows.append(hand_logits(m, h if lens is None else h @ lens.A[r].T + lens.c[r]))
        rows.append(m(ids).logits[0].float())
    return torch.log_softmax(torch.stack(rows), -1)


def _stays_from(top: np.ndarray) -> int:
    r = len(top) - 1
    while r > 0 and top[r - 1]:
        r -= 1
    return r


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any]:
    m = peaked()
    fitted = fit_lens(m, None, text(), kind="tuned", max_tokens=1024, seq_len=64, holdout=128, steps=5, vocab=None, progress=False)
    saved = load_lens(fitted.save(tmp_path_factory.mktemp("lens") / "t"))
    return m, fitted, saved


def test_view_equals_the_saved_translators_by_hand(setup: tuple[Any, Any, Any]) -> None:
    m, fitted, saved = setup
    ids = text(9, seed=11)[None]
    fp, hooks = fingerprint(m), hook_count(m)
    with LogitLensRecorder(m, lens_topk=K, lens=fitted) as rec, torch.no_grad():
        m(ids)
    res = rec.result()
    assert hook_count(m) == hooks and same_fingerprint(fp, fingerprint(m)) == []
    p = hand_rows(m, ids, saved).exp()
    top_p, top_i = p.topk(K, -1)
    np.testing.assert_allclose(res.top_probs, top_p.numpy(), atol=1e-5)
    np.testing.assert_array_equal(res.top_ids[:, :, 0], top_i[:, :, 0].numpy())


def test_two_lenses_side_by_side_and_the_headline(setup: tuple[Any, Any, Any]) -> None:
    m, fitted, saved = setup
    ids = text(9, seed=12)[None]
    with LogitLensRecorder(m, lens_topk=K, lens=[fitted, "logit"], target_token="#7") as rec, torch.no_grad():
        m(ids)
    w = rec.widget()
    ours, logit = hand_rows(m, ids, saved), hand_rows(m, ids, None)
    top_t, top_l = ours[:, -1].argmax(-1).numpy(), logit[:, -1].argmax(-1).numpy()
    assert w.lens_name == "tuned lens" and w.compare_name == "logit lens"
    assert [r["differs"] for r in w.by_layer] == list(top_t != top_l)
    rank = (ours[:, -1] > ours[:, -1, 7:8]).sum(-1).numpy()
    assert [r["rank"] for r in w.by_layer] == list(rank + 1)
    np.testing.assert_allclose([r["p_answer"] for r in w.by_layer], ours[:, -1, 7].exp().numpy(), atol=1e-5)
    kl = (logit[-1:].exp() * (ours[-1:] - ours)).sum(-1)[:, -1]  # KL(final ‖ row), this prompt's last position
    np.testing.assert_allclose([r["kl_prompt"] for r in w.by_layer], kl.numpy(), atol=1e-4)
    assert [r["kl_heldout"] for r in w.by_layer] == fitted.quality["lens"]
    # the headline: where token 7 (or the output's top-1) becomes top-1 and stays, under each lens, by hand
    answer = 7 if top_t[-1] == 7 else -1
    if answer < 0:
        assert w.headline.startswith(w.finding)
    else:
        f_t, f_l = _stays_from(top_t == 7), _stays_from(top_l == 7)
        assert f"from {row_label(f_t)} on under the tuned lens" in w.headline or f_t in (0, L)
        assert f"from {row_label(f_l)} on under the logit lens" in w.headline or f_l in (0, L)
    assert "tuned lens" in w.headline and "logit lens" in w.headline
    assert "tuned lens" in w.fallback_html()


def test_steering_reads_through_the_same_lens(setup: tuple[Any, Any, Any]) -> None:
    m, fitted, saved = setup
    ids = text(6, seed=13)[None]
    vec = torch.zeros(D)
    with LogitLensRecorder(m, lens_topk=K, lens=fitted, steer={1: vec}) as rec, torch.no_grad():
        m(ids)
    rec.widget()
    steered = rec.steering.lens(rec.steering.default, 1.0)  # a zero vector: the same run, the same lens
    steered.fill()
    p = hand_rows(m, ids, saved).exp()
    np.testing.assert_allclose(steered.table["top_probs"][:, :, 0], p.max(-1).values.numpy(), atol=1e-5)


def test_a_lens_for_another_model_is_refused_before_the_cell(setup: tuple[Any, Any, Any]) -> None:
    from nbdebug.adapters.offline import tiny_lm

    _, fitted, _ = setup
    other = tiny_lm("llama", vocab=V, layers=L + 1, d=D)
    with pytest.raises(ValueError, match=f"{L} blocks; the model has {L + 1}"):
        LogitLensRecorder(other, lens=fitted)


def test_patching_lens_column_reads_through_the_same_lens(setup: tuple[Any, Any, Any]) -> None:
    """sessions.lens.model_lens(..., lens=...): what the patching view's lens column uses."""
    from nbdebug.sessions.lens import lens_column, model_lens

    m, fitted, saved = setup
    ids = text(5, seed=14)[None]
    with torch.no_grad():
        hs = m(ids, output_hidden_states=True).hidden_states
    rows = [h[0] for h in hs[:-1]]
    rows.append(hs[-1][0])  # stand-in for the last block's output: its row is read untranslated either way
    col = lens_column(model_lens(m, rows, k=1, lens=fitted))
    want = [int(hand_logits(m, hs[r][0][-1] @ saved.A[r].T + saved.c[r]).argmax()) for r in range(L)]
    assert [c["id"] for c in col[:L]] == want
    assert [c["id"] for c in lens_column(model_lens(m, rows, k=1, lens="logit"))[:L]] == [
        int(hand_logits(m, hs[r][0][-1]).argmax()) for r in range(L)]


def test_patching_session_lens_column_uses_the_fitted_lens(setup: tuple[Any, Any, Any]) -> None:
    """The patching view's lens column (PatchSession(lens=...), what --lens gives the patching recorder)
    equals the saved translators applied by hand to the clean run's last position; without a lens it
    is the logit lens."""
    from nbdebug.sessions.patching import PatchSession

    m, fitted, saved = setup
    clean, corrupt = text(5, seed=14)[None], text(5, seed=15)[None]
    with torch.no_grad():
        hs = m(clean, output_hidden_states=True).hidden_states
    tuned = PatchSession(m, clean, corrupt, answer=3, lens=fitted).lens_of("clean")
    plain = PatchSession(m, clean, corrupt, answer=3).lens_of("clean")
    want = [int(hand_logits(m, hs[r][0][-1] @ saved.A[r].T + saved.c[r]).argmax()) for r in range(L)]
    assert [c["id"] for c in tuned[:L]] == want
    assert [c["id"] for c in plain[:L]] == [int(hand_logits(m, hs[r][0][-1]).argmax()) for r in range(L)]
    assert [c["id"] for c in tuned[:L]] != [c["id"] for c in plain[:L]]  # the two lenses tell apart here
