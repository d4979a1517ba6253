"""%%nndebug training options (--every, --loss, --break-on, --continue) through a fresh InteractiveShell.

Bad values are a ``UsageError`` before the cell runs (nothing executed, no hook left). Option
*parsing* (types, choices, help) is ours (nbdebug/views.py) and tested unconditionally; the value
checks and the behaviour need the thermometer recorder to call ``views.training_options`` and the
issue-10 ``Capture``: those tests are marked ``needs_wiring`` and skip, saying why, until both exist.
"""

from __future__ import annotations

import inspect

import pytest
from IPython.core.error import UsageError

from nbdebug.capture import hook_count
from nbdebug.capture.hooks import optimizer_hook_count
from nbdebug.capture.optim import scaler_patched


def _wired() -> str | None:
    """Why the end-to-end tests cannot run yet, or None."""
    from nbdebug.capture.session import Capture
    from nbdebug.recorders import thermometer

    if "training_options" not in inspect.getsource(thermometer):
        return "the thermometer recorder does not call views.training_options yet (LIVE)"
    params = inspect.signature(Capture).parameters
    missing = [p for p in ("every", "loss", "break_on", "resume", "step_on") if p not in params]
    return f"Capture has no {', '.join(missing)} yet (CORE)" if missing else None


_WHY = _wired()
needs_wiring = pytest.mark.skipif(_WHY is not None, reason=f"needs wiring: {_WHY}")

