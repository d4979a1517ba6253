"""The loop bugs of issue 26, each run for real on a small model under ``nbdebug.debug`` and checked on
its planted fault AND on its healthy twin (the twin must give no warning or error at all), and
``result.findings`` / ``result.headline`` / ``nbdebug.assert_healthy`` (the Python API)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nbdebug

N, D, C = 512, 16, 4


def linear_labels(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """N random inputs of D features, labelled by the argmax of a random linear map to C classes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g)
    w = torch.randn(D, C, generator=g)
    return x, (x @ w).argmax(1)


def train_ce(model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, steps: int, bs: int = 64) -> Any:
    """The standard classification loop under ``nbdebug.debug``: batches of ``bs`` taken in turn, cross-entropy,
    zero_grad / backward / step; the run's result."""
    with nbdebug.debug(model) as dbg:
        for i in range(steps):
            j = (i * bs) % len(x)
            opt.zero_grad()
            F.cross_entropy(model(x[j:j + bs]), y[j:j + bs]).backward()
            opt.step()
    return dbg.result


def _mlp(seed: int = 0, d_out: int = C) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, d_out))


def _batches(x: torch.Tensor, y: torch.Tensor, steps: int, bs: int = 64) -> Any:
    for i in range(steps):
        j = (i * bs) % N
        yield x[j:j + bs], y[j:j + bs]


def _run(model: nn.Module, loop: Callable[[], None]) -> Any:
    with nbdebug.debug(model) as dbg:
        loop()
    return dbg.result


def _serious(res: Any) -> list[tuple[str, str]]:
    return [(f.code, f.severity) for f in res.findings if f.severity != "note"]


def _root(res: Any) -> str:
    return next((f.code for f in res.findings if f.severity != "note"), "")


def _train(model: nn.Module, opt: Any, steps: int = 40, *, zero: bool = True, order: str = "usual",
           loss_fn: Callable[..., torch.Tensor] = F.cross_entropy, data: Any = None, accumulate: int = 1) -> Callable[[], None]:
    x, y = data if data is not None else linear_labels()

    def loop() -> None:
        for i, (xb, yb) in enumerate(_batches(x, y, steps)):
            if order == "step_first":
                opt.zero_grad()
                opt.step()
                loss_fn(model(xb), yb).backward()
                continue
            if zero and i % accumulate == 0:
                opt.zero_grad()
            loss = loss_fn(model(xb), yb) / accumulate
            loss.backward()
            if order == "zero_between":
                opt.zero_grad()
            if (i + 1) % accumulate == 0:
                opt.step()
    return loop


# -- the false alarm of issue 26: Adam's first steps on a small healthy model ---------------------
def test_a_small_healthy_adam_run_has_no_warning_only_a_note() -> None:
    m = _mlp()
    res = _run(m, _train(m, torch.optim.Adam(m.parameters(), lr=3e-3), steps=60))  # ratios ~2e-2 at first
    assert _serious(res) == [], res.findings
    assert res.headline.startswith("no problems found in 60 steps"), res.headline
    notes = [f for f in res.findings if f.code == "update_high"]
    assert notes and notes[0].severity == "note" and "no harm seen" in notes[0].text  # ratios of ~1e-2 are said, quietly


def test_a_learning_rate_that_wrecks_the_run_is_named_with_its_harm() -> None:
    m = _mlp()
    res = _run(m, _train(m, torch.optim.SGD(m.parameters(), lr=10.0), steps=40))  # (lr=3 still trains this easy task)
    assert _root(res) == "lr_high", res.findings
    lr = next(f for f in res.findings if f.code == "lr_high")
    assert lr.severity == "warning" and "the loss rose to" in lr.detail, lr.detail


# -- gradients never zeroed vs accumulation over 4 micro-batches ----------------------------------
def test_grad_never_zeroed_is_named() -> None:
    m = _mlp()
    res = _run(m, _train(m, torch.optim.SGD(m.parameters(), lr=0.01), zero=False))
    assert _root(res) == "grad_not_zeroed", res.findings
    f = res.findings[0]
    assert f.severity == "error" and "zero_grad" in f.advice and res.headline.startswith("gradients never zeroed")


