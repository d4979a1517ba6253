"""The live thermometer in a real JupyterLab: while a ~8 s training loop runs under ``%%nndebug``
(the cell has no execution count yet, the kernel is busy) the step counter and the table change
several times; after it ends, the slider shows an earlier step's values (equal to the kernel's
``res.at(k)``) from data already in the browser, with the header and the note naming step k (not the
last), the slider position reaches the kernel, and a row's histogram says it holds step 1's values.
"""

from __future__ import annotations

import pytest

from .harness import (
    KERNEL_IDLE_MS,
    kernel_json,
    open_notebook,
    run_code_and_wait_text,
    run_js,
    screenshot,
    wait_widget,
    write_notebook,
)

pytestmark = pytest.mark.browser

SETUP = """
import time, torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(1)
"""


def loop_cell(steps: int, growth: int) -> str:
    """The live cell (after :data:`SETUP`): ``steps`` training steps of 0.1 s each on batches whose
    scale grows by 1 every ``growth`` steps, so the stats move while it runs. It starts at once: the
    table's rows travel in the first live push, which is lost when it reaches the browser before the
    view's module has loaded; the view then names its rows from the ``live_rows`` trait (once, before
    that trait, it showed the step count moving but no row until the cell ended: seen in Notebook 7 at
    load 17)."""
    return f"""%%nndebug model --loss loss -o res
for i in range({steps}):
    x = torch.randn(32, 4, generator=gen) * (1 + i / {growth})   # batches of growing scale: the stats move
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), torch.zeros(32, 2))
    loss.backward()
    opt.step()
    time.sleep(0.1)
"""


STEPS = 80
LOOP = loop_cell(STEPS, 20)

# In the page: every 50 ms, note the step counter, row 0's tooltip and whether the loop cell is
# still running (no execution count yet).
WATCH = """
    window.__live = [];
    const cells = app.shell.currentWidget.content.widgets;
    const kernel = app.shell.currentWidget.sessionContext.session.kernel;
    window.__liveTimer = setInterval(() => {
        const root = document.querySelector('.nbdebug-thermometer[data-ready="1"]');
        if (!root) return;
        const count = root.querySelector('.nbd-step-count');
        const cell = root.querySelector('.nbd-row[data-row="0"] .nbd-therm');
        const pending = cells[2].model.executionCount === null;
        const status = kernel.status;
        // JupyterLab's kernel.status flips back to 'idle' while the cell still runs (status messages of
        // other requests): the cell's missing execution count (set on its execute_reply) is the signal.
        const busy = pending;
        const seen = { count: count ? count.textContent : '', cell: cell ? cell.getAttribute('title') : '', busy, pending, status };
        const last = window.__live[window.__live.length - 1];
        if (!last || last.count !== seen.count || last.cell !== seen.cell || last.busy !== busy || last.status !== status) window.__live.push(seen);
    }, 50);
    return true;
"""


def _std(title: str) -> float:
    """The std a thermometer cell's tooltip shows ("mean 0.123 ± std 0.45\nmin …")."""
    return float(title.split()[4])


def test_live_thermometer_lab(page, lab) -> None:
    write_notebook(lab.root, "live_lab", ["%load_ext nbdebug", SETUP, LOOP])
    open_notebook(page, lab, "live_lab")
    run_js(page, WATCH)
    # Start every cell and return at once: the loop is watched while it runs.
    run_js(page, "app.commands.execute('notebook:run-all-cells'); return true;")
    wait_widget(page, "thermometer")
    page.wait_for_function(
        "() => { const c = window.jupyterapp.shell.currentWidget.content.widgets[2];"
        " return c.model.executionCount !== null; }",
        timeout=KERNEL_IDLE_MS,
    )
    seen = page.evaluate("clearInterval(window.__liveTimer), window.__live")
    busy = [s for s in seen if s["busy"]]
    counts = [s["count"] for s in busy if s["count"]]
    partial = {c for c in counts if int(c.split()[0]) < STEPS}
    assert len(partial) >= 3, seen  # the counter changed at least twice while the cell ran (before its end)
    # the final state may land before the cell's execute_reply: then the last count reads "80 steps"
    assert all("(running…)" in c or c == f"{STEPS} steps" for c in counts), counts
    assert all("(running…)" in c for c in counts if int(c.split()[0]) < STEPS), counts
    cells = {s["cell"] for s in busy if s["cell"]}
    assert len(cells) >= 3, seen  # and so did the table
    assert int(counts[0].split()[0]) < int(counts[-1].split()[0]) <= STEPS

    # After the end: the whole history, the last step shown, no error reported from the front-end.
    widget = wait_widget(page, "thermometer")
    widget.locator(".nbd-step-count", has_text=f"{STEPS} steps").wait_for()
    assert widget.locator(".nbd-step-label").text_content() == f"step {STEPS} of {STEPS}"
    assert widget.locator(".nbd-body .nbd-spark-cell svg").count() == 3
    assert widget.locator(".nbd-loss svg path.nbd-spark-line").count() == 1
    last_title = widget.locator('.nbd-row[data-row="0"] .nbd-therm').get_attribute("title")

    # Drag the slider to step 10: the table shows that step's values, as the kernel has them.
    k = 10
    widget.locator("input.nbd-slider").fill(str(k - 1))
    widget.locator(".nbd-step-label", has_text=f"step {k} of {STEPS}").wait_for()
    title = widget.locator('.nbd-row[data-row="0"] .nbd-therm').get_attribute("title")
    ref = kernel_json(page, f"[r.stats['std'] for r in res.at({k}) if r.name == '0']")
    assert _std(title) == pytest.approx(ref[0], rel=6e-3)
    assert _std(last_title) > 1.5 * ref[0]  # the last step's inputs are 3x larger: not the same value
    # the header, the note naming the table's step and the flags follow the slider (not step 80's)
    flags = kernel_json(page, f"(lambda r: [list(f) for f in r.flags])(__import__('nbdebug').inspectors.thermometer.diagnose(res, step={k}))")
    head = widget.locator(".nbd-summary").text_content() or ""
    assert head.startswith(f"step {k}: 3 layers: "), head
    assert head.endswith("no flags") == (not any(flags)), (head, flags)
    notes = widget.locator(".nbd-notes li").all_text_contents()
    assert any(n.startswith(f"table and flags at step {k} of {STEPS} (") for n in notes), notes
    assert not any(f"step {STEPS} of {STEPS}" in n for n in notes), notes
    # The slider position reached the kernel (comm messages and execute requests share the shell channel).
    run_code_and_wait_text(page, "print('step=', _nndebug_widget.step)", f"step= {k}")
    # A row click too.
    widget.locator('.nbd-row[data-row="1"]').click()
    run_code_and_wait_text(page, "print('selected=' + _nndebug_widget.selected)", "selected=1")
    # its histogram says which step its values were kept at (the first call), not step k's
    assert widget.locator(".nbd-detail-title").text_content() == f"layer 1 at step {k}"
    when = widget.locator('[data-histogram="ready"] .nbd-hist-when').text_content() or ""
    assert when == (f"histogram of the values kept at step 1 (the row's first call), not step {k}'s: "
                    "histograms are kept for the first call only"), when
    assert kernel_json(page, "_nndebug_widget.js_error") == ""
    screenshot(page, "live-lab", widget)
