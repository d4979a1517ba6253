"""After ``del model; gc.collect()`` in the notebook, nothing of nbdebug keeps the model alive.

The magic's record of live widgets, ``_nndebug``/``_nndebug_widget``, the dashboard and the views'
widgets (still displayed, comms open) hold the model only weakly; so does the Python API's
``Debug``. Checked with a ``weakref`` to the model, through a fresh ``InteractiveShell``.
"""

from __future__ import annotations

import gc

import pytest
import torch
from shell_cells import CNN, LM, MLP
from torch import nn

from nbdebug.api import Debug
from nbdebug.capture import ModelGoneError

#: each test's ``gc.collect()`` walks only what the test made (tests/conftest.py's ``young_heap``)
pytestmark = pytest.mark.usefixtures("young_heap")

#: made before any test of this module starts, so frozen by ``young_heap``: what it holds stays alive
OLD_HOLDER: list[object] = []

CASES = [
    ("mlp", MLP, "thermometer", "out = model(x); out.sum().backward()"),
    ("cnn", CNN, "featuremaps", "out = model(x)"),
    ("cnn", CNN, "gradcam", "out = model(x)"),
    ("cnn", CNN, "all", "out = model(x); out.sum().backward()"),
    ("lm", LM, "attention", "out = model(x)"),
    ("lm", LM, "logitlens", "out = model(x)"),
    ("lm", LM, "all", "out = model(x)"),
]


def _run_then_delete(shell, setup: str, view: str, body: str, *, raises: bool = False) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(setup + "\nimport gc, weakref\nref = weakref.ref(model)").success
    tail = "\nraise ValueError('after the forward')" if raises else ""
    res = shell.run_cell(f"%%nndebug model --view {view} -o got\n{body}{tail}")
    if raises:
        assert isinstance(res.error_in_exec, ValueError)
    else:
        assert res.success, res.error_in_exec
    w = shell.user_ns["_nndebug_widget"]
    assert w is not None and w.comm is not None  # still displayed
    assert shell.run_cell("del model\ngc.collect()").success
    gc.collect()


@pytest.mark.parametrize(("kind", "setup", "view", "body"), CASES, ids=[f"{k}-{v}" for k, _, v, _ in CASES])
def test_deleted_model_is_collected_while_its_widget_is_displayed(shell, kind: str, setup: str, view: str, body: str) -> None:  # type: ignore[no-untyped-def]
    _run_then_delete(shell, setup, view, body)
    assert shell.user_ns["ref"]() is None, f"{view} on {kind}: something still holds the model"
    magic = shell.magics_manager.registry["NNDebugMagics"]
    assert magic._live and shell.user_ns["_nndebug_widget"] is next(iter(magic._live.values()))[0]


def test_deleted_model_is_collected_after_the_cell_raised(shell) -> None:  # type: ignore[no-untyped-def]
    """IPython keeps the last traceback (and so the magic's frame): it must not hold the model."""
    _run_then_delete(shell, MLP, "thermometer", "out = model(x)", raises=True)
    assert shell.user_ns["ref"]() is None


def test_debug_api_does_not_keep_the_model() -> None:
    import weakref

    m = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    ref = weakref.ref(m)
    with Debug(m, "thermometer") as dbg:
        m(torch.randn(2, 4)).sum().backward()
    w = dbg.widget()
    assert dbg.model is m and dbg.result is not None
    del m
    gc.collect()
    assert ref() is None and w.comm is not None
    with pytest.raises(ModelGoneError, match="re-run the cell"):
        _ = dbg.model
    w.close()


BEFORE_WIDGETS = [
    ("thermometer", False, lambda m, x: m(x).sum().backward()),
    ("featuremaps", True, lambda m, x: m(x)),
    ("gradcam", True, lambda m, x: m(x)),
    ("all", True, lambda m, x: m(x).sum().backward()),
]


@pytest.mark.parametrize(("view", "cnn", "body"), BEFORE_WIDGETS, ids=[v for v, _, _ in BEFORE_WIDGETS])
def test_debug_api_result_read_then_model_deleted_before_any_widget_is_built(view: str, cnn: bool, body) -> None:  # type: ignore[no-untyped-def]
    """``d = nbdebug.debug(m); with d: m(x); d.result; del m`` → collected, though no widget was ever built
    (the session/recorders alone must not keep the model until widgets take it weakly)."""
    import weakref

    import nbdebug

    torch.manual_seed(0)
    if cnn:
        m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
        x = torch.randn(2, 3, 8, 8)
    else:
        m, x = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), torch.randn(5, 4)
    ref = weakref.ref(m)
    d = nbdebug.debug(m, view)
    with d:
        body(m, x)
    assert d.result is not None
    del m, body
    gc.collect()
    assert ref() is None, f"{view}: the Debug (no widget built yet) still holds the model"


