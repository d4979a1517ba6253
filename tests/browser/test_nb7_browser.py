"""The live thermometer, the doctor, the grouped view and the run view in Notebook 7 (the
``/notebooks/<path>`` UI of the session's Notebook 7 server): each test opens its notebook, runs it,
checks the widget drew (pixels on its canvases, DOM values equal to the kernel's) and that an
interaction reached the kernel (a synced trait a later cell prints, or an on-demand fetch the
kernel answered); the live thermometer also comes back whole after a page refresh. The JupyterLab
twins are ``test_live_browser.py``, ``test_doctor_browser.py``, ``test_groups_browser.py`` and
``test_run_browser.py``; the notebooks are theirs where they fit (imported, not copied), smaller
where Lab's would cost CI time for nothing Notebook 7 adds.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from .harness import (
    HOSTILE,
    REPO,
    kernel_json,
    open_and_run,
    open_notebook,
    reload_notebook,
    run_code_and_wait_text,
    run_js,
    screenshot,
    start_run_all,
    wait_canvas_nonblank,
    wait_cell_finished,
    wait_widget,
    write_notebook,
)
from .test_doctor_browser import INFO as DOCTOR_INFO
from .test_doctor_browser import MODEL_CELL as DOCTOR_MODEL
from .test_doctor_browser import RUN_CELL as DOCTOR_RUN
from .test_live_browser import SETUP as LIVE_SETUP
from .test_live_browser import WATCH as LIVE_WATCH
from .test_live_browser import _std
from .test_live_browser import loop_cell as live_loop_cell
from .test_run_browser import BUILD_CELL as RUN_BUILD
from .test_run_browser import SHOW_CELL as RUN_SHOW
from .test_run_browser import row_mean

pytestmark = pytest.mark.browser

HISTOGRAM = '.nbdebug-thermometer [data-histogram="ready"] canvas.nbdebug-histogram'
COUNTED = re.compile(r"exact: all ([\d,]+) values|sample of ([\d,]+) of ([\d,]+) values")


def _histogram_counted(widget) -> list[int]:
    """Wait for the histogram the kernel sent for the selected row (pixels on its canvas); returns
    ``[values counted, values seen]`` as its note says (equal when exact)."""
    assert wait_canvas_nonblank(widget.page, HISTOGRAM, minimum=50) >= 50
    note = widget.locator('[data-histogram="ready"] .nbd-hist-note').text_content() or ""
    m = COUNTED.fullmatch(note)
    assert m, note
    exact, sampled, total = (int(g.replace(",", "")) if g else None for g in m.groups())
    return [exact, exact] if exact is not None else [sampled, total]


def _kernel_counted(layers: str, name: str) -> str:
    """The kernel's ``[values counted, values seen]`` for row ``name`` of ``layers`` (what the
    thermometer's histogram answer says: the kept sample, or all values when a histogram was kept)."""
    return (f"[[int(r.stats['numel'] if r.histogram is not None else r.sample.size), int(r.stats['numel'])] "
            f"for r in {layers} if r.name == {name!r}][0]")


# --------------------------------------------------------------------------------------------
# Live thermometer: the table changes while the cell runs
# --------------------------------------------------------------------------------------------
STEPS = 50  # 5 s at 0.1 s per step: ~20 live pushes at 4 per second (Lab's twin runs 80)
LOOP = live_loop_cell(STEPS, 10)


