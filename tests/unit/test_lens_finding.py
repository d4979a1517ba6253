"""The logit lens's finding: from which block the answer at the last position is top-1 and stays,
on hand-made lens columns and on a tiny GPT-2 whose block 3 writes the answer into the residual."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from planted_language import WordTok, answer_at_block_gpt2  # tests/unit is on sys.path

from nbdebug.inspectors.events import fmt_p
from nbdebug.inspectors.lens_finding import layer_rows, lens_finding, lens_headline, row_label
from nbdebug.recorders.logitlens import LogitLensRecorder

VOCAB = {1: " the", 2: " Paris", 3: ","}
NAMES = ["embed"] + [f"model.layers.{i}" for i in range(6)]


def _find(top1: list[int], rank: list[int] | None = None, target: int = -1, p: float = 0.7):  # type: ignore[no-untyped-def]
    R = len(top1)
    rank = rank if rank is not None else [0 if t == target else 5 for t in top1]
    return lens_finding(np.array(top1), np.full(R, p), np.array(rank), np.full(R, p / 2), target, VOCAB, NAMES[:R])


def _run(target: str | None = None):  # type: ignore[no-untyped-def]
    model = answer_at_block_gpt2(block=3, answer=42)
    with LogitLensRecorder(model, tokenizer=WordTok(), target_token=target) as rec, torch.no_grad():
        model(torch.arange(1, 9)[None])
    return rec.result()


def test_planted_answer_is_top1_from_its_block_on() -> None:
    res = _run()
    assert res.top_ids[:, -1, 0].tolist() == [8, 8, 8, 8, 42, 42, 42]  # rows: embed, blocks 0..5
    f = res.finding
    assert (f.answer_id, f.answer, f.from_row, f.first_row, f.final_rank) == (42, " w42", 4, 4, 0)
    p = float(res.top_probs[-1, -1, 0])
    assert f.sentence == f"'␣w42' is top-1 from block 3 on (the last 3 of 6 blocks); p {fmt_p(p)} at the output."
    assert "#" not in f.sentence  # a tokenizer was given: text, never a raw id


def test_a_given_target_is_the_answer() -> None:
    assert _run(" w42").finding.sentence == _run().finding.sentence
    other = _run(" w7").finding
    assert other.answer_id == 7 and other.from_row == -1 and other.predicted_id == 42 and other.predicted_from_row == 4
    assert re.fullmatch(
        r"'␣w7' is not the top-1 at the output: rank #\d+, p [0-9.]+%\. "
        r"The model predicts '␣w42', top-1 from block 3 on \(the last 3 of 6 blocks\)\.", other.sentence), other.sentence


def test_sentences_at_the_edges() -> None:
    assert _find([2] * 7).sentence == "'␣Paris' is top-1 from the embeddings on (all 6 blocks); p 70% at the output."
    last = _find([1, 1, 1, 1, 1, 1, 2])
    assert last.from_row == 6 and last.sentence == "'␣Paris' is top-1 only at the last block (block 5); p 70% at the output."
    again = _find([1, 2, 1, 1, 2, 2, 2])
    assert (again.first_row, again.from_row) == (1, 4)
    assert again.sentence == "'␣Paris' is top-1 from block 3 on (the last 3 of 6 blocks); p 70% at the output; it was top-1 at block 0 already, then lost it."
    lost = _find([1, 1, 2, 2, 1, 1, 1], rank=[9, 9, 0, 0, 3, 2, 1], target=2)
    assert lost.sentence == ("'␣Paris' is not the top-1 at the output: rank #2, p 35%; it was top-1 at block 1, then lost it. "
                             "The model predicts '␣the', top-1 from block 3 on (the last 3 of 6 blocks).")
    assert row_label(0) == "the embeddings" and row_label(29) == "block 28"


def test_headline_names_where_each_lens_puts_the_answer() -> None:
    """Planted: the answer is top-1 from block 1 under one lens and only at the last block under the
    other; the headline names both rows (not the first lens's alone) and the output's p."""
    tuned = _find([1, 1, 2, 2, 2, 2, 2])
    logit = _find([1, 1, 1, 1, 1, 1, 2])
    assert lens_headline([("tuned lens", tuned), ("logit lens", logit)], 7) == (
        "'␣Paris' is top-1 from block 1 on under the tuned lens, only at the last block under the logit lens; p 70% at the output.")
    assert lens_headline([("logit lens", logit)], 7) == logit.sentence
    lost = _find([1, 2, 1, 1, 1, 1, 1], rank=[9, 0, 3, 3, 3, 2, 1], target=2)
    both = lens_headline([("tuned lens", lost), ("logit lens", _find([1] * 7, rank=[9] * 6 + [1], target=2))], 7)
    assert both.startswith(lost.sentence)
    assert "under the tuned lens: top-1 at block 0, then lost; under the logit lens: never top-1" in both


def test_layer_rows_are_the_data_under_them() -> None:
    vocab = {1: " the", 2: " Paris"}
    rows = layer_rows(["embed", "b0", "b1"], [1, 2, 2], [0.5, 0.6, 0.7], [0.1, 0.6, np.nan], [4, 0, -1], vocab,
                      kl_prompt=[3.0, 1.0, 0.0], kl_heldout=[2.5, 0.5, 0.0], other_top1=[1, 1, 2])
    assert [r["top1"] for r in rows] == ["␣the", "␣Paris", "␣Paris"]
    assert [r["rank"] for r in rows] == [5, 1, 0] and rows[2]["p_answer"] is None and rows[1]["p_answer"] == 0.6
    assert [r["differs"] for r in rows] == [False, True, False] and rows[1]["other_top1"] == "␣the"
    assert [r["kl_heldout"] for r in rows] == [2.5, 0.5, 0.0] and rows[0]["kl_prompt"] == 3.0
