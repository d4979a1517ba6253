"""Thermometer diagnoses on models built to have exactly one problem."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nbdebug.capture.session import Capture
from nbdebug.inspectors.history import FLAG_BITS
from nbdebug.inspectors.thermometer import ThermometerReport, Thresholds, diagnose


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
    assert "1 dead layer (`3`)" in rep.summary  # a module name as a name, never a bare number
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
    assert rep.summary == "4 layers: NaN first appears in `1` (forward)"


def test_nan_already_in_input_is_not_blamed_on_a_layer() -> None:
    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    rep = run(m, torch.tensor([[float("nan"), 1.0]]), backward=False)
    assert rep.flagged("nan_origin_fwd") == [] and rep.flags == [["nonfinite"], ["nonfinite"]]
    assert [(d.code, d.layer, d.message) for d in rep.diagnoses] == [
        ("nonfinite", "0", "NaN/Inf comes from the model's input: `0` (Linear), the first layer to see it, was given a non-finite input."),
    ]
    assert "torch.isfinite(x).all()" in rep.diagnoses[0].suggestion
    assert rep.summary == "2 layers: NaN comes from the model's input (first seen in `0`)"


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
    assert rep.summary == "4 layers: NaN first appears in `2` (backward)"
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
    assert "dead units in 1 layer (`1`)" in rep.summary
    assert rep.flags[0] == [] and rep.flags[2] == []  # nothing else: the conv after them reads 1 live channel


# -- a NaN at step 3 of a 4-step loop, through a real Capture: where it came from, at every step choice
def log_model() -> nn.Sequential:
    """`a` (Linear, identity) → `b` (Log) → `c` (Linear, weights 1): log of a negative value is NaN."""
    m = nn.Sequential()
    m.add_module("a", nn.Linear(2, 2))
    m.add_module("b", LogLayer())
    m.add_module("c", nn.Linear(2, 1))
    with torch.no_grad():
        m.a.weight.copy_(torch.eye(2))
        m.a.bias.zero_()
        m.c.weight.fill_(1.0)
        m.c.bias.zero_()
    return m


def loop(m: nn.Module, bad: torch.Tensor, requires_grad: bool = False):  # type: ignore[no-untyped-def]
    """4 steps (forward + backward, gradients cleared like a training loop); step 3's input is ``bad``."""
    with Capture(m) as cap:
        for k in range(1, 5):
            m.zero_grad(set_to_none=True)
            x = (bad if k == 3 else torch.full((1, 2), float(k + 1))).clone().requires_grad_(requires_grad)
            m(x).sum().backward()
    m.zero_grad(set_to_none=True)
    return cap.result


def told(rep: ThermometerReport) -> list[tuple[str, str, str]]:
    return [(d.code, d.layer, d.message) for d in rep.diagnoses]


ORIGINS = FLAG_BITS["nan_origin_fwd"] | FLAG_BITS["nan_origin_bwd"]


def test_nan_from_the_input_at_step_3_names_no_layer_as_origin() -> None:
    res = loop(log_model(), torch.tensor([[float("nan"), 2.0]]))
    # the capture's per-call check: `a`'s input was non-finite; the gradient of the NaN flows back too
    assert res.forward_nonfinite_call == (0, False) and res.forward_nonfinite_step == 3 == res.backward_nonfinite_step
    assert res.incident.message == "step 3: `a` produced NaN from a non-finite input"
    came = "NaN/Inf at step 3 comes from the model's input: `a` (Linear), the first layer to see it, was given a non-finite input."
    at3 = diagnose(res, step=3)
    assert at3.step == 3 and at3.flags == [["nonfinite"], ["nonfinite"], ["nonfinite"]]
    assert told(at3) == [("nonfinite", "a", came)]
    assert at3.summary == "step 3: 3 layers: first non-finite value at step 3, from the model's input (first seen in `a`)"
    assert not (at3.history_flags & ORIGINS).any()  # no origin at any step, forward or backward
    last = diagnose(res)
    assert last.step == 4 and last.flags == [[], [], []]
    assert told(last) == [("nonfinite", "a", "NaN/Inf first appeared at step 3 from the model's input (first seen in `a`); "
                                             "step 4 is finite again (choose step 3 to see where it came from).")]
    assert "torch.isfinite(x).all()" in last.diagnoses[0].suggestion
    assert last.summary == "step 4: 3 layers: first non-finite value at step 3, from the model's input (first seen in `a`)"
    whole = diagnose(res, step="run")
    assert whole.step is None and whole.flags == [["nonfinite"], ["nonfinite"], ["nonfinite"]]
    assert told(whole) == [("nonfinite", "a", came)]
    assert whole.summary == "3 layers: first non-finite value at step 3, from the model's input (first seen in `a`)"


def test_nan_made_by_a_layer_at_step_3_is_its_forward_origin() -> None:
    res = loop(log_model(), torch.tensor([[1.0, -1.0]]))  # log(-1): `b` makes NaN from finite inputs
    assert res.forward_nonfinite_call == (1, True) and res.forward_nonfinite_step == 3
    assert res.backward_nonfinite_step is None  # d log/dx = 1/x = -1: the output gradients stay finite
    at3 = diagnose(res, step=3)
    assert at3.flags == [[], ["nan_origin_fwd"], ["nonfinite"]]
    assert told(at3) == [("nan_origin_fwd", "b", "`b` (LogLayer) outputs NaN/Inf at step 3 while its inputs were finite.")]
    assert at3.summary == "step 3: 3 layers: first non-finite value at step 3, in `b` (forward)"
    last = diagnose(res)
    assert last.flags == [[], [], []]
    assert told(last) == [("nonfinite", "b", "NaN/Inf first appeared at step 3 in `b` (forward); "
                                             "step 4 is finite again (choose step 3 to see where it came from).")]
    assert last.summary == "step 4: 3 layers: first non-finite value at step 3, in `b` (forward)"
    whole = diagnose(res, step="run")
    assert whole.flags == [[], ["nan_origin_fwd"], ["nonfinite"]]
    assert told(whole) == [("nan_origin_fwd", "b", "NaN/Inf first appears at step 3 in the output of `b` (LogLayer) in the forward "
                                                   "pass; its inputs were finite.")]
    assert whole.summary == "3 layers: first non-finite value at step 3, in `b` (forward)"