def test_live_thermometer_notebook7(page, nb7) -> None:
    write_notebook(nb7.root, "live_nb7", ["%load_ext nbdebug", LIVE_SETUP, LOOP])
    open_notebook(page, nb7, "live_nb7")
    run_js(page, LIVE_WATCH)  # notes the step counter and row 0 every 50 ms, and whether cell 2 runs
    start_run_all(page)
    wait_widget(page, "thermometer")
    wait_cell_finished(page, 2)
    seen = page.evaluate("clearInterval(window.__liveTimer), window.__live")
    busy = [s for s in seen if s["busy"]]
    counts = [s["count"] for s in busy if s["count"]]
    partial = {c for c in counts if int(c.split()[0]) < STEPS}
    assert len(partial) >= 3, seen  # the step counter moved while the cell had no execution count
    # Each count seen while the cell ran says so, but the final state: it may land before the cell's
    # execute_reply (the magic sends it, then returns), and then its count is the whole run's.
    assert all("(running…)" in c or c == f"{STEPS} steps" for c in counts), counts
    assert all("(running…)" in c for c in counts if int(c.split()[0]) < STEPS), counts
    assert len({s["cell"] for s in busy if s["cell"]}) >= 3, seen  # and so did row 0's values
    assert int(counts[0].split()[0]) < int(counts[-1].split()[0]) <= STEPS

    widget = wait_widget(page, "thermometer")
    widget.locator(".nbd-step-count", has_text=f"{STEPS} steps").wait_for()
    assert widget.locator(".nbd-step-label").text_content() == f"step {STEPS} of {STEPS}"
    assert widget.locator(".nbd-loss svg path.nbd-spark-line").count() == 1
    last = widget.locator('.nbd-row[data-row="0"] .nbd-therm').get_attribute("title")
    ref_last = kernel_json(page, f"[r.stats['std'] for r in res.at({STEPS}) if r.name == '0']")
    assert _std(last) == pytest.approx(ref_last[0], rel=6e-3)

    # The slider shows step k's values as the kernel has them, and its position reaches the kernel.
    k = 5
    widget.locator("input.nbd-slider").fill(str(k - 1))
    widget.locator(".nbd-step-label", has_text=f"step {k} of {STEPS}").wait_for()
    title = widget.locator('.nbd-row[data-row="0"] .nbd-therm').get_attribute("title")
    ref = kernel_json(page, f"[r.stats['std'] for r in res.at({k}) if r.name == '0']")
    assert _std(title) == pytest.approx(ref[0], rel=6e-3) and _std(last) > 1.5 * ref[0]
    run_code_and_wait_text(page, "print('step=', _nndebug_widget.step)", f"step= {k}")

    # A row click: synced back, and its histogram fetched from the kernel (values of all the steps).
    widget.locator('.nbd-row[data-row="1"]').click()
    counted = _histogram_counted(widget)
    assert counted == kernel_json(page, _kernel_counted("res.layers", "1")) and counted[1] == STEPS * 32 * 16
    run_code_and_wait_text(page, "print('selected=' + _nndebug_widget.selected)", "selected=1")
    assert kernel_json(page, "_nndebug_widget.js_error") == ""
    screenshot(page, "live-nb7", widget)

    # A page refresh: the widget comes back from the kernel's state (the whole history, not the live messages).
    reload_notebook(page, "live_nb7")
    widget = wait_widget(page, "thermometer")
    widget.locator(".nbd-step-count", has_text=f"{STEPS} steps").wait_for()
    k = 20
    widget.locator("input.nbd-slider").fill(str(k - 1))
    widget.locator(".nbd-step-label", has_text=f"step {k} of {STEPS}").wait_for()
    title = widget.locator('.nbd-row[data-row="0"] .nbd-therm').get_attribute("title")
    assert _std(title) == pytest.approx(kernel_json(page, f"[r.stats['std'] for r in res.at({k}) if r.name == '0']")[0], rel=6e-3)


# --------------------------------------------------------------------------------------------
# Doctor
# --------------------------------------------------------------------------------------------
def test_doctor_notebook7(page, nb7) -> None:
    write_notebook(nb7.root, "doctor_nb7", [DOCTOR_MODEL, DOCTOR_RUN])
    open_and_run(page, nb7, "doctor_nb7")
    widget = wait_widget(page, "doctor")
    info = kernel_json(page, DOCTOR_INFO)
    assert info["failed"] == ["overfit_batch"] and info["js_error"] == ""

    rows = widget.locator(".nbd-check")
    drawn = [[rows.nth(i).get_attribute("data-check"), rows.nth(i).get_attribute("data-status")]
             for i in range(rows.count())]
    # failed checks first, then the others, each in the kernel's checklist order
    failed_first = [s for s in info["statuses"] if s[1] == "fail"] + [s for s in info["statuses"] if s[1] != "fail"]
    assert drawn == failed_first and len(drawn) == 9 and drawn[0] == ["overfit_batch", "fail"]
    over = widget.locator('.nbd-check[data-check="overfit_batch"]')
    assert over.locator(".nbd-status").text_content() == "✗"
    curve = '.nbdebug-doctor [data-check="overfit_batch"] canvas.nbd-curve'
    assert wait_canvas_nonblank(page, curve, minimum=50) >= 50
    # The curve is the kernel's: as many finite points drawn as the synced loss curve holds.
    finite = kernel_json(page, "int(__import__('numpy').isfinite(__import__('numpy').frombuffer(w.curve, 'float32')).sum())")
    assert int(page.locator(curve).get_attribute("data-points")) == finite > 1

    flow = widget.locator('.nbd-check[data-check="gradient_flow"] .nbd-evidence')
    assert f"first = net.{HOSTILE}" in flow.locator("span").all_text_contents()
    assert page.locator('img[src="x"]').count() == 0 and page.evaluate("window.__pwned") is None

    widget.locator('.nbd-check[data-check="dead_units"]').click()
    expect(widget.locator('.nbd-check[data-check="dead_units"]')).to_have_class(re.compile("nbd-selected"))
    run_code_and_wait_text(page, "print('selected=' + w.selected)", "selected=dead_units")
    screenshot(page, "doctor-nb7", widget)


