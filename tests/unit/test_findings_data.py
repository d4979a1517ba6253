"""Round 5 (h-ddata): harm before a warning, and the schedule read from the run's own lr. Hand-built histories,
each a planted fault and its healthy twin:

* ``dead_units``: 60% of a ReLU layer's units silent while the loss falls (a deep Kaiming net, a VAE) is a note;
  the same layer with a flat loss stays a warning;
* ``lr_high``: large first updates and a loss that doubles then ends at 0.1× its start (a cosine classifier at
  scale 30) is a note; the same rise ending at 0.8× its start stays a warning;
* ``batch_stats``: a standardisation over the batch written by hand is a note (duplicating every sample leaves the
  outputs as they were), a norm over the batch or attention across the samples (a seq-first layer) is not;
* ``lr_decayed``: StepLR(gamma=0.7) stepped per batch (the lr at 1e-8 of its peak by the middle, the loss flat
  after) is named; a cosine schedule to 0 over the run and a per-epoch StepLR with a falling loss are not.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nbdebug.capture.history import History
from nbdebug.inspectors.run_evidence import Evidence
from nbdebug.inspectors.run_findings_data import (
    DECAYED,
    RECOVERED,
    STATS_ONLY,
    batch_statistics,
    data_findings,
    recovered,
)
from nbdebug.inspectors.thermometer import diagnose
from nbdebug.runs.batch_probe import batch_probe
from tests.unit.test_history_flags import fields, result_of

ROWS, TYPES, CHAIN = ["0", "1", "2"], ["Linear", "ReLU", "Linear"], [(), (0,), (1,)]


def _run(loss: list[float], *, ratio: float | list[float] = 1e-3, dead: float = 0.0, lr: list[float] | None = None,
         zeros: float | None = None) -> object:
    k = len(loss)
    nan = [math.nan] * k
    r = ratio if isinstance(ratio, list) else [ratio] * k
    v = fields(k, 3, update_ratio=[r, nan, r], param_grad_norm=[[1.0] * k, nan, [1.0] * k],
               dead_unit_frac=[nan, [dead] * k, nan], zero_frac=[[0.0] * k, [min(dead, 0.9)] * (k - 1) + [zeros or min(dead, 0.9)], [0.0] * k],
               std=[[1.0] * k] * 3, mean=[[0.0] * k] * 3)
    scal = {"loss": loss} | ({"lr": lr} if lr is not None else {})
    h = History.from_arrays(range(1, k + 1), ROWS, v, scal,
                            row_info=[{"type": t, "dtype": "float32", "module": n, "shape": [4, 8]} for n, t in zip(ROWS, TYPES, strict=True)])
    return result_of(h, TYPES, CHAIN)


def _codes(rep: object) -> list[tuple[str, str]]:
    return [(f.code, f.severity) for f in rep.findings]  # type: ignore[attr-defined]


FALLS = [2.3 * 0.97 ** i for i in range(40)]
FLAT = [2.3 + 0.01 * (i % 3) for i in range(40)]


def test_half_dead_relu_in_a_model_that_learns_is_a_note() -> None:
    rep = diagnose(_run(FALLS, dead=0.6))
    assert ("dead_units", "note") in _codes(rep) and not [c for c in _codes(rep) if c[1] != "note"], _codes(rep)
    f = next(f for f in rep.findings if f.code == "dead_units")
    assert f.text == "`1` (ReLU): 60% of its units are zero for every sample at step 40" and f.advice == ""
    assert f.detail.endswith("while the loss fell: no harm seen.")
    assert rep.headline.startswith("no problems found in 40 steps")


def test_half_dead_relu_with_a_loss_that_does_not_fall_stays_a_warning() -> None:
    rep = diagnose(_run(FLAT, dead=0.6))
    assert rep.findings[0].code == "dead_units" and rep.findings[0].severity == "warning", _codes(rep)
    assert rep.headline == "`1` (ReLU): 60% of its units are zero for every sample at step 40"


# large first updates (a cosine head at scale 30): the loss doubles at step 3, then
BIG = [0.2, 0.15, 0.1, *[0.005] * 37]
RISE = [2.3, 4.0, 6.5, 5.0, 3.0]


def test_a_loss_rise_the_run_recovers_from_is_no_harm() -> None:
    loss = RISE + [3.0 * 0.93 ** i for i in range(35)]  # ends at 0.07× its first loss
    rep = diagnose(_run(loss, ratio=BIG))
    assert _codes(rep) == [("update_high", "note")], _codes(rep)
    assert "the loss rose to 6.5 at step 3 (2.83× its first value 2.3) but ended far below its start" in rep.findings[0].detail


def test_a_loss_rise_the_run_does_not_recover_from_is_the_learning_rate() -> None:
    loss = RISE + [2.0] * 35  # ends at 0.87× its first loss: above RECOVERED
    rep = diagnose(_run(loss, ratio=BIG))
    assert rep.findings[0].code == "lr_high" and rep.findings[0].severity == "warning", _codes(rep)
    assert "then the loss rose to 6.5 at step 3 (2.83× its first value 2.3)" in rep.findings[0].detail


def test_recovered_exact() -> None:
    ev = Evidence(np.arange(1, 11), np.array([2.0, 5.0, 3.0, 2.0, 1.5, 1.2, 1.1, 1.0, 1.0, 1.0]), np.ones(10))
    assert RECOVERED == 0.5 and recovered(ev)  # median of the last two: 1.0 = 0.5 × 2.0
    ev = Evidence(np.arange(1, 11), np.array([2.0, 5.0, 3.0, 2.0, 1.5, 1.2, 1.1, 1.0, 1.0, 1.02]), np.ones(10))
    assert not recovered(ev)
    ev = Evidence(np.arange(1, 11), np.array([2.0, 5.0, 3.0, 2.0, 1.5, 1.2, 1.1, 1.0, math.nan, 0.5]), np.ones(10))
    assert not recovered(ev)  # a NaN on the way is harm, whatever the end


def test_a_scheduler_stepped_per_batch_is_named() -> None:
    lr = [0.1 * 0.7 ** i for i in range(40)]  # StepLR(step_size=1, gamma=0.7): below 1e-3 from step 14
    loss = [2.3 - 0.05 * i for i in range(14)] + [1.65 + 0.01 * (i % 2) for i in range(26)]
    res = _run(loss, lr=lr)
    got = data_findings(res)
    assert [(f.code, f.severity, f.step) for f in got] == [("lr_decayed", "warning", 14)]
    assert got[0].text == ("the learning rate fell to 9.1e-08 by step 40 (9.1e-07× its peak 0.1; below 1/100 of it "
                           "from step 14), and the loss stopped falling")
    assert diagnose(res).findings[0].code == "lr_decayed"
    assert DECAYED == 1e-2


def test_healthy_schedules_are_quiet() -> None:
    n = 40
    cosine = [0.1 * 0.5 * (1 + math.cos(math.pi * i / (n - 1))) for i in range(n)]  # to exactly 0 at the end
    assert data_findings(_run(FALLS, lr=cosine)) == []
    assert data_findings(_run(FLAT, lr=cosine)) == []  # far below its peak only in the last steps
    per_epoch = [0.1 * 0.7 ** (i // 10) for i in range(n)]
    assert data_findings(_run(FALLS, lr=per_epoch)) == []
    # decayed, but the loss still falls over the last half: not named
    lr = [0.1 * 0.7 ** i for i in range(n)]
    assert data_findings(_run(FALLS, lr=lr)) == []
    assert data_findings(_run(FALLS)) == []  # no lr kept (a hand-written loop)


# -- statistics over the batch (a note) vs samples mixed (a warning): the batch probe fed every sample twice ------
class _Standardise(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (h - h.mean(0, keepdim=True)) / h.std(0, unbiased=False, keepdim=True)


class _SumNorm(nn.Module):  # F.normalize over the batch: a norm over dim 0 grows ×√2 when every sample is fed twice
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.normalize(h, dim=0)


class _SeqFirst(nn.Module):  # attention that expects (T, B, D) fed (B, T, D): attends across the samples
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.att = nn.MultiheadAttention(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.att(x, x, x, need_weights=False)[0].mean(1)


def test_statistics_over_the_batch_are_a_note_and_a_norm_over_it_is_not() -> None:
    x = torch.arange(48, dtype=torch.float32).reshape(8, 6) ** 1.3
    p = batch_probe(_Standardise(), ((x,), {}))
    assert p is not None and p["change"] > 0.01 and p["duplicated"] < 1e-6 and p["seq_first"] is False
    note = batch_statistics(p, 7)
    assert note is not None and (note.code, note.severity, note.step) == ("batch_stats", "note", 7)
    assert note.text.startswith("the outputs depend on statistics over the batch: the first 4 samples of the last batch")
    # F.normalize(dim=0): every output ÷ √2 when each sample comes twice — mixing, the warning stands
    p = batch_probe(_SumNorm(), ((x,), {}))
    assert p is not None and p["duplicated"] == pytest.approx(1 - 2 ** -0.5, rel=1e-5) and batch_statistics(p, 7) is None
    # attention across the samples is unchanged by duplicates too, but a seq-first layer names it (a warning)
    p = batch_probe(_SeqFirst(), ((torch.randn(8, 5, 8),), {}))
    assert p is not None and p["change"] > 0.01 and p["duplicated"] < 1e-5 and p["seq_first"] is True
    assert batch_statistics(p, 7) is None
    assert STATS_ONLY == 0.1


def test_a_partly_dead_layer_does_not_hide_a_loss_at_chance() -> None:
    """Labels unrelated to the inputs: the loss sits at ln C (C = 8, the output's last dimension) for 60 steps while
    the weights move, and 60% of the ReLU's units fell silent. The partly dead layer still passes signal, so it does not
    explain the chance loss: ``loss_at_chance`` is the root (before round 5 the dead units hid it)."""
    chance = math.log(8)
    loss = [chance * (1.0 + 0.002 * (-1) ** i) for i in range(60)]
    rep = diagnose(_run(loss, dead=0.6))
    serious = [(f.code, f.severity) for f in rep.findings if f.severity != "note"]
    assert serious[0] == ("loss_at_chance", "warning") and ("dead_units", "warning") in serious, rep.findings


def test_a_recovered_loss_with_a_layer_dead_at_the_end_is_still_the_learning_rate() -> None:
    """SGD far too fast: the loss doubles at step 3 and ends at 0.07× its start, but the ReLU's outputs are all zero
    at the end (99.5%): units died, so the large updates did harm (a `dead` layer at the end is evidence)."""
    loss = RISE + [3.0 * 0.93 ** i for i in range(35)]
    rep = diagnose(_run(loss, ratio=BIG, dead=0.6, zeros=0.995))
    serious = [f.code for f in rep.findings if f.severity != "note"]
    assert serious[:1] == ["lr_high"] and "dead" in serious, rep.findings
