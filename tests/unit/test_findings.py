"""The thermometer's findings, ranked root cause first, and the header sentence they make (issue 22):
hand-built histories with exact sentences, the ranking rules one by one, advice said once, live
findings equal to the final ones, and single-step captures (the header is the first diagnosis)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from nbdebug.capture.history import History
from nbdebug.capture.incidents import Incident
from nbdebug.capture.session import Capture
from nbdebug.inspectors.findings import headline, live_findings
from nbdebug.inspectors.history import step_flags
from nbdebug.inspectors.thermometer import diagnose
from tests.unit.test_history_flags import MLP_CHAIN, MLP_TYPES, fields, mlp_history, result_of


def _spike(step: int, value: float) -> Incident:
    return Incident("loss_spike", step, None, None, None, f"step {step}: loss {value:g} is big", value=value, median=1.0)


def _nan(step: int, row: str) -> Incident:
    return Incident("nonfinite", step, row, row, "forward", f"step {step}: `{row}` produced Inf from finite inputs")


def test_the_issue_run_header_is_the_root_cause_then_the_death() -> None:
    # the issue's numbers: update ratios 0.04–0.15 at step 1 in `0`, `2`, `4`, healthy after; `3` dead from step 27
    calm = [7.02e-4] * 29
    h = mlp_history({"0": [0.04, *calm], "2": [0.15, *calm], "4": [0.09, *calm]}, dead_from=27)
    rep = diagnose(result_of(h, MLP_TYPES, MLP_CHAIN))
    # the cited ratio is the largest at step 1 among the layers feeding the dead one (`4` comes after it)
    assert rep.headline == "learning rate too high: update ratio 0.15 at step 1 in `2` → `3` dead from step 27"
    assert [(f.code, f.step, f.cause) for f in rep.findings] == [("lr_high", 1, -1), ("became_dead", 27, 0)]
    lr, dead = rep.findings
    assert lr.rows == ("0", "2", "4") and dead.rows == ("3",)
    assert lr.detail == ("learning rate too high: update ratio 0.15 at step 1 in `2`; ‖Δθ‖/‖θ‖ above 0.01 "
                         "in `0`, `2` and `4` from step 1.")
    assert "Lower the learning rate" in lr.advice and dead.advice == ""  # the cause's advice is the fix: said once
    assert rep.summary.startswith("step 30: 5 layers: dead units in 1 layer (`3`) from step 27")  # the table's step


def test_a_death_with_in_range_updates_stands_on_its_own() -> None:
    h = mlp_history({"0": [1e-3] * 30, "2": [5e-3] * 30, "4": [0.5] * 30}, dead_from=27)  # only `4`, after it
    rep = diagnose(result_of(h, MLP_TYPES, MLP_CHAIN))
    codes = [(f.code, f.severity, f.cause) for f in rep.findings]
    # the large ratios of `4` come after the dead `3` and no harm follows them: a note, not a cause (issue 26)
    assert codes == [("became_dead", "warning", -1), ("update_high", "note", -1)], codes
    assert rep.headline == "`3` dead from step 27"
    assert rep.findings[0].advice.startswith("No update before it was too large")


def _nan_run(spikes: list[Incident]) -> object:
    """`0` → `1`: update ratios too large from step 1, an Inf in `1` at step 6 (from finite inputs)."""
    k = 8
    v = fields(k, 2, update_ratio=[[0.3] * k, [math.nan] * k],
               inf=[[0] * k, [0] * 5 + [3] * 3], nan=[[0] * k, [0] * k])
    h = History.from_arrays(range(1, k + 1), ["0", "1"], v, {"loss": [2.0] * k},
                            row_info=[{"type": "Linear", "dtype": "float32"}, {"type": "Log", "dtype": "float32"}])
    return result_of(h, ["Linear", "Log"], [(), (0,)], forward_nonfinite_call=(1, True), forward_nonfinite_step=6,
                     incidents=[*spikes, _nan(6, "1")])


def test_a_nan_after_loss_spikes_follows_from_the_too_large_updates() -> None:
    rep = diagnose(_nan_run([_spike(3, 40.0), _spike(4, 900.0)]))
    assert [(f.code, f.cause) for f in rep.findings] == [("lr_high", -1), ("loss_spike", 0), ("nonfinite", 1)]
    assert rep.headline == ("learning rate too high: update ratio 0.3 at step 1 in `0` → loss spikes from step 3, "
                            "first NaN/Inf at step 6 in `1`")
    assert rep.findings[1].detail == "loss spikes (over 10× the running median) at 2 steps from step 3 (largest 900 at step 4)."
    assert rep.findings[2].detail == "step 6: `1` produced Inf from finite inputs."


def test_a_nan_without_spikes_is_its_own_root_and_ranks_first() -> None:
    # a numerical bug (log of an underflowed softmax), not a divergence: errors rank before warnings
    rep = diagnose(_nan_run([]))
    # the large ratios alone (no loss rise, no spike) are a note under it, not a second finding (issue 26)
    assert [(f.code, f.severity, f.cause) for f in rep.findings] == [("nonfinite", "error", -1), ("update_high", "note", -1)]
    assert rep.headline == "first non-finite value at step 6, in `1` (forward)"
    assert rep.findings[0].severity == "error" and "log/sqrt/division" in rep.findings[0].advice


def test_each_piece_of_advice_once_and_karpathy_once() -> None:
    rep = diagnose(_nan_run([_spike(3, 40.0)]))
    advice = [f.advice for f in rep.findings if f.advice]
    assert len(advice) == len(set(advice))
    assert sum("Karpathy" in a for a in advice) == 1
    # and the same texts as the events and the diagnoses at a step: the views drop a repeat by its text
    texts = {e.suggestion for e in rep.events} | {d.suggestion for d in rep.diagnoses}
    # (the per-step flag and event of a ratio above 1e-2 say no harm was seen from it; the finding, with its
    # harm, says lower the learning rate: its own text)
    assert all(a in texts or a.startswith("Lower the learning rate") or "log/sqrt" in a for a in advice)


def test_live_findings_say_what_the_final_report_says() -> None:
    calm = [7.02e-4] * 29
    h = mlp_history({"0": [0.04, *calm], "2": [0.15, *calm], "4": [0.09, *calm]}, dead_from=27)
    final = diagnose(result_of(h, MLP_TYPES, MLP_CHAIN))
    bits = step_flags(h.values(), MLP_TYPES, dtypes=["float32"] * 5)
    live = live_findings(h, flags=bits)
    assert headline(live) == final.headline
    assert [(f.code, f.step, f.cause, f.text) for f in live] == [(f.code, f.step, f.cause, f.text) for f in final.findings]


def test_single_step_header_is_the_first_diagnosis() -> None:
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
    with torch.no_grad():
        m[2].bias.fill_(-100.0)  # `3` dead
    with Capture(m) as cap:
        m(torch.randn(16, 8)).sum().backward()
    rep = diagnose(cap.result)
    assert rep.step is None and rep.summary == "4 layers: 1 dead layer (`3`)"
    assert rep.headline == "`3` (ReLU) outputs 100.0% exact zeros: its units are dead and pass no gradient"
    assert [f.code for f in rep.findings] == [d.code for d in rep.diagnoses]


def test_a_clean_run_says_so() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)  # update ratios ~1e-3: healthy
    with Capture(m) as cap:
        for _ in range(3):
            opt.zero_grad()
            m(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
    rep = diagnose(cap.result)
    assert rep.findings == [] and rep.headline == "no problems found in 3 steps"
    assert rep.summary == "step 3: 2 layers: no problems found"


@pytest.mark.parametrize("n", [1, 4])
def test_grouped_spikes_are_one_finding(n: int) -> None:
    rep = diagnose(_nan_run([_spike(2 + i, 50.0 * (i + 1)) for i in range(n)]))
    spikes = [f for f in rep.findings if f.code == "loss_spike"]
    assert len(spikes) == 1 and spikes[0].step == 2
    assert spikes[0].short == ("loss spike at step 2" if n == 1 else "loss spikes from step 2")
    assert [f.code for f in rep.findings] == ["lr_high", "loss_spike", "nonfinite"]
