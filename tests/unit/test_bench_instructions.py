"""The benchmarks' instruction counting (``benchmarks/common.py``: ``instructions_per_call``), which
``make bench`` runs for bench_capture and bench_training under valgrind's callgrind and which
``make bench-quick`` cannot afford (under valgrind, importing torch alone takes about a minute): checked
here on small shell loops, whose instructions per call are known up to a constant.

A variant doing twice the work per call after a large fixed set-up must count exactly twice the
instructions per call of the plain variant: the set-up (a process's import and warm-up, in the benchmarks)
cancels in the difference of the two call counts. Without valgrind, or without ``count``, each
variant's process still runs once (the code path ``--quick`` checks) and nothing is counted."""

from __future__ import annotations

import pathlib
import shutil
import sys

import pytest

BENCH = str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import common  # noqa: E402

#: shell-loop iterations per call; every counter has 5 digits, so each iteration costs the same
PER_CALL, SETUP = 200, 500


def _loop(n: int) -> str:
    return f"i=10000; while [ $i -lt {10000 + n} ]; do i=$((i+1)); done"


def _cmd(variant: str, calls: int) -> list[str]:
    """A set-up loop, then ``calls`` calls (``PER_CALL`` iterations each, twice that for "twice…"). Both
    variants have a set-up: dash runs a loop that follows another with ~1% fewer instructions per iteration."""
    if variant == "once":
        return ["/bin/sh", "-c", f"{_loop(10)}; {_loop(PER_CALL * calls)}"]
    return ["/bin/sh", "-c", f"{_loop(SETUP)}; {_loop(2 * PER_CALL * calls)}"]  # "twice after a (larger) set-up"


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed (make bench counts instructions with it)")
def test_instructions_per_call_cancel_the_setup_and_scale_with_the_work() -> None:
    per = common.instructions_per_call(_cmd, ("once", "twice after a set-up"), 1, 3, count=True)
    assert set(per) == {"once", "twice after a set-up"}
    assert 2_000 * PER_CALL < per["once"] < 50_000 * PER_CALL  # a shell-loop iteration: thousands of instructions
    # the set-up (SETUP iterations, 2.5 calls' worth of "once") cancels; without the difference of the two
    # call counts the ratio would be (500 + 1200) / (10 + 600) = 2.8
    assert per["twice after a set-up"] / per["once"] == pytest.approx(2.0, rel=0.01)


@pytest.mark.parametrize("why", ["no valgrind", "count=False"])
def test_without_counting_each_variant_runs_once_and_nothing_is_returned(why: str, tmp_path, monkeypatch) -> None:
    """No valgrind on the machine, or ``count=False`` (--quick): each variant's process runs once, with the
    lower call count, and no ratio is made up."""
    if why == "no valgrind":
        monkeypatch.setattr(shutil, "which", lambda _name: None)
    log = tmp_path / "ran"

    def cmd(variant: str, calls: int) -> list[str]:
        return ["/bin/sh", "-c", f"echo {variant}:{calls} >> {log}"]

    assert common.instructions_per_call(cmd, ("plain", "nbdebug"), 1, 2, count=why != "count=False") == {}
    assert log.read_text().split() == ["plain:1", "nbdebug:1"]
