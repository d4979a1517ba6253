"""%%nndebug through a fresh InteractiveShell: options, errors, output, hygiene."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from IPython.core.error import UsageError

from nbdebug.capture import hook_count
from nbdebug.capture.session import CaptureResult
from nbdebug.widgets.thermometer import ThermometerWidget

SETUP = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 3 * 3, 4))
with torch.no_grad():
    model[0].bias.fill_(-10)
class Holder: pass
holder = Holder(); holder.net = model
x = torch.randn(2, 3, 8, 8)
"""


@pytest.fixture
def sh(shell):  # type: ignore[no-untyped-def]
    assert shell.run_cell(SETUP).success
    return shell


def widgets_shown(sh) -> list[dict]:  # type: ignore[no-untyped-def]
    """The widgets displayed, once each: a live view is displayed when the cell starts and then
    refreshed in place (the shell records both publishes); the last bundle counts."""
    by_id: dict[str, dict] = {}
    for d in sh.displayed:
        view = d.get("application/vnd.jupyter.widget-view+json")
        if view:
            by_id.pop(view["model_id"], None)
            by_id[view["model_id"]] = d
    return list(by_id.values())


def test_magic_shows_thermometer_and_keeps_cell_output(sh, capsys) -> None:  # type: ignore[no-untyped-def]
    res = sh.run_cell("%%nndebug model --view thermometer -o cap\nloss = model(x).sum(); loss.backward()\nprint('user says hi')\nloss.item() * 0 + 42")
    assert res.success and res.result == 42  # the trailing expression is the cell's value
    assert "user says hi" in capsys.readouterr().out
    assert len(widgets_shown(sh)) == 1
    bundle = widgets_shown(sh)[0]
    assert "nbdebug thermometer" in bundle["text/html"]  # static fallback travels with the widget
    cap = sh.user_ns["cap"]
    assert isinstance(cap, CaptureResult) and cap is sh.user_ns["_nndebug"]
    w = sh.user_ns["_nndebug_widget"]
    assert isinstance(w, ThermometerWidget)
    assert [r["name"] for r in w.layers] == ["0", "1", "2", "3", "4"]
    assert w.layers[1]["flags"] == ["dead"] and w.has_grads
    assert hook_count(sh.user_ns["model"]) == 0


def test_dotted_model_path_and_layers_option(sh) -> None:  # type: ignore[no-untyped-def]
    assert sh.run_cell("%%nndebug holder.net --layers 0,re:[34] -o c\nmodel(x)").success
    assert [r.name for r in sh.user_ns["c"].layers] == ["0", "3", "4"]
    assert sh.run_cell("%%nndebug model --layers type:ReLU,type:Linear -o c\nmodel(x)").success
    assert [r.name for r in sh.user_ns["c"].layers] == ["1", "4"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("nomodel", "no variable named 'nomodel'. Models in this notebook: model"),
        ("x", "is a Tensor, not a torch.nn.Module"),
        ("holder.nope", "holder has no attribute 'nope'"),
        ("model --view nope", "unknown view 'nope'; choose from: thermometer"),
        ("model --layers conv1", "no layer named 'conv1'"),
        ("model --layers type:Nope", "torch.nn has no module type 'Nope'"),
        ("model --bogus", "unrecognized arguments: --bogus"),
        ("'model'", "is not a variable name"),
    ],
)
def test_bad_input_is_a_usage_error_and_runs_nothing(sh, line: str, message: str) -> None:  # type: ignore[no-untyped-def]
    sh.user_ns["ran"] = False
    res = sh.run_cell(f"%%nndebug {line}\nran = True")
    assert isinstance(res.error_in_exec, UsageError), res.error_in_exec
    assert message in str(res.error_in_exec)
    assert sh.user_ns["ran"] is False
    assert hook_count(sh.user_ns["model"]) == 0


def test_exception_propagates_and_widget_still_shows(sh) -> None:  # type: ignore[no-untyped-def]
    res = sh.run_cell("%%nndebug model\ny = model(x)\nraise ValueError('from the user')")
    assert isinstance(res.error_in_exec, ValueError) and str(res.error_in_exec) == "from the user"
    assert len(widgets_shown(sh)) == 1  # what ran before the error is shown
    assert hook_count(sh.user_ns["model"]) == 0
    assert sh.user_ns["y"].shape == (2, 4)  # the cell's own effects happened


