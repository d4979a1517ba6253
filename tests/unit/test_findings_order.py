"""``unshuffled`` (issue 26: data not shuffled, each batch one class) and the statistic it reads: the batch's
class make-up from the gradient of the model's classifier output (``class_share`` / ``class_top`` in the
history, nbdebug/capture/classes.py). Planted faults run for real with their shuffled twins, the healthy runs
built to fool the rule, exact values on a hand-built run, absence where there is no such gradient, and the
capture's one transfer per step kept."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nbdebug
from nbdebug.capture.classes import batch_classes
from nbdebug.capture.session import Capture
from nbdebug.inspectors.findings import build
from nbdebug.inspectors.run_evidence import Finding
from nbdebug.inspectors.run_findings_order import order_causes, unshuffled
from tests.unit.test_capture_syncs import DispatchSpy, count_host_syncs, deep

C, D = 6, 12


def blobs(n_per: int, seed: int = 0, sort: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``n_per`` samples of each of C Gaussian blobs in D dimensions, class after class (``sort``) or shuffled."""
    g = torch.Generator().manual_seed(seed)
    centres = 2.0 * torch.randn(C, D, generator=g)
    y = torch.arange(C).repeat_interleave(n_per)
    x = centres[y] + torch.randn(len(y), D, generator=g)
    if not sort:
        p = torch.randperm(len(y), generator=g)
        x, y = x[p], y[p]
    return x, y


def mlp(seed: int = 0, d_in: int = D, d_out: int = C) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, 32), nn.ReLU(), nn.Linear(32, d_out))


