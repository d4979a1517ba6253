"""nbdebug.doctor on the bugs a new user tried it on (issue 26): a .detach() between two modules, an
optimizer holding another model's parameters or only some of them, and what the overfit curve says.
Each planted fault with its healthy twin."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_doctor import C, D, digits  # tests/unit is on sys.path: the same digits-like data
from torch import nn

from nbdebug.doctor import doctor
from nbdebug.inspectors.doctor import (
    CHECKS,
    judge_gradient_flow,
    judge_optimizer,
    judge_overfit,
    smoothing_floor,
)


class BodyHead(nn.Module):
    """body → (cut) → head; ``cut``: "" (none), "detach", "numpy", "no_grad"."""

    def __init__(self, cut: str = "", seed: int = 1) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, C)
        self.cut = cut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cut == "no_grad":
            with torch.no_grad():
                h = self.body(x)
        else:
            h = self.body(x)
        if self.cut == "detach":
            h = h.detach()
        elif self.cut == "numpy":
            h = torch.from_numpy(h.detach().numpy())
        return self.head(h)


# -- gradient_flow and batch_independence on a cut graph --------------------------------------------
@pytest.mark.parametrize("cut", ["detach", "numpy", "no_grad"])
def test_a_cut_graph_fails_gradient_flow_naming_the_layers_without_gradient(cut: str) -> None:
    x, y = digits()
    report = doctor(BodyHead(cut), x, y, steps=5)
    flow = report.checks["gradient_flow"]
    assert flow.status == "fail", repr(report)
    assert flow.evidence["no_grad"] == ["body.0", "body.2"] and flow.evidence["layers"] == ["head"]
    assert "`body.0`, `body.2`" in flow.advice and "`head` gets one" in flow.advice
    # the output still changes with the input, but no gradient reaches it: said as such, not "does not depend"
    assert report.checks["input_dependence"].status == "pass"
    bi = report.checks["batch_independence"]
    assert bi.status == "skip" and bi.evidence["own_grad"] == 0.0
    assert "no gradient reaches the input" in bi.advice and "own_grad = 0" in bi.advice
    assert "the output changes with the input" in bi.advice and "does not depend" not in bi.advice


def test_the_uncut_twin_passes_gradient_flow_and_batch_independence() -> None:
    x, y = digits()
    report = doctor(BodyHead(""), x, y, steps=5)
    assert report.checks["gradient_flow"].status == "pass" and "no_grad" not in report.checks["gradient_flow"].evidence
    assert report.checks["batch_independence"].status == "pass"
    assert report.checks["gradient_flow"].evidence["layers"] == ["body.0", "body.2", "head"]


def test_a_frozen_body_is_not_a_missing_gradient() -> None:
    """requires_grad_(False) on purpose: no trainable parameter lacks a gradient, nothing fails."""
    x, y = digits()
    model = BodyHead("")
    model.body.requires_grad_(False)
    report = doctor(model, x, y, optimizer=torch.optim.Adam(model.head.parameters(), lr=1e-2), steps=20)
    assert report.checks["gradient_flow"].status == "pass" and report.checks["optimizer"].status == "pass"
    assert report.checks["gradient_flow"].evidence["layers"] == ["head"] and "no_grad" not in report.checks["gradient_flow"].evidence
    assert report.checks["overfit_batch"].evidence["shape"] == "still falling"  # the head alone learns: it moves


def test_judge_gradient_flow_with_no_gradient_anywhere() -> None:
    out = judge_gradient_flow([], [], ["0", "2"])
    assert out.status == "fail" and "`0`, `2`" in out.advice
    assert judge_gradient_flow([], [], []).status == "skip"


# -- optimizer ----------------------------------------------------------------------------------------
def test_an_optimizer_of_an_earlier_model_fails_by_name() -> None:
    x, y = digits()
    earlier, model = BodyHead(seed=1), BodyHead(seed=2)
    opt = torch.optim.Adam(earlier.parameters(), lr=1e-3)
    report = doctor(model, x, y, optimizer=opt, steps=20)
    check = report.checks["optimizer"]
    assert check.status == "fail" and check.evidence == {"trainable": 6, "in_optimizer": 6, "missing": 6}
    assert "none of this model's 6 trainable" in check.advice
    over = report.checks["overfit_batch"]  # the copy's optimizer updates nothing of the copy
    assert over.status == "fail" and len(set(over.evidence["curve"])) == 1 and over.evidence["moved"] is False
    assert "never moved" in over.advice and "(see optimizer)" in over.advice
    assert report.failed == ["overfit_batch", "optimizer"]
    # the headline names the root (the optimizer), not its consequence (the flat overfit curve)
    assert report.headline == ("optimizer failed: the optimizer holds 6 parameters, none of this model's 6 trainable "
                               "ones (and 1 more failed)")


def test_an_optimizer_of_some_parameters_names_the_missing_ones() -> None:
    x, y = digits()
    model = BodyHead()
    report = doctor(model, x, y, optimizer=torch.optim.Adam(model.head.parameters(), lr=1e-3), steps=5)
    check = report.checks["optimizer"]
    assert check.status == "fail" and check.evidence["missing"] == 4 and check.evidence["trainable"] == 6
    assert check.evidence["not_in_optimizer"] == ["body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias"]
    assert "4 of the model's 6 trainable parameters" in check.advice and "`body.0.weight`" in check.advice


def test_the_optimizer_of_the_model_passes_and_none_given_skips() -> None:
    x, y = digits()
    model = BodyHead()
    report = doctor(model, x, y, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), steps=100)
    assert report.checks["optimizer"].status == "pass" and report.failed == [], repr(report)
    assert report.headline == "nothing failed (9 checks passed)"
    assert list(report.checks) == list(CHECKS)
    skipped = doctor(model, x, y, steps=1).checks["optimizer"]
    assert skipped.status == "skip" and "optimizer=" in skipped.advice
    assert judge_optimizer([], [], 3, True).status == "skip"


# -- overfit_batch: the advice follows the curve --------------------------------------------------------
def _judge(curve: list[float]):
    return judge_overfit(curve, kind="classification", classes=C, reference=math.log(C), steps=len(curve) - 1,
                         batch=8, probabilities=False)


def test_overfit_advice_follows_the_curve() -> None:
    flat = _judge([2.3] * 11)
    assert flat.evidence["moved"] is False and "never moved (2.3 at each of 10 steps" in flat.advice
    rose = _judge([2.3, 2.5, 3.0, 4.0, 6.0])
    assert rose.evidence["shape"] == "rose" and "lower the learning rate" in rose.advice
    falling = _judge([2.3 - 0.1 * k for k in range(11)])
    assert falling.evidence["shape"] == "still falling" and "raise `steps`" in falling.advice
    plateau = _judge([2.3, 1.0, 0.6, 0.5] + [0.45] * 16)
    assert plateau.evidence["shape"] == "flat" and "cannot fit even this batch" in plateau.advice
    barely = _judge([2.3 - 1e-4 * k for k in range(11)])
    assert barely.evidence["shape"] == "barely moved" and "raise the learning rate" in barely.advice
    assert len({flat.advice, rose.advice, falling.advice, plateau.advice, barely.advice}) == 5


def test_overfit_on_a_relu_on_the_logits_flattens_and_its_twin_passes() -> None:
    x, y = digits()
    torch.manual_seed(3)
    body = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, C))
    faulty = doctor(nn.Sequential(body, nn.ReLU()), x, y, loss_fn=F.cross_entropy, steps=150)
    over = faulty.checks["overfit_batch"]
    assert over.status == "fail" and over.evidence["shape"] == "flat" and "no ReLU" in over.advice
    assert doctor(body, x, y, loss_fn=F.cross_entropy, steps=150).checks["overfit_batch"].status == "pass"


def test_label_smoothing_moves_the_overfit_target_to_its_floor() -> None:
    """CrossEntropyLoss(label_smoothing=0.1) cannot go below the smoothed target's entropy (0.500 for C=10):
    the healthy recipe passes once the target is that floor + 5% of ln C; without smoothing it is unchanged."""
    assert smoothing_floor(0.1, 10) == pytest.approx(-(0.91 * math.log(0.91)) - 9 * 0.01 * math.log(0.01))
    assert smoothing_floor(0.0, 10) == 0.0
    x, y = digits()
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, C))
    report = doctor(model, x, y, loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1), steps=150)
    over = report.checks["overfit_batch"]
    assert over.status == "pass", repr(report)
    assert over.evidence["target"] == pytest.approx(smoothing_floor(0.1, C) + 0.05 * math.log(C))
    assert min(over.evidence["curve"]) > smoothing_floor(0.1, C)  # never below the floor: the old target was unreachable
    plain = doctor(model, x, y, loss_fn=nn.CrossEntropyLoss(), steps=5).checks["overfit_batch"]
    assert plain.evidence["target"] == pytest.approx(0.05 * math.log(C)) and "smoothing_floor" not in plain.evidence
