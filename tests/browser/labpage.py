"""One loaded JupyterLab page per pytest(-xdist) worker, reused by the JupyterLab tests.

Loading JupyterLab costs chromium 8–10 CPU-s (``page.goto`` and Lab's start-up); opening one more
notebook inside a page where Lab already runs costs 1.3–1.6 CPU-s (``tests/browser/cpu_split.py``).
So a worker keeps one browser context with one Lab page (:class:`LabPage`, the session fixture
``lab_page`` in ``conftest.py``), and a test's :func:`harness.open_notebook` opens its notebook there
with ``docmanager:open`` instead of navigating. Between two tests:

* after a test (:meth:`LabPage.release`): every main-area widget is marked clean and disposed (no
  "save changes?" dialog; the notebook's widget views go with it), then the ``lab`` fixture deletes
  the test's sessions (its kernel) through the REST API;
* before a test (:meth:`LabPage.acquire`): the page must hold no document and no dialog, the
  globals earlier tests set on ``window`` (``__`` names Lab itself did not define) are deleted, the
  viewport and the mouse are put back, and the error lists are emptied, so the console-error check
  sees this test's errors only (its widgets' disposal included).

Anything unexpected (a failed test, a console error, a dialog, a leftover widget, an exception in this
path) closes the context: the next test gets a fresh page and loads Lab again. Tests that need a page
of their own ask for it with ``@pytest.mark.fresh_page`` (reloads, first-paint timings); Notebook 7
tests and pages outside Jupyter always get a fresh context. ``NBDEBUG_BROWSER_REUSE=0`` turns reuse off.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from .harness import PageErrors, run_js, wait_kernel_idle
from .servers import JupyterServer, ipynb

VIEWPORT = {"width": 1400, "height": 1000}

_OPEN = """
const w = await app.commands.execute('docmanager:open', { path: arg, factory: 'Notebook' });
app.shell.activateById(w.id);
return true;
"""

# Mark every document clean (no "save changes?" dialog), then dispose every main-area widget: the
# docmanager disposes each context (and its session connection) with its last widget. Lab may open a
# launcher when the main area empties; that one holds no document.
_CLOSE = """
for (const w of Array.from(app.shell.widgets('main'))) {
    if (w.context && w.context.model) w.context.model.dirty = false;
    w.dispose();
}
"""

# What a test leaves behind that a fresh page would not have, checked before the next test reuses
# the page (a reason string: not reusable; "" : clean). The shell's layout (side panels, mode, theme)
# and the ids of the widgets outside the main area must equal those seen right after Lab loaded; the
# main area may hold a launcher only; no dialog, menu, tooltip or completer, and nothing any notebook
# drew (no nbdebug node, output area or ipywidget) anywhere in the DOM, so no locator of the next
# test can match a stale node. The server must run no session and no kernel (the ``lab`` fixture
# deleted them). Then the globals earlier tests set on ``window`` (``__`` names Lab itself did not
# define) are deleted. A reload or a navigation loses ``__nbdebugPage``: not reusable either.
_LAYOUT = """
    const shell = app.shell;
    const ids = (area) => { try { return Array.from(shell.widgets(area)).map((w) => w.id).sort(); } catch (e) { return []; } };
    return JSON.stringify({
        left: shell.leftCollapsed, right: shell.rightCollapsed, mode: shell.mode,
        presentation: !!shell.presentationMode, theme: document.body.dataset.jpThemeName || '',
        areas: ['left', 'right', 'top', 'menu', 'header', 'down', 'bottom'].map(ids),
    });
