"""Calibrated findings (issue 26): a warning needs harm seen in the run. Hand-built histories with
exact sentences: the same update ratios with a loss that rises (a warning, the rise cited) and with a
loss that falls (a note under a quiet header); a loss that ends at twice its start (the SmolLM2
``Trainer`` at lr 3e-3: mean 8.81 vs 4.13) and its healthy twin; a gradient that blows up before the
updates grow (named as the gradient) and a clipped one whose loss falls (nothing)."""

from __future__ import annotations

import math

import numpy as np

from nbdebug.capture.history import History
from nbdebug.inspectors.findings import headline, live_findings
from nbdebug.inspectors.history import step_flags
from nbdebug.inspectors.run_evidence import Evidence
from nbdebug.inspectors.thermometer import diagnose
from tests.unit.test_history_flags import fields, result_of

ROWS, TYPES, CHAIN = ["0", "1", "2"], ["Linear", "GELU", "Linear"], [(), (0,), (1,)]


def _run(loss: list[float], ratio: list[float], pg: list[float] | None = None) -> object:
    k = len(loss)
    nan = [math.nan] * k
    v = fields(k, 3, update_ratio=[ratio, nan, ratio], param_grad_norm=[pg or [1.0] * k, nan, pg or [1.0] * k])
    h = History.from_arrays(range(1, k + 1), ROWS, v, {"loss": loss},
                            row_info=[{"type": t, "dtype": "float32", "module": r} for r, t in zip(ROWS, TYPES)])
    return result_of(h, TYPES, CHAIN)


def _serious(rep: object) -> list[tuple[str, int]]:
    return [(f.code, f.cause) for f in rep.findings if f.severity != "note"]  # type: ignore[attr-defined]


# Adam's first steps on a big model: every weight moves by about lr (ratio 0.15), then calmer
ADAM = [0.15, 0.12, 0.08, *[0.02] * 7]


def test_large_updates_then_a_loss_that_doubles_is_the_learning_rate() -> None:
    # the wrecked fine-tune: 4.1 at the start, 9.4 by the end
    rep = diagnose(_run([4.1, 5.2, 7.9, 9.3, 9.6, 9.2, 9.5, 9.4, 9.3, 9.4], ADAM))
    assert _serious(rep) == [("lr_high", -1), ("loss_diverged", 0)]
    lr = rep.findings[0]
    assert lr.text == "learning rate too high: update ratio 0.15 at step 1 in `0`"
    assert lr.detail == ("learning rate too high: update ratio 0.15 at step 1 in `0`; ‖Δθ‖/‖θ‖ above 0.01 in `0` and `2` "
                         "from step 1; then the loss rose to 9.6 at step 5 (2.34× its first value 4.1).")
    assert rep.headline == "learning rate too high: update ratio 0.15 at step 1 in `0` → loss 2.28× its start by step 10"


def test_the_same_updates_with_a_falling_loss_are_a_note() -> None:
    # the healthy twin (lr 5e-5 in the issue, here the very same ratios): the loss falls
    rep = diagnose(_run([4.1, 3.9, 3.6, 3.4, 3.3, 3.1, 3.0, 2.9, 2.9, 2.8], ADAM))
    assert _serious(rep) == []
    assert [(f.code, f.severity) for f in rep.findings] == [("update_high", "note")]
    assert rep.headline == "no problems found in 10 steps (1 note below)"
    assert rep.findings[0].text == ("update ratios above 0.01 (rule of thumb ≈ 1e-3) from step 1, up to 0.15 in `0`, "
                                    "with no harm seen")


def test_a_loss_that_doubles_without_update_ratios_is_its_own_finding() -> None:
    nan = [math.nan] * 10
    rep = diagnose(_run([4.0, 4.4, 5.1, 6.0, 7.2, 8.0, 8.5, 8.8, 9.0, 9.1], nan))
    assert _serious(rep) == [("loss_diverged", -1)]
    assert rep.headline == "loss diverged: it ends at 9.05, 2.26× its start (4)"
    # noisy but healthy: a spike back to the start is no divergence
    rep = diagnose(_run([4.0, 3.0, 2.5, 4.1, 2.2, 2.0, 1.9, 3.5, 1.8, 1.7], nan))
    assert _serious(rep) == []


def test_a_gradient_that_blows_up_before_the_updates_grow_is_named_as_the_gradient() -> None:
    k = 12
    pg = [1.0] * 5 + [400.0, 2e3, 5e3, 9e3, 2e4, 3e4, 4e4]
    ratio = [1e-3] * 5 + [0.5] * 7  # the updates grow with it: they follow from it
    loss = [2.0] * 5 + [3.0, 6.0, 9.0, 12.0, 15.0, 18.0, 20.0]
    rep = diagnose(_run(loss, ratio, pg))
    codes = _serious(rep)
    assert codes[0] == ("exploding", -1) and ("lr_high", 0) in codes, codes
    assert rep.findings[0].text == "gradients exploded: norm 566 at step 6, 400× its first steps'"  # √2 · 400: two layers
    assert "clip" in rep.findings[0].advice.lower()
    # the same gradients clipped, the loss falling: nothing to say (the raw norm grows, no harm)
    rep = diagnose(_run([2.0 - 0.1 * i for i in range(k)], [1e-3] * k, pg))
    assert _serious(rep) == []


def test_live_findings_say_what_the_final_ones_say() -> None:
    res = _run([4.1, 5.2, 7.9, 9.3, 9.6, 9.2, 9.5, 9.4, 9.3, 9.4], ADAM)
    h = res.history  # type: ignore[attr-defined]
    final = diagnose(res)
    live = live_findings(h, flags=step_flags(h.values(), TYPES, dtypes=["float32"] * 3))
    assert headline(live) == final.headline
    assert [(f.code, f.severity, f.cause) for f in live] == [(f.code, f.severity, f.cause) for f in final.findings]


def test_evidence_rules_exact() -> None:
    ev = Evidence(np.arange(1, 11), np.array([2.0, 1.9, 4.5, 1.8, 1.7, 1.6, 1.5, 1.5, 1.4, 1.4]), np.ones(10))
    assert ev.loss_rise(1) == (3, 4.5, 2.25, 2.0, 2.0) and ev.loss_rise(3) is None
    assert ev.diverged() is None and ev.falls()
    ev = Evidence(np.arange(1, 5), np.array([1.0, 3.0, 3.0, 3.0]), np.ones(4))
    assert ev.diverged() is None  # fewer than 5 steps with a loss: the run's end is not judged
