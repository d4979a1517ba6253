"""Fixtures of the real-use matrix: compiled models (compiled once per session), a fresh IPython
shell; and the "Works with" table: every run compares the matrix's outcomes with the committed copies
(``works_with.check``) and fails on a ✓ that became a note; ``NBDEBUG_WORKS_WITH=1`` rewrites them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from . import models as M


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """The matrix's tensors are tiny: with two intra-op threads on a busy 2-core machine every op
    waits for the other thread (a 7×16 matmul takes ~0.4 ms instead of ~10 µs). One thread, then
    restored after each module (other tiers run in the same session)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def compiled() -> Iterator[dict[str, tuple[torch.nn.Module, torch.nn.Module]]]:
    """family → (compiled, original): an eval-mode TinyCNN and tiny GPT-2, each compiled and warmed up once.

    ``backend="eager"``: TorchDynamo traces, guards and graph-breaks exactly as with the default
    backend (that is what hooks interact with), without Inductor's code generation, which would
    cost tens of seconds on every recompilation the views' hooks trigger.
    """
    out: dict[str, tuple[torch.nn.Module, torch.nn.Module]] = {}
    cnn = M.tiny_cnn().eval()
    out["cnn"] = (torch.compile(cnn, backend="eager"), cnn)
    gpt2 = M.tiny_lm("gpt2")
    out["gpt2"] = (torch.compile(gpt2, backend="eager"), gpt2)
    with torch.no_grad():
        out["cnn"][0](M.image())
        out["gpt2"][0](M.prompt())
    yield out
    torch._dynamo.reset()  # the rest of the session starts without our compiled code


@pytest.fixture(scope="session")
def offloaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(offloaded, reference): a 2-layer, 2-head, d=16 random Llama saved once and loaded twice, spread
    by accelerate over the CPU and disk, and without offload (``nbdebug.testing.offloaded_llama``)."""
    pytest.importorskip("accelerate")
    from nbdebug.testing import offloaded_llama

    return offloaded_llama(tmp_path_factory.mktemp("offload"), layers=2, hidden=16, heads=2, vocab=M.VOCAB)


# -- the Works-with table ----------------------------------------------------------------------
# Every run of the tier compares its outcomes with tests/envelope/WORKS_WITH.md and the table in
# docs/works-with.md (works_with.check): a committed ✓ whose test ended in a note or failed fails the
# run; on a run of the whole tier any difference does. NBDEBUG_WORKS_WITH=1 rewrites both copies
# (only from a run of the whole tier).
_OUTCOMES: dict[tuple[str, str], str] = {}
_HERE = Path(__file__).resolve().parent
_TIER: dict[str, set[str]] = {"collected": set(), "finished": set(), "deselected": set()}
_SUMMARY: list[str] = []


def _in_tier(path: object) -> bool:
    return Path(str(path)).resolve().is_relative_to(_HERE)


def _whole_tier_asked(config: pytest.Config) -> bool:
    """Whether the command line asked for all of ``tests/envelope`` (it or a folder above it, not a
    file or a test id)."""
    for arg in config.args:
        if "::" in arg:
            continue
        p = (config.invocation_params.dir / arg).resolve()
        if p.is_dir() and _HERE.is_relative_to(p):
            return True
    return False


def pytest_deselected(items: list[pytest.Item]) -> None:
    _TIER["deselected"].update(i.nodeid for i in items if _in_tier(i.path))


def pytest_collection_finish(session: pytest.Session) -> None:
    _TIER["collected"] = {i.nodeid for i in session.items if _in_tier(i.path)}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _TIER["finished"].add(report.nodeid)
    props = dict(report.user_properties)
    keys = props.get("cells") or ([props["cell"]] if "cell" in props else [])
    if not keys or report.when not in ("call", "setup") or (report.when == "setup" and report.passed):
        return
    outcome = (props.get("note") or "✓") if report.passed else "✗"
    for key in keys:  # several tests of one cell (the matrix and the magic): the worst outcome stands
        old = _OUTCOMES.get(tuple(key))
        _OUTCOMES[tuple(key)] = outcome if old is None or _rank(outcome) >= _rank(old) else old


def _rank(outcome: str) -> int:
    """✓ < a note < ✗."""
    return 0 if outcome == "✓" else (2 if outcome == "✗" else 1)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _TIER["collected"]:
        return
    whole = (_whole_tier_asked(session.config) and not _TIER["deselected"]
             and _TIER["collected"] <= _TIER["finished"])
    from .works_with import check

    passed, lines = check(_OUTCOMES, whole, bool(os.environ.get("NBDEBUG_WORKS_WITH")))
    _SUMMARY[:] = lines
    if not passed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SUMMARY:
        terminalreporter.section("Works with (tests/envelope/works_with.py)", sep="=", red=True, bold=True)
        for line in _SUMMARY:
            terminalreporter.line(line)
