"""Two checkouts of nbdebug side by side in one process: the capture's overhead in each, on the same
models, in interleaved rounds (a restructuring must not move it: issue 19 asks for ±3%).

    python benchmarks/compare_trees.py --base /path/to/other/checkout [--rounds 15] [--quick]

The other checkout's package is imported under the name ``nbdebug_base`` (its modules import each
other relatively), this one's as ``nbdebug``; every variant runs in the same process, one round of
each after the other, so both see the same machine. Workloads (``Capture`` over every leaf module):

  digits      the digits CNN (4 leaf convs/linears + ReLUs), 100 SGD steps per cell, 1 thread
  small CNN   three 32-channel 3×3 convs on 32×32 images, batch 32, 20 SGD steps, 1 thread
  inference   the digits CNN, 100 forwards under no_grad
  forward     ResNet-18-shaped CNN, batch 8 at 224², one forward (bench_capture's model), all threads

Printed: median CPU seconds of each variant and its ratio to the plain loop, then this tree's ratio
over the base's (1.000 = the same overhead).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from bench_training import Loop, digits_model, small_cnn
from common import ResNet18, interleaved, table

from nbdebug.capture.session import Capture


def load_base(root: Path) -> Any:
    """The other checkout's ``Capture`` (its package imported as ``nbdebug_base``). Its native kernel is
    built into a cache directory of its own: the CPython module keeps state set up by the package that
    loads it, so the two trees must not share one loaded copy (a second file is a second copy)."""
    pkg = root / "nbdebug"
    spec = importlib.util.spec_from_file_location("nbdebug_base", pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["nbdebug_base"] = mod
    spec.loader.exec_module(mod)
    saved = os.environ.get("NBDEBUG_CACHE_DIR")
    os.environ["NBDEBUG_CACHE_DIR"] = tempfile.mkdtemp(prefix="nbdebug-base-native-")
    try:
        base_native = importlib.import_module("nbdebug_base.capture.native")
        print(f"base kernel: {base_native.status()}")
    finally:
        if saved is None:
            os.environ.pop("NBDEBUG_CACHE_DIR")
        else:
            os.environ["NBDEBUG_CACHE_DIR"] = saved
    from nbdebug.capture import native

    print(f"this tree's kernel: {native.status()}")
    return importlib.import_module("nbdebug_base.capture.session").Capture


def workloads(quick: bool) -> dict[str, tuple[nn.Module, Callable[[], None], int]]:
    """name → (model, one cell of user code, torch threads)."""
    torch.manual_seed(0)
    out: dict[str, tuple[nn.Module, Callable[[], None], int]] = {}
    steps = 10 if quick else 100
    m = digits_model()
    x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,))
    out["digits"] = (m, Loop(m, x, y, steps), 1)
    c = small_cnn()
    xc, yc = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    out["small CNN"] = (c, Loop(c, xc, yc, 4 if quick else 20), 1)
    d = digits_model()

    def infer() -> None:
        with torch.no_grad():
            for _ in range(steps):
                d(x)

    out["inference"] = (d, infer, 1)
    if not quick:
        r = ResNet18().eval()
        xr = torch.randn(8, 3, 224, 224)
        out["forward"] = (r, lambda: (r(xr), None)[1], torch.get_num_threads())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", type=Path, required=True, help="the other checkout (its root, holding nbdebug/)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    base = load_base(a.base)
    rows = []
    threads = torch.get_num_threads()
    for name, (model, cell, n) in workloads(a.quick).items():
        torch.set_num_threads(n)

        def run(cls: Any, model: nn.Module = model, cell: Callable[[], None] = cell) -> None:
            with cls(model):
                cell()

        cpu: dict[str, float] = {}
        interleaved({"plain": cell, "this tree": lambda: run(Capture), "base": lambda: run(base)},
                    rounds=2 if a.quick else a.rounds, warmup=1, cpu=cpu)
        this, old = cpu["this tree"] / cpu["plain"], cpu["base"] / cpu["plain"]
        rows.append((name, f"{cpu['plain'] * 1e3:.1f}", f"{this:.3f}", f"{old:.3f}", f"{this / old:.3f}"))
        torch.set_num_threads(threads)
    print(table(rows, ("workload", "plain ms (CPU)", "this tree × plain", "base × plain", "this / base")))


if __name__ == "__main__":
    main()
