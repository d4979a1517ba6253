"""The usual CPU step's short path (``updates.flat_update``) gives exactly what the general
``aggregate`` gives from the same snapshot: shared parameters, modules without bias, a module at
‖θ‖ = 0 (inf) and one that did not move from 0 (NaN), a skipped step, with and without the native kernel."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from nbdebug.capture import native
from nbdebug.capture.hooks import HookSet
from nbdebug.capture.optim import OptimizerWatch
from nbdebug.capture.updates import aggregate, flat_update


class Zoo(nn.Module):
    """Shared weight (a, b), no-bias Linear, LayerNorm, a zero module that moves (inf), one that does not (NaN)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)
        self.b.weight = self.a.weight
        self.nb, self.ln = nn.Linear(3, 3, bias=False), nn.LayerNorm(3)
        self.zero, self.still = nn.Linear(3, 1), nn.Linear(3, 1)
        with torch.no_grad():
            for m in (self.zero, self.still):
                m.weight.zero_()
                m.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.zero(self.ln(self.nb(self.b(self.a(x))))) + 1 + 0 * self.still(x)


def same(x: list[float], y: list[float]) -> bool:
    return len(x) == len(y) and all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(x, y))


@pytest.mark.parametrize("kernel", ["1", "0"])
@pytest.mark.parametrize("many", [False, True])
def test_flat_update_equals_aggregate(kernel: str, many: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBDEBUG_NATIVE", kernel)
    native._reset()
    try:
        torch.manual_seed(0)
        model = nn.Sequential(Zoo(), *[nn.Linear(1, 1, bias=i % 2 == 0) for i in range(30 if many else 0)])
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        mods = [(n, m) for n, m in model.named_modules() if n and not list(m.children())]
        checked = 0
        with HookSet() as hooks, OptimizerWatch(mods, hooks, 2**20) as watch:
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(4, 3)).pow(2).sum().backward()
                opt.step()
                upd = watch.take()
                plan = watch._cached(opt)
                g = plan.fast
                assert g is not None
                snap = g.snapshot().copy()  # θ now; move the parameters as a step would
                with torch.no_grad():
                    for p in g.params[::2]:
                        p.mul_(1.01)
                m = len(plan.names)
                for skipped in (False, True):
                    got = flat_update(g, snap, m, skipped)
                    found_inf = torch.tensor([1.0 if skipped else 0.0])
                    ratios, pnorms, was = aggregate(plan, [g.norms(snap)], found_inf)
                    assert was is skipped
                    assert same(got[0], ratios) and same(got[1], pnorms)
                    checked += 1
            ratio = {k: float(v) for k, v in upd.update_ratio.items()}
        assert checked == 6
        assert math.isnan(ratio["0.still"]) and np.isfinite(ratio["0.a"])
    finally:
        native._reset()


def test_first_step_of_a_zero_module_is_inf() -> None:
    torch.manual_seed(0)
    model = Zoo()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with HookSet() as hooks, OptimizerWatch([(n, m) for n, m in model.named_children()], hooks, 2**20) as watch:
        model(torch.randn(4, 3)).pow(2).sum().backward()
        opt.step()
        upd = watch.take()
    assert upd.update_ratio["zero"] == math.inf and math.isnan(upd.update_ratio["still"])
    assert upd.param_norm["zero"] == 0.0 and upd.lr == {"": 0.1, **dict.fromkeys(upd.param_norm, 0.1)}