def run(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, bs: int, *, shuffle: bool,
        lr: float = 0.05, seed: int = 0) -> Any:
    """SGD + momentum on batches of ``bs`` read in order, or from a fresh permutation each epoch (``shuffle``)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    order, at = torch.arange(len(y)), len(y)
    with nbdebug.debug(model) as dbg:
        for _ in range(steps):
            if at + bs > len(y):
                order, at = (torch.randperm(len(y), generator=g) if shuffle else torch.arange(len(y))), 0
            i = order[at:at + bs]
            at += bs
            opt.zero_grad()
            F.cross_entropy(model(x[i]), y[i]).backward()
            opt.step()
    return dbg.result


def serious(res: Any) -> list[tuple[str, str]]:
    return [(f.code, f.severity) for f in res.findings if f.severity != "note"]


# -- the finding on real runs -------------------------------------------------------------------------
def test_a_loop_over_data_sorted_by_class_is_named_at_its_first_step_and_its_shuffled_twin_is_quiet() -> None:
    x, y = blobs(40)  # 40 per class, batches of 16: classes 0,0,(0|1),1,1,(1|2),...
    res = run(mlp(), x, y, 60, 16, shuffle=False)
    f = next(f for f in res.findings if f.code == "unshuffled")
    assert f.severity == "warning" and f.step == 1 and res.findings[0].code == "unshuffled"
    share, top = res.series("class_share"), res.series("class_top")
    assert np.array_equal(share[:3], [1.0, 1.0, 0.5]) and np.array_equal(top[:3], [0, 0, 0])  # batch 3: 8 of class 0, 8 of 1
    assert "class 0 at step 1–3" not in f.text and "class 0 at step 1–2, class 1 at step 4–5" in f.text
    assert "shuffle=True" in f.advice and "changed" in f.text
    twin = run(mlp(), x, y, 60, 16, shuffle=True)
    assert "unshuffled" not in [c for c, _ in serious(twin)] and not any(f.code == "unshuffled" for f in twin.findings)
    assert np.nanmax(twin.series("class_share")) < 0.9


def test_healthy_shuffled_runs_made_to_fool_it_stay_quiet() -> None:
    # batches of 4 of 6 classes: now and then a batch of one class, by chance
    x, y = blobs(60, seed=1, sort=False)
    tiny = run(mlp(1), x, y, 150, 4, shuffle=True, lr=0.02)
    share = tiny.series("class_share")
    assert (share >= 0.75).any() and not any(f.code == "unshuffled" for f in tiny.findings)
    # binary data at 90/10, shuffled: most batches nearly all class 0, the same class every time
    g = torch.Generator().manual_seed(2)
    yb = (torch.rand(1200, generator=g) < 0.1).long()
    xb = torch.randn(1200, D, generator=g) + yb[:, None].float()
    imb = run(mlp(2, d_out=2), xb, yb, 100, 8, shuffle=True)
    share, top = imb.series("class_share"), imb.series("class_top")
    assert (share >= 0.9).mean() > 0.3 and set(top[share >= 0.9].tolist()) == {0.0}
    assert not any(f.code == "unshuffled" for f in imb.findings)


def test_a_head_predicting_one_class_for_every_batch_reads_the_labels_not_the_predictions() -> None:
    x, y = blobs(60, seed=3, sort=False)
    m = mlp(3)
    with torch.no_grad():
        m[-1].bias[2] += 30.0  # every sample predicted 2, softmax saturated at 1 for it
    res = run(m, x, y, 40, 32, shuffle=True, lr=0.001)
    assert np.nanmax(res.series("class_share")) < 0.6 and not any(f.code == "unshuffled" for f in res.findings)


# -- the statistic's exact values -------------------------------------------------------------------
def test_the_statistic_on_a_hand_built_two_step_run() -> None:
    """Linear(2 → 3) with known weights: step 1's batch has labels [0, 0, 1, 2] (share 2/4, class 0); step 2's
    labels [2, 2, 2, 1] where the first sample's softmax is exactly 1 at its label (gradient 0 there, the others
    positive: still its label) and the last is fed with logits that tie (one negative entry) → 3/4, class 2."""
    lin = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]))
    batches = [(torch.tensor([[1.0, 0.0], [0.0, 0.0], [2.0, 1.0], [0.5, 0.5]]), torch.tensor([0, 0, 1, 2])),
               (torch.tensor([[-10.0, -10.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]), torch.tensor([2, 2, 2, 1]))]
    opt = torch.optim.SGD(lin.parameters(), lr=0.0)
    grads = []
    with nbdebug.debug(lin) as dbg:
        for x, y in batches:
            opt.zero_grad()
            out = lin(x)
            out.retain_grad()
            F.cross_entropy(out, y).backward()
            grads.append(out.grad.clone())
            opt.step()
    assert grads[1][0].tolist()[2] == 0.0 and min(grads[1][0].tolist()[:2]) > 0  # saturated row: 0 at its label
    res = dbg.result
    assert res.series("class_share").tolist() == [0.5, 0.75] and res.series("class_top").tolist() == [0.0, 2.0]
    # the device path (torch ops) gives the same numbers as the numpy path
    for g, want in zip(grads, ([0.5, 0.0], [0.75, 2.0])):
        assert batch_classes(g, False).tolist() == want and batch_classes(g, True).tolist() == want
        assert batch_classes(g.to(torch.bfloat16), False).tolist() == want


def test_nll_on_log_softmax_and_rows_that_name_no_label() -> None:
    logp = torch.log_softmax(torch.randn(5, 4), 1).requires_grad_()
    y = torch.tensor([3, 3, 3, 1, 0])
    (g,) = torch.autograd.grad(F.nll_loss(logp, y), logp)  # −1/5 at the label, 0 elsewhere
    assert batch_classes(g, False).tolist() == [pytest.approx(0.6), 3.0]
    # a regression's gradient (two negative entries) or a fitted row of zeros names no label
    g2 = torch.tensor([[-1.0, -2.0, 1.0], [0.0, 0.0, 0.0], [-0.5, 0.1, 0.2]])
    assert batch_classes(g2, False).tolist() == [pytest.approx(1 / 3), 0.0]


def test_absent_under_inference_mode_no_grad_and_for_integer_or_single_column_outputs() -> None:
    x, y = blobs(10, seed=4, sort=False)
    m = mlp(4)
    with nbdebug.debug(m) as dbg:
        with torch.inference_mode():
            m(x[:8])
        with torch.no_grad():
            m(x[8:16])
    assert len(dbg.result.series("class_share")) and np.isnan(dbg.result.series("class_share")).all()

    class ArgMax(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = mlp(5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            z = self.body(x)
            z.sum().backward()  # a gradient reaches the head, but the output is the integer argmax
            return z.argmax(1)

    am = ArgMax()
    with nbdebug.debug(am) as dbg:
        for k in range(3):
            am(x[8 * k:8 * k + 8])
    assert np.isnan(dbg.result.series("class_share")).all()
    one = nn.Sequential(nn.Linear(D, 1))
    with nbdebug.debug(one) as dbg:
        for k in range(3):
            F.mse_loss(one(x[8 * k:8 * k + 8]).squeeze(1), y[8 * k:8 * k + 8].float()).backward()
    assert np.isnan(dbg.result.series("class_share")).all()


def test_an_output_made_after_the_last_module_still_gives_the_statistic() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(D, C)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) / 2.0  # not a recorded module's tensor: its own hook

    x, y = blobs(10, seed=5)
    m = Scaled()
    with nbdebug.debug(m) as dbg:
        for k in range(2):
            F.cross_entropy(m(x[10 * k:10 * k + 10]), y[10 * k:10 * k + 10]).backward()
    assert dbg.result.series("class_share").tolist() == [1.0, 1.0] and dbg.result.series("class_top").tolist() == [0.0, 1.0]


def test_one_transfer_per_step_and_no_data_dependent_op_with_the_statistic() -> None:
    """The device path with a cross-entropy classifier: the statistic travels with the step's one transfer."""

    def steps(n: int) -> tuple[Counter[str], Counter[str], Any]:
        torch.manual_seed(1)
        model = deep(2)  # ... → Linear(16, 2): a 2-class head
        xs = [torch.randn(4, 16) for _ in range(n)]
        ys = [torch.tensor([0, 0, 0, 1]) for _ in range(n)]
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        spy = DispatchSpy()
        with count_host_syncs() as py:
            with Capture(model, device_path=True) as cap:
                with spy:
                    for x, y in zip(xs, ys):
                        opt.zero_grad()
                        F.cross_entropy(model(x), y).backward()
                        opt.step()
            total = Counter(py)
        return total, Counter(spy.syncs), cap.result

    (py3, disp3, _), (py6, disp6, res6) = steps(3), steps(6)
    assert disp3 == disp6 == Counter()
    assert res6.series("class_share").tolist() == [0.75] * 6 and res6.series("class_top").tolist() == [0.0] * 6
    per_step = {k: (py6[k] - py3[k]) / 3 for k in py6}
    assert per_step.get("cpu") == 1 and per_step.get("numpy") == 1, per_step
    assert sum(v for k, v in per_step.items() if k not in ("cpu", "numpy", "to")) == 0 and per_step.get("to", 0) <= 1