def test_intentional_accumulation_is_not_a_bug() -> None:
    m = _mlp()
    res = _run(m, _train(m, torch.optim.SGD(m.parameters(), lr=0.05), steps=80, accumulate=4))
    assert _serious(res) == [], res.findings


def test_zeroing_in_place_is_not_a_bug() -> None:
    m = _mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    x, y = linear_labels()

    def loop() -> None:
        for xb, yb in _batches(x, y, 40):
            opt.zero_grad(set_to_none=False)  # the same .grad tensors every step, zeroed: healthy
            F.cross_entropy(m(xb), yb).backward()
            opt.step()
    res = _run(m, loop)
    assert _serious(res) == [], res.findings


# -- parameters no optimizer steps vs a body frozen on purpose -------------------------------------
def test_an_optimizer_of_an_earlier_model_is_named() -> None:
    old, m = _mlp(1), _mlp()
    res = _run(m, _train(m, torch.optim.SGD(old.parameters(), lr=0.05)))
    f = res.findings[0]
    assert (f.code, f.severity) == ("params_not_stepped", "error"), res.findings
    assert f.text == "the optimizer stepped 40 times but holds none of this model's parameters (2 modules got gradients)"


def test_an_optimizer_of_some_parameters_names_the_others() -> None:
    m = _mlp()
    res = _run(m, _train(m, torch.optim.SGD(m[2].parameters(), lr=0.05)))
    f = res.findings[0]
    assert f.code == "params_not_stepped" and f.rows == ("0",), res.findings


def test_a_body_frozen_on_purpose_is_not_a_bug() -> None:
    m = _mlp()
    m[0].requires_grad_(False)
    res = _run(m, _train(m, torch.optim.SGD(m[2].parameters(), lr=0.05)))
    assert _serious(res) == [], res.findings


# -- step() missing, step() before backward(), zero_grad() between backward() and step() -----------
@pytest.mark.parametrize("order", ["step_first", "zero_between"])
def test_parameters_that_never_change_are_named(order: str) -> None:
    m = _mlp()
    res = _run(m, _train(m, torch.optim.Adam(m.parameters(), lr=1e-3), order=order))
    f = res.findings[0]
    assert (f.code, f.severity) == ("no_optimizer_step", "error"), res.findings
    assert f.text == "parameters never changed: the optimizer stepped 40 times with no gradient to apply"


def test_no_step_at_all_with_a_flat_loss_is_named_and_a_working_hand_written_loop_is_not() -> None:
    m = _mlp()
    x, y = linear_labels()

    def forgot() -> None:
        for xb, yb in _batches(x, y, 40):
            m.zero_grad()
            F.cross_entropy(m(xb), yb).backward()
    assert _root(_run(m, forgot)) == "no_optimizer_step"

    m = _mlp()

    def by_hand() -> None:  # a hand-written SGD: no torch.optim, but the loss falls
        for xb, yb in _batches(x, y, 60):
            m.zero_grad()
            F.cross_entropy(m(xb), yb).backward()
            with torch.no_grad():
                for p in m.parameters():
                    p -= 0.5 * p.grad
    res = _run(m, by_hand)
    assert _serious(res) == [], res.findings


# -- the graph cut between two modules vs the same model whole ------------------------------------
class _Cut(nn.Module):
    def __init__(self, cut: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.act, self.head = nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, C)
        self.cut = cut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.body(x))
        if self.cut == "detach":
            h = h.detach()
        elif self.cut == "numpy":
            h = torch.from_numpy(h.detach().numpy())
        return self.head(h)


