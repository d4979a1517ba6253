"""The distributed run's view in a real JupyterLab: a Run of 2 ranks (spooled in the kernel itself by
two ``SpoolDebug`` blocks with RANK=0/1: no processes needed here; NaN planted on rank 1 at step 3,
one parameter changed on rank 1, a layer with a hostile name) shows the rank selector on rank 1, the
first-NaN card with rank/step/module, the spread column; choosing rank 0 fetches that rank's table
from the kernel and redraws it (values equal the kernel's ``run.ranks[0]``); its step slider moves the
spread column to that step (min … max of the ranks' series there) and to the whole run, without a request;
the header and the note name the slider's step; a row click asks for no histogram (a rank's values are not
kept across processes: a quiet line says so) and leaves no ``js_error``; every text node is at WCAG AA
contrast and nothing is cut in an 800-px window."""

from __future__ import annotations

import re

import pytest

from .harness import (
    HOSTILE,
    kernel_json,
    open_and_run,
    run_code_and_wait_text,
    screenshot,
    wait_widget,
    write_notebook,
)
from .legibility import clipped, contrast_failures, narrow

pytestmark = pytest.mark.browser


BUILD_CELL = f"""
import os, tempfile
import torch
from torch import nn
from nbdebug.distributed import SpoolDebug, load

class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = 1.0
    def forward(self, x):
        return x * self.k

spool = tempfile.mkdtemp()
for rank in (0, 1):
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), "2"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), Scale(), nn.ReLU(), nn.Linear(8, 2))
    model.add_module({HOSTILE!r}, nn.Identity())
    g = torch.Generator().manual_seed(100 + rank)
    with SpoolDebug(model, spool=spool, resume=None):
        for step in range(1, 5):
            if (rank, step) == (1, 3):
                model[1].k = float("nan")
            model(torch.randn(6, 4, generator=g)).pow(2).mean().backward()
        if rank == 1:
            with torch.no_grad():
                model[3].bias.add_(1.0)
del os.environ["RANK"], os.environ["WORLD_SIZE"]
run = load(spool)
"""

SHOW_CELL = "w = run.widget()\nw"

MEAN = re.compile(r"mean (\S+) ±")


SPREAD_TEXT = """(name) => {
    for (const r of document.querySelectorAll('.nbdebug-run .nbdebug-thermometer .nbd-row')) {
        const first = r.querySelector('.nbd-name')?.firstChild;
        if (first && first.textContent === name) return r.querySelector('.nbd-spread-cell')?.textContent ?? null;
    }
    return null;
}"""


def spread_cell(page, row: str) -> tuple[float, float]:
    """The spread column's ``lo … hi`` (or one value) of the row named ``row``."""
    text = page.evaluate(SPREAD_TEXT, row)
    assert text, row
    parts = [float(x) for x in text.split(" … ")]
    return parts[0], parts[-1]


def row_mean(widget, i: int) -> float:
    title = widget.locator(f'.nbdebug-thermometer .nbd-row[data-row="{i}"] .nbd-therm').get_attribute("title") or ""
    m = MEAN.search(title)
    assert m, title
    return float(m.group(1))


