"""No silent skips in CI: with ``CI`` set (``.ci/run`` sets ``CI=true``), a test or module skipped for any
reason not on :data:`ALLOWED` fails the session, so a missing chromium, pillow, captum or model package
turns CI red instead of quietly switching checks off. Outside CI a skip stays a skip (listed by ``-ra``).

Loaded by tests/conftest.py (``from skip_policy import *``); tests/unit/test_skip_policy.py runs it on
planted skips. Under pytest-xdist the workers' module-level skips (``importorskip`` at import) reach
the controller through ``workeroutput``; test-level skips come back as the tests' own reports.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

#: the only skip reasons CI accepts: hardware this machine has not, and the numpy-path run's switch
ALLOWED: tuple[str, ...] = (
    "needs a GPU",
    "fused Adam unavailable",
    "NBDEBUG_NATIVE=0 in the environment",
    "disabled (NBDEBUG_NATIVE=0)",  # native.status() on the numpy-path run
)
_KEY = "nbdebug_unallowed_skips"
_seen: list[str] = []


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _reason(report: Any) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _note(report: Any) -> None:
    reason = _reason(report)
    if not any(allowed in reason for allowed in ALLOWED):
        _seen.append(f"{report.nodeid or report.fspath}: {reason}")


def pytest_collectreport(report: Any) -> None:
    if report.skipped:
        _note(report)


def pytest_runtest_logreport(report: Any) -> None:
    # on an xdist worker the controller gets this report too (and notes it there)
    if report.skipped and not hasattr(report, "wasxfail") and not _CONFIG.get("worker"):
        _note(report)


_CONFIG: dict[str, bool] = {}  # "worker": this process is a pytest-xdist worker


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG["worker"] = hasattr(config, "workerinput")
    _seen.clear()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: a worker's module-level skips."""
    _seen.extend(getattr(node, "workeroutput", {}).get(_KEY, []))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _CONFIG.get("worker"):
        session.config.workeroutput[_KEY] = list(_seen)  # type: ignore[attr-defined]
        return
    if in_ci() and _seen and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _CONFIG.get("worker") or not _seen or not in_ci():
        return
    terminalreporter.section("skips CI does not allow (tests/skip_policy.py)", red=True)
    for line in sorted(set(_seen)):
        terminalreporter.write_line(f"SKIPPED IN CI: {line}")
    terminalreporter.write_line(f"CI=true fails on any skip whose reason is not one of: {'; '.join(ALLOWED)}. "
                                "Install what the test needs (make setup), or fix the test.")