"""

_CLEAN = """
    const [token, layout, known] = arg;
    if (!app || window.__nbdebugPage !== token) return 'the page was reloaded or navigated';
    const now = await (async () => { LAYOUT })();
    if (now !== layout) {
        const [a, b] = [JSON.parse(now), JSON.parse(layout)];
        const diff = Object.keys(b).filter((k) => JSON.stringify(a[k]) !== JSON.stringify(b[k]));
        return 'the shell layout changed: ' + diff.map((k) => k + ' ' + JSON.stringify(a[k]) + ' (was ' + JSON.stringify(b[k]) + ')').join('; ');
    }
    const main = Array.from(app.shell.widgets('main'));
    const launcher = (w) => w.hasClass('jp-Launcher') || !!(w.content && w.content.hasClass && w.content.hasClass('jp-Launcher'));
    if (!main.every(launcher)) return 'a widget left in the main area: ' + main.map((w) => w.id);
    const stale = document.querySelector(
        '.jp-Dialog, .lm-Menu, .jp-Tooltip, .jp-Completer:not(.lm-mod-hidden), .jp-Notebook, .jp-OutputArea, '
        + '[class*="nbd"], .jupyter-widgets, .widget-output');
    if (stale) return 'a node left in the page: ' + stale.tagName + '.' + stale.className;
    const sm = app.serviceManager;
    await Promise.all([sm.sessions.refreshRunning(), sm.kernels.refreshRunning()]);
    const running = Array.from(sm.sessions.running()).length + Array.from(sm.kernels.running()).length;
    if (running) return running + ' session(s)/kernel(s) still running';
    for (const k of Object.keys(window)) {
        if (k.startsWith('__') && !known.includes(k)) delete window[k];
    }
    return '';