# -- the rule and its ranking on plain arrays --------------------------------------------------------
def test_the_rule_against_chance() -> None:
    rng = np.random.default_rng(0)
    steps = np.arange(1, 201)
    # batches of 2 of a balanced binary task: one class half the time, which class drawn afresh: chance
    y = rng.integers(0, 2, (200, 2))
    share = np.where(y[:, 0] == y[:, 1], 1.0, 0.5)
    assert unshuffled(steps, share, y[:, 0].astype(float)) is None
    # the same share, but the class held for 8 steps at a time: named, with its runs
    top = (np.arange(200) // 8 % 2).astype(float)
    f = unshuffled(steps, np.ones(200), top)
    assert f is not None and f.step == 1 and "changed 24 times" in f.text and "runs of 8–8 steps" in f.text
    # one class all along (imbalance, or one class in the data): no swing, no finding
    assert unshuffled(steps, np.ones(200), np.zeros(200)) is None
    # too few steps with the statistic (NaN: an eval cell, a regression)
    assert unshuffled(steps, np.r_[np.ones(9), np.full(191, np.nan)], top) is None


def test_what_follows_from_one_class_per_batch_is_ranked_under_it() -> None:
    order = unshuffled(np.arange(1, 41), np.ones(40), (np.arange(40) // 4 % 5).astype(float))
    assert order is not None
    lr = Finding("lr_high", "warning", 3, ("fc",), "learning rate too high", "lr", "lr.", "Lower it.", key="lr_high")
    div = Finding("loss_diverged", "warning", 30, (), "loss diverged", "diverged", "d.", "Lower.", key="loss_diverged")
    early = Finding("loss_spike", "warning", 0, (), "loss spike", "spike", "s.", "", key="loss_spike")
    assert order_causes([lr, div, early, order]) == {"lr_high": "unshuffled", "loss_diverged": "unshuffled"}
    ranked = build([], [], extra=[lr, div, order])
    assert [f.code for f in ranked] == ["unshuffled", "lr_high", "loss_diverged"]
    assert ranked[1].cause == 0 and ranked[2].cause == 0
