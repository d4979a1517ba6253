"""The language widgets lead with their finding: the attention widget's unusual heads and filter,
the lens widget's "top-1 from block N on", its targets' text (no raw ids), and readable colours in
the static snapshot."""

from __future__ import annotations

import importlib.util
import re
from html import escape as html_escape
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from nbdebug.inspectors.events import fmt_p
from nbdebug.recorders.attention import AttentionRecorder
from nbdebug.recorders.logitlens import LogitLensRecorder
from nbdebug.widgets._snapshot import lut
from nbdebug.widgets.attention import AttentionWidget
from nbdebug.widgets.logitlens import LogitLensWidget, text_on

_spec = importlib.util.spec_from_file_location("planted_language", Path(__file__).resolve().parent.parent / "unit" / "planted_language.py")
assert _spec and _spec.loader
planted = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(planted)


def _contrast(a: np.ndarray, b: np.ndarray) -> float:
    def lum(c: np.ndarray) -> float:
        c = np.asarray(c, np.float64) / 255
        lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
        return float(lin @ [0.2126, 0.7152, 0.0722])
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_attention_widget_syncs_the_finding_and_the_outliers() -> None:
    model = planted.previous_token_gpt2(layer=2, head=1)
    with AttentionRecorder(model, tokenizer=planted.WordTok()) as rec, torch.no_grad():
        model(torch.arange(1, 13)[None])
    w = rec.widget()
    assert isinstance(w, AttentionWidget)
    assert w.finding == rec.result().finding and w.finding.startswith("1 of 16 heads stands out: L2H1 attends to the previous token")
    assert [(o["layer"], o["head"], o["kind"]) for o in w.outliers] == [(2, 1, "prev_token")]
    assert w.outliers[0]["value"] == pytest.approx(1.0, abs=0.01) and w.outliers[0]["z"] >= 3.5
    assert "robust z-score" in w.outlier_rule and w.outliers_only is False
    w.outliers_only = True  # the browser's "outliers only" box
    assert w.get_state("outliers_only") == {"outliers_only": True}
    html = w.fallback_html()
    assert html.index("1 of 16 heads stands out") < html.index("heads put &gt; 50%")  # the finding first
    assert "<li><b>L2H1</b> prev 100%: attends to the previous token" in html
    assert w.export_requests()[0] == ("head", {"layer": 2, "head": 1})  # the unusual head is precomputed first
    assert "L2H1 attends to the previous token" in repr(w)


def test_attention_headline_and_the_reason_under_the_outlined_head() -> None:
    """The planted previous-token head is outlined; under it the view prints its previous-token share
    (the headline's reason), not the selected metric (first_mass, a few percent for this head)."""
    model = planted.previous_token_gpt2(layer=2, head=1)
    with AttentionRecorder(model, tokenizer=planted.WordTok()) as rec, torch.no_grad():
        model(torch.arange(1, 13)[None])
    w = rec.widget()
    res = rec.result()
    prev = float(res.metrics["prev_token"][2, 1])
    assert w.headline == w.finding == res.finding
    assert w.headline.startswith(f"1 of 16 heads stands out: L2H1 attends to the previous token ({fmt_p(prev)};")
    assert w.metric == "first_mass"
    shown = float(res.metrics[w.metric][2, 1])
    assert w.outliers[0]["short"] == f"prev {fmt_p(prev)}" == "prev 100%"
    assert fmt_p(shown) != fmt_p(prev)  # the naive label (the selected metric) would say something else
    assert w.fallback_html().index(html_escape(w.headline)) < w.fallback_html().index("<table")


def test_lens_widget_syncs_the_finding_and_names_every_target() -> None:
    model = planted.answer_at_block_gpt2(block=3, answer=42)
    ids = torch.arange(1, 9)[None]
    with LogitLensRecorder(model, tokenizer=planted.WordTok()) as rec, torch.no_grad():
        model(ids)
    w = rec.widget()
    assert isinstance(w, LogitLensWidget)
    assert re.fullmatch(r"'␣w42' is top-1 from block 3 on \(the last 3 of 6 blocks\); p [\d.]+% at the output\.", w.finding), w.finding
    assert w.headline == w.finding and w.lens_name == "logit lens" and w.compare_name == ""  # one lens: its own sentence
    strip = w.by_layer  # the by-layer strip: the data of the last column, row by row
    res = rec.result()
    assert [r["rank"] for r in strip] == [int(x) + 1 for x in res.target_rank[:, -1]]
    assert [r["p_answer"] for r in strip] == [float(x) for x in res.target_prob[:, -1]]
    assert [r["top1"] for r in strip][-4:] == [strip[-4]["top1"]] + ["␣w42"] * 3 and strip[-4]["top1"] != "␣w42" and "differs" not in strip[0]
    assert w.finding_cell["from_row"] == 4 and w.finding_cell["position"] == 7 and w.finding_cell["answer_id"] == 42
    # the tip names each position's target: every target id arrives with its text
    assert w.targets == [2, 3, 4, 5, 6, 7, 8, 42]
    assert {str(t): f"␣w{t}" for t in w.targets}.items() <= w.vocab.items()
    assert not any(re.fullmatch(r"#\d+", s) for s in w.vocab.values())
    assert w.fallback_html().index("top-1 from block 3 on") < w.fallback_html().index("<table")
    assert "top-1 from block 3 on" in repr(w)


def test_snapshot_cells_choose_the_readable_text_colour() -> None:
    table = lut("viridis")
    black, white = np.zeros(3), np.full(3, 255.0)
    worst = min(_contrast(c, black if text_on(tuple(c)) == "#000" else white) for c in table)
    assert worst >= 4.5, worst
    # the old rule (black above p = 0.6) put white on the light greens: below AA
    assert _contrast(table[round(0.55 * 255)], white) < 4.5 and text_on(tuple(table[round(0.55 * 255)])) == "#000"