""".replace("LAYOUT", _LAYOUT)

# Logged by JupyterLab's debugger when a notebook closes before its kernel answered the debugger's
# first request (a test that ends within a second or two of opening its notebook; a user closing a
# notebook that fast sees it too). A fresh page never logs it: the harness closes the whole page.
# Dropped only when it comes while the harness closes the documents.
CLOSING_NOISE = re.compile(r"^Could not restore the debugger state: Canceled future for debug_request message")

# Put back the side panels ``legibility.narrow`` collapsed (it notes how they were), before the
# layout check: a panel a test closed some other way is still a changed layout.
_UNNARROW = """() => {
    const was = window.__nbdebugNarrowed, shell = window.jupyterapp && window.jupyterapp.shell;
    if (!was || !shell) return;
    if (!was[0] && shell.leftCollapsed) shell.expandLeft();
    if (!was[1] && shell.rightCollapsed) shell.expandRight();
    delete window.__nbdebugNarrowed;
}"""

_GLOBALS = "() => Object.keys(window).filter((k) => k.startsWith('__'))"
# set by the views' key guard (js/src/lib/keys.ts): one window listener per page, kept
_KEEP = ["__nbdebugKeyGuard", "__nbdebugPage", "__nbdebugJobs"]


def enabled() -> bool:
    return os.environ.get("NBDEBUG_BROWSER_REUSE", "1").strip().lower() not in ("0", "false", "no")


class LabPage:
    """The worker's reusable JupyterLab page (created on first use, replaced after any trouble)."""

    def __init__(self, browser: Any, timeout_ms: int) -> None:
        self.browser = browser
        self.timeout_ms = timeout_ms
        self.context: Any = None
        self.page: Any = None
        self.errors: PageErrors | None = None
        self.server: JupyterServer | None = None  # whose Lab the page has loaded (None: not yet)
        self.known: list[str] = []  # window's "__" names once Lab ran
        self.token = ""  # window.__nbdebugPage of the load (gone after a reload or a navigation)
        self.layout = ""  # the shell's layout right after the load (_LAYOUT)
        self.listeners: dict[str, list[Any]] = {}  # the page's own Python handlers (PageErrors')
        self.loads = 0  # full page loads (for the report at the end of the session)
        self.reuses = 0
        self.refused: list[str] = []  # why a loaded page was not reused (the session's report)

    # -- per test ---------------------------------------------------------------------------
    def acquire(self) -> Any:
        """The page for the next test: the loaded one once it proved clean, else a fresh one."""
        if self.page is not None and not self._clean():
            self.discard()
        if self.page is None:
            self.context = self.browser.new_context(viewport=dict(VIEWPORT))
            self.context.set_default_timeout(self.timeout_ms)
            self.page = self.context.new_page()
            self.errors = PageErrors(self.page, "lab")
            # tests may call page.nbdebug_errors.check() early
            self.page.nbdebug_errors = self.errors
            self.page.nbdebug_reuse = self
            self.listeners = _listeners(self.page)
        assert self.errors is not None
        self.errors.errors.clear()
        self.errors.console.clear()
        return self.page

    def _clean(self) -> bool:
        if self.server is None:
            return False  # Lab never loaded here (or opening in place failed): nothing to reuse
        try:
            if self.page.viewport_size != VIEWPORT:  # first: the shell's layout is compared at Lab's load size
                self.page.set_viewport_size(dict(VIEWPORT))
                self.page.evaluate("new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
            self.page.evaluate(_UNNARROW)
            why = run_js(self.page, _CLEAN, [self.token, self.layout, self.known + _KEEP], timeout=self.timeout_ms)
            if not why:
                self.page.evaluate("window.__nbdebugJobs = {}")  # earlier run_js results
                self.page.mouse.move(0, 0)  # no hover left over a widget the next notebook draws
                return True
        except Exception as exc:
            why = str(exc)
        print(f"[labpage] page not reusable ({why}); a fresh page", file=sys.stderr)
        self.refused.append(why[:600])
        return False

    def release(self, ok: bool) -> None:
        """After a test: close its documents (the page stays), or drop the page when ``ok`` is false."""
        if not ok or self.page is None:
            self.discard("the test failed (or is an expected failure)" if self.page is not None else "")
            return
        try:
            _drop_listeners(self.page, self.listeners)  # handlers and routes the test added
            self.page.unroute_all()
            assert self.errors is not None
            seen = len(self.errors.console)
            run_js(self.page, _CLOSE, timeout=self.timeout_ms)
            self.errors.console[seen:] = [c for c in self.errors.console[seen:] if not CLOSING_NOISE.search(c)]
        except Exception as exc:
            print(f"[labpage] closing documents failed ({exc}); a fresh page", file=sys.stderr)
            self.discard(f"closing documents failed: {exc}")

    def discard(self, reason: str = "") -> None:
        """Close the context: the next test loads JupyterLab in a fresh one."""
        if reason:
            self.refused.append(reason[:300])
        context, self.context, self.page, self.server = self.context, None, None, None
        if context is not None:
            try:
                context.close()
            except Exception:  # already gone with the browser
                pass

    # -- opening a notebook (harness.open_notebook) -------------------------------------------
    def open(self, server: JupyterServer, name: str) -> bool:
        """Open ``name`` in the Lab this page already runs and wait for its kernel; False when the
        page has not loaded this server's Lab yet, or opening failed (the caller navigates then)."""
        if self.server is not server:
            return False
        try:
            run_js(self.page, _OPEN, ipynb(name), timeout=self.timeout_ms)
            wait_kernel_idle(self.page, name)
            self.reuses += 1
            return True
        except Exception as exc:
            print(f"[labpage] opening {name} in place failed ({exc}); loading Lab", file=sys.stderr)
            self.server = None
            assert self.errors is not None
            self.errors.errors.clear()  # the notebook has no outputs yet: Lab's own noise, not a view's
            self.errors.console.clear()
            return False

    def loaded(self, server: JupyterServer) -> None:
        """``page.goto`` loaded ``server``'s Lab and its kernel is idle: later tests reuse the page,
        once it looks as it looks now (layout, globals, this token)."""
        self.loads += 1
        if server.app != "lab":
            return
        self.known = list(self.page.evaluate(_GLOBALS))
        self.token = f"{os.getpid()}-{self.loads}"
        self.page.evaluate("(t) => { window.__nbdebugPage = t; }", self.token)
        self.layout = run_js(self.page, _LAYOUT)
        self.server = server


def _listeners(page: Any) -> dict[str, list[Any]]:
    """The page's Python-side event handlers now (Playwright's event emitter behind the sync page)."""
    impl = page._impl_obj
    return {ev: list(impl.raw_listeners(ev)) for ev in impl.event_names()}


def _drop_listeners(page: Any, keep: dict[str, list[Any]]) -> None:
    """Remove the handlers a test added with ``page.on`` (e.g. a websocket frame counter)."""
    impl = page._impl_obj
    for ev in list(impl.event_names()):
        for f in impl.raw_listeners(ev):
            if f not in keep.get(ev, []):
                impl.remove_listener(ev, f)
