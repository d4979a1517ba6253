"""Helpers for the real-browser tier: notebooks, and driving them in chromium (servers: servers.py).

Everything here waits on conditions (kernel status, ``data-ready`` attributes, cell outputs),
never on sleeps; the timeouts are the ones that held on a loaded 2-core machine
(see ``/work/shared/BROWSER_TESTING.md``). The fixtures in ``conftest.py`` build on these.

>>> path = write_notebook(tmp, "probe", ["%load_ext nbdebug", "print(1)"])   # doctest: +SKIP
>>> open_and_run(page, lab, "probe")                                         # doctest: +SKIP
>>> run_code_and_wait_text(page, "print(w.selected)", "features.0")          # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import nbformat

from .canvas import canvas_nonblank, wait_canvas_nonblank
from .servers import (  # the timeouts are re-exported: tests import them from here
    ARTIFACTS,
    CELL_MS,
    KERNEL_IDLE_MS,
    PAGE_LOAD_MS,
    POLL_MS,
    REPO,
    RUN_ALL_MS,
    WIDGET_MS,
    App,
    JupyterServer,
    ipynb,
    start_server,
)

__all__ = [
    "ARTIFACTS",
    "REPO",
    "App",
    "JupyterServer",
    "PageErrors",
    "canvas_nonblank",
    "cell_output_text",
    "kernel_json",
    "open_and_run",
    "open_notebook",
    "reload_notebook",
    "run_cell",
    "run_code_and_wait_text",
    "run_js",
    "screenshot",
    "start_run_all",
    "start_server",
    "wait_canvas_nonblank",
    "wait_cell_finished",
    "wait_kernel_idle",
    "wait_widget",
    "write_notebook",
]

CHROMIUM = "/usr/bin/chromium"
# Chromium keeps only the last --disable-features switch, so ours repeats Playwright's own list
# (1.65; test_harness_browser checks that it still covers the list Playwright passes) and adds the
# omnibox popup's WebUI, which chromium preloads in a renderer of its own for every new context
# (window) although headless never shows it: ~0.8 chromium CPU-s per context (tests/browser/page_cpu.py:
# a Notebook 7 load 4.8 -> 3.7 CPU-s, a JupyterLab load 5.5 -> 4.8, two runs each). Nothing drawn changes.
PLAYWRIGHT_DISABLED_FEATURES = [
    "AimEnabled", "AvoidCorsURLLoaderRestartOnRedirect", "AvoidUnnecessaryBeforeUnloadCheckSync",
    "DestroyProfileOnBrowserClose", "HttpsFirstBalancedModeAutoEnable", "HttpsUpgrades", "LensOverlay",
    "MediaRouter", "NetworkTimeServiceQuerying", "OptimizationHints", "PaintHolding", "PreconnectToSearch",
    "TcpPortRandomizationWin", "ThirdPartyStoragePartitioning", "msEdgeUpdateLaunchServicesPreferredVersion",
    "msForceBrowserSignIn",
]  # fmt: skip
UNSEEN_WEBUI = ["PreloadTopChromeWebUI", "WebUIOmniboxPopup", "WebUIOmniboxAimPopup", "WebUIOmniboxFullPopup"]
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-features=" + ",".join(PLAYWRIGHT_DISABLED_FEATURES + UNSEEN_WEBUI),
]


# Notebook 7.6.5 raises this on every load from its own shortcuts plugin; nothing else is allowed.
ALLOWED_PAGE_ERRORS = {"notebook": [re.compile(r"reading 'schema'")], "lab": []}
# Console messages of type "error" fail a test as well: that is where the front-end reports a widget
# that failed ("[anywidget] Failed to initialize model", an error thrown in our ES modules, a comm
# opened for a model that is closed at once). Nothing is allowed but the page error above, which
# Notebook 7.6.5 may also log to the console.
ALLOWED_CONSOLE_ERRORS = ALLOWED_PAGE_ERRORS

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_job_ids = itertools.count()


# --------------------------------------------------------------------------------------------
# Notebooks
# --------------------------------------------------------------------------------------------
# A layer name that would run script if any view used innerHTML (`add_module` refuses dots: no `window.`).
HOSTILE = "<img src=x onerror=__pwned=1>"


def write_notebook(root: Path, name: str, cells: list[str]) -> Path:
    """Write a notebook of code cells with a ``python3`` kernelspec (else a kernel dialog blocks)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    path = Path(root) / ipynb(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


# --------------------------------------------------------------------------------------------
# Page errors and artifacts
# --------------------------------------------------------------------------------------------
class PageErrors:
    """Collects a page's uncaught errors and its console messages of type ``error``; any of either
    that the allow-lists do not name fails the test (see :meth:`check`)."""

    def __init__(self, page: Any, app: App | None = None) -> None:
        self.app = app
        self.errors: list[str] = []
        self.console: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(f"{exc.name}: {exc.message}"))
        page.on("console", self._on_console)

    def _on_console(self, msg: Any) -> None:
        if msg.type != "error":
            return
        text = msg.text
        url = (msg.location or {}).get("url") or ""
        if url and url not in text:  # "Failed to load resource: 404" names no URL by itself
            text = f"{text} ({url})"
        self.console.append(text)

    def unexpected(self) -> list[str]:
        """Page errors, then console errors (prefixed ``console: ``), that are not allowed."""
        allowed = ALLOWED_PAGE_ERRORS.get(self.app or "", [])
        allowed_console = ALLOWED_CONSOLE_ERRORS.get(self.app or "", [])
        return [e for e in self.errors if not any(p.search(e) for p in allowed)] + [
            f"console: {c}" for c in self.console if not any(p.search(c) for p in allowed_console)
        ]

    def check(self) -> None:
        """Fail on any page error or console error except Notebook 7's known one."""
        bad = self.unexpected()
        if bad:
            raise AssertionError("errors in the browser:\n" + "\n".join(bad[:20]))


