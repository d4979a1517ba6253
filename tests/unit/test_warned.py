"""``torch_warning`` whatever the user's warning filters: Python shows a warning location once per process
("default"), so a cell run a second time, or a notebook that starts with ``warnings.filterwarnings("ignore")``,
used to get "no problems found" for a broadcasting MSE. The finding is now kept in both cases, while what
is displayed still follows the user's filters (nothing under "ignore", an exception under "error", once per
cell otherwise), and the filters are as found after the cell."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nbdebug


def _cell(broadcast: bool = True) -> list[str]:
    """The same training cell each time: an (N, 1) output against (N,) targets (or (N, 1) for the twin)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(160, 4)
    t = x[:, :1] * 0.5
    target = t.squeeze(1) if broadcast else t
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with nbdebug.debug(m) as dbg:
        for i in range(10):
            opt.zero_grad()
            F.mse_loss(m(x[i * 16:(i + 1) * 16]), target[i * 16:(i + 1) * 16]).backward()
            opt.step()
    return [f.code for f in dbg.result.findings if f.code == "torch_warning"]


def test_a_second_run_of_the_cell_still_names_the_broadcast_and_shows_it_once_per_cell() -> None:
    shown: list[str] = []
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter("default")  # Python's own: a location is shown once per process
        warnings.showwarning = lambda message, *a, **k: shown.append(str(message))
        assert _cell() == ["torch_warning"]
        assert _cell() == ["torch_warning"]  # was []: the header said "no problems found"
        assert _cell(broadcast=False) == []
        assert not [f for f in warnings.filters if f[1] is not None and "input size" in f[1].pattern]  # taken out
        assert warnings.filters[-1] == ("default", None, Warning, None, 0)  # the user's, in place
    assert sum("different to the input size" in s for s in shown) == 2  # once per cell, not once per step


def test_a_users_ignore_hides_the_display_not_the_finding_and_error_still_raises() -> None:
    shown: list[str] = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")  # a common first notebook line
        warnings.showwarning = lambda message, *a, **k: shown.append(str(message))
        assert _cell() == ["torch_warning"]  # was []
        assert shown == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="different to the input size"):
            _cell()
