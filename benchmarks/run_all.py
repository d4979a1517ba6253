"""Run every benchmark script in this folder, one after the other (`make bench`).

bench_capture, bench_distributed, bench_groups, bench_language, bench_training (training loops, and a 10,000-step memory run that
takes minutes), bench_vision; arguments (e.g. `--quick`) are passed to each.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

here = pathlib.Path(__file__).resolve().parent
status = 0
for script in sorted(here.glob("bench_*.py")):
    print(f"\n=== {script.name} ===", flush=True)
    status |= subprocess.call([sys.executable, str(script), *sys.argv[1:]])
sys.exit(status)
