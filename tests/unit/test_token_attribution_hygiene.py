"""nbdebug.attribute leaves the model as found (0 hooks, parameters, buffers, .grad, requires_grad,
modes, RNG) after success and after an exception in the middle of the chunks; never calls the user's
hooks; gives the same scores under a caller's no_grad / inference_mode; runs in bf16."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from nbdebug.adapters.offline import tiny_lm
from nbdebug.attribution import attribute
from nbdebug.capture import fingerprint, hook_count, same_fingerprint

METHODS = ["grad_x_input", "integrated_gradients", "occlusion"]
IDS = torch.tensor([[1, 7, 4, 9, 2, 11]])


def snapshot(m: torch.nn.Module) -> dict[str, Any]:
    return {"fp": fingerprint(m), "rng": torch.get_rng_state(), "hooks": hook_count(m),
            "modes": [x.training for x in m.modules()], "rg": [p.requires_grad for p in m.parameters()]}


def unchanged(m: torch.nn.Module, before: dict[str, Any]) -> None:
    assert same_fingerprint(before["fp"], fingerprint(m)) == []
    assert torch.equal(before["rng"], torch.get_rng_state())
    assert hook_count(m) == before["hooks"]
    assert before["modes"] == [x.training for x in m.modules()]
    assert before["rg"] == [p.requires_grad for p in m.parameters()]


@pytest.mark.parametrize("method", METHODS)
def test_model_left_as_found_and_user_hooks_not_called(method: str) -> None:
    m = tiny_lm("llama")
    m.model.layers[1].train()  # a mode that must survive (dropout is 0 in this config)
    m.lm_head.weight.requires_grad_(False)  # a frozen parameter stays frozen
    called: list[int] = []
    h = m.model.layers[0].register_forward_hook(lambda *args: called.append(1))
    m(IDS).logits[:, -1, 3].sum().backward()  # a gradient the user holds: .grad must survive unchanged
    assert called == [1]
    try:
        before = snapshot(m)
        a = attribute(m, IDS, answer=3, wrong=5, method=method, steps=8, max_bytes=20_000)
        assert np.isfinite(a.scores).all()
        unchanged(m, before)
        assert called == [1]  # nbdebug's passes set the user's hooks aside
    finally:
        h.remove()
    assert hook_count(m) == 0


@pytest.mark.parametrize("method", METHODS)
def test_exception_mid_chunk_leaves_the_model(method: str) -> None:
    m = tiny_lm("gpt2")
    before = snapshot(m)
    calls: list[int] = []

    def metric(logits: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return logits[:, -1, 3] - logits[:, -1, 5]

    # a tiny budget: one run per chunk, so the second chunk raises
    with pytest.raises(RuntimeError, match="boom"):
        attribute(m, IDS, metric=metric, method=method, steps=8, max_bytes=1)
    unchanged(m, before)
    assert hook_count(m) == 0 and all(p.grad is None for p in m.parameters())


@pytest.mark.parametrize("caller", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("method", METHODS)
def test_same_scores_under_no_grad_and_inference_mode(caller: str, method: str) -> None:
    m = tiny_lm("gpt2")
    ref = attribute(m, IDS, answer=3, wrong=5, method=method, steps=8)
    ctx = torch.no_grad() if caller == "no_grad" else torch.inference_mode()
    with ctx:
        ids = IDS.clone()  # an inference tensor under inference_mode
        got = attribute(m, ids, answer=3, wrong=5, method=method, steps=8)
    np.testing.assert_allclose(got.scores, ref.scores, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got.curves["deletion"], ref.curves["deletion"], rtol=1e-6, atol=1e-8)
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("method", METHODS)
def test_bf16_close_to_float32(method: str) -> None:
    m32 = tiny_lm("llama")
    m16 = tiny_lm("llama").to(torch.bfloat16)
    before = snapshot(m16)
    a32 = attribute(m32, IDS, answer=3, wrong=5, method=method, steps=8, faithfulness=False)
    a16 = attribute(m16, IDS, answer=3, wrong=5, method=method, steps=8, faithfulness=False)
    unchanged(m16, before)
    assert np.isfinite(a16.scores).all()
    scale = np.abs(a32.scores).max()
    assert np.abs(a16.scores - a32.scores).max() <= 0.1 * scale + 1e-3


def test_training_mode_note_and_dropout_rng_untouched() -> None:
    m = tiny_lm("gpt2").train()
    before = snapshot(m)
    a = attribute(m, IDS, answer=3, wrong=5, faithfulness=False)
    assert any("training mode" in n for n in a.notes)
    unchanged(m, before)