def screenshot(page: Any, name: str, locator: Any = None) -> Path:
    """Save a PNG under ``test-artifacts/`` (the whole page, or just ``locator``)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / (name if name.endswith(".png") else f"{name}.png")
    (locator or page).screenshot(path=str(path))
    return path


# --------------------------------------------------------------------------------------------
# Driving the notebook
# --------------------------------------------------------------------------------------------
def run_js(page: Any, body: str, arg: Any = None, timeout: int = CELL_MS) -> Any:
    """Run the async JS ``body`` (sees ``app`` = window.jupyterapp and ``arg``) with a timeout.

    ``page.evaluate`` on a promise has no timeout; this starts the promise, then waits on a flag.
    """
    key = f"j{next(_job_ids)}"
    page.evaluate(
        """([key, src, arg]) => {
            const jobs = (window.__nbdebugJobs = window.__nbdebugJobs || {});
            jobs[key] = { done: false };
            const app = window.jupyterapp;
            const fn = new Function('app', 'arg', 'return (async () => {' + src + '})();');
            Promise.resolve()
              .then(() => fn(app, arg))
              .then((value) => { jobs[key] = { done: true, value }; },
                    (e) => { jobs[key] = { done: true, error: String((e && e.stack) || e) }; });
        }""",
        [key, body, arg],
    )
    page.wait_for_function(f"window.__nbdebugJobs['{key}'].done", timeout=timeout, polling=POLL_MS)
    job = page.evaluate(f"window.__nbdebugJobs['{key}']")
    if "error" in job:
        raise RuntimeError(f"JS failed: {job['error']}")
    return job.get("value")


_KERNEL_IDLE = """(name) => {
    const app = window.jupyterapp;
    const w = app && app.shell && app.shell.currentWidget;
    if (!w || !w.context || !w.sessionContext || !w.context.path.endsWith(name)) return false;
    const s = w.sessionContext.session;
    return !!(s && s.kernel && s.kernel.status === 'idle');
}"""

_OUTPUTS = """
    const nb = app.shell.currentWidget.content;
    const cells = nb.widgets;
    const pick = arg === null ? cells.map((_, i) => i) : [arg < 0 ? cells.length + arg : arg];
    return pick.map((i) => {
        const c = cells[i];
        if (!c || c.model.type !== 'code') return { index: i, outputs: [] };
        return { index: i, count: c.model.executionCount, outputs: c.model.outputs.toJSON() };
    });
