"""The gradient's depth ratio at the first step (``nbdebug.inspectors.run_findings.depth_ratio``, issue 26):
the output gradient of the first layer with parameters over the last one's. A deep ReLU MLP with He init ×3
explodes toward the input (``exploding``, an error named as the gradient, the learning rate's finding
following from it); an RNN whose input and recurrent weights were scaled ×0.01 starves its first layer
while the loss stays flat (``vanishing``). Each beside its healthy twin (the same code without the
mistake: no warning or error), and the ratio checked exactly on a hand-built array."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from nbdebug.capture.history import FIELD_INDEX, HISTORY_FIELDS
from nbdebug.inspectors.run_findings import DEPTH_EXPLODES, DEPTH_VANISHES, depth_ratio
from tests.unit.test_findings_loop import C, D, linear_labels, train_ce


def _serious(res: Any) -> list[str]:
    return [f.code for f in res.findings if f.severity != "note"]


def test_depth_ratio_is_the_first_parametrised_rows_output_gradient_over_the_last_ones() -> None:
    v = np.full((2, 4, len(HISTORY_FIELDS)), np.nan, np.float32)
    g, p = FIELD_INDEX["grad_norm"], FIELD_INDEX["param_grad_norm"]
    v[0, :, g] = [8.0, 100.0, 2.0, 0.5]  # row 1 (an activation: no parameter gradient) is not compared
    v[0, [0, 2, 3], p] = 1.0
    v[1, :, g] = [1.0, 1.0, 1.0, 1.0]  # later steps are not read: the ratio is the init's
    v[1, [0, 2, 3], p] = 1.0
    assert depth_ratio(v, ["a", "act", "b", "out"]) == (16.0, "a", "out")
    v[0, 3, g] = 0.0  # the last row's gradient is 0: no ratio
    assert depth_ratio(v, ["a", "act", "b", "out"]) is None


def _deep_relu(gain: float) -> nn.Sequential:
    torch.manual_seed(3)
    layers: list[nn.Module] = []
    d = D
    for _ in range(8):
        layers += [nn.Linear(d, 64), nn.ReLU()]
        d = 64
    m = nn.Sequential(*layers, nn.Linear(64, C))
    with torch.no_grad():
        for layer in m:
            if isinstance(layer, nn.Linear):
                nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
                layer.weight.mul_(gain)
                layer.bias.zero_()
    return m


@pytest.mark.parametrize("faulty", [True, False])
def test_he_init_times_3_explodes_toward_the_input_and_he_init_does_not(faulty: bool) -> None:
    x, y = linear_labels()
    m = _deep_relu(3.0 if faulty else 1.0)
    opt = torch.optim.SGD(m.parameters(), lr=1e-4 if faulty else 3e-3, momentum=0.9)
    res = train_ce(m, opt, x, y, 40)
    if not faulty:
        assert _serious(res) == [], res.findings
        r, first, last = depth_ratio(res.history.values("last"), list(res.history.rows))
        assert (first, last) == ("0", "16") and 0.1 < r < 10  # a healthy deep net: same order at both ends
        return
    root = res.findings[0]
    assert (root.code, root.severity, root.step, root.rows) == ("exploding", "error", 1, ("0", "16")), res.findings
    r = float(root.text.split("is ")[1].split("×")[0])
    assert r >= DEPTH_EXPLODES and "clip" in root.advice and "learning rate" not in root.text
    # the learning-rate finding, when there is one, follows from the gradient: it is not a root
    assert all(f.cause >= 0 for f in res.findings if f.code == "lr_high")


class _RowRNN(nn.Module):
    """Rows of 4 features read as 4 steps: a projection, a tanh RNN, a head on the last step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.proj = nn.Linear(4, 32)
        self.rnn = nn.RNN(32, 32, batch_first=True)
        self.head = nn.Linear(32, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.proj(x.reshape(-1, 4, 4)))
        return self.head(h[:, -1])


@pytest.mark.parametrize("faulty", [True, False])
def test_an_rnn_scaled_down_starves_its_first_layer_and_the_default_init_does_not(faulty: bool) -> None:
    x, y = linear_labels()
    m = _RowRNN()
    if faulty:
        with torch.no_grad():
            for w in (m.proj.weight, m.rnn.weight_ih_l0, m.rnn.weight_hh_l0):
                w.mul_(0.01)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    res = train_ce(m, opt, x, y, 60)
    if not faulty:
        assert _serious(res) == [], res.findings
        return
    root = res.findings[0]
    assert (root.code, root.severity, root.step, root.rows) == ("vanishing", "warning", 1, ("proj", "head")), res.findings
    r = float(root.text.split("is ")[1].split("×")[0])
    assert 0 < r <= DEPTH_VANISHES and "the loss did not fall" in root.text
    assert not math.isnan(r)
