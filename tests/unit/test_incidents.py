"""The flight recorder: what an incident holds (inputs, output, parameters, previous step, optimizer
state), its budget, GradScaler-skipped steps (not incidents), loss spikes, NonFiniteError."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from nbdebug.capture import hook_count
from nbdebug.capture.incidents import Incident, LossSpikes, NonFiniteError
from nbdebug.capture.session import Capture


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


def model() -> nn.Sequential:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), Log(), nn.Linear(3, 1))
    with torch.no_grad():
        m[0].weight.copy_(torch.eye(3))
        m[0].bias.zero_()
    return m


def run(m: nn.Module, bad_step: int, steps: int = 5, **kw: object) -> tuple[object, list[torch.Tensor]]:
    opt = torch.optim.Adam(m[2].parameters(), lr=1e-3)  # the Linear before the log keeps its identity
    xs = [torch.rand(2, 3) + 1.0 for _ in range(steps)]
    xs[bad_step - 1][0, 1] = -1.0
    with Capture(m, **kw) as cap:
        for x in xs:
            opt.zero_grad()
            m(x).sum().backward()
            opt.step()
    return cap.result, xs


@pytest.mark.parametrize("device_path", [False, True])
def test_incident_snapshot(device_path: bool) -> None:
    m = model()
    res, xs = run(m, 4, device_path=device_path)
    inc = res.incident
    assert isinstance(inc, Incident) and (inc.step, inc.module, inc.row, inc.phase) == (4, "1", "1", "forward")
    assert torch.equal(inc.inputs[0], xs[3]) and inc.inputs[0].device.type == "cpu"
    assert torch.equal(torch.isnan(inc.output), torch.isnan(torch.log(xs[3])))
    assert inc.params == {}  # a Log has no parameters
    assert inc.previous["mean"] == pytest.approx(float(torch.log(xs[2]).mean()), rel=1e-6)
    assert "step 4: `1` produced NaN from finite inputs; input min -1" in inc.message
    assert res.incidents == [inc]


def test_incident_of_a_layer_with_parameters_has_their_stats_and_optimizer_state() -> None:
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    with torch.no_grad():
        m[0].weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        m[0].bias.zero_()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    with Capture(m) as cap:
        for k in range(3):
            if k == 2:  # what the model and optimizer hold when step 3 starts
                w = m[0].weight.detach().clone()
                exp_avg = float(opt.state[m[0].weight]["exp_avg"].norm())
            opt.zero_grad()
            x = torch.ones(1, 2) * (1e38 if k == 2 else 1.0)  # step 3: the first Linear overflows to inf
            m(x).sum().backward()
            opt.step()
    inc = cap.result.incident
    assert (inc.step, inc.module, inc.phase) == (3, "0", "forward") and "produced Inf" in inc.message
    assert inc.params["weight"]["norm"] == pytest.approx(float(w.norm()), rel=1e-6)
    assert inc.params["weight"]["max"] == pytest.approx(float(w.max()), rel=1e-6)
    assert inc.optimizer["weight"]["lr"] == 1e-3 and inc.optimizer["weight"]["step"] == 2.0
    assert inc.optimizer["weight"]["exp_avg"] == pytest.approx(exp_avg, rel=1e-5)


def test_inputs_beyond_the_budget_are_not_copied() -> None:
    m = model()
    res, _ = run(m, 3, max_bytes=8)
    assert res.incident.step == 3 and res.incident.inputs is None and res.incident.output is None


def test_gradscaler_skipped_steps_are_not_incidents_and_do_not_break() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=1000)
    with Capture(m, break_on="nonfinite") as cap:
        for _ in range(3):
            opt.zero_grad()
            scaler.scale(m(torch.randn(8, 4)).pow(2).mean() * 100).backward()  # inf gradients: skipped
            scaler.step(opt)
            scaler.update()
    res = cap.result
    assert res.skipped_steps.tolist() == [1, 2, 3] and res.series("skipped").tolist() == [1.0, 1.0, 1.0]
    assert res.incidents == [] and res.first_nonfinite_step is None
    assert res.series("2", "grad_inf").max() > 0  # the gradients were inf: shown, not an incident


def test_break_on_on_the_device_path() -> None:
    m = model()
    xs = [torch.rand(2, 3) + 1.0 for _ in range(4)]
    xs[2][1, 2] = -2.0
    with pytest.raises(NonFiniteError) as info:
        with Capture(m, device_path=True, break_on="nonfinite") as cap:
            for x in xs:
                m(x).sum().backward()
    assert (info.value.step, info.value.module, info.value.row) == (3, "1", "1")
    assert isinstance(info.value, FloatingPointError) and hook_count(m) == 0
    assert cap.result.steps == 3 and cap.result.incident.step == 3 and torch.equal(cap.result.incident.inputs[0], xs[2])


def test_loss_spike_detector() -> None:
    s = LossSpikes()
    assert [s.check(v) for v in (1.0, 100.0, 1.0, 1.0, 1.0)] == [None] * 5  # fewer than 5 steps: none
    assert s.check(math.nan) is None
    assert s.check(10.5) == 1.0 and s.check(9.0) is None
    assert np.isclose(s.check(1000.0), 1.0)