"""


def wait_kernel_idle(page: Any, name: str) -> None:
    """Wait until notebook ``name`` is the current widget and its kernel is idle (not the toolbar's
    indicator: it says idle early)."""
    page.wait_for_function(_KERNEL_IDLE, arg=ipynb(name), timeout=KERNEL_IDLE_MS, polling=POLL_MS)


def open_notebook(page: Any, server: JupyterServer, name: str) -> None:
    """Open notebook ``name`` and wait until its kernel is idle. A page that already runs this
    server's JupyterLab (the ``page`` fixture's reused one, ``labpage.py``) opens it in place."""
    reuse = getattr(page, "nbdebug_reuse", None)
    if reuse is not None and reuse.open(server, name):
        return
    page.goto(server.url_for(name), wait_until="domcontentloaded", timeout=PAGE_LOAD_MS)
    wait_kernel_idle(page, name)
    if reuse is not None:
        reuse.loaded(server)


def open_and_run(
    page: Any, server: JupyterServer, name: str, app: App | None = None, timeout: int = RUN_ALL_MS
) -> list[dict[str, Any]]:
    """Open ``name``, wait for kernel idle, run all cells, fail with the traceback if one raised.

    ``app`` defaults to the server's kind ("lab" or "notebook"). Returns every cell's outputs.
    """
    if app is not None and app != server.app:
        raise ValueError(f"server runs {server.app!r}, not {app!r}")
    open_notebook(page, server, name)
    run_js(page, "await app.commands.execute('notebook:run-all-cells');", timeout=timeout)
    outputs = run_js(page, _OUTPUTS, None)
    raise_on_error_outputs(outputs)
    return outputs


def reload_notebook(page: Any, name: str) -> None:
    """Save notebook ``name`` (its outputs), reload the page and wait until its kernel (the same one,
    still running) is idle: widgets then restore from the kernel's state, as after a user's refresh."""
    run_js(page, "await app.commands.execute('docmanager:save'); return true;")
    page.reload(wait_until="domcontentloaded", timeout=PAGE_LOAD_MS)
    wait_kernel_idle(page, name)


def start_run_all(page: Any) -> None:
    """Start running every cell of the current notebook and return at once (to watch a cell while it
    runs; :func:`wait_cell_finished` waits for its end)."""
    run_js(page, "app.commands.execute('notebook:run-all-cells'); return true;")


_CELL_FINISHED = """(i) => {
    const cells = window.jupyterapp.shell.currentWidget.content.widgets;
    const c = cells[i < 0 ? cells.length + i : i];
    return !!c && c.model.type === 'code' && c.model.executionCount !== null;
}"""


def wait_cell_finished(page: Any, index: int, timeout: int = KERNEL_IDLE_MS) -> None:
    """Wait until code cell ``index`` has an execution count: set by its execute_reply, so the cell
    has finished (the kernel's status is no signal: it flips to idle between other requests while a
    cell still runs, in JupyterLab and Notebook 7 alike)."""
    page.wait_for_function(_CELL_FINISHED, arg=index, timeout=timeout, polling=POLL_MS)


def raise_on_error_outputs(cells: list[dict[str, Any]]) -> None:
    for cell in cells:
        for out in cell["outputs"]:
            if out.get("output_type") == "error":
                tb = _ANSI.sub("", "\n".join(out.get("traceback", [])))
                raise AssertionError(
                    f"cell {cell['index']} raised {out.get('ename')}: {out.get('evalue')}\n{tb}"
                )


def outputs_text(outputs: list[dict[str, Any]]) -> str:
    """Plain text of a cell's outputs: streams, text/plain results, errors."""
    parts: list[str] = []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            text = out.get("text", "")
            parts.append("".join(text) if isinstance(text, list) else text)
        elif kind in ("execute_result", "display_data"):
            text = out.get("data", {}).get("text/plain", "")
            parts.append("".join(text) if isinstance(text, list) else text)
        elif kind == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}")
    return "".join(parts)


