"""Under ``-n 2``: ``--dist loadgroup`` keeps each ``xdist_group`` on one worker under this pytest/xdist pair (tests/conftest.py
tags the nodeids itself: pytest-xdist 3.8's tag is lost on pytest 9, and the tutorials' story tests then
executed their notebook a second time on the other worker), and each worker computes on one thread."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

PLANTED = '''
import os, pathlib, pytest
OUT = pathlib.Path(__file__).with_name("ran.txt")
def record(what):
    with OUT.open("a") as f:
        f.write(f"{what} {os.environ['PYTEST_XDIST_WORKER']}\\n")
def test_threads():
    import subprocess, sys, torch
    child = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True)
    OUT.with_name("threads.txt").write_text(f"{torch.get_num_threads()} {child.stdout.strip()}")
@pytest.mark.parametrize("i", [pytest.param(i, marks=pytest.mark.xdist_group(f"g{i % 2}")) for i in range(12)])
def test_param(i): record(f"g{i % 2}")
@pytest.mark.xdist_group("g0")
def test_story0(): record("g0")
@pytest.mark.xdist_group("g1")
def test_story1(): record("g1")
'''


def test_each_group_runs_on_one_worker(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    # xdist alone of the installed plugins (-p below): the others' entry points (jaxtyping, typeguard,
    # anyio...) cost ~0.5 CPU-s in each of the 3 pytest processes and play no part here.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    shutil.copy(TESTS / "skip_policy.py", tmp_path / "skip_policy.py")
    shutil.copy(TESTS / "shells.py", tmp_path / "shells.py")
    shutil.copy(TESTS / "cpu_times.py", tmp_path / "cpu_times.py")
    (tmp_path / "test_planted.py").write_text(PLANTED)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "xdist.plugin", "-q", "-n", "2", "--dist", "loadgroup", "test_planted.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    workers: dict[str, set[str]] = {}
    for line in (tmp_path / "ran.txt").read_text().splitlines():
        group, worker = line.split()
        workers.setdefault(group, set()).add(worker)
    assert sum(1 for _ in (tmp_path / "ran.txt").read_text().splitlines()) == 14
    assert workers.keys() == {"g0", "g1"} and all(len(w) == 1 for w in workers.values()), workers
    # one intra-op thread per worker, and in the processes it starts (a tutorial's kernel)
    assert (tmp_path / "threads.txt").read_text() == "1 1"
