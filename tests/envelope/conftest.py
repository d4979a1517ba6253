"""Fixtures of the real-use matrix: compiled models (compiled once per session), a fresh IPython
shell, and the "Works with" table written from the matrix's outcomes (``NBDEBUG_WORKS_WITH=path``)."""

from __future__ import annotations

import os
from collections.abc import Iterator

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
_OUTCOMES: dict[tuple[str, str], str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    props = dict(report.user_properties)
    keys = props.get("cells") or ([props["cell"]] if "cell" in props else [])
    if not keys or report.when not in ("call", "setup") or (report.when == "setup" and report.passed):
        return
    for key in keys:
        _OUTCOMES[tuple(key)] = (props.get("note") or "✓") if report.passed else "✗"


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("NBDEBUG_WORKS_WITH")
    if not path or not _OUTCOMES:
        return
    from .works_with import write_table

    write_table(path, _OUTCOMES)
