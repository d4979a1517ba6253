"""The thermometer's per-update work on a long run: ``step_flags`` over every kept step and row, then
``events`` (the timeline), on a 1,000-step × 300-row history — what a live view recomputes at each
push. Target: well under the live view's update interval (1 s; ~30 ms measured alone on this machine).

    python benchmarks/bench_history_flags.py [--quick] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from common import Figures

from nbdebug.capture.history import HISTORY_FIELDS, History
from nbdebug.inspectors.events import events
from nbdebug.inspectors.history import step_flags


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 steps × 30 rows, one round")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    k, r, rounds = (100, 30, 1) if a.quick else (1000, 300, a.rounds)
    rng = np.random.default_rng(0)
    v = rng.random((k, r, len(HISTORY_FIELDS)), dtype=np.float32)
    v[:, :, HISTORY_FIELDS.index("nan")] = 0
    h = History.from_arrays(np.arange(1, k + 1), [f"r{i}" for i in range(r)], v, max_bytes=2**30)
    types = ["ReLU"] * r
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        bits = step_flags(h.values(), types)
        events(h, flags=bits)
        times.append(time.perf_counter() - t)
    fig = Figures("benchmarks/README.md, live thermometer update")
    fig.add(f"step_flags + events, {k} steps × {r} rows (median of {rounds})", f"{statistics.median(times) * 1e3:.0f} ms")
    fig.print()


if __name__ == "__main__":
    main()
