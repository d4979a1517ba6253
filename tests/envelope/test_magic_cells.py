"""The matrix through ``%%nndebug`` in a fresh IPython shell: a few modes, and 100 re-runs."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from nbdebug.capture import hook_count

from . import models as M

SETUP = """
import torch, gc, weakref
from envelope import models as M
model = M.tiny_cnn(); x = M.image()
mlp = M.mlp(); v = torch.randn(2, 6)
lm = M.tiny_lm("gpt2"); ids = M.prompt()
"""


@pytest.fixture
def sh(shell):  # type: ignore[no-untyped-def]
    assert shell.run_cell(SETUP).success
    return shell


def shown(sh: Any) -> list[dict]:
    """The widgets displayed, once each (a live view is displayed when the cell starts, then updated in place)."""
    out: dict[str, dict] = {}
    for d in sh.displayed:
        if "application/vnd.jupyter.widget-view+json" in d:
            out.setdefault(d["application/vnd.jupyter.widget-view+json"]["model_id"], d)
    return list(out.values())


def test_inference_mode_cell(sh, capsys, record_property) -> None:  # type: ignore[no-untyped-def]
    record_property("cell", ("inference_mode", "thermometer"))
    res = sh.run_cell("%%nndebug model -o cap\nwith torch.inference_mode():\n    y = model(x)")
    assert res.success, res.error_in_exec
    assert [r.name for r in sh.user_ns["cap"].layers] == M.CNN_ROWS
    assert len(shown(sh)) == 1 and "nbdebug" not in capsys.readouterr().err
    assert hook_count(sh.user_ns["model"]) == 0


def test_view_that_does_not_apply_is_one_quiet_note(sh, capsys) -> None:  # type: ignore[no-untyped-def]
    """Issue 9 item 3: `--view thermometer,gradcam` on an MLP shows the thermometer and one note."""
    res = sh.run_cell("%%nndebug mlp --view thermometer,gradcam\nmlp(v).sum().backward()")
    assert res.success, res.error_in_exec
    assert capsys.readouterr().err == ""
    assert len(shown(sh)) == 1
    dash = sh.user_ns["_nndebug_widget"]
    assert list(getattr(dash, "views", {}) or {}) in (["thermometer"], []), dash
    notes = list(dash.notes)
    assert len(notes) == 1 and "gradcam" in notes[0] and "\n" not in notes[0], notes


def test_view_all_on_a_cnn_says_nothing_on_stderr(sh, capsys) -> None:  # type: ignore[no-untyped-def]
    from collections import Counter

    from ipywidgets.widgets.widget import _instances

    def language_widgets() -> Counter[str]:  # other tests of the session may have left some alive
        return Counter(n for w in list(_instances.values()) if (n := type(w).__name__) in ("AttentionWidget", "LogitLensWidget"))

    before = language_widgets()
    res = sh.run_cell("%%nndebug model --view all\nmodel(x)")
    assert res.success, res.error_in_exec
    assert capsys.readouterr().err == ""  # "attention, logitlens skipped" is a quiet note, not a warning
    dash = sh.user_ns["_nndebug_widget"]
    assert any("attention" in n and "logitlens" in n for n in dash.notes), dash.notes
    assert language_widgets() == before  # none created for views that do not apply


def test_user_exception_propagates_unchanged(sh) -> None:  # type: ignore[no-untyped-def]
    cell = """
class Boom(Exception): pass
def raiser(m, a, o): raise Boom("mine")
h = model.conv2.register_forward_hook(raiser)
"""
    assert sh.run_cell(cell).success
    res = sh.run_cell("%%nndebug model --view thermometer,featuremaps,gradcam\ny = model(x)")
    assert type(res.error_in_exec).__name__ == "Boom" and str(res.error_in_exec) == "mine"
    assert len(shown(sh)) == 1
    assert hook_count(sh.user_ns["model"]) == 1  # only the user's hook
    assert sh.run_cell("h.remove()").success


def test_keyboard_interrupt_inside_a_language_model(sh) -> None:  # type: ignore[no-untyped-def]
    cell = """
