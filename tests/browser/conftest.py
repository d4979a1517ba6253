"""Fixtures of the real-browser tier: one JupyterLab and one Notebook 7 server per session, one
headless Debian chromium per session, a fresh browser context (and page) per test.

* ``lab`` / ``nb7``: a :class:`harness.JupyterServer` (``.root`` is where to write notebooks,
  ``.app`` is ``"lab"`` or ``"notebook"``); after each test its kernels are shut down.
* ``page``: a Playwright page whose uncaught errors and console errors (e.g. "[anywidget] Failed to
  initialize model") fail the test, except Notebook 7's known "reading 'schema'" one; on failure a
  screenshot lands in ``test-artifacts/<test>-failure.png``.
* ``browser``: the shared chromium. Missing ``/usr/bin/chromium`` skips the tier locally and
  fails it in CI (``CI=true``).

Every test under ``tests/browser/`` gets the ``browser`` marker automatically.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from . import harness

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.browser)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    setattr(item, f"_nbdebug_rep_{rep.when}", rep)
    return rep


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


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A page in a fresh context; page and console errors fail the test, failures leave a screenshot."""
    app = None
    names = set(request.fixturenames)
    if "nb7" in names or "nb7_server" in names:
        app = "notebook"
    elif "lab" in names or "lab_server" in names:
        app = "lab"
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(harness.WIDGET_MS)
    pg = context.new_page()
    errors = harness.PageErrors(pg, app)
    pg.nbdebug_errors = errors  # tests may call page.nbdebug_errors.check() early
    try:
        yield pg
        rep = getattr(request.node, "_nbdebug_rep_call", None)
        if rep is not None and rep.failed:
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
            try:
                harness.screenshot(pg, f"{name}-failure")
            except Exception:  # the page may be gone; the failure itself matters more
                pass
    finally:
        context.close()
    errors.check()
