"""Run every benchmark script in this folder to the end, one after the other (`make bench`).

    python benchmarks/run_all.py            # the figures (long: 8,192-token captures take minutes each; idle machine)
    python benchmarks/run_all.py --quick    # every script with tiny sizes and one round: proves each runs to the end

Every ``bench_*.py`` here is run (a new one is picked up without listing it), with the remaining
arguments passed on (with none, ``FIGURE_ARGS``); each must accept ``--quick``. The run fails when any
script fails. A full run gives each script a fresh process of its own, one at a time (figures need a quiet
machine and a process no other script has touched). ``--quick`` is what ``make test`` (and so CI) runs, so
a benchmark cannot stop working unseen; its figures mean nothing (tiny models, one round, one intra-op
thread on a shared machine), so it spends its CPU on the scripts' code, not on importing torch again:
the scripts that read resident memory (``MEASURE_MEMORY``) each get their own process, with glibc's
settings given up front; every other script runs in one shared process, one after the other, each as
``python bench_x.py --quick`` runs it (``runpy``: as ``__main__``, its own ``sys.argv``, torch's
default seed, one thread, the environment and warning filters as they were before it); that process
and one memory script run at a time beside each other. Each script ends with the figures README.md and
docs/*.md quote, labelled (``common.Figures``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import resource
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

HERE = pathlib.Path(__file__).resolve().parent
#: what a plain full run (`make bench`, no arguments) adds per script so that every figure the pages
#: quote is printed: the target loops over 5 fresh processes and their
#: instruction counts (callgrind, a few minutes; bench_capture's too), BertViz at 512 tokens (~45 s, ~5 GB)
FIGURE_ARGS = {"bench_training.py": ["--processes", "5", "--instructions"], "bench_capture.py": ["--instructions"],
               "bench_language.py": ["--bertviz-max", "512"]}

#: the scripts that read resident memory (``common.exact_rss_env``, or their own re-exec) and glibc's settings they need
MEASURE_MEMORY = {"bench_capture.py", "bench_language.py", "bench_workbench.py", "bench_vision.py"}
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
#: the argument that makes this file the shared process of ``--quick``: ``--one-process REPORT a.py,b.py -- ARGS``
ONE_PROCESS = "--one-process"


def cpu_seconds() -> float:
    """User + system CPU of this process and of the child processes it has waited for."""
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def exit_status(exc: SystemExit) -> int:
    """The exit status ``python script.py`` would have had for ``sys.exit(code)`` (a message: printed, 1)."""
    if exc.code is None or isinstance(exc.code, int):
        return (exc.code or 0) & 0xFF  # as the OS keeps it: sys.exit(256) exits 0
    print(exc.code, file=sys.stderr)
    return 1


def run_in_this_process(scripts: list[pathlib.Path], args: list[str], report: pathlib.Path) -> int:
    """Each script run as ``python script args`` would run it, one after the other in this process; after
    each, one JSON line (name, exit status, wall s, CPU s) appended to ``report``. 0 when every one succeeded.

    What a script could leave behind for the next is put back before it: ``sys.argv``, the environment,
    the working directory, the warning filters and torch's intra-op threads (one, from ``OMP_NUM_THREADS=1``);
    torch's, numpy's and Python's random generators are seeded afresh from the OS, as a new process's are.
    Not put back: modules already imported (``common``, ``zoo``, ``torch._dynamo`` once a script imported
    it), ``sys.path`` inserts and torch's other global settings (default dtype, grad mode, global hooks):
    a script that changes one changes it for the scripts after it (a full run gives each a fresh process)."""
    import random

    import numpy as np
    import torch

    threads = torch.get_num_threads()
    failed = 0
    for script in scripts:
        print(f"\n=== {script.name} {' '.join(args)} ===", flush=True)
        saved = sys.argv, dict(os.environ), os.getcwd()
        torch.seed()
        np.random.seed()
        random.seed()
        torch.set_num_threads(threads)
        sys.argv = [str(script), *args]
        cpu, t = cpu_seconds(), time.perf_counter()
        status = 0
        with warnings.catch_warnings():
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as exc:
                status = exit_status(exc)
            except Exception:  # the script failed: say how, go on with the next
                traceback.print_exc()
                status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        sys.argv = saved[0]
        os.environ.clear()
        os.environ.update(saved[1])
        os.chdir(saved[2])
        failed += status != 0
        with open(report, "a") as f:
            f.write(json.dumps({"name": script.name, "status": status, "wall": time.perf_counter() - t,
                                "cpu": cpu_seconds() - cpu}) + "\n")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    """Run each script with ``argv``; print its output and a summary line per script; 0 when every
    script succeeded. Full runs go one at a time, a process each (figures need a quiet machine);
    ``--quick`` runs the memory scripts in a process each and the others in one shared process, two
    processes at a time (nothing is timed for real), each process's output printed whole when it ends."""
    if argv[:1] == [ONE_PROCESS]:
        import gc

        import torch  # noqa: F401

        gc.freeze()  # torch's objects are never garbage: the scripts' full collections need not scan them again
        sep = argv.index("--")
        return run_in_this_process([HERE / s for s in argv[2].split(",")], argv[sep + 1:], pathlib.Path(argv[1]))
    quick = "--quick" in argv
    env = dict(os.environ)
    if quick:
        # One intra-op thread (tiny tensors: two threads only wait for each other on a busy machine), and
        # glibc's settings given up front to the memory-measuring scripts only, so they do not re-execute
        # themselves (for the others they cost system time: bench_cams --quick 11 CPU-s of sys with them, 1.6 without)
        env.update(OMP_NUM_THREADS="1")
    scripts = sorted(HERE.glob("bench_*.py"))
    shared = [s for s in scripts if quick and s.name not in MEASURE_MEMORY]
    jobs = min(2, os.cpu_count() or 1) if quick else 1
    results: dict[str, tuple[int, float, float]] = {}  # name → (exit status, wall s, CPU s)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report = pathlib.Path(tmp) / "one-process.jsonl"
        # the shared process first (the longest), then the others one by one beside it
        waiting: list[list[pathlib.Path]] = ([shared] if shared else []) + [[s] for s in scripts if s not in shared]
        running: dict[int, tuple[list[pathlib.Path], float, pathlib.Path | None]] = {}  # pid → (scripts, start, log)
        one_cpu = 0.0
        while waiting or running:
            while waiting and len(running) < jobs:
                group = waiting.pop(0)
                args = argv or FIGURE_ARGS.get(group[0].name, [])
                if jobs == 1:
                    print(f"\n=== {group[0].name} {' '.join(args)} ===", flush=True)
                    log = None
                else:
                    log = pathlib.Path(tmp) / f"{group[0].stem}.log"
                if group is shared:
                    cmd = [sys.executable, __file__, ONE_PROCESS, str(report), ",".join(s.name for s in group), "--", *args]
                else:
                    cmd = [sys.executable, str(group[0]), *args]
                with open(log, "wb") if log else contextlib.nullcontext() as out:
                    script_env = dict(env, **MALLOC_ENV) if quick and group[0].name in MEASURE_MEMORY else env
                    proc = subprocess.Popen(cmd, env=script_env, stdout=out, stderr=subprocess.STDOUT if out else None)
                running[proc.pid] = (group, time.perf_counter(), log)
            pid, wstatus, usage = os.wait4(-1, 0)  # the next process to end, with its CPU time
            if pid not in running:
                continue
            group, t, log = running.pop(pid)
            status = os.waitstatus_to_exitcode(wstatus)
            cpu = usage.ru_utime + usage.ru_stime
            if group is shared:
                one_cpu = cpu
                done = {}
                if report.exists():
                    done = {d["name"]: d for d in map(json.loads, report.read_text().splitlines())}
                for s in group:  # a script the process never reported on: it died there
                    d = done.get(s.name, {"status": status or 1, "wall": 0.0, "cpu": 0.0})
                    results[s.name] = (d["status"], d["wall"], d["cpu"])
            else:
                results[group[0].name] = (status, time.perf_counter() - t, cpu)
            if log is not None:
                if group is not shared:
                    print(f"\n=== {group[0].name} {' '.join(argv)} ===", flush=True)
                sys.stdout.write(log.read_text(errors="replace"))
                sys.stdout.flush()
    print(f"\n=== run_all{' --quick' if quick else ''}: {len(results)} benchmarks in {time.perf_counter() - start:.0f} s "
          f"({jobs} at a time) ===")
    for script in scripts:
        status, seconds, cpu = results[script.name]
        where = " (shared process)" if script in shared else ""
        print(f"  {script.name:24s} {'ok' if status == 0 else f'FAILED (exit {status})':18s} {seconds:6.1f} s, CPU {cpu:6.1f} s{where}")
    if shared:
        print(f"  the shared process in all: CPU {one_cpu:.1f} s ({len(shared)} scripts; Python, torch and the rest imported once)")
    return 0 if all(status == 0 for status, _, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
