"""Review 26 (REVIEW.md R3, R4, R5): the run's evidence measured on the loss's own scale. Hand-built histories
(``tests.unit.test_findings_data._run``), each a planted mistake of the old rule beside its healthy twin:

* R3: a loss that goes negative by design (−cosine) starting near 0 — a rise is measured against the range it spans
  below its start, not as a factor over a first value of 0.004 ("17× its first value");
* R4: a ReLU layer 96% silent (a bias of −1.0; no unit zero for every sample) with a loss near chance is named as the
  layer (``dead``), not blamed on the data (``loss_at_chance``: "inputs and labels unrelated?");
* R5: 89% of a layer's units dead while a classifier's loss falls 15% from chance stays a warning (it was a note from
  a 10% fall); the same layer in a classifier that reaches half of ln C, or under a loss whose floor is unknown (a
  VAE's, 38 → 27), is a note.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from nbdebug.inspectors.run_evidence import Evidence
from nbdebug.inspectors.run_findings_data import recovered
from nbdebug.inspectors.thermometer import diagnose
from tests.unit.test_findings_data import BIG, _codes, _run
from tests.unit.test_findings_loop import linear_labels, train_ce


def test_a_rise_is_measured_on_the_losss_scale_whatever_its_offset() -> None:
    # −cosine from 0.004: up to 0.08 at step 2 (noise on a loss of range ~0.3), then down to −0.3
    ev = Evidence(np.arange(1, 11), np.array([0.004, 0.08, 0.0, -0.1, -0.2, -0.3, -0.2, -0.1, 0.0, 0.003]), np.ones(10))
    assert ev.scale() == 0.304 and ev.loss_rise(1) is None  # 1 + 0.076 / 0.304 = 1.25 < 2 (was 20× its first value)
    # a loss ≥ 0: the factor over its first value, as before
    ev = Evidence(np.arange(1, 6), np.array([2.0, 1.9, 4.5, 1.8, 1.7]), np.ones(5))
    assert ev.scale() == 2.0 and ev.loss_rise(1) == (3, 4.5, 2.25, 2.0, 2.0)
    # a loss that starts negative and rises by 2.5× its size is a rise (was never one: a first loss ≤ 0)
    ev = Evidence(np.arange(1, 6), np.array([-1.0, -1.2, 1.5, -0.5, -0.9]), np.ones(5))
    r = ev.loss_rise(1)
    assert ev.scale() == 1.0 and r is not None and (r.step, r.value, r.factor, r.start, r.scale) == (3, 1.5, 3.5, -1.0, 1.0)
    assert ev.loss_rise(3) is None  # −0.5 is 0.5 × its scale above the start


NEG_COSINE = [0.0045, 0.0768, *np.linspace(0.05, -0.3, 20).tolist(), *np.linspace(-0.3, 0.003, 10).tolist(), *[0.003] * 8]


def test_large_updates_on_a_negative_by_design_loss_near_0_are_a_note() -> None:
    """Adam's first steps on a −cosine loss: the loss wobbles from 0.0045 to 0.077, goes down to −0.3 and back near 0.
    No rise on its scale (the old rule: "rose to 0.0768 (17.1× its first value 0.0045)", an lr_high warning — the run's
    end 0.003 is not ≤ 0.5× 0.0045, so `recovered` did not save it)."""
    rep = diagnose(_run(NEG_COSINE, ratio=BIG))
    assert _codes(rep) == [("update_high", "note")], _codes(rep)
    assert "the loss did not rise" in rep.findings[0].detail
    assert not recovered(Evidence.of(_run(NEG_COSINE).history))  # type: ignore[attr-defined]
    # its twin, the same wobble 10× higher on a loss that never goes negative: still the learning rate
    rep = diagnose(_run([0.05, 0.77, *[0.05] * 38], ratio=BIG))
    assert rep.findings[0].code == "lr_high" and "(15.4× its first value 0.05)" in rep.findings[0].detail, _codes(rep)


@pytest.mark.parametrize("bias", [-1.0, None], ids=["bias_minus_1", "twin"])
def test_a_mostly_silent_relu_layer_is_named_not_the_data(bias: float | None) -> None:
    """MLP 16→64→4, SGD 0.05, 120 steps (REVIEW.md R4, /tmp/rv26/dead2.py): the first bias at −1.0 leaves 96% of the
    hidden ReLU's outputs at 0 (no unit on every sample) and the loss near ln 4 (1.385 → 1.354). The old header: "the
    loss stays at chance … inputs and labels unrelated?". Its twin (the default bias) learns and says nothing."""
    x, y = linear_labels(3)
    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    if bias is not None:
        with torch.no_grad():
            m[0].bias.fill_(bias)
    res = train_ce(m, torch.optim.SGD(m.parameters(), lr=0.05), x, y, 120)
    serious = [(f.code, f.severity) for f in res.findings if f.severity != "note"]
    if bias is None:
        assert serious == []
        return
    assert serious == [("dead", "warning")], serious
    assert res.headline == "`1` (ReLU) is mostly silent: 96% of its outputs are exactly 0 over steps 61–120, and the loss does not fall"
    assert "loss_at_chance" not in [f.code for f in res.findings]


def _dead_codes(loss: list[float]) -> list[tuple[str, str]]:
    return [c for c in _codes(diagnose(_run(loss, dead=0.89))) if c[0] == "dead_units"]


def test_dead_units_are_harmless_only_once_a_classifier_learnt() -> None:
    chance = float(np.log(8))  # the hand-built history's last row is 4×8
    slow = [chance * (1 - 0.15 * i / 39) for i in range(40)]  # falls 15% from chance: `falls()` said learning
    assert Evidence.of(_run(slow).history).chance == chance  # type: ignore[attr-defined]
    assert _dead_codes(slow) == [("dead_units", "warning")]
    learnt = [chance * 0.95 ** i for i in range(40)]  # ends at 0.15× chance
    assert _dead_codes(learnt) == [("dead_units", "note")]
    vae = [38.3 - 11.0 * i / 39 for i in range(40)]  # no classifier at chance: its floor is unknown, a fall of 10% says it
    assert math.isnan(Evidence.of(_run(vae).history).chance)  # type: ignore[attr-defined]
    assert _dead_codes(vae) == [("dead_units", "note")]
