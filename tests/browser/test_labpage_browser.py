"""The reused JupyterLab page (``labpage.py``) hands the next test what a fresh page would: no node,
global, Python handler or kernel of the previous test's notebook; and each leftover it checks for,
planted on purpose, makes it refuse the page (the next test then loads Lab afresh).

Drives its own :class:`labpage.LabPage` (one Lab load), not the worker's, so the planted leftovers
cannot reach another test."""

from __future__ import annotations

import json
from typing import Any

import pytest

from . import labpage
from .harness import WIDGET_MS, kernel_json, open_and_run, run_js, wait_widget, write_notebook
from .legibility import narrow

pytestmark = pytest.mark.browser

CELLS = [
    "%load_ext nbdebug",
    "import torch\nfrom torch import nn\ntorch.manual_seed(0)\nmodel = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))\nx = torch.randn(5, 4)",
    "%%nndebug model --view thermometer\nmodel(x).sum().backward()",
]
KERNEL_ID = "app.shell.currentWidget.sessionContext.session.kernel.id"


def _handlers(page: Any) -> int:
    impl = page._impl_obj
    return sum(len(impl.raw_listeners(ev)) for ev in impl.event_names())


def test_reused_lab_page_is_clean_and_refuses_leftovers(browser, lab) -> None:  # type: ignore[no-untyped-def]
    pool = labpage.LabPage(browser, WIDGET_MS)
    try:
        page = pool.acquire()
        own = _handlers(page)
        write_notebook(lab.root, "reuse_a", CELLS)
        open_and_run(page, lab, "reuse_a")
        wait_widget(page, "thermometer")
        first_kernel = run_js(page, f"return {KERNEL_ID};")
        assert pool.loads == 1 and pool.reuses == 0
        page.evaluate("window.__leak = 1")
        page.on("websocket", lambda ws: None)
        assert _handlers(page) == own + 1
        assert not pool._clean()  # the notebook is still open: not reusable yet

        pool.release(True)
        lab.shutdown_sessions()
        again = pool.acquire()
        assert again is page  # reused ...
        assert page.locator(".nbdebug-thermometer, .jp-Notebook, .jp-OutputArea").count() == 0
        assert page.evaluate("window.__leak") is None  # ... with the test's globals gone
        assert _handlers(page) == own  # and its Python handlers
        assert pool.errors is not None and pool.errors.unexpected() == []

        write_notebook(lab.root, "reuse_b", CELLS)
        open_and_run(page, lab, "reuse_b")
        assert pool.loads == 1 and pool.reuses == 1  # opened in place
        wait_widget(page, "thermometer")
        assert page.locator(".nbdebug-thermometer").count() == 1  # only this notebook's widget
        assert run_js(page, f"return {KERNEL_ID};") != first_kernel  # a kernel of its own
        assert kernel_json(page, "'model' in dir()") is True
        pool.release(True)
        lab.shutdown_sessions()
        assert pool._clean()

        # each planted leftover makes the page unusable; taken back, the page is clean again
        plants = {
            "an nbdebug node": ("document.body.appendChild(Object.assign(document.createElement('div'), {className: 'nbd-x', id: 'planted'}))",
                                "document.getElementById('planted').remove()"),
            "a dialog": ("document.body.appendChild(Object.assign(document.createElement('div'), {className: 'jp-Dialog', id: 'planted'}))",
                         "document.getElementById('planted').remove()"),
            "a side panel": ("window.jupyterapp.shell.leftCollapsed ? window.jupyterapp.shell.expandLeft() : window.jupyterapp.shell.collapseLeft()",
                             "window.jupyterapp.shell.leftCollapsed ? window.jupyterapp.shell.expandLeft() : window.jupyterapp.shell.collapseLeft()"),
        }
        for what, (plant, undo) in plants.items():
            page.evaluate(plant)
            assert not pool._clean(), what
            if what == "a side panel":  # the reason names what changed, not the whole layout
                assert pool.refused[-1].startswith("the shell layout changed: left "), pool.refused[-1]
            page.evaluate(undo)
            assert pool._clean(), what
        # the 800-px tests' narrow(): the side panels it closed are opened again and the viewport put
        # back before the layout check (it once cost 5 Lab reloads a run)
        left = json.loads(pool.layout)["left"]
        assert narrow(page) == 0 and page.viewport_size != labpage.VIEWPORT
        assert run_js(page, "return app.shell.leftCollapsed;") is True
        assert pool._clean(), pool.refused[-1:]
        assert page.viewport_size == labpage.VIEWPORT and run_js(page, "return app.shell.leftCollapsed;") == left
        lab.api("/api/kernels", method="POST")  # a kernel left running on the server
        assert not pool._clean()
        lab.shutdown_sessions()
        assert pool._clean()

        page.reload(wait_until="domcontentloaded")  # a reload: Lab's state is not the one checked
        assert pool.acquire() is not page
    finally:
        pool.discard()
