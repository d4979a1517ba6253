"""Round 6 of issue 26, each run for real under ``nbdebug.debug`` with its healthy twin: ``loss_at_chance`` for
two classes (C = 2 was left out while the zoo's 2-class RNN twin never learnt), and raw inputs ranked above the
large updates they cause in a later layer (an LSTM fed kelvin: its head's update ratio used to rank first)."""

from __future__ import annotations

import math
import pathlib
import sys
from typing import Any

import pytest
import torch
from torch import nn

from tests.unit.test_findings_loop import train_ce


def _serious(res: Any) -> list[str]:
    return [f.code for f in res.findings if f.severity != "note"]


@pytest.mark.parametrize("faulty", [True, False])
def test_two_classes_with_labels_unrelated_stay_at_ln_2_and_matching_labels_learn(faulty: bool) -> None:
    """Two classes, a fresh batch each step: labels dealt out apart from the inputs sit at ln 2 = 0.693 and are
    named; the labels the inputs decide give no warning at all."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(80 * 64, 12, generator=g)
    y = (x[:, :3].sum(1) > 0).long()
    if faulty:
        y = (torch.arange(len(x)) % 2)[torch.randperm(len(x), generator=g)]
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    res = train_ce(m, opt, x, y, steps=80)  # the standard loop, a fresh batch each step
    if faulty:
        assert _serious(res)[:1] == ["loss_at_chance"], res.findings
        assert f"ln 2 = {math.log(2):.3g}" in res.findings[0].text
    else:
        assert _serious(res) == [], res.findings


@pytest.mark.parametrize("faulty", [True, False])
def test_raw_kelvin_into_an_lstm_is_the_root_and_the_heads_large_updates_follow(faulty: bool) -> None:
    """The project zoo's ``lstm_kelvin_sgd`` (hourly temperatures in kelvin, ≈ 288, into an LSTM; SGD + momentum),
    run in full: the head's update ratio is high from step 1 (the saturated LSTM feeds it) and `lr_high` is said,
    but after the input's scale, its root (before round 6 `lr_high` ranked first: its row, the head, is not the
    first layer). Twin: the readings standardised, no warning."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_diagnosis
    import zoo

    case = next(c for c in zoo.CASES if c.name == "lstm_kelvin_sgd" + ("" if faulty else "~"))
    out = bench_diagnosis.run_case(case, quick=False, doctor=False)
    codes = [f["code"] for f in out.findings if f["severity"] != "note"]
    if faulty:
        assert codes[:1] == ["input_scale"] and "lr_high" in codes, out.findings
    else:
        assert codes == [], out.findings
