"""Shared helpers for the benchmark scripts: interleaved timing and peak-memory measurement.

Times are medians over interleaved rounds (variant A, B, C, A, B, C, ...) in one process, so that
machine noise hits every variant alike; ratios are what we report. Peak memory is the process's
peak resident set (Linux ``VmHWM``), reset before each measurement through ``/proc/self/clear_refs``.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from nbdebug.testing import ResNetShaped


def exact_rss_env() -> None:
    """Re-exec the script with glibc returning every large block to the OS on free.

    Otherwise freed tensors stay resident in malloc's heap and the peak-RSS readings below would
    not see later allocations. Call first thing in ``main()``.
    """
    import os
    import sys

    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def peak_extra_bytes(fn: Callable[[], object]) -> int:
    """Peak resident memory reached while running ``fn`` above what was resident before it.

    The garbage is collected first, then what is left is frozen (``gc.freeze``: never scanned again), so
    the next call's collection scans only the objects made since: with torch and transformers imported, a
    full collection takes ~0.25 CPU-s, and a script measures a dozen peaks."""
    gc.collect()
    gc.freeze()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return -1
    before = _status("VmRSS")
    out = fn()
    peak = _status("VmHWM")
    del out
    return max(peak - before, 0)


def interleaved(variants: dict[str, Callable[[], object]], rounds: int = 7, warmup: int = 2,
                cpu: dict[str, float] | None = None) -> dict[str, float]:
    """Median wall seconds of each variant over interleaved rounds; with ``cpu`` (a dict), also the
    median CPU seconds of the process per variant, filled in (on a shared machine the time another
    process takes from a 1-thread loop shows in wall time, not in CPU time)."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    cpus: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for k, fn in variants.items():
            c, t = time.process_time(), time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
            cpus[k].append(time.process_time() - c)
    if cpu is not None:
        cpu.update({k: statistics.median(v) for k, v in cpus.items()})
    return {k: statistics.median(v) for k, v in times.items()}


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *map(line, rows)])


class Figures:
    """The figures README.md and docs/*.md quote, printed labelled at the end of a benchmark.

    Every number those pages give comes from one line of this block, so re-running the benchmark
    and copying the block is how the pages are updated:

    >>> fig = Figures("docs/comparison.md, per-layer stats row")  # doctest: +SKIP
    >>> fig.add("nbdebug, ResNet-18 b8 224²", f"{1.08:.2f}× forward")  # doctest: +SKIP
    >>> fig.print()  # doctest: +SKIP
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self.lines: list[tuple[str, str]] = []

    def add(self, label: str, value: str) -> None:
        """One quoted figure: what it is, and its value as the page writes it."""
        self.lines.append((label, value))

    def print(self) -> None:
        """The block: a heading naming the page, then one ``label: value`` line per figure."""
        print(f"\n## figures quoted in {self.where}")
        for label, value in self.lines:
            print(f"  {label}: {value}")


def ResNet18() -> nn.Module:
    """torchvision's resnet18 layout (same module names and shapes), random init."""
    return ResNetShaped(64, 1000)


def gpt2_small() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024)
    cfg._attn_implementation = "eager"
    return GPT2LMHeadModel(cfg).eval()


__all__ = ["F", "Figures", "ResNet18", "exact_rss_env", "gpt2_small", "interleaved", "peak_extra_bytes", "table"]


def instructions_per_call(cmd_for: Callable[[str, int], list[str]], variants: tuple[str, ...], lo: int, hi: int,
                          count: bool) -> dict[str, float]:
    """Instructions per call of each variant, counted by valgrind's callgrind (wall-time ratios swing ±15%
    on a shared machine; instruction counts do not): ``cmd_for(variant, calls)`` is a child process
    making ``calls`` calls; each variant runs with ``lo`` and with ``hi`` calls and the difference is
    divided by ``hi - lo``, so import, set-up and warm-up cancel out. Without ``count`` (``--quick``, or
    no valgrind: under it, importing torch alone takes about a minute) each variant's ``lo`` process runs
    as is: the code path is checked, nothing is counted (``{}``)."""
    import re
    import shutil
    import subprocess

    valgrind = shutil.which("valgrind")
    counting = count and valgrind is not None
    per: dict[str, float] = {}
    for variant in variants:
        counts = []
        for calls in (lo, hi) if counting else (lo,):
            cmd = cmd_for(variant, calls)
            if counting:
                cmd = [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd]
            err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
            m = re.search(r"Collected\s*:\s*(\d+)", err)
            if counting and m:
                counts.append(int(m.group(1)))
        if len(counts) == 2:
            per[variant] = (counts[1] - counts[0]) / (hi - lo)
    return per if len(per) == len(variants) else {}