# --------------------------------------------------------------------------------------------
# Grouped thermometer (repeated blocks collapsed; ≥ 100 rows)
# --------------------------------------------------------------------------------------------
BLOCKS, EXPERTS = 6, 3  # 6 × (2 norms + 4 projections + 3 experts × 4) + 3 leaves = 111 rows (+ 6 block outputs)
GROUPS_SETUP = f"""
import sys, torch
sys.path.insert(0, {str(REPO / "benchmarks")!r})
from bench_groups import big_model
model, ids, _ = big_model({BLOCKS}, {EXPERTS})
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
"""
GROUPS_RUN = """%%nndebug model --view thermometer -o gres
for _ in range(3):
    opt.zero_grad()
    model(ids).pow(2).mean().backward()
    opt.step()
"""
ROW = "model.layers.2.self_attn.q_proj"
NUMBER = r"(-?[\d.]+(?:e[-+]?\d+)?)"


def test_grouped_view_notebook7(page, nb7) -> None:
    write_notebook(nb7.root, "groups_nb7", ["%load_ext nbdebug", GROUPS_SETUP, GROUPS_RUN])
    open_and_run(page, nb7, "groups_nb7")
    w = wait_widget(page, "thermometer")
    panel = w.locator(".nbd-groups-panel")
    expect(panel).to_be_visible()
    expect(w.locator(".nbd-table")).to_be_hidden()
    at_last = f"[r.stats for r in gres.at(3) if r.name == {ROW!r}][0]"  # the grouped rows show the last step
    info = kernel_json(page, f"{{'rows': len(_nndebug_widget.layers), 'mean': {at_last}['mean'], 'std': {at_last}['std'], "
                             f"'counted': {_kernel_counted('gres.layers', ROW)}, 'js_error': _nndebug_widget.js_error}}")
    assert info["rows"] == BLOCKS * (6 + 4 * EXPERTS) + 3 + BLOCKS and info["js_error"] == ""

    grp = panel.locator('.nbd-grp[data-group="0"]')
    assert grp.locator(".nbd-gname").text_content() == "model.layers"
    assert grp.locator(".nbd-cell").count() == BLOCKS
    assert grp.locator(".nbd-cell").nth(2).get_attribute("title").startswith("model.layers.2: ")
    assert panel.locator(".nbd-grp svg").count() >= 1  # the strip's statistic over the 3 steps

    # Expand the group, then block 2: its rows hold the kernel's values for that step.
    grp.click()
    expect(panel.locator(".nbd-grp-body > .nbd-blk")).to_have_count(BLOCKS)
    panel.locator(".nbd-grp-body > .nbd-blk").nth(2).click()
    row = panel.locator(".nbd-blk-body .nbd-grow").filter(has=page.locator(".nbd-gname", has_text=re.compile(r"^self_attn\.q_proj$")))
    expect(row).to_have_count(1)
    mean, std = (float(x) for x in re.fullmatch(rf"{NUMBER} ± {NUMBER}", row.locator(".nbd-gstat").first.text_content()).groups())
    assert mean == pytest.approx(info["mean"], rel=5e-3, abs=5e-4) and std == pytest.approx(info["std"], rel=5e-3)

    # Selecting the row reaches the kernel (synced trait, and a histogram it answers).
    row.click()
    expect(row).to_have_class(re.compile("nbd-selected"))
    assert _histogram_counted(w) == info["counted"]
    run_code_and_wait_text(page, "print('selected=' + _nndebug_widget.selected)", f"selected={ROW}")

    # The strip statistic too.
    stat = panel.locator("select.nbd-group-stat")
    choice = next(v for v in stat.locator("option").evaluate_all("os => os.map(o => o.value)") if v != stat.input_value())
    stat.select_option(choice)
    run_code_and_wait_text(page, "print('stat=' + _nndebug_widget.group_stat)", f"stat={choice}")
    assert kernel_json(page, "_nndebug_widget.js_error") == ""
    screenshot(page, "groups-nb7", w)