impl = lm.config._attn_implementation
def stop(m, a, o): raise KeyboardInterrupt
h = lm.transformer.h[1].register_forward_hook(stop)
"""
    assert sh.run_cell(cell).success
    res = sh.run_cell("%%nndebug lm --view attention,logitlens,thermometer\nlm(ids)")
    assert isinstance(res.error_in_exec, KeyboardInterrupt)
    assert hook_count(sh.user_ns["lm"]) == 1
    assert sh.run_cell("assert lm.config._attn_implementation == impl\nh.remove()").success


def test_layer_option_names_the_second_call(sh) -> None:  # type: ignore[no-untyped-def]
    res = sh.run_cell("%%nndebug model --view gradcam --layer relu#2 -o cam\nmodel(x)")
    assert res.success, res.error_in_exec
    assert sh.user_ns["cam"].layer == "relu#2"
    assert sh.run_cell("%%nndebug model --view featuremaps -o fm\nmodel(x)").success
    assert {"relu", "relu#2"} <= set(sh.user_ns["fm"].layers)
    assert {"relu", "relu#2"} <= {lay["name"] for lay in sh.user_ns["_nndebug_widget"].layers}


@pytest.mark.parametrize(("var", "views"), [("model", "gradcam,featuremaps,thermometer"), ("lm", "attention,logitlens,thermometer")])
def test_deleted_model_is_freed(sh, var: str, views: str, record_property) -> None:  # type: ignore[no-untyped-def]
    record_property("cells", [("del_model", v) for v in views.split(",")])
    arg = "x" if var == "model" else "ids"
    assert sh.run_cell(f"%%nndebug {var} --view {views}\nout = {var}({arg})").success
    assert sh.run_cell(f"r = weakref.ref({var}); del {var}, out; gc.collect()").success
    assert sh.run_cell("assert r() is None, 'the model is still alive'").success


@pytest.mark.parametrize(("var", "views"), [("model", "thermometer,featuremaps,gradcam"), ("lm", "attention,logitlens,thermometer")])
def test_100_reruns(sh, var: str, views: str, record_property) -> None:  # type: ignore[no-untyped-def]
    """0 hooks, no widget growth, no memory growth after 100 runs of the same cell."""
    from ipywidgets.widgets.widget import _instances

    record_property("cells", [("reruns", v) for v in views.split(",")])
    arg = "x" if var == "model" else "ids"
    cell = f"%%nndebug {var} --view {views}\nout = {var}({arg})"
    for _ in range(3):
        assert sh.run_cell(cell).success
    gc.collect()
    live = len(_instances)
    objects = len(gc.get_objects())  # cheaper than tracemalloc, which would triple the loop's time
    for _ in range(100):
        res = sh.run_cell(cell)
        assert res.success, res.error_in_exec
        sh.displayed.clear()
    gc.collect()
    grown = len(gc.get_objects()) - objects
    assert hook_count(sh.user_ns[var]) == 0
    assert len(_instances) == live, (live, len(_instances))
    # IPython keeps each cell's input history (a few objects a run); a kept capture would be hundreds
    assert grown < 2_000, grown


def test_max_bytes_units_and_zero(sh) -> None:  # type: ignore[no-untyped-def]
    """Issue 9 items 9 and 12: `--max-bytes 64MB` is accepted; `%config NNDebugMagics.max_bytes = 0` is honoured."""
    res = sh.run_cell("%%nndebug model --max-bytes 64MB -o cap\nmodel(x).sum().backward()")
    assert res.success, res.error_in_exec
    assert all(r.sample is not None for r in sh.user_ns["cap"].layers)
    assert sh.run_cell("%config NNDebugMagics.max_bytes = 0").success
    res = sh.run_cell("%%nndebug model -o cap\nmodel(x).sum().backward()")
    assert res.success, res.error_in_exec
    assert all(r.sample is None for r in sh.user_ns["cap"].layers), "max_bytes=0 replaced by the default"
    assert any("budget" in n or "max-bytes" in n for n in sh.user_ns["_nndebug_widget"].notes)


def test_view_all_on_a_language_model(sh, capsys) -> None:  # type: ignore[no-untyped-def]
    res = sh.run_cell("%%nndebug lm --view all -o r\nout = lm(ids)")
    assert res.success, res.error_in_exec
    assert capsys.readouterr().err == ""
    assert set(sh.user_ns["r"]) == {"thermometer", "attention", "logitlens"}, list(sh.user_ns["r"])
    dash = sh.user_ns["_nndebug_widget"]
    assert len(dash.notes) == 1 and "featuremaps" in dash.notes[0] and "gradcam" in dash.notes[0], dash.notes


def test_pending_backward_in_the_next_cell(sh) -> None:  # type: ignore[no-untyped-def]
    """Issue 9 item 2 through the magic: Grad-CAM in one cell, the user's backward in the next."""
    assert sh.run_cell("ref = __import__('copy').deepcopy(model); ref(x).sum().backward()").success
    res = sh.run_cell("%%nndebug model --view gradcam,thermometer\nout = model(x)")
    assert res.success, res.error_in_exec
    res = sh.run_cell("out.sum().backward()")
    assert res.success, res.error_in_exec
    code = "assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters()))"
    assert sh.run_cell(code).success


def test_generate_through_the_magic(sh) -> None:  # type: ignore[no-untyped-def]
    cell = "%%nndebug lm --view attention,logitlens -o r\nout = lm.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)"
    res = sh.run_cell(cell)
    assert res.success, res.error_in_exec
    T = M.PROMPT_LEN + M.NEW_TOKENS
    r = sh.user_ns["r"]
    assert r["attention"].shape[2] == T and r["logitlens"].top_ids.shape[1] == T
    assert hook_count(sh.user_ns["lm"]) == 0
    assert sh.user_ns["out"].shape == (1, T)


def test_zero_threshold_is_honoured(sh) -> None:  # type: ignore[no-untyped-def]
    """Item 12: `--dead-threshold 0` means "any fraction of zeros", not the default 0.99."""
    assert sh.run_cell("%%nndebug model --dead-threshold 0\nmodel(x)").success
    flags = {lay["name"]: lay["flags"] for lay in sh.user_ns["_nndebug_widget"].layers}
    assert "dead" in flags["conv1"], flags
    assert sh.run_cell("%%nndebug model\nmodel(x)").success
    flags = {lay["name"]: lay["flags"] for lay in sh.user_ns["_nndebug_widget"].layers}
    assert "dead" not in flags["conv1"], flags
