"""The attention view's finding: heads unusual for this model (robust z-scores against its own
heads), sinks neutral, and the header sentence, on hand-made matrices and a tiny GPT-2 with a
planted previous-token head."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from planted_language import WordTok, previous_token_gpt2  # tests/unit is on sys.path

from nbdebug.inspectors.attention import from_attentions
from nbdebug.inspectors.attention_findings import MIN_HEADS, RULE, head_findings
from nbdebug.inspectors.events import fmt_p
from nbdebug.recorders.attention import AttentionRecorder


def _causal_uniform(T: int) -> torch.Tensor:
    u = torch.tril(torch.ones(T, T))
    return u / u.sum(-1, keepdim=True)


def _sink(T: int, mass: float, noise: torch.Tensor) -> torch.Tensor:
    """Causal head with ``mass`` on token 0 and the rest spread by ``noise`` over the visible keys."""
    rest = torch.tril(noise.abs() + 0.1)
    rest[:, 0] = 0
    rest = rest / rest.sum(-1, keepdim=True).clamp_min(1e-9)
    p = rest * (1 - mass)
    p[:, 0] += mass
    p[0] = 0
    p[0, 0] = 1
    return p


def test_planted_previous_token_head_is_the_outlier() -> None:
    model = previous_token_gpt2(layer=2, head=1)
    with AttentionRecorder(model, tokenizer=WordTok()) as rec, torch.no_grad():
        model(torch.arange(1, 13)[None])
    res = rec.result()
    f = res.findings
    assert f is not None and f.compared
    assert [(o.layer, o.head, o.kind) for o in f.outliers] == [(2, 1, "prev_token")]
    assert f.mask.sum() == 1 and f.mask[2, 1] and f.of(2, 1) is f.outliers[0] and f.of(0, 0) is None
    typical = f.typical["prev_token"]
    assert typical == pytest.approx(float(np.median(res.metrics["prev_token"])))
    assert res.finding == (
        f"1 of 16 heads stands out: L2H1 attends to the previous token "
        f"({100 * res.metrics['prev_token'][2, 1]:.0f}%; typical head here: {100 * typical:.0f}%)."
    )
    assert res.finding.startswith("1 of 16 heads stands out: L2H1 attends to the previous token (100%; typical head here: 19%)")
    # its low entropy is a consequence: the pattern (previous token) is what it is described by
    assert res.metrics["norm_entropy"][2, 1] < 0.1


def test_sinks_on_the_first_token_are_normal_when_most_heads_sink() -> None:
    T, L, H = 10, 3, 4
    g = torch.Generator().manual_seed(0)
    heads = [_sink(T, 0.75 + 0.2 * float(torch.rand(1, generator=g)), torch.randn(T, T, generator=g)) for _ in range(L * H)]
    att = torch.stack(heads).view(L, 1, H, T, T)
    res = from_attentions(tuple(att), ["<s>"] + [f"w{i}" for i in range(1, T)])
    assert res.summary.startswith("12 of 12 heads put > 50% on <s>")
    assert (res.flags & 1).all()  # every head keeps its neutral sink mark
    assert res.findings is not None and res.findings.outliers == [] and not res.findings.mask.any()
    assert res.finding == "No head stands out: each of the 12 heads is close to this model's typical head."


def test_a_sink_is_coloured_only_where_sinks_are_rare() -> None:
    T, L, H = 8, 2, 4
    heads = [_causal_uniform(T) for _ in range(L * H)]
    heads[5] = _sink(T, 0.9, torch.ones(T, T))  # layer 1, head 1: the one head that sinks on [CLS]
    att = torch.stack(heads).view(L, 1, H, T, T)
    res = from_attentions(tuple(att), ["[CLS]"] + [f"w{i}" for i in range(1, T)])
    (o,) = res.findings.outliers
    assert (o.layer, o.head, o.kind) == (1, 1, "sink")
    assert o.text.startswith("puts 90% on [CLS] (typical head here:")


def test_self_and_one_token_heads_are_named() -> None:
    T, L, H = 8, 2, 4
    heads = [_causal_uniform(T) for _ in range(L * H)]
    self_head = torch.eye(T)
    focus = _causal_uniform(T).clone()
    focus[3:] = 0.1 * focus[3:]
    focus[3:, 3] += 0.9  # from token 3 on, 90% on token 3
    heads[2], heads[6] = self_head, focus
    att = torch.stack(heads).view(L, 1, H, T, T)
    toks = ["<s>", "The", "Ġcity", "ĠParis", "Ġis", "Ġbig", "Ġand", "Ġold"]
    res = from_attentions(tuple(att), toks)
    by = {(o.layer, o.head): o for o in res.findings.outliers}
    assert set(by) == {(0, 2), (1, 2)}
    assert by[(0, 2)].kind == "self" and by[(0, 2)].text.startswith("attends to its own token (100%;")
    assert by[(1, 2)].kind == "focus" and by[(1, 2)].token == 3
    assert by[(1, 2)].text.startswith("attends to '␣Paris' [3] (")
    assert res.finding.startswith("2 of 8 heads stand out: L0H2 attends to its own token (100%; typical head here: ")


def test_too_few_heads_or_tokens_compare_nothing() -> None:
    col = np.full((1, MIN_HEADS - 1, 5), 0.2, np.float32)
    metrics = {k: np.zeros((1, MIN_HEADS - 1), np.float32) for k in ("prev_token", "diagonal", "first_mass", "sep_mass", "norm_entropy")}
    f = head_findings(metrics, col, ["a"] * 5)
    assert not f.compared and f.outliers == [] and f.sentence == "Too few to compare (3 heads): no head is marked as unusual."
    col2 = np.full((2, 4, 2), 0.5, np.float32)
    metrics2 = {k: np.zeros((2, 4), np.float32) for k in metrics}
    assert head_findings(metrics2, col2, ["a", "b"]).sentence == "Too few to compare (2 tokens): no head is marked as unusual."


def _prev() -> torch.Tensor:
    T = 8
    prev = torch.zeros(T, T)
    prev[0, 0] = 1
    for i in range(1, T):
        prev[i, i - 1] = 1
    return prev


def test_four_outliers_are_described_and_the_others_named_never_counted_away() -> None:
    """The naive sentence ("...; and 1 more.") hides the fifth head's reason: it is named instead,
    and its reason is printed under its thumbnail (``short``)."""
    T, L, H = 8, 4, 4
    heads = [_causal_uniform(T) for _ in range(L * H)]
    for i in (1, 6, 11, 12, 15):
        heads[i] = _prev()
    res = from_attentions(tuple(torch.stack(heads).view(L, 1, H, T, T)))
    assert len(res.findings.outliers) == 5
    assert res.finding == (
        "5 of 16 heads stand out: L0H1 attends to the previous token (100%; typical head here: 25%); "
        "L1H2 attends to the previous token (100%; typical head here: 25%); "
        "L2H3 attends to the previous token (100%; typical head here: 25%); "
        "L3H0 attends to the previous token (100%; typical head here: 25%); "
        "also L3H3, each with its reason under it in the grid.")
    assert "more" not in res.finding
    assert [o.short for o in res.findings.outliers] == ["prev 100%"] * 5
    assert "1.4826·MAD" in RULE and "3.5" in RULE and "normal" in RULE


def test_many_outliers_list_twelve_labels_then_count_the_others() -> None:
    T, L, H = 8, 8, 8
    heads = [_causal_uniform(T) for _ in range(L * H)]
    planted = list(range(0, 64, 3))  # 22 heads
    for i in planted:
        heads[i] = _prev()
    res = from_attentions(tuple(torch.stack(heads).view(L, 1, H, T, T)))
    labels = [o.label for o in res.findings.outliers]
    assert len(labels) == 22 and {(o.layer * H + o.head) for o in res.findings.outliers} == set(planted)
    assert res.finding.endswith(f"; also {', '.join(labels[4:16])} and 6 others, each with its reason under it in the grid.")


def test_the_reason_under_a_head_is_the_sentence_s_statistic() -> None:
    """Each outlined head's short reason: the statistic and value its sentence gives, written as fmt_p
    writes probabilities; one token's reason is that token's readable label (cut to 8 characters)."""
    T, L, H = 8, 2, 4
    heads = [_causal_uniform(T) for _ in range(L * H)]
    focus = _causal_uniform(T).clone()
    focus[3:] = 0.1 * focus[3:]
    focus[3:, 3] += 0.9  # from token 3 on, 90% on token 3
    heads[2], heads[6] = torch.eye(T), focus
    toks = ["<s>", "The", "Ġcity", "ĠParisianstyle", "Ġis", "Ġbig", "Ġand", "Ġold"]
    res = from_attentions(tuple(torch.stack(heads).view(L, 1, H, T, T)), toks)
    by = {(o.layer, o.head): o for o in res.findings.outliers}
    assert by[(0, 2)].short == "self 100%"
    f = by[(1, 2)]
    assert f.kind == "focus" and f.short == f"␣Parisi… {fmt_p(f.value)}"
    assert f.to_json()["short"] == f.short and f"({fmt_p(f.value)};" in f.text
