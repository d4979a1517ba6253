"""The graph cut between two modules: .detach(), a numpy round trip, no_grad inside the model."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Setup, digits, fault, first_batch, sgd_loop
from .classes import GRAPH_CUT


class BodyHead(nn.Module):
    """body → (cut?) → head; ``cut``: "" (none), "detach", "numpy", "no_grad"."""

    def __init__(self, cut: str, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.head = nn.Linear(32, 10)
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
            h = torch.from_numpy(h.detach().cpu().numpy())
        return self.head(h)


def _case(cut: str, faulty: bool, seed: int) -> Setup:
    x, y = digits()
    m = BodyHead(cut if faulty else "", seed)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return Setup(m, sgd_loop(m, opt, x, y), (*first_batch(x, y), F.cross_entropy, opt))


@fault(GRAPH_CUT, "detach_between", doctor=("gradient_flow",))
def detach_between(faulty: bool) -> Setup:
    """forward returns head(body(x).detach()): the body never learns (twin: no detach)."""
    return _case("detach", faulty, 40)


@fault(GRAPH_CUT, "numpy_round_trip", doctor=("gradient_flow",))
def numpy_round_trip(faulty: bool) -> Setup:
    """forward takes the body's output through numpy and back (twin: stays a tensor)."""
    return _case("numpy", faulty, 41)


@fault(GRAPH_CUT, "no_grad_in_forward", doctor=("gradient_flow",))
def no_grad_in_forward(faulty: bool) -> Setup:
    """forward runs the body under torch.no_grad() (twin: without)."""
    return _case("no_grad", faulty, 42)
