"""Real-use rows for ``lens=`` (``--lens``) in the logit-lens view: the caller under ``no_grad``,
``inference_mode``, ``generate()``, an accelerate-offloaded model, and an exception in the middle of
the cell. In each: the table equals the lens's translators applied by hand (1e-5), no hook is left,
and the model is as it was (parameters, buffers, ``.grad``, modes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from test_lens_fit import L, hand_logits, peaked, text  # tests/unit is on sys.path

import nbdebug
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.lens import fit_lens

K = 3


def hand_top(m: torch.nn.Module, ids: torch.Tensor, lens: Any) -> tuple[np.ndarray, np.ndarray]:
    """(rows, T) top-1 ids and probabilities of rows 0 … L-1 read through ``lens`` by hand."""
    with torch.no_grad():
        hs = m(ids, output_hidden_states=True).hidden_states
        p = torch.stack([torch.softmax(hand_logits(m, hs[r][0] @ lens.A[r].T + lens.c[r]), -1) for r in range(L)])
    top = p.max(-1)
    return top.indices.numpy(), top.values.numpy()


@pytest.fixture(scope="module")
def fitted() -> tuple[torch.nn.Module, Any]:
    m = peaked()
    return m, fit_lens(m, None, text(), kind="shortcut", max_tokens=1024, seq_len=64, holdout=0, progress=False)


def _table(dbg: Any) -> Any:
    res = dbg.results["logitlens"]
    dbg.widgets()
    return res


@pytest.mark.parametrize("caller", ["no_grad", "inference_mode", "grad"])
def test_lens_view_under_each_caller(fitted: tuple[torch.nn.Module, Any], caller: str) -> None:
    m, lens = fitted
    ids = text(8, seed=21)[None]
    want_i, want_p = hand_top(m, ids, lens)  # first: transformers' output_hidden_states leaves its own hooks
    fp, hooks = fingerprint(m), hook_count(m)
    ctx = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "grad": torch.enable_grad}[caller]
    with nbdebug.debug(m, view="logitlens", lens=lens) as dbg, ctx():
        out = m(ids)
    res = _table(dbg)
    np.testing.assert_array_equal(np.asarray(res.top_ids)[:L, :, 0], want_i)
    np.testing.assert_allclose(np.asarray(res.top_probs)[:L, :, 0], want_p, atol=1e-5)
    assert hook_count(m) == hooks and same_fingerprint(fp, fingerprint(m)) == []
    if caller == "grad":  # the user's graph is intact: backward runs and only then writes .grad
        out.logits.sum().backward()
        assert all(p.grad is not None for p in m.parameters() if p.requires_grad)
        m.zero_grad(set_to_none=True)


def test_lens_view_over_generate(fitted: tuple[torch.nn.Module, Any]) -> None:
    m, lens = fitted
    ids = text(5, seed=22)[None]
    hand_top(m, ids, lens)  # transformers' output_hidden_states installs its hooks once: before counting
    fp, hooks = fingerprint(m), hook_count(m)
    with nbdebug.debug(m, view="logitlens", lens=lens) as dbg:
        out = m.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    res = _table(dbg)
    top = np.asarray(res.top_ids)[:, :, 0]
    T = top.shape[1]
    assert T in (out.shape[1], out.shape[1] - 1), (T, out.shape)  # every position the model read
    want_i, want_p = hand_top(m, out[:, :T], lens)
    np.testing.assert_array_equal(top[:L], want_i)
    np.testing.assert_allclose(np.asarray(res.top_probs)[:L, :, 0], want_p, atol=1e-5)
    assert hook_count(m) == hooks and same_fingerprint(fp, fingerprint(m)) == []


class Boom(RuntimeError):
    pass


def test_lens_view_after_an_exception_mid_cell(fitted: tuple[torch.nn.Module, Any]) -> None:
    """The user's forward raises after block 0: the exception propagates unchanged, what ran (embed,
    block 0) is read through the lens as by hand, or the view says in one line why it is not shown."""
    m, lens = fitted
    ids = text(8, seed=23)[None]
    want_i, want_p = hand_top(m, ids, lens)

    def boom(*_: Any) -> None:
        raise Boom("planted in block 1")

    h = m.model.layers[1].register_forward_hook(boom)
    try:
        fp, hooks = fingerprint(m), hook_count(m)
        dbg = nbdebug.debug(m, view="logitlens", lens=lens)
        with pytest.raises(Boom, match="planted in block 1"), dbg, torch.no_grad():
            m(ids)
        assert hook_count(m) == hooks and same_fingerprint(fp, fingerprint(m)) == []
    finally:
        h.remove()
    res = dbg.results.get("logitlens")
    if res is None or "logitlens" in getattr(dbg, "skipped", {}):
        note = str(dbg.skipped.get("logitlens", ""))
        assert note and "\n" not in note and ("rais" in note or "error" in note.lower()), note
        return
    top = np.asarray(res.top_ids)[:, :, 0]
    assert list(res.row_names)[:2] == ["embed", "model.layers.0"], res.row_names
    np.testing.assert_array_equal(top[:2], want_i[:2])
    np.testing.assert_allclose(np.asarray(res.top_probs)[:2, :, 0], want_p[:2], atol=1e-5)


def test_lens_view_on_an_offloaded_model(tmp_path: Any) -> None:
    pytest.importorskip("accelerate")
    from nbdebug.testing import offloaded_llama

    m, ref = offloaded_llama(tmp_path, layers=2, hidden=64, vocab=512)
    ids = torch.randint(1, 512, (600,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        m(ids[None, :8])  # accelerate's first forward (see test_offload.state)
    lens = fit_lens(ref, None, ids, kind="shortcut", max_tokens=512, seq_len=64, holdout=0, progress=False)
    lens.attach(m)
    fp, hooks = fingerprint(m), hook_count(m)
    x = ids[None, 100:109]
    with nbdebug.debug(m, view="logitlens", lens=lens) as dbg, torch.no_grad():
        m(x)
    res = _table(dbg)
    with torch.no_grad():
        hs = ref(x, output_hidden_states=True).hidden_states
        p = torch.stack([torch.softmax(ref.lm_head(ref.model.norm(hs[r][0] @ lens.A[r].T + lens.c[r])).float(), -1)
                         for r in range(2)])
    np.testing.assert_array_equal(np.asarray(res.top_ids)[:2, :, 0], p.argmax(-1).numpy())
    np.testing.assert_allclose(np.asarray(res.top_probs)[:2, :, 0], p.max(-1).values.numpy(), atol=1e-5)
    assert m.lm_head.weight.device.type == "meta"
    assert hook_count(m) == hooks and same_fingerprint(fp, fingerprint(m)) == []
