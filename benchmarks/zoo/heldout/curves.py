"""Is every held-out fault a fault? Runs each fault and its twin without nbdebug (the loop as the user
wrote it, the full steps) and prints the loss at the start and the end (means of the first and last 5
steps), whether the run raised or went non-finite, and the verdict: the twin must learn (its loss
ends below 70% of its start) and the fault must harm (non-finite, raised, or its end loss above 1.5×
the twin's, or below 0 where the loss cannot be). Healthy recipes: must learn.

    cd benchmarks && python -m zoo.heldout.curves [--only NAME] [--markdown]
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings

import torch

from . import CASES


def curve(case) -> tuple[float, float, str]:  # type: ignore[no-untyped-def]
    """(start, end, note) of one run."""
    torch.manual_seed(0)
    setup = case.build()
    note = ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            setup.loop(setup.steps)
        except Exception as exc:
            note = f"raised {type(exc).__name__}"
    losses = [float(v) for v in setup.keep["losses"]]
    if not losses:
        return math.nan, math.nan, note or "no loss"
    if any(not math.isfinite(v) for v in losses):
        first = next(i for i, v in enumerate(losses) if not math.isfinite(v))
        note = note or f"non-finite from step {first + 1}"
    fin = [v for v in losses if math.isfinite(v)] or [math.nan]
    return sum(fin[:5]) / len(fin[:5]), sum(losses[-5:]) / len(losses[-5:]), note


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    by = {c.name: c for c in CASES if a.only in c.name}
    bad = 0
    if a.markdown:
        print("| case | class | fault: start → end | twin: start → end | verdict |\n| --- | --- | --- | --- | --- |")
    for name, case in by.items():
        if name.endswith("~"):
            continue
        s, e, note = curve(case)
        if case.cls == "healthy":
            ok = e < 0.7 * s
            row = (name, "healthy recipe", "", f"{s:.3g} → {e:.3g}", "learns" if ok else "DOES NOT LEARN")
        else:
            ts, te, tnote = curve(by[name + "~"])
            learns = te < 0.7 * ts and not tnote
            harm = bool(note) or not math.isfinite(e) or e > 1.5 * te or e < 0
            ok = learns and harm
            verdict = ("harms" if harm else "NO HARM") + (", twin learns" if learns else ", TWIN DOES NOT LEARN")
            row = (name, case.cls, f"{s:.3g} → {e:.3g}" + (f" ({note})" if note else ""), f"{ts:.3g} → {te:.3g}", verdict)
        bad += not ok
        print(("| " + " | ".join(row) + " |") if a.markdown else "  ".join(f"{c:28s}" for c in row), flush=True)
    print(f"\n{bad} case(s) not as they should be", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
