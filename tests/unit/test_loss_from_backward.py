"""The loss, always (issue 22): with no ``loss=`` and no loss in the model's output, a step's loss is
the tensor ``backward()`` ran on — equal to the loop's own values in every backward form, unscaled
under a GradScaler, summed (with a note) for a non-scalar tensor or several backwards in one step —
and ``torch.autograd.backward`` is the original again after the capture, however it ended."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import nbdebug
from nbdebug.capture import hook_count
from nbdebug.capture.losses import BACKWARD_NOTES
from nbdebug.capture.session import Capture

ORIGINAL_BACKWARD = torch.autograd.backward


def _setup() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    return m, torch.optim.SGD(m.parameters(), lr=0.1), torch.randn(16, 4), torch.randint(0, 3, (16,))


def _run(kind: str, steps: int = 6, **kw: Any) -> tuple[np.ndarray, list[float], list[str]]:
    m, opt, x, y = _setup()
    sc = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    ref: list[float] = []
    with Capture(m, **kw) as cap:
        for _ in range(steps):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            if kind == "tensor":
                loss.backward()
            elif kind == "autograd":
                torch.autograd.backward(loss)
            elif kind == "autograd_list":
                torch.autograd.backward([loss], [torch.ones_like(loss)])
            elif kind == "scaler":
                sc.scale(loss).backward()
            if kind == "scaler":
                sc.step(opt)
                sc.update()
            else:
                opt.step()
            ref.append(loss.item())
    assert torch.autograd.backward is ORIGINAL_BACKWARD
    return cap.result.series("loss"), ref, cap.result.notes


@pytest.mark.parametrize("kind", ["tensor", "autograd", "autograd_list", "scaler"])
def test_the_loss_is_what_backward_ran_on(kind: str) -> None:
    got, ref, notes = _run(kind)
    np.testing.assert_allclose(got, ref, rtol=1e-6)  # the history keeps float32
    assert not any(n.startswith("loss from backward") for n in notes)


def test_a_non_scalar_backward_counts_its_sum_with_a_note() -> None:
    m, opt, x, _ = _setup()
    sums = []
    with Capture(m) as cap:
        for _ in range(3):
            opt.zero_grad()
            out = m(x)
            sums.append(out.detach().sum().item())
            out.backward(torch.ones_like(out))
            opt.step()
    np.testing.assert_allclose(cap.result.series("loss"), sums, rtol=1e-5)
    assert BACKWARD_NOTES["nonscalar"] in cap.result.notes


def test_several_backwards_in_one_step_count_their_sum_with_a_note() -> None:
    m, opt, x, y = _setup()
    ref = []
    with Capture(m, step_on="optimizer") as cap:
        for _ in range(4):
            opt.zero_grad()
            total = 0.0
            for half in (slice(0, 8), slice(8, 16)):  # gradient accumulation: two micro-batches per step
                loss = F.cross_entropy(m(x[half]), y[half]) / 2
                loss.backward()
                total += loss.item()
            opt.step()
            ref.append(total)
    np.testing.assert_allclose(cap.result.series("loss"), ref, rtol=1e-6)
    assert BACKWARD_NOTES["several"] in cap.result.notes


class _WithLoss(nn.Module):
    """Returns its own loss (as an HF model given labels): that loss wins over what backward ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        return {"loss": F.cross_entropy(logits, y), "logits": logits}


def test_the_models_own_loss_and_the_users_loss_come_first() -> None:
    torch.manual_seed(0)
    m = _WithLoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    ref = []
    with Capture(m) as cap:
        for _ in range(3):
            opt.zero_grad()
            out = m(x, y)
            (out["loss"] * 10).backward()  # scaled on purpose: the output's loss is the step's
            opt.step()
            ref.append(out["loss"].item())
    np.testing.assert_allclose(cap.result.series("loss"), ref, rtol=1e-6)
    box: dict[str, Any] = {}
    with Capture(m, loss=lambda: box.get("v")) as cap:
        for i in range(3):
            opt.zero_grad()
            m(x, y)["loss"].backward()
            box["v"] = float(i)
            opt.step()
    np.testing.assert_array_equal(cap.result.series("loss"), [0.0, 1.0, 2.0])


def test_checkpoint_recomputation_inside_backward_is_not_a_second_loss() -> None:
    m, opt, x, y = _setup()
    x.requires_grad_()  # the reentrant checkpoint needs an input that requires grad
    ref = []
    with Capture(m) as cap:
        for _ in range(3):
            opt.zero_grad()
            loss = F.cross_entropy(checkpoint(m, x, use_reentrant=True), y)
            loss.backward()  # the reentrant checkpoint calls torch.autograd.backward inside this backward
            opt.step()
            ref.append(loss.item())
    np.testing.assert_allclose(cap.result.series("loss"), ref, rtol=1e-6)
    assert BACKWARD_NOTES["several"] not in cap.result.notes


def test_the_backward_wrapper_is_gone_after_an_exception_and_an_interrupt() -> None:
    m, _opt, x, y = _setup()
    for exc in (RuntimeError("user bug"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with Capture(m):
                F.cross_entropy(m(x), y).backward()
                assert torch.autograd.backward is not ORIGINAL_BACKWARD
                raise exc
        assert torch.autograd.backward is ORIGINAL_BACKWARD and hook_count(m) == 0


def test_the_usual_loop_under_debug_has_a_loss_curve() -> None:
    """The issue's loop: ``loss = F.cross_entropy(net(X), Y); loss.backward()`` with no ``--loss``."""
    m, opt, x, y = _setup()
    ref = []
    with nbdebug.debug(m, "thermometer") as dbg:
        for _ in range(5):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            ref.append(loss.item())
    np.testing.assert_allclose(dbg.result.series("loss"), ref, rtol=1e-6)
    for w in dbg.widgets():
        w.close()
