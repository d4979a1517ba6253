"""`widget.save_html(path)` files opened from file:// in chromium with every network request
blocked: each view draws from its inlined module and state, and clicks are answered from the
precomputed table (no kernel, no Jupyter server)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from .harness import canvas_nonblank, screenshot, wait_canvas_nonblank

pytest.importorskip("transformers")

_spec = importlib.util.spec_from_file_location("snapshot_models", Path(__file__).resolve().parent.parent / "widget" / "snapshot_models.py")
models = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(models)  # type: ignore[union-attr]
HOSTILE = models.HOSTILE


def _open(page: Any, path: Path, view: str) -> tuple[Any, list[str]]:
    """Open the exported file with everything but the file itself aborted; wait for the view."""
    me = path.resolve().as_uri()
    blocked: list[str] = []

    def route(r: Any) -> None:
        if r.request.url == me:
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(me)
    root = page.locator(f'.nbdebug-{view}[data-ready="1"]')
    root.wait_for(state="attached")
    return root, blocked


def _export(tmp_path: Path, view: str) -> Path:
    w = models.BUILDERS[view]()
    return w.save_html(tmp_path / f"{view}.html")


def test_thermometer_export(page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    root, blocked = _open(page, _export(tmp_path, "thermometer"), "thermometer")
    assert page.title() == "nbdebug thermometer"
    rows = root.locator(".nbd-row")
    assert rows.count() == 9 and rows.nth(8).locator(".nbd-name").text_content() == HOSTILE
    rows.nth(2).click()  # the ReLU row: its histogram is a precomputed answer
    root.locator('.nbd-detail[data-histogram="ready"]').wait_for()
    assert wait_canvas_nonblank(page, ".nbdebug-thermometer canvas.nbdebug-histogram", minimum=50) >= 50
    rows.nth(8).click()
    root.locator(".nbd-detail-title code").filter(has_text=HOSTILE).wait_for()
    assert root.locator("img").count() == 0 and blocked == []
    screenshot(page, "export-thermometer")


def test_featuremaps_export_and_missing_answer(page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    root, blocked = _open(page, _export(tmp_path, "featuremaps"), "featuremaps")
    # The view opens on the deepest spatial layer ("4", 16 channels of 8×8)
    assert root.locator(".nbd-tile").count() == 16
    assert wait_canvas_nonblank(page, '.nbdebug-featuremaps .nbd-tile[data-channel="15"] canvas', minimum=5) >= 5
    root.locator("select.nbd-layer").select_option("0")  # another layer's first page: precomputed
    page.wait_for_function("document.querySelectorAll('.nbdebug-featuremaps .nbd-tile').length === 8")
    assert wait_canvas_nonblank(page, '.nbdebug-featuremaps .nbd-tile[data-channel="0"] canvas', minimum=20) >= 20
    screenshot(page, "export-featuremaps")
    root.locator("select.nbd-sort").select_option("mean")  # not in the table: answered ok=false
    page.get_by_text("not available in the exported file").first.wait_for()
    assert blocked == []


def test_gradcam_export(page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    root, blocked = _open(page, _export(tmp_path, "gradcam"), "gradcam")
    sel = ".nbdebug-gradcam canvas.nbd-overlay"
    before = wait_canvas_nonblank(page, sel, minimum=50)
    labels = root.locator("select.nbd-class option").all_text_contents()
    assert labels and all(HOSTILE in t for t in labels)
    root.locator("select.nbd-sample").select_option("1")  # sample 1's view: precomputed
    page.wait_for_function("(s) => document.querySelector(s.root).dataset.ready === '1'", arg={"root": ".nbdebug-gradcam"})
    assert wait_canvas_nonblank(page, sel, minimum=50) >= 50 and before >= 50
    assert "not available" not in root.text_content()
    assert root.locator("img").count() == 0 and blocked == []
    screenshot(page, "export-gradcam")


def test_attention_export(page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    root, blocked = _open(page, _export(tmp_path, "attention"), "attention")
    assert root.locator(".nba-head").count() == 4
    assert canvas_nonblank(page, '.nbdebug-attention .nba-head[data-layer="1"][data-head="0"] canvas') > 0
    root.locator('.nba-head[data-layer="1"][data-head="0"]').click()  # the head's matrix: precomputed
    page.locator('.nbdebug-attention .nba-detail[data-ready="1"]').wait_for(state="attached")
    assert wait_canvas_nonblank(page, ".nbdebug-attention .nba-matrix", minimum=10) >= 10
    assert page.locator(".nbdebug-attention .nba-detail .nba-tok").filter(has_text=HOSTILE).count() >= 1
    assert blocked == []
    screenshot(page, "export-attention")


def test_logitlens_export(page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    root, blocked = _open(page, _export(tmp_path, "logitlens"), "logitlens")
    page.locator('.nbdebug-logitlens[data-complete="1"]').wait_for(state="attached")  # columns answered
    assert root.locator("thead th").nth(2).text_content() == HOSTILE
    cells = root.locator("table:not(.nbl-bylayer) tbody td")
    assert cells.count() == 4 * 9 and root.locator("td.nbl-pending").count() == 0
    cells.nth(3).click()  # the pinned cell's top-20: precomputed
    page.locator('.nbdebug-logitlens .nbl-pins[data-ready="1"] .nbl-pin').wait_for(state="attached")
    assert root.locator("img").count() == 0 and blocked == []
    screenshot(page, "export-logitlens")
