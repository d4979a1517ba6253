"""Each test's CPU seconds, beside pytest's wall-clock ``--durations``: on a shared 2-core machine the
wall time of a test says how busy the machine was, its CPU time what the test costs.

Measured in the process that runs the test (an xdist worker): user + system time of the process and of
the child processes it has waited for (a notebook's kernel, a subprocess.run), from the start of the
test's set-up to the end of its tear-down. Processes the test starts and does not wait for are not
counted, and a session fixture's processes are charged to the test whose tear-down reaps them (in the
browser tier, the Jupyter servers' whole CPU lands on a worker's last test): there, use
tests/browser/cpu_split.py. Each test's figure goes into the junit XML as
the property ``cpu_s``; the terminal summary lists the ``--durations`` slowest (25 when not given)."""

from __future__ import annotations

import resource
from typing import Any

import pytest


def cpu_seconds() -> float:
    """User + system CPU of this process and of its waited-for children, in seconds."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        use = resource.getrusage(who)
        total += use.ru_utime + use.ru_stime
    return total


class CpuTimes:
    """A pytest plugin: measures each test on the process that runs it, collects the figures where the
    reports arrive (the xdist controller, or the one process), and prints the slowest."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.start: dict[str, float] = {}
        self.rows: list[tuple[float, str]] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Any:
        self.start[item.nodeid] = cpu_seconds()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Any:
        outcome = yield
        if call.when == "teardown" and item.nodeid in self.start:
            spent = cpu_seconds() - self.start.pop(item.nodeid)
            outcome.get_result().user_properties.append(("cpu_s", round(spent, 2)))

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "teardown":
            for name, value in report.user_properties:
                if name == "cpu_s":
                    self.rows.append((float(value), report.nodeid))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows:
            return
        terminalreporter.write_sep("=", f"slowest {self.top} by CPU (process + waited children; total {sum(c for c, _ in self.rows):.0f} CPU-s)")
        for spent, nodeid in sorted(self.rows, reverse=True)[: self.top]:
            terminalreporter.write_line(f"{spent:8.2f} CPU-s  {nodeid}")


def register(config: pytest.Config) -> None:
    """Add the plugin (once per process)."""
    if not config.pluginmanager.has_plugin("nbdebug-cpu-times"):
        top = config.getoption("durations", None) or 25
        config.pluginmanager.register(CpuTimes(top), "nbdebug-cpu-times")
