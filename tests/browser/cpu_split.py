"""Where a browser-tier run's CPU goes: run a command, sample its process tree from ``/proc`` every
0.5 s, and print the CPU seconds (user + sys) of each kind of process (chromium, kernels, Jupyter
servers, the Playwright driver, pytest) when it ends. Not a test; a measuring tool for issue 30.

    python tests/browser/cpu_split.py python -m pytest -p no:cacheprovider -q -n 0 -m browser tests/browser/test_x.py

A process that starts and ends between two samples is missed (short-lived helpers only); the last
sample of a long-lived one is at most 0.5 s old, so the split is a slight undercount.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
KINDS = (
    ("ipykernel", "kernels"),
    ("chromium", "chromium"),
    ("labapp", "jupyterlab server"),
    ("notebook.app", "notebook 7 server"),
    ("playwright", "playwright driver"),
    ("pytest", "pytest"),
    ("exec(eval(", "pytest"),  # pytest-xdist's workers
    ("node", "node (jupyterlab's build check at server start)"),
    ("npm", "node (jupyterlab's build check at server start)"),
)


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            kids[int(stat.rsplit(")", 1)[1].split()[1])].append(int(d))
    return kids


def _tree(root: int) -> list[int]:
    kids, out, i = _children(), [root], 0
    while i < len(out):
        out += kids.get(out[i], [])
        i += 1
    return out


def _kind(cmdline: str) -> str:
    return next((name for key, name in KINDS if key in cmdline), cmdline[:60] or "(exited)")


def main(cmd: list[str]) -> int:
    proc = subprocess.Popen(cmd)
    last: dict[int, tuple[float, str]] = {}
    start = time.monotonic()
    while proc.poll() is None:
        for pid in _tree(proc.pid):
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                cmdline = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
            except OSError:
                continue
            # an exited (zombie) process has an empty cmdline: keep the name read while it lived
            name = cmdline or last.get(pid, (0.0, ""))[1]
            last[pid] = ((int(fields[11]) + int(fields[12])) / TICK, name)
        time.sleep(0.5)
    split: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for cpu, cmdline in last.values():
        split[_kind(cmdline)] += cpu
        count[_kind(cmdline)] += 1
    for kind, cpu in split.most_common():
        print(f"{cpu:8.1f} CPU-s  {kind} ({count[kind]} processes)")
    print(f"{sum(split.values()):8.1f} CPU-s  total, {time.monotonic() - start:.0f} s wall, load {os.getloadavg()[0]:.1f}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
