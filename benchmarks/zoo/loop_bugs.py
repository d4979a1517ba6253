"""The loop bugs: zero_grad forgotten, step forgotten or misplaced, an optimizer holding the wrong parameters."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Setup, batches, cnn, digits, fault, first_batch, mlp, sgd_loop
from .classes import NO_STEP, NOT_IN_OPT, NOT_ZEROED


def _loop(m: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, order: str):
    """The user's loop with its calls in ``order``: z zero_grad, f forward+loss, b backward, s step."""
    nxt = batches(len(y), 64, 0)

    def loop(n: int) -> None:
        m.train()
        for _ in range(n):
            i = nxt()
            loss = None
            for c in order:
                if c == "z":
                    opt.zero_grad()
                elif c == "f":
                    loss = F.cross_entropy(m(x[i]), y[i])
                elif c == "b":
                    loss.backward()
                elif c == "s":
                    opt.step()

    return loop


@fault(NOT_ZEROED, "zero_grad_forgotten_sgd")
def zero_grad_forgotten_sgd(faulty: bool) -> Setup:
    """digits MLP, SGD+momentum lr=0.05: opt.zero_grad() forgotten (twin: called)."""
    x, y = digits()
    m = mlp(seed=30)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, _loop(m, opt, x, y, "fbs" if faulty else "zfbs"), (*first_batch(x, y), F.cross_entropy, opt))


@fault(NOT_ZEROED, "zero_grad_forgotten_adam")
def zero_grad_forgotten_adam(faulty: bool) -> Setup:
    """digits BatchNorm CNN, Adam lr=1e-3: opt.zero_grad() forgotten (twin: called)."""
    x, y = digits(image=True)
    m = cnn(seed=31)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, _loop(m, opt, x, y, "fbs" if faulty else "zfbs"), (*first_batch(x, y), F.cross_entropy, opt))


@fault(NO_STEP, "step_forgotten")
def step_forgotten(faulty: bool) -> Setup:
    """opt.step() forgotten: gradients computed, parameters never change (twin: called)."""
    x, y = digits()
    m = mlp(seed=32)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, _loop(m, opt, x, y, "zfb" if faulty else "zfbs"), (*first_batch(x, y), F.cross_entropy, opt))


@fault(NO_STEP, "step_before_backward")
def step_before_backward(faulty: bool) -> Setup:
    """zero_grad, forward, step, backward: each step sees no gradient (twin: backward then step)."""
    x, y = digits()
    m = mlp(seed=33)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return Setup(m, _loop(m, opt, x, y, "zfsb" if faulty else "zfbs"), (*first_batch(x, y), F.cross_entropy, opt))


@fault(NO_STEP, "zero_grad_between")
def zero_grad_between(faulty: bool) -> Setup:
    """forward, backward, zero_grad, step: the gradient is wiped before the step (twin: zero_grad first)."""
    x, y = digits()
    m = mlp(seed=34)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, _loop(m, opt, x, y, "fbzs" if faulty else "zfbs"), (*first_batch(x, y), F.cross_entropy, opt))


@fault(NOT_IN_OPT, "optimizer_last_layer_only", doctor=("optimizer",))
def optimizer_last_layer_only(faulty: bool) -> Setup:
    """Adam(model[-1].parameters()): only the head is optimised, the body gets gradients nobody applies
    (twin: Adam(model.parameters()))."""
    x, y = digits()
    m = mlp(seed=35)
    opt = torch.optim.Adam((m[-1] if faulty else m).parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(NOT_IN_OPT, "optimizer_first_layer_only", doctor=("optimizer",))
def optimizer_first_layer_only(faulty: bool) -> Setup:
    """SGD(list(model.parameters())[:2]): only the first layer is optimised (twin: all parameters)."""
    x, y = digits()
    m = mlp(seed=36)
    params = list(m.parameters())
    opt = torch.optim.SGD(params[:2] if faulty else params, lr=0.05, momentum=0.9)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(NOT_IN_OPT, "optimizer_of_earlier_model", doctor=("optimizer",))
def optimizer_of_earlier_model(faulty: bool) -> Setup:
    """The cell building the model was re-run after the optimizer's: the optimizer holds the earlier model's
    parameters (twin: the optimizer built from the model trained)."""
    x, y = digits()
    earlier = mlp(seed=37)
    opt = torch.optim.Adam(earlier.parameters(), lr=1e-3)
    m = mlp(seed=38)
    if not faulty:
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    # the earlier model stays alive, as in the notebook
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt), keep=earlier)
