"""Bytes and time per step per rank of the `--distributed` spool (issue 11).

One rank's side, in one process (no launch needed: what a worker's ``nbdebug.debug`` does when
``NBDEBUG_SPOOL`` is set): a 101-row MLP (50 × Linear(64, 64)+ReLU, then a head; 102 parameters),
batch 32, SGD, ``torch.set_num_threads(1)``. Reported: plain loop vs ``Capture`` vs the spooling
capture (ms per step), and the chunk each step writes (median bytes; total written), i.e. what
crosses from a rank to the launching kernel per step; then the bytes per step of a 4-layer MLP
(3 Linear+ReLU, a head) and of a 301-row one (150 Linear+ReLU, a head).

    python benchmarks/bench_distributed.py [--quick] [--steps N]

The figures README.md / docs/distributed.md quote are printed last, labelled.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import Figures
from torch import nn

from nbdebug.capture.session import Capture
from nbdebug.distributed import SpoolDebug, load


def make_model(pairs: int = 50) -> nn.Module:
    """``pairs`` × (Linear(64, 64) + ReLU), then a head: 2 × pairs + 1 rows."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(pairs):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(64, 10))


def spool_bytes(model: nn.Module, steps: int) -> tuple[int, int, int]:
    """(rows, parameters, median bytes one step writes) of ``model`` under the spooling capture."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    spool = tempfile.mkdtemp(prefix="nbdebug-bench-spool-")
    with SpoolDebug(model, spool=spool):
        loop(model, opt, steps)
    sizes = [f.stat().st_size for f in sorted(Path(spool).glob("rank*/c*.npz"))]
    rows = len(load(spool).ranks[0].history.rows)
    return rows, len(list(model.parameters())), int(statistics.median(sizes)) if sizes else 0


def loop(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(32, 64)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="10 steps (checks the script runs)")
    ap.add_argument("--steps", type=int, default=60)
    args, _ = ap.parse_known_args()
    steps = 10 if args.quick else args.steps
    torch.set_num_threads(1)
    ms: dict[str, float] = {}
    fig = Figures("docs/distributed.md (what crosses processes)")
    for mode in ("plain", "capture", "spool"):
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        loop(model, opt, 3)  # warm-up
        spool = tempfile.mkdtemp(prefix="nbdebug-bench-spool-")
        t = time.perf_counter()
        if mode == "plain":
            loop(model, opt, steps)
        elif mode == "capture":
            with Capture(model):
                loop(model, opt, steps)
        else:
            with SpoolDebug(model, spool=spool) as dbg:
                loop(model, opt, steps)
        ms[mode] = (time.perf_counter() - t) / steps * 1e3
        if mode == "spool":
            sizes = [f.stat().st_size for f in sorted(Path(spool).glob("rank*/c*.npz"))]
            run = load(spool)
            rows, params = len(run.ranks[0].history.rows), len(list(model.parameters()))
            median = int(statistics.median(sizes)) if sizes else 0
            print(f"rank 0: {rows} rows, {params} parameters; "
                  f"{len(sizes)} chunks, median {median} B per step, "
                  f"{dbg.writer.bytes_written} B written in {steps} steps")
            fig.add(f"spool, {rows} rows / {params} parameters: written per step per rank", f"{median / 1000:.1f} KB")
    plain = ms["plain"]
    print("ms/step: " + ", ".join(f"{k} {v:.2f} ({v / plain:.2f}× plain)" for k, v in ms.items()))
    fig.add("spool, the spooling capture's cost over Capture", f"{ms['spool'] - ms['capture']:.1f} ms per step")
    for pairs in (3, 150):  # a 4-layer MLP (3 Linear+ReLU, a head) and a 300-row one: bytes only
        rows, params, median = spool_bytes(make_model(pairs), 4 if args.quick else 20)
        print(f"{rows} rows, {params} parameters: median {median} B per step")
        fig.add(f"spool, {rows} rows / {params} parameters: written per step per rank", f"{median / 1000:.1f} KB")
    fig.add("ms per step: plain / Capture / spooling capture", f"{plain:.2f} / {ms['capture']:.2f} ({ms['capture'] / plain:.1f}×) / "
            f"{ms['spool']:.2f} ({ms['spool'] / plain:.1f}×)")
    fig.print()


if __name__ == "__main__":
    main()