def test_keyboard_interrupt_leaves_no_hooks(sh) -> None:  # type: ignore[no-untyped-def]
    sh.run_cell("from nbdebug.capture import fingerprint, same_fingerprint\nbefore = fingerprint(model)")
    res = sh.run_cell("%%nndebug model\nmodel(x)\nraise KeyboardInterrupt")
    assert not res.success and type(res.error_in_exec) is KeyboardInterrupt  # propagated as raised, not wrapped
    assert hook_count(sh.user_ns["model"]) == 0
    assert sh.run_cell("assert same_fingerprint(before, fingerprint(model)) == []").success


def test_help_documents_every_option(sh) -> None:  # type: ignore[no-untyped-def]
    from nbdebug.magic import NNDebugMagics

    doc = NNDebugMagics.nndebug.__doc__
    for opt in ("--view", "--layers", "-o", "--max-bytes", "--histograms", "--dead-threshold", "thermometer"):
        assert opt in doc, opt


def test_config_defaults(sh) -> None:  # type: ignore[no-untyped-def]
    assert sh.run_cell("%config NNDebugMagics.dead_threshold = 0.5").success
    m = sh.magics_manager.registry["NNDebugMagics"]
    assert m.dead_threshold == 0.5


def test_100_reruns_leave_no_hooks_and_no_growth(sh) -> None:  # type: ignore[no-untyped-def]
    cell = "%%nndebug model\nmodel(x).sum().backward()"
    from ipywidgets.widgets.widget import _instances

    def live() -> int:
        return sum(isinstance(w, ThermometerWidget) for w in list(_instances.values()))

    for _ in range(5):
        assert sh.run_cell(cell).success
    gc.collect()
    live_before = live()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(100):
        assert sh.run_cell(cell).success
        sh.displayed.clear()  # the test's own record of display calls is not the product's memory
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert hook_count(sh.user_ns["model"]) == 0
    # IPython keeps each cell's input history (a few hundred bytes a run); captures must not pile up.
    assert grown < 400_000, grown
    assert live() == live_before  # each re-run closed the previous run's widget


def test_python_api_without_magic() -> None:
    import torch
    from torch import nn

    import nbdebug

    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with nbdebug.debug(m, view="thermometer") as dbg:
        m(torch.randn(3, 2)).sum().backward()
    assert [r.name for r in dbg.result.layers] == ["0", "1"] and dbg.result.backward_ran
    assert isinstance(dbg.widget(), ThermometerWidget)
    w = nbdebug.thermometer(m, lambda: m(torch.randn(3, 2)))
    assert isinstance(w, ThermometerWidget) and hook_count(m) == 0
    assert callable(nbdebug.head_view) and nbdebug.Capture.__name__ == "Capture"
    with pytest.raises(ValueError, match="unknown view 'nope'"):
        nbdebug.debug(m, view="nope")
    with pytest.raises(TypeError, match=r"needs a torch\.nn\.Module"):
        nbdebug.debug("model")  # type: ignore[arg-type]


def test_quoted_option_values_lose_their_quotes(sh) -> None:  # type: ignore[no-untyped-def]
    from nbdebug.magic import _unquote

    assert _unquote('" Paris"') == " Paris" and _unquote("'a'") == "a" and _unquote('"') == '"' and _unquote(3) == 3
    assert sh.run_cell('%%nndebug model --layers "0,4" -o c\nmodel(x)').success
    assert [r.name for r in sh.user_ns["c"].layers] == ["0", "4"]


def test_trailing_semicolon_silences_the_value_as_without_the_magic(sh) -> None:  # type: ignore[no-untyped-def]
    out: list[object] = []
    sh.displayhook.write_output_prompt = lambda: None  # type: ignore[method-assign]
    sh.displayhook.write_format_data = lambda data, md=None: out.append(data.get("text/plain"))  # type: ignore[method-assign]
    assert sh.run_cell("model(x).shape[0];", store_history=True).success
    assert sh.run_cell("%%nndebug model\nmodel(x).shape[0];", store_history=True).success
    assert sh.run_cell("%%nndebug model\nmodel(x).shape[0] + 1  # shown", store_history=True).success
    assert out == ["3"]  # the magic cell with `;` shows no value (before: Out[..]: 2)


def test_syntax_error_runs_nothing_and_shows_no_view(sh) -> None:  # type: ignore[no-untyped-def]
    res = sh.run_cell("%%nndebug model\ny = model(x)\nz = (")
    assert isinstance(res.error_in_exec, SyntaxError)
    assert "y" not in sh.user_ns and widgets_shown(sh) == []
    assert hook_count(sh.user_ns["model"]) == 0