def test_recorder_model_is_a_weak_attribute() -> None:
    import weakref

    from nbdebug.views import Recorder

    m = nn.Linear(2, 2)
    rec = Recorder(m)
    assert rec.model is m
    other = nn.Linear(3, 3)
    rec.model = other  # assignable like an attribute
    assert rec.model is other
    ref = weakref.ref(other)
    del other
    gc.collect()
    assert ref() is None
    with pytest.raises(ModelGoneError):
        _ = rec.model


def test_a_fetch_after_the_model_is_gone_answers_with_the_message_as_an_error() -> None:
    """The RPC layer sends ``ModelGoneError``'s message as it is (other errors keep their type)."""
    import weakref

    from nbdebug.capture import ModelRef
    from nbdebug.widgets._base import NBWidget, rpc
    from nbdebug.widgets._export import build_page

    class Needy(NBWidget):
        _view_name_ = "thermometer"

        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self._ref = ModelRef(model)

        @rpc("weights")
        def _weights(self, params: dict) -> tuple[dict, dict]:
            if params.get("bad"):
                raise KeyError("bad")
            return {"n": sum(p.numel() for p in self._ref.get().parameters())}, {}

    m = nn.Linear(2, 3)
    ref = weakref.ref(m)
    w = Needy(m)
    sent: list[dict] = []
    w.send = lambda content, buffers=None: sent.append(content)  # type: ignore[method-assign]
    w._handle_request(w, {"type": "request", "id": 1, "method": "weights", "params": {}}, [])
    assert sent[-1]["ok"] and sent[-1]["result"] == {"n": 9}
    del m
    gc.collect()
    assert ref() is None
    w._handle_request(w, {"type": "request", "id": 2, "method": "weights", "params": {}}, [])
    assert sent[-1] == {"type": "response", "id": 2, "ok": False, "error": str(ModelGoneError())}
    w._handle_request(w, {"type": "request", "id": 3, "method": "weights", "params": {"bad": 1}}, [])
    assert sent[-1]["error"] == "KeyError: 'bad'"
    page, _ = build_page(esm="", state={}, answers=[("weights", {}, ModelGoneError())], title="t", max_bytes=10**6)
    assert str(ModelGoneError()) in page and "ModelGoneError:" not in page
    w.close()


def test_displaying_a_widget_whose_snapshot_needs_the_deleted_model_does_not_raise() -> None:
    """The static snapshot travels in the mimebundle; if it cannot be made, one line says why."""
    from nbdebug.capture import ModelRef
    from nbdebug.widgets._base import NBWidget
    from nbdebug.widgets.dashboard import Dashboard

    class Lazy(NBWidget):
        _view_name_ = "thermometer"

        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self._ref = ModelRef(model)

        def fallback_html(self) -> str:
            return f"<p>{type(self._ref.get()).__name__}</p>"

    m = nn.Linear(2, 2)
    w = Lazy(m)
    dash = Dashboard({"lazy": w})
    assert w._repr_mimebundle_()[0]["text/html"] == "<p>Linear</p>"
    del m
    gc.collect()
    html = w._repr_mimebundle_()[0]["text/html"]
    assert "no static snapshot" in html and "the model was deleted" in html
    assert "no static snapshot" in dash._repr_mimebundle_()[0]["text/html"]
    dash.close()


def test_a_model_held_by_an_object_older_than_the_test_is_not_collected() -> None:
    """The twin of ``young_heap``: an object alive before the test (frozen) that holds the model keeps
    it alive through ``gc.collect()``, as without the freeze; a cycle made in the test is collected."""
    import weakref

    m = nn.Linear(2, 2)
    m.me = [m]  # a cycle: only the collector frees it
    ref = weakref.ref(m)
    OLD_HOLDER.append(m)
    del m
    gc.collect()
    assert ref() is not None, "a frozen holder's reference was not counted"
    OLD_HOLDER.clear()
    gc.collect()
    assert ref() is None, "a cycle made during the test was not collected"