def test_run_view_lab(page, lab) -> None:
    write_notebook(lab.root, "run_lab", [BUILD_CELL, SHOW_CELL])
    open_and_run(page, lab, "run_lab")
    widget = wait_widget(page, "run")
    info = kernel_json(page, "{'rank': w.rank, 'diverged': run.diverged, 'first': [run.first_nonfinite[0].rank, "
                             "run.first_nonfinite[0].step, run.first_nonfinite[0].module], 'js_error': w.js_error, "
                             "'means': [[float(r.history.at(4)[n]['mean']) for n in r.history.rows] for r in run.ranks], "
                             "'rows': run.ranks[0].history.rows}")
    assert info["rank"] == 1 and info["first"] == [1, 3, "1"] and info["diverged"] == ["3.bias"] and info["js_error"] == ""

    # the rank selector: one button per rank, rank 1 (the first NaN) shown and marked
    buttons = widget.locator(".nbd-rank-btn")
    assert buttons.count() == 2
    assert "nbd-rank-active" in (buttons.nth(1).get_attribute("class") or "")
    assert buttons.nth(1).locator(".nbd-rank-nan").count() == 1
    assert widget.get_attribute("data-rank") == "1"
    card = widget.locator(".nbd-run-nonfinite-head").text_content() or ""
    assert card.startswith("first NaN/Inf: rank 1, step 3, 1 (forward)")
    assert widget.locator(".nbd-run-nonfinite-head code").text_content() == "1"
    assert widget.locator(".nbd-run-diverged-list").text_content() == "3.bias from step 4"

    # rank 1's table at its last step; the spread column on every row
    assert widget.locator(".nbdebug-thermometer .nbd-row").count() == len(info["rows"]) == 5
    assert row_mean(widget, 0) == pytest.approx(info["means"][1][0], rel=5e-3)
    assert widget.locator(".nbd-row .nbd-spread-cell").count() == 5
    assert widget.locator(".nbd-h-spread").text_content() == "mean across ranks"

    # the hostile layer name is text
    assert HOSTILE in (widget.locator(".nbdebug-thermometer").text_content() or "")
    assert page.locator('img[src="x"]').count() == 0 and page.evaluate("window.__pwned") is None

    # choosing rank 0 fetches its table from the kernel and redraws
    buttons.nth(0).click()
    page.locator('.nbdebug-run[data-rank="0"]').wait_for(state="attached", timeout=30_000)
    assert "nbd-rank-active" in (widget.locator('.nbd-rank-btn[data-rank="0"]').get_attribute("class") or "")
    for i in (0, 3):
        assert row_mean(widget, i) == pytest.approx(info["means"][0][i], rel=5e-3)
    assert info["means"][0][0] != pytest.approx(info["means"][1][0], rel=5e-3)  # the ranks differ: a real redraw
    assert widget.locator(".nbd-row .nbd-spread-cell").count() == 5
    run_code_and_wait_text(page, "print('rank=' + str(w.rank), 'err=' + repr(w.js_error))", "rank=0 err=''")
    screenshot(page, "run-lab", widget)

    # rank 0's step slider: the spread column follows it (step 2: min … max of the ranks' series at
    # step 2), then "whole run" (the ranks' merged rows), from the spread trait already in the browser
    # (rank 1's merged row 3 is NaN from step 3 on: the spread is over the ranks with a finite value)
    ref = kernel_json(page, "(lambda fin: {'s2': [fin(r.series(n, 'mean')[1] for r in run.ranks) for n in ('0', '3')], "
                            "'whole': [fin(r[n].stats['mean'] for r in run.ranks) for n in ('0', '3')]})"
                            "(lambda xs: sorted(float(x) for x in xs if x == x))")
    widget.locator(".nbdebug-thermometer input.nbd-slider").fill("1")
    widget.locator(".nbd-step-label", has_text="step 2 of 4").wait_for()
    # the header and the note naming the table's step follow the slider too (not step 4's)
    head = widget.locator(".nbdebug-thermometer .nbd-summary").text_content() or ""
    assert head.startswith("step 2: 5 layers: "), head
    notes = widget.locator(".nbdebug-thermometer .nbd-notes li").all_text_contents()
    assert any(n.startswith("table and flags at step 2 of 4 (") for n in notes), notes
    assert not any("step 4 of 4" in n for n in notes), notes
    # a row click: no histogram request (a rank's values are not kept across processes), a quiet line
    widget.locator('.nbdebug-thermometer .nbd-row[data-row="0"] .nbd-type').click()
    widget.locator('.nbd-detail[data-histogram="none"]').wait_for()
    note = widget.locator(".nbd-detail .nbd-hist-note").text_content() or ""
    assert note.startswith("no histogram: values are not kept across processes"), note
    assert widget.locator(".nbd-detail .nbd-error").count() == 0
    assert kernel_json(page, "w.js_error") == ""
    for i, row in enumerate(("0", "3")):
        lo, hi = spread_cell(page, row)
        assert (lo, hi) == (pytest.approx(ref["s2"][i][0], rel=5e-3), pytest.approx(ref["s2"][i][-1], rel=5e-3)), row
    assert ref["s2"][0][0] != pytest.approx(ref["whole"][0][0], rel=5e-3)
    widget.locator(".nbdebug-thermometer .nbd-whole").click()
    widget.locator(".nbd-step-label", has_text="whole run").wait_for()
    for i, row in enumerate(("0", "3")):
        lo, hi = spread_cell(page, row)
        assert (lo, hi) == (pytest.approx(ref["whole"][i][0], rel=5e-3), pytest.approx(ref["whole"][i][-1], rel=5e-3)), row
    title = widget.locator(".nbd-h-spread").get_attribute("title") or ""
    assert "over the whole run" in title
    # the header is the kernel's whole-run report of rank 0 (backticked names drawn as code)
    merged = kernel_json(page, "__import__('nbdebug.inspectors.thermometer', fromlist=['diagnose']).diagnose(run.ranks[0], step='run').summary")
    assert widget.locator(".nbdebug-thermometer .nbd-summary").text_content() == merged.replace("`", "")
    assert kernel_json(page, "w.js_error") == ""
    # legibility (issue 22): every text node at WCAG AA, and nothing cut in an 800-px window
    checked, bad = contrast_failures(page, ".nbdebug-run")
    assert checked > 50 and bad == [], bad[:10]
    assert 0 < narrow(page) <= 800
    checked, cut = clipped(page, ".nbdebug-run")
    assert checked > 30 and cut == [], cut[:10]
    screenshot(page, "run-800px", widget)
