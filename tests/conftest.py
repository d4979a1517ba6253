"""Shared fixtures. Tiers: tests/unit (pure Python), tests/widget (widgets + magic in an
InteractiveShell), tests/models (offline pretrained models), tests/browser (real chromium)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from skip_policy import (  # noqa: F401  (hooks: no silent skips in CI)
    pytest_collectreport,
    pytest_configure,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_testnodedown,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def shell() -> Iterator[Any]:
    """A fresh IPython shell with nbdebug loaded and displays recorded in ``shell.displayed``
    (the widget and real-use tiers run the magic through it)."""
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.clear_instance()
    sh = InteractiveShell.instance()
    displayed: list[object] = []
    sh.display_pub.publish = lambda data, metadata=None, **kw: displayed.append(data)  # type: ignore[method-assign]
    sh.displayed = displayed  # type: ignore[attr-defined]
    assert sh.run_cell("%load_ext nbdebug").success
    yield sh
    InteractiveShell.clear_instance()


@pytest.fixture(autouse=True)
def _no_accelerator_left_behind() -> Iterator[None]:
    """A test that runs a ``transformers.Trainer`` creates accelerate's process-wide state; left behind,
    ``accelerate.notebook_launcher`` in a later test refuses to start ("the `Accelerator` should only be
    initialized inside your training function"). Reset it after any test that made one."""
    yield
    import sys

    state = sys.modules.get("accelerate.state")
    if state is not None and (state.AcceleratorState._shared_state or state.PartialState._shared_state):
        state.AcceleratorState._reset_state(reset_partial_state=True)


#: the longest files first (measured: build/ci/*.xml of a `.ci/run`), so that two xdist workers do not end
#: with one of them alone on a 5-minute test; whole files move, in this order, the rest keeps its order
LONG_FIRST = (
    "tests/browser/test_readme_screenshots_browser.py",
    "tests/browser/test_groups_browser.py",
    "tests/browser/test_tutorial_browser.py",
    "tests/notebooks/",
    "tests/models/",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid
        return next((i for i, p in enumerate(LONG_FIRST) if path.startswith(p)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: within a rank, collection order