SETUP = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 2)
not_a_result = 3
"""

LOOP = """
ran = True
losses = []
for _ in range({n}):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
"""


@pytest.fixture
def sh(shell):  # type: ignore[no-untyped-def]
    assert shell.run_cell(SETUP).success
    shell.user_ns["ran"] = False
    return shell


def usage_error(sh, line: str) -> UsageError:  # type: ignore[no-untyped-def]
    res = sh.run_cell(f"%%nndebug model {line}\n" + LOOP.format(n=3))
    assert isinstance(res.error_in_exec, UsageError), res.error_in_exec
    assert sh.user_ns["ran"] is False  # the cell did not run
    assert hook_count(sh.user_ns["model"]) == 0 and optimizer_hook_count() == 0 and not scaler_patched()
    return res.error_in_exec


# -- parsing (views.py; no wiring needed) ------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--every ten", "argument --every: invalid int value: 'ten'"),
        ("--every", "argument --every: expected one argument"),
        ("--break-on sometimes", "argument --break-on: invalid choice: 'sometimes'"),
        ("--continue", "argument --continue: expected one argument"),
    ],
)
def test_unparsable_values_are_usage_errors(sh, line: str, message: str) -> None:  # type: ignore[no-untyped-def]
    assert message in str(usage_error(sh, line))


def test_help_lists_the_training_options(sh) -> None:  # type: ignore[no-untyped-def]
    doc = sh.find_cell_magic("nndebug").__doc__
    for flag in ("--every N", "--loss NAME", "--break-on {nonfinite}", "--continue VAR"):
        assert flag in doc, flag
    flat = " ".join(doc.split())
    assert "may sync once per module call on accelerators" in flat
    assert "%debug opens" in flat and "earlier %%nndebug cell" in flat


# -- value checks (need the recorder to call views.training_options) ---------------------------
@needs_wiring
@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--every 0", "--every takes a positive number of steps, e.g. --every 10"),
        ("--every -3", "--every takes a positive number of steps, e.g. --every 10"),
        ("--continue run", "--continue run: no variable named 'run'; pass the -o variable of an earlier %%nndebug cell"),
        ("--continue not_a_result", "not the result of a thermometer run; pass the -o variable of an earlier %%nndebug cell"),
        ("--loss 1loss", "--loss takes the name of the variable holding the loss, e.g. --loss loss"),
        # a name neither in the notebook nor assigned by the cell: its loss series would be all NaN
        ("--loss nosuch", "--loss nosuch: no variable 'nosuch' in the notebook and the cell never assigns one; "
                          "the cell assigns: loss, losses, ran. Pass the variable holding the step's loss, e.g. --loss loss"),
        ("--loss los.item", "--loss los: no variable 'los' in the notebook and the cell never assigns one; "
                            "did you mean --loss loss? the cell assigns: loss, losses, ran."),
    ],
)
def test_bad_values_are_usage_errors_before_the_cell_runs(sh, line: str, message: str) -> None:  # type: ignore[no-untyped-def]
    assert message in str(usage_error(sh, line))


@needs_wiring
def test_every_and_loss_reach_the_history(sh) -> None:  # type: ignore[no-untyped-def]
    assert sh.run_cell("%%nndebug model --every 2 --loss loss -o run\n" + LOOP.format(n=5)).success
    run, losses = sh.user_ns["run"], sh.user_ns["losses"]
    assert run.steps == 5 and run.every == 2
    assert list(run.step_index) == [1, 3, 5]  # every 2nd step, and the last
    assert list(run.series("loss")) == pytest.approx([losses[0], losses[2], losses[4]], rel=1e-6)
    assert optimizer_hook_count() == 0 and not scaler_patched()


@needs_wiring
def test_loss_names_the_cell_assigns_or_the_notebook_holds_are_accepted(sh) -> None:  # type: ignore[no-untyped-def]
    # `out` is assigned by the cell only (dotted path into it); `x` exists in the notebook already
    cell = "%%nndebug model --loss {} -o run\n" + LOOP.format(n=2).replace("loss.backward()", "loss.backward(); out = {{'l': loss}}")
    assert sh.run_cell(cell.format("out.l")).success
    assert list(sh.user_ns["run"].series("loss")) == pytest.approx(sh.user_ns["losses"], rel=1e-6)
    assert sh.run_cell(cell.format("x")).success  # a tensor of several values: its mean, not an error


@needs_wiring
def test_a_loss_set_by_a_training_function_of_the_notebook_is_accepted(sh) -> None:  # type: ignore[no-untyped-def]
    """`global gloss` in a function the cell calls (defined in an earlier cell, or in this one) sets the
    variable the cell never assigns itself: accepted, and its values reach the history."""
    body = LOOP.format(n=3).replace("loss.backward()", "loss.backward(); keep(loss)")
    assert sh.run_cell("def keep(v):\n    global gloss\n    gloss = v\n").success
    assert sh.run_cell("%%nndebug model --loss gloss -o run\n" + body).success
    assert list(sh.user_ns["run"].series("loss")) == pytest.approx(sh.user_ns["losses"], rel=1e-6)
    sh.user_ns.pop("keep")
    sh.user_ns.pop("gloss")
    inline = "def keep2(v):\n    global gloss2\n    gloss2 = v\n" + body.replace("keep(loss)", "keep2(loss)")
    assert sh.run_cell("%%nndebug model --loss gloss2 -o run\n" + inline).success
    sh.user_ns["ran"] = False
    assert "did you mean" in str(usage_error(sh, "--loss gloss3"))  # still refused when nothing sets it


@needs_wiring
def test_continue_appends_to_an_earlier_run(sh) -> None:  # type: ignore[no-untyped-def]
    assert sh.run_cell("%%nndebug model --loss loss -o run\n" + LOOP.format(n=3)).success
    first = list(sh.user_ns["losses"])
    assert sh.run_cell("%%nndebug model --loss loss --continue run -o run2\n" + LOOP.format(n=2)).success
    run2 = sh.user_ns["run2"]
    assert run2.steps == 5 and list(run2.step_index) == [1, 2, 3, 4, 5]
    assert list(run2.series("loss")) == pytest.approx(first + sh.user_ns["losses"], rel=1e-6)


@needs_wiring
def test_break_on_nonfinite_raises_in_the_cell_and_cleans_up(sh) -> None:  # type: ignore[no-untyped-def]
    import nbdebug

    cell = ("%%nndebug model --break-on nonfinite -o run\n"
            "ran = True\n"
            "with torch.no_grad():\n    model[0].weight[0, 0] = float('nan')\n"
            "model(x).sum().backward()\n"
            "after = True\n")
    res = sh.run_cell(cell)
    err = res.error_in_exec
    assert isinstance(err, nbdebug.NonFiniteError), err
    assert err.step == 1 and err.module == "0"
    assert "after" not in sh.user_ns  # stopped at the first non-finite output
    assert hook_count(sh.user_ns["model"]) == 0 and optimizer_hook_count() == 0 and not scaler_patched()


# -- training_options itself (what the recorder calls) -----------------------------------------
def test_training_options_maps_magic_options_to_capture_arguments() -> None:
    from types import SimpleNamespace

    from nbdebug.capture.result import CaptureResult
    from nbdebug.views import training_options

    cap = SimpleNamespace(result=CaptureResult([], 1, False, 0, False, 0, 1e-6, 0, False, None, None, 0.0))
    ns: dict = {"run": cap.result, "both": {"thermometer": cap.result, "attention": None}}
    got = training_options({"every": 5, "loss_var": "out.loss", "break_on": "nonfinite", "continue_from": "run", "user_ns": ns})
    assert got["every"] == 5 and got["break_on"] == "nonfinite" and got["step_on"] == "forward"
    assert got["resume"] is cap.result
    assert got["loss"]() is None  # read when asked: `out` does not exist yet
    ns["out"] = {"loss": 1.5}
    assert got["loss"]() == 1.5
    assert training_options({"continue_from": "both"}, ns)["resume"] is cap.result  # -o of several views
    assert training_options({"resume": cap.result, "step_on": "optimizer"})["resume"] is cap.result  # Python API
    fn = lambda: 2.0  # noqa: E731
    assert training_options({"loss": fn})["loss"] is fn
    assert training_options({}) == {"every": 1, "loss": None, "break_on": None, "resume": None, "step_on": "forward"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"every": 0}, "--every takes a positive number of steps, e.g. --every 10"),
        ({"every": True}, "--every takes a positive number of steps"),
        ({"every": 2.5}, "--every takes a positive number of steps"),
        ({"break_on": "nan"}, "--break-on takes nonfinite"),
        ({"step_on": "backward"}, "step_on takes 'forward' or 'optimizer'"),
        ({"loss": 3.0}, "loss= takes a function returning the step's loss"),
        ({"loss_var": "loss"}, "--loss NAME reads a notebook variable"),
        ({"continue_from": "run", "user_ns": {}}, "no variable named 'run'; pass the -o variable of an earlier %%nndebug cell"),
        ({"continue_from": "a.b", "user_ns": {}}, "--continue takes a variable name"),
        ({"resume": 3}, "that is a int, not the result of a thermometer run"),
    ],
)
def test_training_options_reject_bad_values(options: dict, message: str) -> None:
    from nbdebug.views import training_options

    with pytest.raises(ValueError, match=None) as info:
        training_options(options)
    assert message in str(info.value)
