"""``benchmarks/run_all.py --quick`` runs the scripts that measure no memory one after the other in one
process (``run_in_this_process``): each must run as ``python bench_x.py --quick`` runs it, its failure
must be reported and must not stop the others, and what it changes must not reach the next script.
Checked on small planted scripts."""

from __future__ import annotations

import json
import os
import pathlib
import random
import sys
import warnings

import numpy as np
import torch

BENCH = str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import run_all  # noqa: E402

SCRIPTS = {
    # changes what a later script could see: environment, cwd, warning filters, threads, seeds
    "a_leaves_state.py": """
import os, random, sys, warnings
import torch
print("argv", sys.argv[1:], "name", __name__, "file", os.path.basename(__file__))
os.environ["RUN_ALL_TEST_LEAK"] = "1"
os.chdir("/")
warnings.simplefilter("error")
torch.set_num_threads(3)
torch.manual_seed(0)
random.seed(0)
print("rand", torch.rand(1).item())
""",
    "b_exits_3.py": "import sys\nsys.exit(3)\n",
    "c_raises.py": "raise RuntimeError('planted failure')\n",
    "d_message.py": "raise SystemExit('planted message')\n",
    "e_sees_clean_state.py": """
import os, random, warnings
import torch
print("leak", os.environ.get("RUN_ALL_TEST_LEAK"), "cwd", os.getcwd(), "threads", torch.get_num_threads())
warnings.warn("only a warning")  # an error under the first script's filter
print("rand", torch.rand(1).item(), "random", random.random())
if __name__ == "__main__":
    print("main ran")
""",
}


def test_each_script_runs_as_its_own_main_and_leaves_nothing_behind(tmp_path, capsys) -> None:
    for name, text in SCRIPTS.items():
        (tmp_path / name).write_text(text)
    report = tmp_path / "report.jsonl"
    threads, cwd, argv, env = torch.get_num_threads(), os.getcwd(), list(sys.argv), dict(os.environ)
    rng = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e's warning, once it is allowed through
            status = run_all.run_in_this_process([tmp_path / n for n in SCRIPTS], ["--quick"], report)
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(rng[0])
        np.random.set_state(rng[1])
        random.setstate(rng[2])
    out, err = capsys.readouterr()
    assert status == 1
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(r["name"], r["status"]) for r in rows] == [
        ("a_leaves_state.py", 0), ("b_exits_3.py", 3), ("c_raises.py", 1), ("d_message.py", 1), ("e_sees_clean_state.py", 0)]
    assert all(r["cpu"] >= 0 and r["wall"] >= 0 for r in rows)
    assert "argv ['--quick'] name __main__ file a_leaves_state.py" in out
    assert [line for line in out.splitlines() if line.startswith("===")] == [f"=== {n} --quick ===" for n in SCRIPTS]
    assert "RuntimeError: planted failure" in err and "planted message" in err
    # the last script: no leaked variable, the old working directory, the threads and warning filters of before
    assert f"leak None cwd {cwd} threads {threads}" in out
    assert "main ran" in out
    # seeded afresh: not the sequences manual_seed(0) / random.seed(0) of the first script continued
    g = torch.Generator().manual_seed(0)
    first, second = torch.rand(1, generator=g).item(), torch.rand(1, generator=g).item()
    assert f"rand {first}" in out and f"rand {second}" not in out
    assert f"random {random.Random(0).random()}" not in out
    # and this process is as it was
    assert dict(os.environ) == env and os.getcwd() == cwd and sys.argv == argv


def test_exit_status_as_python_gives_it() -> None:
    assert [run_all.exit_status(SystemExit(c)) for c in (None, 0, 2)] == [0, 0, 2]
    assert run_all.exit_status(SystemExit("a message")) == 1
