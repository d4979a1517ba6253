"""The grouped thermometer (js/src/thermometer/groups.ts) in a real JupyterLab with a 1,603-row
model (1,603 leaf rows and the 32 blocks' outputs): first draw, expanding a group and a block, a filter that finds a row inside a collapsed
group, and a row click reaching the kernel; timed with ``performance.now()`` in the page.

The model is ``benchmarks/bench_groups.py``'s (32 blocks × 50 captured rows, 11 experts per block
as nested groups, the blocks' own outputs for the residual stream row), captured for one training
step by ``Capture``, grouped by ``nbdebug.inspectors.groups``. The widget is a test-only anywidget
whose ES module is ``renderGroups`` bundled by esbuild here (timing the view alone);
``test_thermometer_grouped_view_lab`` checks the same view inside the real thermometer widget. Figures go to ``test-artifacts/groups_browser_timing.json``, which
``benchmarks/bench_groups.py`` prints.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from playwright.sync_api import expect

from .harness import (
    ARTIFACTS,
    KERNEL_IDLE_MS,
    REPO,
    kernel_json,
    open_and_run,
    open_notebook,
    run_code_and_wait_text,
    run_js,
    screenshot,
    wait_widget,
    write_notebook,
)

pytestmark = pytest.mark.browser

ENTRY = """
import { renderGroups } from %s;
export default {
  render(ctx) {
    const t0 = performance.now();
    const cleanup = renderGroups(ctx);
    const draw = performance.now() - t0;
    requestAnimationFrame(() => { window.__nbdGroups = { draw, paint: performance.now() - t0 }; });
    return cleanup;
  },
};
"""

SETUP = f"""
import sys, json, pathlib
sys.path.insert(0, {str(REPO / "benchmarks")!r})
from bench_groups import capture_report, payload_bytes
from nbdebug.inspectors.groups import attach_residual, group_report, groups_payload, residual_for
from nbdebug.inspectors.thermometer import LEGEND
from nbdebug.widgets._transport import encode_array

result, report = capture_report()
tree = group_report(report)
attach_residual(tree, residual_for(tree, result.layers))
meta, arrays = groups_payload(tree)
payload = {{**meta, **{{k: encode_array(v) for k, v in arrays.items()}}}}
print(len(report.names), payload_bytes(meta, arrays))
"""

WIDGET = """
import anywidget, traitlets

class GroupsTestWidget(anywidget.AnyWidget):
    _esm = pathlib.Path("groups_test.js").read_text()
    groups = traitlets.Dict().tag(sync=True)
    legend = traitlets.Dict().tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    group_stat = traitlets.Unicode("").tag(sync=True)

