"""%%nndebug --view logitlens --lens: a fitted lens from the notebook, two lenses compared, a bad
value refused before the cell runs."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

pytest.importorskip("transformers")

from nbdebug.capture import hook_count

SETUP = """
import torch
import nbdebug
from nbdebug.adapters.offline import tiny_lm
m = tiny_lm("llama", vocab=200, layers=3, d=32)
with torch.no_grad():
    for name, p in m.named_parameters():
        if "norm" not in name:
            p.mul_(4.0)
text = torch.randint(0, 200, (2000,), generator=torch.Generator().manual_seed(0))
mine = nbdebug.fit_lens(m, None, text, kind="shortcut", max_tokens=512, seq_len=64, holdout=128, progress=False)
ids = torch.randint(0, 200, (1, 7), generator=torch.Generator().manual_seed(1))
"""


@pytest.fixture
def sh(shell):  # type: ignore[no-untyped-def]
    assert shell.run_cell(SETUP).success
    return shell


def test_lens_option_shows_the_fitted_lens_against_the_logit_lens(sh) -> None:  # type: ignore[no-untyped-def]
    res = sh.run_cell("%%nndebug m --view logitlens --lens mine,logit -o out\nwith torch.no_grad():\n    m(ids)")
    assert res.success, res.error_in_exec
    w = sh.user_ns["_nndebug_widget"]
    assert w.lens_name == "shortcut lens" and w.compare_name == "logit lens"
    assert [r["kl_heldout"] for r in w.by_layer] == sh.user_ns["mine"].quality["lens"]
    assert "shortcut lens" in w.headline or w.headline == w.finding
    assert hook_count(sh.user_ns["m"]) == 0
    res = sh.run_cell("%%nndebug m --view logitlens --lens shortcut\nwith torch.no_grad():\n    m(ids)")  # the notebook's lens of that kind
    assert res.success and sh.user_ns["_nndebug_widget"].lens_name == "shortcut lens"


def test_bad_lens_is_a_usage_error_and_runs_nothing(sh) -> None:  # type: ignore[no-untyped-def]
    sh.user_ns["ran"] = False
    res = sh.run_cell("%%nndebug m --view logitlens --lens nonsense\nran = True")
    assert isinstance(res.error_in_exec, UsageError), res.error_in_exec
    assert "logit, tuned, shortcut" in str(res.error_in_exec) and sh.user_ns["ran"] is False
