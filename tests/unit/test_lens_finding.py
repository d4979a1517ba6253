"""The logit lens's finding: from which block the answer at the last position is top-1 and stays,
on hand-made lens columns and on a tiny GPT-2 whose block 3 writes the answer into the residual."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from planted_language import WordTok, answer_at_block_gpt2  # tests/unit is on sys.path

from nbdebug.inspectors.lens_finding import lens_finding, row_label
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
    assert f.sentence == f"' w42' is top-1 from block 3 on (the last 3 of 6 blocks); p = {p:.2f} at the output."
    assert "#" not in f.sentence  # a tokenizer was given: text, never a raw id


def test_a_given_target_is_the_answer() -> None:
    assert _run(" w42").finding.sentence == _run().finding.sentence
    other = _run(" w7").finding
    assert other.answer_id == 7 and other.from_row == -1 and other.predicted_id == 42 and other.predicted_from_row == 4
    assert re.fullmatch(
        r"' w7' is not the top-1 at the output: rank #\d+, p = 0\.\d\d\. "
        r"The model predicts ' w42', top-1 from block 3 on \(the last 3 of 6 blocks\)\.", other.sentence), other.sentence


def test_sentences_at_the_edges() -> None:
    assert _find([2] * 7).sentence == "' Paris' is top-1 from the embeddings on (all 6 blocks); p = 0.70 at the output."
    last = _find([1, 1, 1, 1, 1, 1, 2])
    assert last.from_row == 6 and last.sentence == "' Paris' is top-1 only at the last block (block 5); p = 0.70 at the output."
    again = _find([1, 2, 1, 1, 2, 2, 2])
    assert (again.first_row, again.from_row) == (1, 4)
    assert again.sentence == "' Paris' is top-1 from block 3 on (the last 3 of 6 blocks); p = 0.70 at the output; it was top-1 at block 0 already, then lost it."
    lost = _find([1, 1, 2, 2, 1, 1, 1], rank=[9, 9, 0, 0, 3, 2, 1], target=2)
    assert lost.sentence == ("' Paris' is not the top-1 at the output: rank #2, p = 0.35; it was top-1 at block 1, then lost it. "
                             "The model predicts ' the', top-1 from block 3 on (the last 3 of 6 blocks).")
    assert row_label(0) == "the embeddings" and row_label(29) == "block 28"
