"""The real-use matrix of issue 9: one test per mode × view through the public API.

Each cell runs a user's cell on a fresh tiny model under ``nbdebug.debug(model, view=...)`` and on
an identical copy without nbdebug, then checks the view's content, hooks, model state and graph
(``usercode.py``: models, cell bodies, references; ``cells.py``: running a cell; ``checks.py``: what each view must show). A cell the product does not pass yet is a strict xfail naming the
issue-9 item and the symptom: when a fix makes it pass, the xfail fails and the mark must go.
"""

from __future__ import annotations

import pytest

import nbdebug

from . import cells
from .checks import check

CNN = ["thermometer", "featuremaps", "gradcam"]
LANG = ["attention[gpt2]", "attention[llama]", "logitlens[gpt2]", "logitlens[llama]"]
ALL = CNN + LANG
ALL_T = [*ALL, "thermometer[llama]", "attention[bert]"]  # + the thermometer on Llama, attention on a BERT encoder
#: mode → the views it applies to (thermometer[gpt2]: the thermometer on a language model)
MODES: dict[str, list[str]] = {
    "plain": ALL_T,
    "no_grad": [*ALL, "attention[bert]"],
    "inference_mode": ALL_T,
    "autocast": ALL_T,
    "pending_backward": ALL_T,
    "user_hooks": ALL,
    "exception": ALL_T,
    "keyboard_interrupt": ALL_T,
    "shape_error": CNN,
    "interrupt_in_forward": CNN,
    "dtype_error": CNN,
    "nan_loop": CNN,
    "generate": ["thermometer[gpt2]", *LANG],
    "generate_user_hooks": ["thermometer[gpt2]", *LANG],
    "shared": CNN,
    "ckpt_reentrant": CNN,
    "ckpt_nonreentrant": CNN,
    "hf_ckpt": ["thermometer[gpt2]", *LANG],
    "fp16": ALL_T,
    "bf16": ALL_T,
    "int_outputs": CNN,
    "channels_last": CNN,
    "input_grad": CNN,
    "dropout": CNN,
    "train_step": CNN,
    "nonsquare": CNN,
    "inplace_relu": CNN,
    "frozen": ALL,
    "double_backward": CNN,
    "parametrized": CNN,
    "kwargs_call": CNN,
    "inputs_embeds": ["thermometer[llama]", *LANG],
    "tuple_output": LANG,
    "padded": [*LANG, "attention[bert]"],
    "budget0": ALL_T,
    "not_applicable": ["featuremaps", "gradcam", "attention", "logitlens", "logitlens[bert]"],
}

# every view at once (view="all"): each as correct as alone, the others a quiet note
for _mode, _views in list(MODES.items()):
    if _mode == "not_applicable":
        continue
    MODES[_mode] = [*_views, *(f"all[{fam}]" for fam, own in (("cnn", CNN), ("gpt2", LANG[::2]), ("llama", LANG[1::2]))
                               if any(v in own for v in _views))]

#: (mode, view) → "issue 9 item N: symptom" for cells that fail on the current tree (strict xfail)
XFAIL: dict[tuple[str, str], str] = {}


def no_interrupt(fn, *args):  # type: ignore[no-untyped-def]
    """A KeyboardInterrupt escaping nbdebug (not the user's, which ``run`` expects) fails the cell
    instead of stopping the whole session."""
    try:
        return fn(*args)
    except KeyboardInterrupt as exc:
        pytest.fail(f"KeyboardInterrupt escaped from nbdebug after the cell: {exc}")


def _params(modes: dict[str, list[str]]) -> list[object]:
    out = []
    for mode, views in modes.items():
        for view in views:
            reason = XFAIL.get((mode, view))
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            out.append(pytest.param(mode, view, marks=marks, id=f"{mode}-{view}"))
    return out


@pytest.mark.parametrize(("mode", "view"), _params(MODES))
def test_cell(mode: str, view: str, record_property) -> None:  # type: ignore[no-untyped-def]
    record_property("cell", (mode, view))
    res = no_interrupt(cells.run, mode, view, check)
    if res.note:
        record_property("note", res.note)


COMPILED = ["thermometer", "featuremaps", "gradcam", "attention[gpt2]", "logitlens[gpt2]", "thermometer[gpt2]", "all[cnn]", "all[gpt2]"]


@pytest.mark.parametrize(("mode", "view"), _params({"compiled": COMPILED}))
def test_compiled(mode: str, view: str, compiled, record_property) -> None:  # type: ignore[no-untyped-def]
    record_property("cell", (mode, view))
    fam = cells.family_of(mode, view)
    res = no_interrupt(cells.run_compiled, view, *compiled[fam], check)
    if res.note:
        record_property("note", res.note)


DEL_VIEWS = [*ALL, "all[cnn]", "all[gpt2]", "all[llama]"]


@pytest.mark.parametrize(("mode", "view"), _params({"del_model": DEL_VIEWS}))
def test_del_model(mode: str, view: str, record_property) -> None:  # type: ignore[no-untyped-def]
    """After ``del model; gc.collect()`` nothing of ours keeps the model; a fetch answers or says it is gone."""
    from nbdebug.capture.weak import MODEL_GONE

    record_property("cell", (mode, view))
    gone, answers = no_interrupt(cells.run_del_model, view)
    assert gone, "the model is still alive after del model + gc.collect()"
    assert answers, "no widget to ask"
    for v, a in answers:
        if v == "gradcam":  # another layer needs the model: the clear message, as an error
            assert MODEL_GONE in a, a
        else:  # kept data still answers; anything that needs the model says it is gone
            assert a == "ok" or MODEL_GONE in a, a


def test_shared_module_names_link_across_views() -> None:
    """One name per call in every view: selecting thermometer row relu#2 opens relu#2 in the feature
    grid and in Grad-CAM (and relu opens relu), through the dashboard's linked selection."""
    from . import models as M

    model, x = M.tiny_cnn(), M.image()
    with nbdebug.debug(model, view="thermometer,featuremaps,gradcam") as dbg:
        model(x)
    dash = dbg.dashboard()
    t, f, g = (dash.views[v] for v in ("thermometer", "featuremaps", "gradcam"))
    for name in ("relu#2", "relu", "relu#2"):
        t.selected = name
        assert (f.layer, g.layer) == (name, name), (name, f.layer, g.layer)
    info, _ = g.handle_request("view", {"layer": "relu", "sample": 0})
    assert info["result"]["layer"] == "relu"
    dash.close()