def test_backward_only_nan_at_step_3_is_its_backward_origin() -> None:
    m = log_model()
    m.b = SqrtLayer()  # sqrt(0) = 0 forward; d sqrt/dx at 0 = inf in its backward
    res = loop(m, torch.tensor([[0.0, 4.0]]))
    assert res.forward_nonfinite_call is None and res.backward_nonfinite_step == 3 == res.first_nonfinite_step
    assert res.first_nonfinite_phase == "output_grad" and res.layers[res.backward_origin_row].name == "b"
    at3 = diagnose(res, step=3)
    # `a`'s output gradient is inf: non-finite, and an inf norm is above the exploding threshold
    assert at3.flags == [["nonfinite", "exploding"], ["nan_origin_bwd"], []]
    assert told(at3)[0] == ("nan_origin_bwd", "b", "Backward: the gradient becomes NaN/Inf at step 3 in or just after `b` (SqrtLayer).")
    assert at3.summary == "step 3: 3 layers: first non-finite value at step 3, in `b` (backward), exploding gradients in 1 layer"
    last = diagnose(res)
    assert last.flags == [[], [], []]
    assert told(last) == [("nonfinite", "b", "NaN/Inf first appeared at step 3 in `b` (backward); "
                                             "step 4 is finite again (choose step 3 to see where it came from).")]
    assert "backward of this layer" in last.diagnoses[0].suggestion
    assert last.summary == "step 4: 3 layers: first non-finite value at step 3, in `b` (backward)"
    whole = diagnose(res, step="run")
    assert whole.flags[1] == ["nan_origin_bwd"] and not any("nan_origin_fwd" in f for f in whole.flags)
    assert told(whole)[0] == ("nan_origin_bwd", "b", "Backward: the gradient first becomes NaN/Inf at step 3 in the backward of "
                                                     "`b` (SqrtLayer): finite gradient at its output, non-finite at its input.")
    assert whole.summary.startswith("3 layers: first non-finite value at step 3, in `b` (backward)"), whole.summary


class LogBetween(nn.Module):
    """`a` → torch.log in the parent's forward (no module) → `b`."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 1)
        with torch.no_grad():
            self.a.weight.copy_(torch.eye(2))
            self.a.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.log(self.a(x)))


def test_nan_made_between_captured_modules_is_not_called_the_model_input() -> None:
    res = loop(LogBetween(), torch.tensor([[1.0, -1.0]]))
    assert res.forward_nonfinite_call == (1, False)  # `b` saw it first, in its input; `a`'s output was finite
    msg = ("NaN/Inf at step 3 was already in the input of `b` (Linear), the first layer to see it: it comes from the "
           "model's input or from code between captured modules.")
    for step in (3, "run"):
        rep = diagnose(res, step=step)
        assert rep.flags == [[], ["nonfinite"]] and told(rep) == [("nonfinite", "b", msg)]
        assert rep.summary.endswith("2 layers: first non-finite value at step 3, before `b` (its input was already non-finite)")
    assert diagnose(res).summary == "step 4: 2 layers: first non-finite value at step 3, before `b` (its input was already non-finite)"


def test_a_later_nan_in_a_row_nothing_captured_feeds_is_not_said_to_have_finite_inputs() -> None:
    # the NaN input stays from step 3 on: at step 4 the history alone cannot tell input from weights
    m = log_model()
    bad = torch.tensor([[float("nan"), 2.0]])
    with Capture(m) as cap:
        for k in range(1, 5):
            m(bad if k >= 3 else torch.full((1, 2), float(k + 1)))
    rep = diagnose(cap.result)
    assert rep.step == 4 and rep.flags == [["nan_origin_fwd"], ["nonfinite"], ["nonfinite"]]
    assert told(rep) == [("nan_origin_fwd", "a", "`a` (Linear) outputs NaN/Inf at step 4; no captured layer feeds it: its input "
                          "(the model's input?) or its weights hold NaN/Inf. The first non-finite value was at step 3, from the "
                          "model's input (first seen in `a`): the weights may hold NaN since.")]
    assert diagnose(cap.result, step=3).flags == [["nonfinite"], ["nonfinite"], ["nonfinite"]]


def test_units_dead_below_a_dead_layer_are_its_consequence_not_a_finding() -> None:
    """Below a fully dead ReLU every input is constant, so a later ReLU whose units get a negative
    constant is zero for every sample: not flagged (whole run, and at every step of a loop)."""
    from nbdebug.capture.session import Capture

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
    with torch.no_grad():
        model[0].bias.fill_(-10.0)  # ReLU `1` dead
        model[2].bias.copy_(torch.tensor([-1.0, 1.0] * 4))  # constant input → half of ReLU `3`'s units 0
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with Capture(model) as cap:
        for _ in range(3):
            model(torch.randn(16, 6) * 0.1).sum().backward()
            opt.step()
            opt.zero_grad()
    res = cap.result
    assert res["3"].stats["dead_unit_frac"] == 0.5  # the fact is measured…
    for step in (None, 2, "run"):
        rep = diagnose(res, step=step)
        flags = dict(zip(rep.names, rep.flags))
        assert flags["1"] == ["dead"] and flags["3"] == [], (step, flags)  # …but only the dead layer is flagged