# --------------------------------------------------------------------------------------------
# Run view (2 ranks spooled in the kernel)
# --------------------------------------------------------------------------------------------
RUN_INFO = (
    "{'rank': w.rank, 'first': [run.first_nonfinite[0].rank, run.first_nonfinite[0].step], 'js_error': w.js_error, "
    "'means': [[float(r.history.at(4)[n]['mean']) for n in r.history.rows] for r in run.ranks], "
    "'rows': run.ranks[0].history.rows}"
)


def test_run_view_notebook7(page, nb7) -> None:
    write_notebook(nb7.root, "run_nb7", [RUN_BUILD, RUN_SHOW])
    open_and_run(page, nb7, "run_nb7")
    widget = wait_widget(page, "run")
    info = kernel_json(page, RUN_INFO)
    assert info["rank"] == 1 and info["first"] == [1, 3] and info["js_error"] == ""

    buttons = widget.locator(".nbd-rank-btn")
    assert buttons.count() == 2 and widget.get_attribute("data-rank") == "1"
    assert (widget.locator(".nbd-run-nonfinite-head").text_content() or "").startswith("first NaN/Inf: rank 1, step 3")
    assert widget.locator(".nbdebug-thermometer .nbd-row").count() == len(info["rows"])
    assert row_mean(widget, 0) == pytest.approx(info["means"][1][0], rel=5e-3)
    assert HOSTILE in (widget.locator(".nbdebug-thermometer").text_content() or "")
    assert page.locator('img[src="x"]').count() == 0 and page.evaluate("window.__pwned") is None

    # Rank 0: the kernel sends that rank's table, the view redraws it, the trait reaches the kernel.
    buttons.nth(0).click()
    page.locator('.nbdebug-run[data-rank="0"]').wait_for(state="attached", timeout=30_000)
    for i in (0, 3):
        assert row_mean(widget, i) == pytest.approx(info["means"][0][i], rel=5e-3)
    assert info["means"][0][0] != pytest.approx(info["means"][1][0], rel=5e-3)
    run_code_and_wait_text(page, "print('rank=' + str(w.rank))", "rank=0")

    assert kernel_json(page, "w.js_error") == ""
    screenshot(page, "run-nb7", widget)


# --------------------------------------------------------------------------------------------
# Keyboard: the widget's own keys, not the notebook's
# --------------------------------------------------------------------------------------------
KEYS_LOOP = """%%nndebug model -o res
for i in range(10):
    x = torch.randn(32, 4, generator=gen)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), torch.zeros(32, 2)).backward()
    opt.step()
"""
NOTEBOOK_STATE = "const nb = app.shell.currentWidget.content; return [nb.activeCellIndex, nb.mode];"


def test_thermometer_keys_notebook7(page, nb7) -> None:
    """ArrowDown on a focused row selects the next row; ArrowLeft on the step slider goes one step back;
    the notebook's active cell does not move (as in JupyterLab for the rows); Shift+Enter stays the
    notebook's."""
    write_notebook(nb7.root, "keys_nb7", ["%load_ext nbdebug", LIVE_SETUP, KEYS_LOOP])
    open_and_run(page, nb7, "keys_nb7")
    widget = wait_widget(page, "thermometer")
    # the run's final state is in (a loaded machine can deliver the last live push after the cell ends)
    widget.locator(".nbd-step-label", has_text="step 10 of 10").wait_for()
    widget.locator('.nbd-row[data-row="1"]').click()
    before = run_js(page, NOTEBOOK_STATE)
    page.keyboard.press("ArrowDown")
    expect(widget.locator('.nbd-row[data-row="2"]')).to_have_class(re.compile("nbd-selected"), timeout=3_000)
    slider = widget.locator("input.nbd-slider")
    slider.focus()
    page.keyboard.press("ArrowLeft")
    widget.locator(".nbd-step-label", has_text="step 9 of 10").wait_for(timeout=5_000)
    assert run_js(page, NOTEBOOK_STATE) == before
    run_code_and_wait_text(page, "print(_nndebug_widget.selected, _nndebug_widget.step)", "2 9")
    # Only the navigation keys are the widget's: Shift+Enter on a focused row still runs the cell and
    # moves the notebook on (the notebook's shortcut), it does not select the row.
    widget.locator('.nbd-row[data-row="0"]').click()
    at = run_js(page, NOTEBOOK_STATE)[0]
    page.keyboard.press("Shift+Enter")
    page.wait_for_function(f"() => window.jupyterapp.shell.currentWidget.content.activeCellIndex !== {at}", timeout=10_000)