@pytest.mark.parametrize("cut", ["detach", "numpy"])
def test_a_graph_cut_names_both_modules(cut: str) -> None:
    m = _Cut(cut)
    res = _run(m, _train(m, torch.optim.SGD(m.parameters(), lr=0.05)))
    f = res.findings[0]
    assert (f.code, f.severity, f.rows) == ("graph_cut", "error", ("act", "head")), res.findings
    assert f.text == "the gradient stops between `act` and `head`: `body` got no gradient at any step, though trainable"


def test_the_whole_model_has_no_cut() -> None:
    m = _Cut("")
    res = _run(m, _train(m, torch.optim.SGD(m.parameters(), lr=0.05)))
    assert _serious(res) == [], res.findings


# -- NaN made by the loss vs the same loss computed stably -----------------------------------------
def test_a_nan_made_by_the_loss_is_said_so() -> None:
    m = _mlp()

    def unstable(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(torch.log(torch.softmax(out * 1e3, dim=1)), y)  # log(0) = -inf for a confident miss
    res = _run(m, _train(m, torch.optim.SGD(m.parameters(), lr=0.05), loss_fn=unstable, steps=10))
    assert _root(res) == "nan_in_loss", res.findings
    assert res.findings[0].rows == ("2",) and "the model's output (`2`) was finite" in res.findings[0].text


def test_the_stable_loss_is_quiet() -> None:
    m = _mlp()
    res = _run(m, _train(m, torch.optim.SGD(m.parameters(), lr=0.05),
                         loss_fn=lambda out, y: F.nll_loss(F.log_softmax(out, dim=1), y)))
    assert _serious(res) == [], res.findings


# -- a PyTorch warning that points at a bug: MSE broadcasting (N,) against (N, 1) --------------------
@pytest.mark.parametrize("faulty", [True, False])
def test_the_mse_broadcast_warning_is_a_finding_once(faulty: bool) -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, 1))
    x = torch.randn(N, D)
    t = x[:, :1] * 0.5
    target = t.squeeze(1) if faulty else t
    opt = torch.optim.SGD(m.parameters(), lr=0.05)

    def loop() -> None:
        for i in range(30):
            opt.zero_grad()
            F.mse_loss(m(x[i * 16:(i + 1) * 16]), target[i * 16:(i + 1) * 16]).backward()
            opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # shown every time, as in a fresh kernel
        res = _run(m, loop)
    codes = [f.code for f in res.findings if f.code == "torch_warning"]
    assert codes == (["torch_warning"] if faulty else [])
    if faulty:
        assert "that is different to the input size" in res.findings[0].text and res.findings[0].step == 1


# -- the Python API ---------------------------------------------------------------------------------
def test_assert_healthy_raises_with_the_findings_and_honours_allow() -> None:
    m = _mlp()
    res = _run(m, _train(m, torch.optim.SGD(m.parameters(), lr=0.05), zero=False))
    with pytest.raises(AssertionError) as err:
        nbdebug.assert_healthy(res)
    msg = str(err.value)
    assert msg.startswith("1 finding:\n[error] grad_not_zeroed (step 2): gradients never zeroed"), msg
    nbdebug.assert_healthy(res, allow=["grad_not_zeroed"])  # allowed: passes

    m = _mlp()
    with nbdebug.debug(m) as dbg:
        _train(m, torch.optim.Adam(m.parameters(), lr=1e-3), steps=30)()
    nbdebug.assert_healthy(dbg)  # the debug session itself: its thermometer's findings; notes never fail
    assert dbg.results["thermometer"] is dbg.result and dbg.result.headline.startswith("no problems found")


# -- weight decay that wipes the weights out vs a usual one -----------------------------------------
@pytest.mark.parametrize("wd", [0.5, 5e-4])
def test_weight_decay_that_dominates_is_named_and_a_usual_one_is_not(wd: float) -> None:
    m = _mlp()
    res = _run(m, _train(m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=wd), steps=60))
    if wd > 0.1:
        assert _root(res) == "weight_decay_dominates", res.findings
        assert res.findings[0].text.startswith("the weights shrank: ‖θ‖ of `0` and `2` fell from ")
    else:
        assert _serious(res) == [], res.findings
