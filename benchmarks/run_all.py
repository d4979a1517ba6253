"""Run every benchmark script in this folder to the end, one after the other (`make bench`).

    python benchmarks/run_all.py            # the figures (long: 8,192-token captures take minutes each; idle machine)
    python benchmarks/run_all.py --quick    # every script with tiny sizes and one round: proves each runs to the end

Every ``bench_*.py`` here is run (a new one is picked up without listing it), each in its own process,
with the remaining arguments passed on (with none, ``FIGURE_ARGS``); each must accept ``--quick``. The run fails when any script
fails (with ``--quick``, two run at a time). ``--quick`` is what ``make test`` (and so CI) runs, so a benchmark cannot stop working unseen;
its figures mean nothing (tiny models, one round, one intra-op thread on a shared machine). Each script
ends with the figures README.md and docs/*.md quote, labelled (``common.Figures``).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
#: what a plain full run (`make bench`, no arguments) adds per script so that every figure the pages
#: quote is printed: the target loops over 5 fresh processes and their
#: instruction counts (callgrind, a few minutes; bench_capture's too), BertViz at 512 tokens (~45 s, ~5 GB)
FIGURE_ARGS = {"bench_training.py": ["--processes", "5", "--instructions"], "bench_capture.py": ["--instructions"],
               "bench_language.py": ["--bertviz-max", "512"]}

#: the scripts that read resident memory (``common.exact_rss_env``, or their own re-exec) and glibc's settings they need
MEASURE_MEMORY = {"bench_capture.py", "bench_language.py", "bench_workbench.py", "bench_vision.py"}
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def main(argv: list[str]) -> int:
    """Run each script with ``argv``; print its output and a summary line per script; 0 when every
    script succeeded. Full runs go one at a time (figures need a quiet machine); ``--quick`` runs two
    at a time (nothing is timed for real), each script's output printed whole when it ends."""
    quick = "--quick" in argv
    env = dict(os.environ)
    if quick:
        # One intra-op thread (tiny tensors: two threads only wait for each other on a busy machine), and
        # glibc's settings given up front to the memory-measuring scripts only, so they do not re-execute
        # themselves (for the others they cost system time: bench_cams --quick 11 CPU-s of sys with them, 1.6 without)
        env.update(OMP_NUM_THREADS="1")
    scripts = sorted(HERE.glob("bench_*.py"))
    jobs = min(2, os.cpu_count() or 1) if quick else 1
    results: dict[str, tuple[int, float, float]] = {}  # name → (exit status, wall s, CPU s)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        waiting = list(scripts)
        running: dict[int, tuple[pathlib.Path, float, pathlib.Path | None]] = {}  # pid → (script, start, log)
        while waiting or running:
            while waiting and len(running) < jobs:
                script = waiting.pop(0)
                args = argv or FIGURE_ARGS.get(script.name, [])
                if jobs == 1:
                    print(f"\n=== {script.name} {' '.join(args)} ===", flush=True)
                    log = None
                else:
                    log = pathlib.Path(tmp) / f"{script.stem}.log"
                with open(log, "wb") if log else contextlib.nullcontext() as out:
                    script_env = dict(env, **MALLOC_ENV) if quick and script.name in MEASURE_MEMORY else env
                    proc = subprocess.Popen([sys.executable, str(script), *args], env=script_env,
                                            stdout=out, stderr=subprocess.STDOUT if out else None)
                running[proc.pid] = (script, time.perf_counter(), log)
            pid, wstatus, usage = os.wait4(-1, 0)  # the next script to end, with its CPU time
            if pid not in running:
                continue
            script, t, log = running.pop(pid)
            status = os.waitstatus_to_exitcode(wstatus)
            results[script.name] = (status, time.perf_counter() - t, usage.ru_utime + usage.ru_stime)
            if log is not None:
                print(f"\n=== {script.name} {' '.join(argv)} ===", flush=True)
                sys.stdout.write(log.read_text(errors="replace"))
                sys.stdout.flush()
    print(f"\n=== run_all{' --quick' if quick else ''}: {len(results)} benchmarks in {time.perf_counter() - start:.0f} s "
          f"({jobs} at a time) ===")
    for script in scripts:
        status, seconds, cpu = results[script.name]
        print(f"  {script.name:24s} {'ok' if status == 0 else f'FAILED (exit {status})':18s} {seconds:6.1f} s, CPU {cpu:6.1f} s")
    return 0 if all(status == 0 for status, _, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
