"""Thermometer diagnoses on models built to have exactly one problem."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nbdebug.capture.session import Capture
from nbdebug.inspectors.thermometer import Thresholds, diagnose


def run(model: nn.Module, x: torch.Tensor, backward: bool = True, **kw):  # type: ignore[no-untyped-def]
    model.zero_grad(set_to_none=True)  # .grad accumulates: each run starts clean, like a training step
    with Capture(model) as cap:
        y = model(x)
        if backward:
            y.sum().backward()
    return diagnose(cap.result, kw.get("thresholds"))


def small_cnn(dead_bias: float | None = None) -> nn.Sequential:
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 10),
    )
    if dead_bias is not None:
        with torch.no_grad():
            m[2].bias.fill_(dead_bias)
    return m


def test_healthy_model_has_no_flags() -> None:
    rep = run(small_cnn(), torch.randn(4, 3, 8, 8))
    assert all(not f for f in rep.flags), rep.flags
    assert rep.summary.endswith("no problems found")


def test_dead_relu_is_flagged_and_only_it() -> None:
    rep = run(small_cnn(dead_bias=-10.0), torch.randn(4, 3, 8, 8))
    assert rep.flagged("dead") == ["3"]  # the ReLU after the conv with bias -10; not the pool after it
    d = next(d for d in rep.diagnoses if d.code == "dead")
    assert "100.0% exact zeros" in d.message and "Kaiming" in d.suggestion
    assert "1 dead layer (3)" in rep.summary
    # Gradients stop at the dead layer: exactly zero upstream, which is not a second "vanishing" finding.
    assert rep.flagged("vanishing") == []


def test_dead_threshold_is_configurable() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with torch.no_grad():
        m[0].weight.zero_()
        m[0].bias.copy_(torch.tensor([-1.0, -1.0, -1.0, 1.0]))  # 75% zeros
    x = torch.randn(5, 4)
    assert run(m, x, backward=False).flagged("dead") == []
    assert run(m, x, backward=False, thresholds=Thresholds(dead=0.7)).flagged("dead") == ["1"]


class LogLayer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class SqrtLayer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


def test_forward_nan_origin_is_first_layer_with_finite_inputs() -> None:
    m = nn.Sequential(nn.Linear(3, 3), LogLayer(), nn.Linear(3, 3), nn.ReLU())
    with torch.no_grad():
        m[0].weight.copy_(torch.eye(3))
        m[0].bias.zero_()
    x = torch.tensor([[1.0, -1.0, 2.0]])
    rep = run(m, x, backward=False)
    assert rep.flagged("nan_origin_fwd") == ["1"]
    assert rep.flagged("nonfinite") == ["2", "3"]  # inherited, not origins
    assert "NaN first appears in `1` (forward)" in rep.summary


def test_nan_already_in_input_is_not_blamed_on_a_layer() -> None:
    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    rep = run(m, torch.tensor([[float("nan"), 1.0]]), backward=False)
    d = next(d for d in rep.diagnoses if d.code == "nan_origin_fwd")
    assert d.layer == "0" and "input was already non-finite" in d.message


def test_backward_only_nan_origin_is_named_separately() -> None:
    # Forward is finite: sqrt(0) = 0. Backward: d sqrt/dx at 0 = inf reaches the ReLU's output;
    # ReLU's backward zeroes it again (threshold_backward), so layer 0's gradient is finite.
    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), SqrtLayer(), nn.Linear(2, 1))
    with torch.no_grad():
        m[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        m[0].bias.zero_()
    x = torch.tensor([[-1.0, 4.0]])
    rep = run(m, x)
    assert rep.flagged("nan_origin_fwd") == []
    assert rep.flagged("nan_origin_bwd") == ["2"]  # the SqrtLayer's backward made the gradient inf
    assert "NaN first appears in `2` (backward)" in rep.summary
    assert rep.flags[1] == ["nonfinite"] and rep.flags[0] == []


def test_exploding_and_vanishing_thresholds() -> None:
    # By hand: x = 1, h0 = W0·x = 4, out = W1·h0; d(sum out)/d out = 1, d/d h0 = W1ᵀ1 = 4e4 each.
    # Activation-gradient norms: layer 1: 2, layer 0: 8e4. Parameter-gradient norms:
    # dW1 = 1 ⊗ h0 (all 4): 16; dW0 = (W1ᵀ1) ⊗ x (all 4e4): 1.6e5.
    m = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    with torch.no_grad():
        m[0].weight.fill_(1.0)
        m[1].weight.fill_(1e4)
    rep = run(m, torch.ones(1, 4))
    assert rep.column("grad_norm")[1] == pytest.approx(2.0)
    assert rep.column("grad_norm")[0] == pytest.approx(8e4, rel=1e-5)
    assert rep.column("param_grad_norm")[1] == pytest.approx(16.0)
    assert rep.column("param_grad_norm")[0] == pytest.approx(1.6e5, rel=1e-5)
    assert rep.flagged("exploding") == ["0"]
    assert rep.grad_ratio == pytest.approx(4e4)
    rep2 = run(m, torch.ones(1, 4), thresholds=Thresholds(exploding=1e6, vanishing=20.0))
    assert rep2.flagged("exploding") == [] and rep2.flagged("vanishing") == ["1"]
    with torch.no_grad():
        m[1].weight.fill_(1e-6)
    rep3 = run(m, torch.ones(1, 4))
    assert any(d.code == "vanishing" and d.layer == "" for d in rep3.diagnoses)
    assert "vanishing gradients" in rep3.summary


def test_saturated_tanh() -> None:
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
    with torch.no_grad():
        m[0].weight.mul_(1000)
    rep = run(m, torch.randn(16, 4), backward=False)
    assert rep.flagged("saturated") == ["1"]


def test_no_backward_note() -> None:
    rep = run(small_cnn(), torch.randn(1, 3, 8, 8), backward=False)
    assert any("no backward ran" in n for n in rep.notes)


def test_dead_units_in_one_step() -> None:
    # 3 of 4 channels get a bias of -100: zero at every position of every sample (75% of units dead),
    # while the layer as a whole is not dead (75% zeros < 99%).
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1))
    with torch.no_grad():
        m[0].weight.mul_(0.01)
        m[0].bias.copy_(torch.tensor([-100.0, -100.0, -100.0, 1.0]))
    rep = run(m, torch.randn(2, 3, 6, 6))
    assert rep.column("dead_unit_frac")[1] == pytest.approx(0.75)
    assert rep.flags[1] == ["dead_units"] and rep.flagged("dead") == []
    d = next(d for d in rep.diagnoses if d.code == "dead_units")
    assert d.layer == "1" and "75% of its units are zero for every sample" in d.message
    assert "dead units in 1 layer (1)" in rep.summary
    assert rep.flags[0] == [] and rep.flags[2] == []  # nothing else: the conv after them reads 1 live channel