def cell_output_text(page: Any, index: int = -1) -> str:
    """Text of the outputs of cell ``index`` (negative counts from the end), read from the model."""
    return outputs_text(run_js(page, _OUTPUTS, index)[0]["outputs"])


def run_cell(page: Any, code: str, timeout: int = CELL_MS) -> str:
    """Append a code cell at the end, run it, and return its output text once it finished."""
    run_js(
        page,
        """
        const nb = app.shell.currentWidget.content;
        nb.activeCellIndex = nb.widgets.length - 1;
        await app.commands.execute('notebook:insert-cell-below');
        nb.activeCell.model.sharedModel.setSource(arg);
        await app.commands.execute('notebook:run-cell');
        """,
        code,
        timeout=timeout,
    )
    return cell_output_text(page, -1)


def run_code_and_wait_text(page: Any, code: str, expected: str, timeout: int = CELL_MS) -> str:
    """Run ``code`` in a new last cell and wait until its output contains ``expected``.

    Comm updates from the front-end and execute requests share the shell channel, so a cell run
    after a UI action sees the trait the action set once the view has sent it: this proves the action
    reached the kernel. A view's handler may run late on a loaded machine (its update then lands after
    the cell's execute request), so a stale answer is asked again until ``timeout``, never accepted.
    """
    deadline = time.monotonic() + timeout / 1000
    text = run_cell(page, code, timeout=timeout)
    while True:
        if expected in text:
            return text
        # run-cell resolves on execute_reply; an iopub stream can land a moment later.
        try:
            page.wait_for_function(_LAST_CELL_HAS, arg=expected, timeout=5_000, polling=POLL_MS)
            return cell_output_text(page, -1)
        except Exception as exc:
            text = cell_output_text(page, -1)
            if time.monotonic() > deadline:
                raise AssertionError(f"expected {expected!r} in the output of {code!r}, got {text!r}") from exc
        text = run_cell(page, code, timeout=timeout)


_LAST_CELL_HAS = """(expected) => {
    const cells = window.jupyterapp.shell.currentWidget.content.widgets;
    const outs = cells[cells.length - 1].model.outputs.toJSON();
    const text = outs.map((o) => {
        const t = o.text !== undefined ? o.text : (o.data && o.data['text/plain']) || '';
        return Array.isArray(t) ? t.join('') : t;
    }).join('');
    return text.includes(expected);
}"""


_JSON_MARK = "@@nbdebug-json@@"


def kernel_json(page: Any, expr: str, timeout: int = CELL_MS) -> Any:
    """Evaluate the Python expression ``expr`` in the kernel (in a new last cell) and return it.

    The value crosses as JSON printed after a marker, so it must be JSON-serialisable.
    """
    code = f"import json as _j\nprint({_JSON_MARK!r} + _j.dumps({expr}))"
    text = run_code_and_wait_text(page, code, _JSON_MARK, timeout=timeout)
    return json.loads(text.split(_JSON_MARK, 1)[1].strip().splitlines()[0])


def widget_selector(view_or_css: str) -> str:
    """``"thermometer"`` → ``.nbdebug-thermometer[data-ready="1"]``; CSS passes through."""
    if re.fullmatch(r"[a-z0-9_-]+", view_or_css):
        return f'.nbdebug-{view_or_css}[data-ready="1"]'
    return view_or_css


def wait_widget(page: Any, view_or_css: str, timeout: int = WIDGET_MS, index: int = 0) -> Any:
    """Wait until the widget root is drawn (``data-ready="1"``); returns its Playwright locator."""
    loc = page.locator(widget_selector(view_or_css)).nth(index)
    loc.wait_for(state="attached", timeout=timeout)
    loc.scroll_into_view_if_needed(timeout=timeout)
    return loc


def chromium_available() -> bool:
    return os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
