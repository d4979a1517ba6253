"""The thermometer's rows say calls per forward pass ("×2": a module called twice per pass), not the
number of calls over the run (issue 26: every row of a 120-step run read "×120")."""

from __future__ import annotations

import torch
from torch import nn

from nbdebug.capture.session import Capture
from nbdebug.inspectors.thermometer import diagnose
from nbdebug.widgets.thermometer import ThermometerWidget


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act = nn.Linear(4, 4), nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(self.fc(x)))  # `fc` twice per pass, `act` once


def test_rows_count_calls_per_pass() -> None:
    torch.manual_seed(0)
    m = _Twice()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    with Capture(m) as cap:
        for _ in range(5):
            opt.zero_grad()
            m(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
    res = cap.result
    w = ThermometerWidget(diagnose(res), res)
    calls = {row["name"]: row["calls"] for row in w.layers}
    # each call of a pass is its own row (`fc#2` the second): once per pass each, over 5 steps
    assert res.steps == 5 and [r.calls for r in res.layers] == [5, 5, 5]
    assert calls == {"fc": 1, "act": 1, "fc#2": 1}, calls
    w.close()
