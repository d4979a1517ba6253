"""The logit lens's finding: from which layer the answer is the top-1 prediction and stays so.

The answer is the token the last position is scored against: the ``--target-token`` when one was
given, else the model's own prediction (the final row's top-1). Rows are the embeddings (row 0) and
each block's output (row ``r`` is block ``r − 1``). "Stays" means top-1 in that row and every row
after it, down to the output; a token that is top-1 somewhere in the middle and loses it again is
reported as such.

>>> f = lens_finding(top1, top1_prob, rank, prob, target_id, vocab, row_names)   # doctest: +SKIP
>>> f.sentence
"'␣Paris' is top-1 from block 28 on (the last 2 of 30 blocks); p 66% at the output."
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .attention import display_token
from .events import fmt_p

__all__ = ["LensFinding", "lens_finding", "row_label"]


def row_label(row: int) -> str:
    """``"the embeddings"`` for row 0, else ``"block {row - 1}"``."""
    return "the embeddings" if row == 0 else f"block {row - 1}"


def _stays_from(top: np.ndarray) -> int:
    """The first row from which ``top`` (bool per row) is True down to the last row, -1 if the last is False."""
    if top.size == 0 or not top[-1]:
        return -1
    false = np.flatnonzero(~top)
    return int(false[-1]) + 1 if false.size else 0


@dataclass
class LensFinding:
    """Where the answer becomes top-1 at one position, and the sentence the lens view leads with.

    ``answer_id``/``answer``: the token scored (``-1``/``""``: none); ``from_row``: the first row from
    which it is top-1 down to the output (``-1``: not top-1 at the output); ``first_row``: the first row
    where it is top-1 at all (``-1``: never); ``final_rank`` (0 = top-1) and ``final_prob`` at the output;
    ``predicted_id``/``predicted``/``predicted_from_row``: the output's own top-1 and where it settles.
    """

    position: int
    answer_id: int
    answer: str
    from_row: int
    first_row: int
    final_rank: int
    final_prob: float
    predicted_id: int
    predicted: str
    predicted_from_row: int
    sentence: str

    def to_json(self) -> dict[str, object]:
        """Plain values for a widget trait (the answer's text is model text: shown with textContent)."""
        return {"position": self.position, "answer_id": self.answer_id, "from_row": self.from_row,
                "first_row": self.first_row, "predicted_id": self.predicted_id,
                "predicted_from_row": self.predicted_from_row, "sentence": self.sentence}


def _where(row: int, R: int) -> str:
    """``"from block 28 on (the last 2 of 30 blocks)"``: where a token is top-1 down to the output."""
    if row == 0:
        return f"from the embeddings on (all {R - 1} blocks)"
    if row == R - 1:
        return f"only at the last block ({row_label(row)})"
    return f"from {row_label(row)} on (the last {R - row} of {R - 1} blocks)"


def lens_finding(
    top1: np.ndarray,
    top1_prob: np.ndarray,
    target_rank: np.ndarray,
    target_prob: np.ndarray,
    target_id: int,
    vocab: Mapping[int, str],
    row_names: Sequence[str],
    position: int = -1,
) -> LensFinding:
    """The finding at one position from its lens column: ``top1``/``top1_prob`` ``(R,)`` (each row's
    top-1 id and probability), ``target_rank``/``target_prob`` ``(R,)`` of ``target_id`` (``-1``: no
    target, the output's top-1 is then the answer); ``vocab`` gives the tokens' text."""
    top1 = np.asarray(top1).astype(np.int64)
    R = len(top1)
    predicted = int(top1[-1])
    text = lambda i: f"'{display_token(vocab.get(i, f'#{i}'))}'"  # noqa: E731  (quoted, as every view writes a token)
    pred_from = _stays_from(top1 == predicted)
    if target_id < 0 or target_id == predicted:
        answer, is_top = predicted, top1 == predicted
        final_rank, final_prob = 0, float(top1_prob[-1])
    else:
        answer = target_id
        is_top = np.asarray(target_rank) == 0
        final_rank, final_prob = int(target_rank[-1]), float(target_prob[-1])
    from_row = _stays_from(is_top)
    hits = np.flatnonzero(is_top)
    first_row = int(hits[0]) if hits.size else -1
    if from_row >= 0:
        earlier = f"; it was top-1 at {row_label(first_row)} already, then lost it" if 0 <= first_row < from_row else ""
        sentence = f"{text(answer)} is top-1 {_where(from_row, R)}; p {fmt_p(final_prob)} at the output{earlier}."
    else:
        earlier = f"; it was top-1 at {row_label(first_row)}, then lost it" if first_row >= 0 else ""
        sentence = (f"{text(answer)} is not the top-1 at the output: rank #{final_rank + 1}, p {fmt_p(final_prob)}{earlier}. "
                    f"The model predicts {text(predicted)}, top-1 {_where(pred_from, R)}.")
    return LensFinding(position, answer, vocab.get(answer, f"#{answer}"), from_row, first_row, final_rank, final_prob,
                       predicted, vocab.get(predicted, f"#{predicted}"), pred_from, sentence)


def _short_where(row: int, R: int) -> str:
    if row == 0:
        return "from the embeddings on"
    if row == R - 1:
        return "only at the last block"
    return f"from {row_label(row)} on"


def lens_headline(named: Sequence[tuple[str, LensFinding]], R: int) -> str:
    """The view's headline: where the answer becomes top-1 (and stays) under each lens, e.g.
    ``"'␣Paris' is top-1 from block 14 on under the tuned lens, from block 27 on under the logit lens; p 66% at the output."``
    With one lens, its own sentence. The answer and the output row are the same under every lens (the
    last block's output is read without a translator), so the first lens's finding names them."""
    if not named:
        return ""
    _name, first = named[0]
    if len(named) == 1:
        return first.sentence
    ans = f"'{display_token(first.answer)}'" if first.answer_id >= 0 else "the answer"
    if first.from_row < 0:  # not top-1 at the output: the lenses agree on that row; say it once
        others = "; ".join(f"under the {n}: " + (f"top-1 at {row_label(f.first_row)}, then lost" if f.first_row >= 0 else "never top-1")
                           for n, f in named)
        return f"{first.sentence} {ans} {others}."
    parts = [f"{_short_where(f.from_row, R)} under the {n}" for n, f in named]
    return f"{ans} is top-1 {', '.join(parts)}; p {fmt_p(first.final_prob)} at the output."


def layer_rows(row_names: Sequence[str], top1: Sequence[int], top1_prob: Sequence[float], answer_prob: Sequence[float],
               answer_rank: Sequence[int], vocab: Mapping[int, str], *, kl_prompt: Sequence[float] | None = None,
               kl_heldout: Sequence[float] | None = None, other_top1: Sequence[int] | None = None) -> list[dict[str, object]]:
    """The by-layer strip at one position, one dict per row (row 0 = the embeddings): the top-1 token
    and its p, the answer's p and rank (1 = top-1; 0 when there is no answer), KL(final ‖ row) on this
    prompt (mean over its positions) and on held-out text (``None``: unknown), the compared lens's
    top-1 and whether it differs."""
    out: list[dict[str, object]] = []
    for r, name in enumerate(row_names):
        t = int(top1[r])
        p_ans = float(answer_prob[r])
        row: dict[str, object] = {
            "row": r, "name": name, "top1": display_token(vocab.get(t, f"#{t}")), "p_top1": float(top1_prob[r]),
            "p_answer": p_ans if np.isfinite(p_ans) else None,
            "rank": int(answer_rank[r]) + 1 if int(answer_rank[r]) >= 0 else 0,
            "kl_prompt": float(kl_prompt[r]) if kl_prompt is not None else None,
            "kl_heldout": float(kl_heldout[r]) if kl_heldout is not None and r < len(kl_heldout) else None,
        }
        if other_top1 is not None:
            o = int(other_top1[r])
            row["other_top1"] = display_token(vocab.get(o, f"#{o}"))
            row["differs"] = o != t
        out.append(row)
    return out
