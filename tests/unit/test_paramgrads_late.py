"""Late parameter-gradient norms (no recorded output on the backward's path) under a GradScaler."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nbdebug.capture.session import Capture


def _loop(set_to_none: bool) -> tuple[list[list[float]], list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    o1 = torch.optim.SGD(model[0].parameters(), lr=0.0)
    o2 = torch.optim.SGD(model[1].parameters(), lr=0.0)
    sc = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with Capture(model) as cap:
        for _ in range(3):
            o1.zero_grad(set_to_none=set_to_none)
            o2.zero_grad(set_to_none=set_to_none)
            model(torch.ones(1, 2))  # a step opens; its output is not on the loss's path
            sc.scale(sum(p.pow(2).sum() for p in model.parameters())).backward()
            sc.step(o1)
            sc.step(o2)
            sc.update()
    want = [float(torch.cat([2 * m.weight.detach().reshape(-1), 2 * m.bias.detach()]).norm()) for m in model]
    return [cap.result.series(n, "param_grad_norm").tolist() for n in ("0", "1")], want


def test_late_norms_under_a_grad_scaler_with_two_optimizers_are_unscaled() -> None:
    """The scaler unscales one optimizer's gradients at a time: norms taken before the first optimizer's
    step would hold the second optimizer's gradients still scaled (1024× too large)."""
    for set_to_none in (True, False):
        got, want = _loop(set_to_none)
        assert len(got) == len(want) == 2
        for g, w in zip(got, want):
            assert len(g) == 3 and all(abs(x - w) <= 1e-5 * w for x in g), (set_to_none, got, want)


def test_a_backward_that_raised_does_not_leave_the_steps_later_backwards_unseen() -> None:
    """Gradient accumulation (step_on="optimizer"): a micro-batch's backward raises midway (its end-of-backward
    callback is dropped by the engine) and the loop goes on; the step's norms are of the gradients the
    optimizer steps, not those after the first micro-batch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    want: list[list[float]] = []

    def boom(_: torch.Tensor) -> None:
        raise RuntimeError("boom")

    with Capture(model, step_on="optimizer") as cap:
        for _ in range(2):
            opt.zero_grad()
            for j in range(3):
                x = torch.randn(5, 3, requires_grad=True)
                if j == 1:
                    x.register_hook(boom)  # after every layer's gradients: the callback is lost
                    with pytest.raises(RuntimeError, match=r"^boom$"):  # the planted error, unchanged
                        model(x).pow(2).mean().backward()
                else:
                    model(x).pow(2).mean().backward()
            want.append([float(torch.cat([m.weight.grad.reshape(-1), m.bias.grad]).norm()) for m in (model[0], model[2])])
            opt.step()
    got = [cap.result.series(n, "param_grad_norm").tolist() for n in ("0", "2")]
    assert len(want) == 2
    for i in range(2):
        assert len(got[i]) == 2 and all(abs(g - w[i]) <= 1e-6 * w[i] for g, w in zip(got[i], want)), (got, want)
