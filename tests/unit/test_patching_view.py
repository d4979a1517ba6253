"""The patching view's parts without a shell: the session keeps no reference to the model between
requests and records each prompt once; the options parser; the static scale matches the JS one."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

import nbdebug
from nbdebug.adapters.offline import tiny_lm
from nbdebug.adapters.text import token_option
from nbdebug.capture import ModelGoneError, hook_count
from nbdebug.sessions.patching import PatchSession
from nbdebug.widgets.patching import NEGATIVE, POSITIVE, diverging
from nbdebug.workbench.metric import top_tokens


def pair() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(3))
    y = x.clone()
    y[0, 1] = (y[0, 1] + 9) % 64
    return x, y


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_session_grids_equal_patch_and_hold_no_model(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_lm(family, layers=2, heads=2, d=16)
    x, y = pair()
    s = PatchSession(model, x, y, answer=5, wrong=6)
    refs = {sites: nbdebug.patch(model, x, y, answer=5, wrong=6, sites=sites) for sites in ("resid", "heads")}
    import nbdebug.workbench.session as session_mod

    calls: list[int] = []
    real = session_mod.record_state
    monkeypatch.setattr(session_mod, "record_state", lambda *a, **k: calls.append(1) or real(*a, **k))
    for sites, ref in refs.items():
        np.testing.assert_allclose(s.grid(sites).effect, ref.effect, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert calls == [1, 1]  # "heads" needs the heads taps: each prompt recorded again once, then never
    s.grid("resid")
    s.cell("heads", "exact", 1, 0)
    assert calls == [1, 1] and hook_count(model) == 0
    assert all(run.runner is None for run in s.kept.runs.values())  # between requests nothing points at the model
    ref_model = weakref.ref(model)
    del model
    gc.collect()
    assert ref_model() is None
    with pytest.raises(ModelGoneError):
        s.cell("resid", "exact", 1, 1)


def test_top_tokens_and_options() -> None:
    z = torch.tensor([0.0, 3.0, 1.0, 2.0])
    assert [t["id"] for t in top_tokens(z, None, 3)] == [1, 3, 2]
    assert sum(t["p"] for t in top_tokens(z, None, 4)) == pytest.approx(1.0)
    assert token_option("#12", object()) == 12 and token_option("12", None) == 12
    assert token_option(" Paris", object()) == " Paris" and token_option("12", object()) == "12"
    assert token_option(None, None) is None


def test_static_scale_matches_the_js_scale() -> None:
    assert diverging(0.0) == (255, 255, 255) and diverging(1.0) == POSITIVE and diverging(-2.0) == NEGATIVE
    assert diverging(0.5) == tuple(round(255 + (c - 255) * 0.5) for c in POSITIVE)
    assert diverging(float("nan")) == (224, 224, 224)
