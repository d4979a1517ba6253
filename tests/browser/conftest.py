"""Fixtures of the real-browser tier: one JupyterLab and one Notebook 7 server per session, one
headless Debian chromium per session; JupyterLab tests share one loaded Lab page per worker
(``labpage.py``: each test's notebook opened in it, closed after), every other test gets a fresh
browser context (and page).

* ``lab`` / ``nb7``: a :class:`harness.JupyterServer` (``.root`` is where to write notebooks,
  ``.app`` is ``"lab"`` or ``"notebook"``); after each test its kernels are shut down.
* ``page``: a Playwright page (the worker's reused JupyterLab page for a test that uses ``lab``,
  unless marked ``fresh_page``) whose uncaught errors and console errors (e.g. "[anywidget] Failed to
  initialize model") fail the test, except Notebook 7's known "reading 'schema'" one; on failure a
  screenshot lands in ``test-artifacts/<test>-failure.png``.
* ``browser``: the shared chromium. Missing ``/usr/bin/chromium`` skips the tier locally and
  fails it in CI (``CI=true``).

Every test under ``tests/browser/`` gets the ``browser`` marker automatically.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from . import harness, labpage, page_cpu, schedule

HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "fresh_page: a JupyterLab test that needs a page of its own (not the worker's reused Lab page)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.browser)
    schedule.longest_first(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item._nbdebug_chromium0 = page_cpu.chromium_cpu_seconds()  # type: ignore[attr-defined]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    setattr(item, f"_nbdebug_rep_{rep.when}", rep)
    start = getattr(item, "_nbdebug_chromium0", None)
    if rep.when == "teardown" and start is not None:
        # chromium's CPU during this test (set-up to tear-down; uncounted by ``cpu_s``, which sees
        # only processes the worker waited for): the junit property ``chromium_cpu_s``
        end = _CHROMIUM_AT_CLOSE.pop() if _CHROMIUM_AT_CLOSE else page_cpu.chromium_cpu_seconds()
        rep.user_properties.append(("chromium_cpu_s", round(end - start, 2)))
    return rep


_CHROMIUM_ROWS: list[tuple[float, str]] = []
_CHROMIUM_AT_CLOSE: list[float] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # where the reports arrive (the xdist controller, or the one process)
    if report.when == "teardown":
        _CHROMIUM_ROWS.extend((float(v), report.nodeid) for k, v in report.user_properties if k == "chromium_cpu_s")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    rows = _CHROMIUM_ROWS
    if rows:
        terminalreporter.write_sep("=", f"chromium CPU by test (total {sum(c for c, _ in rows):.0f} CPU-s)")
        for spent, nodeid in sorted(rows, reverse=True)[:25]:
            terminalreporter.write_line(f"{spent:8.2f} chromium CPU-s  {nodeid}")


def _require_chromium() -> None:
    if harness.chromium_available():
        return
    msg = f"{harness.CHROMIUM} is missing (install it with `make chromium`)"
    if harness.in_ci():
        pytest.fail(f"{msg}; browser tests must run in CI", pytrace=False)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """The one headless Debian chromium of the session (never `playwright install`)."""
    _require_chromium()
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(
            executable_path=harness.CHROMIUM, headless=True, args=harness.CHROMIUM_ARGS
        )
        try:
            yield b
        finally:
            # the last test's tear-down closes chromium: its reading is taken here
            _CHROMIUM_AT_CLOSE.append(page_cpu.chromium_cpu_seconds())
            b.close()
    finally:
        pw.stop()


@pytest.fixture(scope="session")
def lab_server() -> Iterator[harness.JupyterServer]:
    """JupyterLab for the whole session (started on first use)."""
    _require_chromium()
    server = harness.start_server("lab")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def nb7_server() -> Iterator[harness.JupyterServer]:
    """Notebook 7 for the whole session (started on first use)."""
    _require_chromium()
    server = harness.start_server("notebook")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def lab(lab_server: harness.JupyterServer) -> Iterator[harness.JupyterServer]:
    """The session's JupyterLab; this test's kernels are shut down afterwards."""
    yield lab_server
    lab_server.shutdown_sessions()


@pytest.fixture
def nb7(nb7_server: harness.JupyterServer) -> Iterator[harness.JupyterServer]:
    """The session's Notebook 7; this test's kernels are shut down afterwards."""
    yield nb7_server
    nb7_server.shutdown_sessions()


@pytest.fixture(scope="session")
def lab_page(browser: Any) -> Iterator[labpage.LabPage]:
    """The worker's reusable JupyterLab page (``labpage.py``), loaded by the first test that opens a
    notebook in it."""
    pool = labpage.LabPage(browser, harness.WIDGET_MS)
    try:
        yield pool
    finally:
        pool.discard()
        # xdist workers' prints are not shown: the counts go to test-artifacts/ as well
        line = f"[labpage] JupyterLab loaded {pool.loads}x, a loaded page reused {pool.reuses}x"
        print("\n" + line)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        harness.ARTIFACTS.mkdir(exist_ok=True)
        (harness.ARTIFACTS / f"labpage-{worker}.txt").write_text("\n".join([line, *pool.refused]) + "\n")


def _app_of(request: pytest.FixtureRequest) -> harness.App | None:
    names = set(request.fixturenames)
    if "nb7" in names or "nb7_server" in names:
        return "notebook"
    if "lab" in names or "lab_server" in names:
        return "lab"
    return None


def _failure_screenshot(request: pytest.FixtureRequest, pg: Any) -> bool:
    """A screenshot when the test's call failed; returns whether it failed."""
    rep = getattr(request.node, "_nbdebug_rep_call", None)
    if rep is None:
        return True  # no call report: setup failed
    if not rep.failed:
        return hasattr(rep, "wasxfail")  # an expected failure is a failure of the page all the same
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    try:
        harness.screenshot(pg, f"{name}-failure")
    except Exception:  # the page may be gone; the failure itself matters more
        pass
    return True


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A page; page and console errors fail the test, failures leave a screenshot.

    A test that uses ``lab`` (not marked ``fresh_page``) gets the worker's loaded JupyterLab page;
    any other test a page in a fresh context."""
    app = _app_of(request)
    if app == "lab" and labpage.enabled() and request.node.get_closest_marker("fresh_page") is None:
        yield from _reused_lab_page(request)
        return
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(harness.WIDGET_MS)
    pg = context.new_page()
    errors = harness.PageErrors(pg, app)
    pg.nbdebug_errors = errors  # tests may call page.nbdebug_errors.check() early
    try:
        yield pg
        _failure_screenshot(request, pg)
    finally:
        context.close()
    errors.check()


def _reused_lab_page(request: pytest.FixtureRequest) -> Iterator[Any]:
    # `lab` set up first, so torn down after this fixture: the documents are closed before the
    # test's sessions (kernels) are deleted.
    request.getfixturevalue("lab")
    pool: labpage.LabPage = request.getfixturevalue("lab_page")
    pg = pool.acquire()
    errors = pool.errors
    ok = False
    try:
        yield pg
        ok = not _failure_screenshot(request, pg)
    finally:
        pool.release(ok)  # closing the test's documents: their widgets' disposal is checked too
    try:
        assert errors is not None
        errors.check()
    except BaseException:
        pool.discard("errors in the browser")
        raise
