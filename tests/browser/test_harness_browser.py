"""The harness itself, proven on a tiny anywidget (no nbdebug front-end needed).

The probe draws an exact 10×10 red square on a transparent 20×20 canvas and counts clicks in a
synced trait, so the canvas count, the widget wait and the UI→kernel round trip all have exact
expected values.
"""

from __future__ import annotations

import os

import nbformat
import pytest

from . import harness
from .harness import (
    canvas_nonblank,
    kernel_json,
    open_and_run,
    run_code_and_wait_text,
    screenshot,
    wait_widget,
    write_notebook,
)
from .servers import PLAIN_KERNEL

pytestmark = pytest.mark.browser

PROBE = '''
import anywidget, traitlets

class Probe(anywidget.AnyWidget):
    _esm = """
    export default { render({ model, el }) {
        const root = document.createElement('div');
        root.className = 'nbdebug-probe';
        const c = document.createElement('canvas');
        c.width = 20; c.height = 20;
        const g = c.getContext('2d');
        g.fillStyle = '#ff0000'; g.fillRect(0, 0, 10, 10);
        const b = document.createElement('button');
        b.className = 'probe-button';
        b.textContent = model.get('label');
        b.addEventListener('click', () => {
            model.set('clicks', model.get('clicks') + 1);
            model.save_changes();
        });
        root.append(c, b);
        el.appendChild(root);
        root.dataset.ready = '1';
    } };
    """
    clicks = traitlets.Int(0).tag(sync=True)
    label = traitlets.Unicode("").tag(sync=True)

probe = Probe(label="<img src=x onerror=window.__pwned=1>")
probe
'''


def _probe_round_trip(page, server, name: str, kernel: str = "python3") -> None:
    path = write_notebook(server.root, name, [PROBE])
    if kernel != "python3":
        nb = nbformat.read(path, as_version=4)
        nb.metadata["kernelspec"]["name"] = kernel
        nbformat.write(nb, path)
    open_and_run(page, server, name)
    root = wait_widget(page, "probe")
    # Exactly the 10×10 red square differs from the transparent background.
    assert canvas_nonblank(page, ".nbdebug-probe canvas") == 100
    assert canvas_nonblank(page, ".nbdebug-probe canvas", background=(255, 0, 0, 255)) == 300
    button = root.locator("button.probe-button")
    assert button.text_content() == "<img src=x onerror=window.__pwned=1>"
    # One click at a time: the kernel echoes each update back, and an echo of the first click that
    # lands after a second local click would set the counter back (a race of the probe, not the harness).
    button.click()
    run_code_and_wait_text(page, "print('clicks', probe.clicks)", "clicks 1")
    button.click()
    run_code_and_wait_text(page, "print('clicks', probe.clicks)", "clicks 2")
    screenshot(page, f"harness-{server.app}")
    # Who launched the kernel: the zygote forks python3 kernels (tests/kernel_zygote.py), the server
    # launches python3-plain ones (and every kernel under NBDEBUG_TEST_ZYGOTE=0).
    forked = kernel == "python3" and server.zygote is not None
    assert kernel_json(page, "__import__('os').getppid()") == (server.zygote.pid if forked else server.proc.pid)


def test_harness_lab(page, lab) -> None:
    _probe_round_trip(page, lab, "probe_lab")
    assert page.evaluate("window.__pwned") is None


def test_harness_lab_plain_kernel(page, lab) -> None:
    """The probe on a kernel the server launches itself: real launching stays tested."""
    _probe_round_trip(page, lab, "probe_lab_plain", kernel=PLAIN_KERNEL)


def test_harness_notebook7(page, nb7) -> None:
    _probe_round_trip(page, nb7, "probe_nb7")


def test_cell_errors_surface_with_traceback(page, lab) -> None:
    write_notebook(lab.root, "raises", ["x = 1", "raise ValueError('boom ' + str(x))"])
    with pytest.raises(AssertionError, match="ValueError: boom 1"):
        open_and_run(page, lab, "raises")


def test_missing_chromium_fails_in_ci(monkeypatch) -> None:
    monkeypatch.setattr(harness, "CHROMIUM", "/nonexistent/chromium")
    from .conftest import _require_chromium

    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        _require_chromium()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        _require_chromium()


def test_page_errors_are_caught(browser) -> None:
    context = browser.new_context()
    try:
        pg = context.new_page()
        lab_errors = harness.PageErrors(pg, "lab")
        nb_errors = harness.PageErrors(pg, "notebook")
        pg.set_content(
            '<script>setTimeout(() => { throw new TypeError("Cannot read properties of'
            " undefined (reading 'schema')\"); });"
            "setTimeout(() => { throw new Error('kaboom'); }, 10);</script>"
        )
        for _ in range(200):  # wait (at most 10 s) on the condition: both errors reported
            if len(lab_errors.errors) == 2:
                break
            pg.wait_for_timeout(50)
        assert len(lab_errors.errors) == 2
        with pytest.raises(AssertionError, match="kaboom"):
            lab_errors.check()
        # Notebook 7's known error is allowed, the other one is not.
        assert nb_errors.unexpected() == ["Error: kaboom"]
    finally:
        context.close()


def _browser_switches() -> list[str]:
    """The command line of this process's chromium (the browser process: no ``--type=``)."""
    for pid in sorted(int(d) for d in os.listdir("/proc") if d.isdigit()):
        try:
            args = open(f"/proc/{pid}/cmdline").read().split("\0")
            parent = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
            grandparent = int(open(f"/proc/{parent}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        # pytest -> Playwright's node driver -> chromium
        if grandparent == os.getpid() and args[0].endswith("chromium") and not any(a.startswith("--type=") for a in args):
            return args
    raise AssertionError("no chromium browser process below this pytest process")


def test_chromium_keeps_playwrights_features_off_and_preloads_no_hidden_webui(browser) -> None:
    # chromium obeys the last --disable-features only: ours must still hold every one Playwright passed
    lists = [a.split("=", 1)[1].split(",") for a in _browser_switches() if a.startswith("--disable-features=")]
    assert len(lists) == 2, lists  # Playwright's, then ours
    assert set(lists[0]) <= set(lists[-1]), set(lists[0]) - set(lists[-1])
    assert set(harness.UNSEEN_WEBUI) <= set(lists[-1])
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.set_content("<p>x</p>")
        cdp = browser.new_browser_cdp_session()
        targets = cdp.send("Target.getTargets", {"filter": [{}]})["targetInfos"]
        cdp.detach()
        # the page is there; the omnibox popup's WebUI (a renderer per context) is not
        assert any(t["type"] == "page" for t in targets), targets
        assert [t["url"] for t in targets if t["type"] == "browser_ui"] == []
    finally:
        context.close()