w = GroupsTestWidget(groups=payload, legend=LEGEND)
w
"""

# click, then wait for the next frame after the DOM work (layout + paint are in the measured time)
TIMED_CLICK = """
const el = document.querySelector(arg);
const t0 = performance.now();
el.click();
await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
return performance.now() - t0;
"""

TIMED_FILTER = """
const box = document.querySelector('.nbdebug-groups .nbd-group-filter');
const t0 = performance.now();
box.value = arg;
box.dispatchEvent(new Event('input'));
await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
return performance.now() - t0;
"""


def _bundle(dest) -> None:
    """``renderGroups`` wrapped with draw timing, bundled as one ES module (esbuild from js/)."""
    entry = dest.parent / "groups_entry.js"
    entry.write_text(ENTRY % json.dumps(str(REPO / "js" / "src" / "thermometer" / "groups_widget.ts")))
    esbuild = REPO / "js" / "node_modules" / ".bin" / "esbuild"
    if not esbuild.exists():
        pytest.skip("js/node_modules missing: run `cd js && npm ci`")
    subprocess.run([str(esbuild), str(entry), "--bundle", "--format=esm", f"--outfile={dest}", "--log-level=warning"],
                   check=True, cwd=REPO / "js")


@pytest.mark.fresh_page  # times the first paint: a page of its own, as a user's first open
def test_grouped_thermometer_1600_rows_lab(page, lab):
    _bundle(lab.root / "groups_test.js")
    write_notebook(lab.root, "groups", [SETUP, WIDGET])
    open_and_run(page, lab, "groups")
    w = wait_widget(page, "groups")
    rows, nbytes = kernel_json(page, "[len(report.names), payload_bytes(meta, arrays)]")
    assert rows == 1603 + 32 and nbytes <= 1_000_000
    page.wait_for_function("window.__nbdGroups !== undefined")
    first = page.evaluate("window.__nbdGroups")

    # collapsed: embed, the model.layers group (32 strip cells), final norm, head
    grp = w.locator('.nbd-grp[data-group="0"]')
    assert grp.locator(".nbd-gname").text_content() == "model.layers"
    assert grp.locator(".nbd-cell").count() == 32
    assert w.locator(".nbd-grow").all_text_contents() and w.locator(".nbd-grow .nbd-gname").all_text_contents() == [
        "model.embed_tokens", "model.norm", "lm_head"]
    assert w.locator(".nbd-group-stat").input_value() == "residual"
    title = grp.locator(".nbd-cell").nth(5).get_attribute("title")
    assert title.startswith("model.layers.5: residual stream norm ")

    # expand the group (32 block lines), then block 17 (its 50 rows incl. 11 nested expert groups)
    expand_group = run_js(page, TIMED_CLICK, '.nbdebug-groups .nbd-grp[data-group="0"]')
    assert w.locator(".nbd-grp-body > .nbd-blk").count() == 32
    b17 = _block(page, "model.layers.17")
    expand_block = run_js(page, TIMED_CLICK, f'.nbdebug-groups .nbd-blk[data-block="{b17}"]')
    body = w.locator(".nbd-blk-body").first
    names = body.locator(":scope > .nbd-grow .nbd-gname").all_text_contents()
    assert names[:2] == ["input_layernorm", "self_attn.q_proj"] and names[-1] == "(output)"
    assert body.locator(":scope > .nbd-grp").count() == 1  # mlp.experts: a nested group of 11
    assert body.locator(":scope > .nbd-grp .nbd-cell").count() == 11

    # collapse, then a filter finds one row deep inside the collapsed groups
    run_js(page, TIMED_CLICK, '.nbdebug-groups .nbd-grp[data-group="0"]')
    assert w.locator(".nbd-blk").count() == 0
    target = "model.layers.23.mlp.experts.7.act"
    filter_ms = run_js(page, TIMED_FILTER, "layers.23.mlp.experts.7.act type:gelu")
    hit = w.locator(".nbd-grow")
    assert hit.count() == 1
    assert hit.locator(".nbd-gname").get_attribute("title") == f"{target}\nGELU"
    assert w.locator(".nbd-group-count").text_content() == f"1 of {rows} rows match"
    hit.click()
    run_code_and_wait_text(page, "print(w.selected)", target)
    filter_all_ms = run_js(page, TIMED_FILTER, "type:linear")
    linear = kernel_json(page, "sum(t == 'Linear' for t in report.types)")
    assert linear == 32 * 26 + 1 and w.locator(".nbd-grow").count() == 400
    assert "more matches" in w.locator(".nbd-group-more").text_content()
    screenshot(page, "groups-lab", w)

    timing = {"rows": rows, "payload_kib": round(nbytes / 1024, 1), "first_draw_ms": first["draw"],
              "first_paint_ms": first["paint"], "expand_group_ms": expand_group, "expand_block_ms": expand_block,
              "filter_one_ms": filter_ms, f"filter_400_of_{linear}_ms": filter_all_ms}
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "groups_browser_timing.json").write_text(json.dumps(timing, indent=1))
    print(timing)
    assert first["paint"] < 2000 and expand_group < 1000 and expand_block < 1000  # generous: loaded 2-core machine


def _block(page, name: str) -> int:
    """Index of block ``name`` in the payload (what the view's data-block attributes hold)."""
    return kernel_json(page, f"[b.name for b in tree.blocks].index({name!r})")


MAGIC_SETUP = f"""
import sys
sys.path.insert(0, {str(REPO / "benchmarks")!r})
from bench_groups import big_model
model, ids, _ = big_model()
"""


def test_thermometer_grouped_view_lab(page, lab):
    """The real thermometer (`%%nndebug --view thermometer`) on the 1,603-leaf model (a transformer: its
    32 blocks' outputs are captured too, for the residual stream strip): the grouped view
    is on (the flat table hidden), a strip cell opens its block, a row click selects the row in the
    kernel, and switching the grouped view off shows the flat table."""
    write_notebook(lab.root, "therm_groups", ["%load_ext nbdebug", MAGIC_SETUP,
                                              "%%nndebug model --view thermometer\nmodel(ids).sum().backward()"])
    open_and_run(page, lab, "therm_groups")
    w = wait_widget(page, "thermometer")
    panel = w.locator(".nbd-groups-panel")
    expect(panel).to_be_visible()
    expect(w.locator(".nbd-table")).to_be_hidden()
    grp = panel.locator('.nbd-grp[data-group="0"]')
    assert grp.locator(".nbd-gname").text_content() == "model.layers"
    assert grp.locator(".nbd-cell").count() == 32
    grp.locator('.nbd-cell[title^="model.layers.9:"]').click()
    row = panel.locator(".nbd-blk-body .nbd-grow").nth(1)
    name = row.locator(".nbd-gname").get_attribute("title").splitlines()[0]
    assert name == "model.layers.9.self_attn.q_proj"
    row.click()
    expect(row).to_have_class(re.compile("nbd-selected"))
    run_code_and_wait_text(page, "print(_nndebug_widget.selected)", name)
    panel.locator(".nbd-grouped-toggle").uncheck()
    expect(w.locator(".nbd-table")).to_be_visible()
    assert w.locator(".nbd-row").count() == 1603 + 32  # every leaf, and each block's own output (residual stream)
    assert kernel_json(page, "_nndebug_widget.js_error") == ""



TIMED_LOOP = """%%nndebug model --view thermometer -o res
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
for k in range(3):
    model(torch.randint(0, 64, (1, 8), generator=g)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)  # the residual stream grows 4x per step
"""

_NORM = re.compile(r"residual stream norm (\S+) ")


def _strip_value(panel, block: int) -> float:
    title = panel.locator(f'.nbd-grp[data-group="0"] .nbd-cell[title^="model.layers.{block}:"]').get_attribute("title")
    m = _NORM.search(title or "")
    assert m, title
    return float(m.group(1))


def test_grouped_view_follows_the_step_slider_lab(page, lab):
    """A 3-step training loop on the 1,635-row model: moving the thermometer's step slider redraws
    the group strips and the rows inside an open block at that step (the residual stream norm at
    step k equals the kernel's ``residual_history`` at k, a block row's mean ± std its ``res.at(k)``),
    "whole run" shows the merged residual stream; the slider's step still reaches the kernel."""
    write_notebook(lab.root, "therm_groups_steps", ["%load_ext nbdebug", MAGIC_SETUP + "import torch\n", TIMED_LOOP])
    open_and_run(page, lab, "therm_groups_steps")
    w = wait_widget(page, "thermometer")
    panel = w.locator(".nbd-groups-panel")
    expect(panel).to_be_visible()
    expect(w.locator(".nbd-step-label")).to_have_text("step 3 of 3")
    expect(panel.locator(".nbd-group-count")).to_contain_text("(values and flags at step 3)")
    blocks = "[f'model.layers.{i}' for i in range(32)]"
    ref = kernel_json(page, "(lambda h, rh: [[float(rh[h.step_index.tolist().index(k), b]) for b in (5, 20)] for k in (1, 2, 3)])"
                            f"(res.history, __import__('nbdebug.inspectors.residual', fromlist=['x']).residual_history(res.history, {blocks}))")
    last = _strip_value(panel, 5)
    assert last == pytest.approx(ref[2][0], rel=6e-3)

    w.locator("input.nbd-slider").fill("0")
    w.locator(".nbd-step-label", has_text="step 1 of 3").wait_for()
    expect(panel.locator(".nbd-group-count")).to_contain_text("(values and flags at step 1)")
    assert _strip_value(panel, 5) == pytest.approx(ref[0][0], rel=6e-3)
    assert _strip_value(panel, 20) == pytest.approx(ref[0][1], rel=6e-3)
    assert last > 4 * _strip_value(panel, 5)  # a real redraw: the stream grew between the steps
    run_code_and_wait_text(page, "print('step=', _nndebug_widget.step)", "step= 1")

    # open block 5 at step 1: its own output row ("(output)") shows res.at(1)'s mean ± std
    panel.locator('.nbd-cell[title^="model.layers.5:"]').click()
    out = panel.locator(".nbd-blk-body .nbd-grow").filter(has=page.locator(".nbd-gname", has_text="(output)"))
    expect(out).to_have_count(1)
    mean, std = (float(x) for x in out.locator(".nbd-gstat").first.text_content().split(" ± "))
    at1 = kernel_json(page, "[[r.stats['mean'], r.stats['std']] for r in res.at(1) if r.name == 'model.layers.5'][0]")
    assert mean == pytest.approx(at1[0], rel=6e-3, abs=1e-3) and std == pytest.approx(at1[1], rel=6e-3)
    w.locator("input.nbd-slider").fill("1")
    w.locator(".nbd-step-label", has_text="step 2 of 3").wait_for()
    assert _strip_value(panel, 5) == pytest.approx(ref[1][0], rel=6e-3)
    expect(panel.locator('.nbd-blk:has(> .nbd-gname[title="model.layers.5"])')).to_have_class(re.compile("nbd-open"))  # stays open

    # whole run: the payload's residual stream, merged over the run
    w.locator(".nbd-whole").click()
    expect(panel.locator(".nbd-group-count")).to_contain_text("(values and flags over the whole run)")
    whole = kernel_json(page, "float(__import__('nbdebug.inspectors.residual', fromlist=['x'])"
                              f".residual_stream(res.layers, {blocks}).norm[5])")
    assert _strip_value(panel, 5) == pytest.approx(whole, rel=6e-3)
    run_code_and_wait_text(page, "print('step=', _nndebug_widget.step)", "step= -1")
    assert kernel_json(page, "_nndebug_widget.js_error") == ""
    screenshot(page, "groups-steps-lab", w)


LIVE_LOOP = """%%nndebug model --view thermometer -o res
import os, time
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
for k in range(3):  # a step closes when the next one starts: 2 closed steps while the cell waits below
    model(torch.randint(0, 64, (1, 8), generator=g)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)
    time.sleep(0.4)  # live pushes go out at most 4 times a second
t0 = time.time()
while not os.path.exists("release.flag") and time.time() - t0 < 600:  # busy until the test has looked
    time.sleep(0.05)
"""

LIVE_MS = 400_000
_PENDING = "() => window.jupyterapp.shell.currentWidget.content.widgets[2].model.executionCount === null"


def test_grouped_view_live_while_the_cell_runs_lab(page, lab):
    """While the training cell still runs (the kernel busy): the grouped view is there (the tree of
    the rows so far), its strips follow the live steps and the step slider, from the pushed history;
    after the cell ends, the value seen at step 1 equals the kernel's ``residual_history`` at step 1."""
    flag = lab.root / "release.flag"
    flag.unlink(missing_ok=True)
    write_notebook(lab.root, "therm_groups_live", ["%load_ext nbdebug", MAGIC_SETUP + "import torch\n", LIVE_LOOP])
    open_notebook(page, lab, "therm_groups_live")
    run_js(page, "app.commands.execute('notebook:run-all-cells'); return true;")
    try:
        w = wait_widget(page, "thermometer")
        w.locator(".nbd-step-count", has_text="2 steps (running…)").wait_for(timeout=LIVE_MS)  # 1,635 rows: slow steps
        panel = w.locator(".nbd-groups-panel")
        expect(panel).to_be_visible()
        expect(panel.locator(".nbd-group-count")).to_contain_text("(values and flags at step 2)")
        last = _strip_value(panel, 5)
        w.locator("input.nbd-slider").fill("0")
        w.locator(".nbd-step-label", has_text="step 1 of 2").wait_for()
        expect(panel.locator(".nbd-group-count")).to_contain_text("(values and flags at step 1)")
        first = _strip_value(panel, 5)
        assert page.evaluate(_PENDING)  # all of it while the cell still ran
    finally:
        flag.write_text("go")
    page.wait_for_function(f"() => !({_PENDING})()", timeout=KERNEL_IDLE_MS)
    assert last > 2 * first  # the stream grew 4x per step: a real redraw
    ref = kernel_json(page, "(lambda h, rh: [float(rh[h.step_index.tolist().index(k), 5]) for k in (1, 2)])"
                            "(res.history, __import__('nbdebug.inspectors.residual', fromlist=['x'])"
                            ".residual_history(res.history, [f'model.layers.{i}' for i in range(32)]))")
    assert first == pytest.approx(ref[0], rel=6e-3) and last == pytest.approx(ref[1], rel=6e-3)
    run_code_and_wait_text(page, "print('step=', _nndebug_widget.step)", "step= 1")
    assert kernel_json(page, "_nndebug_widget.js_error") == ""
