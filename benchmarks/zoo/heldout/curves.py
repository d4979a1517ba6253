"""Is every held-out fault a fault? Runs each fault and its twin without nbdebug (the loop as the user
wrote it, the full steps) and prints the loss at the start and the end (means of the first and last 5
steps), whether the run raised or went non-finite, and the verdict: the twin must learn (its loss
ends below 70% of its start) and the fault must harm (non-finite, raised, or its end loss above 1.5×
the twin's, or below 0 where the loss cannot be) or, for the two whose harm is not in the training
loss (``BUG_CHECKS``), show its bug (checked on the model, and absent from the twin). Healthy recipes:
must learn.

    cd benchmarks && python -m zoo.heldout.curves [--only NAME] [--markdown]
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings

import torch

from . import CASES


def _down_path_frozen(setup) -> bool:  # type: ignore[no-untyped-def]
    """The UNet's down path never changes (``.data`` cut it off): compared with a fresh build."""
    fresh = setup.model.__class__(34, cut=True)
    return all(torch.equal(a, b) for a, b in zip(setup.model.down.parameters(), fresh.down.parameters(), strict=True))


def _output_depends_on_batch(setup) -> bool:  # type: ignore[no-untyped-def]
    """Sample 0's output changes with the other samples of its batch (normalised over the batch)."""
    x = setup.doctor[0]
    m = setup.model.eval()
    with torch.no_grad():
        return not torch.allclose(m(x[:8])[0], m(x[:16])[0], atol=1e-4)


#: faults whose harm is not in the training loss, with the check that the bug is there
BUG_CHECKS = {"ho_unet_dot_data": ("the down path is never trained", _down_path_frozen),
              "ho_bag_normalize_dim0": ("a sample's output depends on its batch", _output_depends_on_batch)}


def curve(case) -> tuple[float, float, str]:  # type: ignore[no-untyped-def]
    """(start, end, note) of one run."""
    torch.manual_seed(0)
    setup = case.build()
    note = ""
    bug = BUG_CHECKS.get(case.name.rstrip("~"))
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
    if bug is not None and bug[1](setup):
        note = note or f"bug: {bug[0]}"
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
            learns = te < 0.7 * ts and not tnote  # a twin with the BUG_CHECKS bug would carry a note
            harm = bool(note) or not math.isfinite(e) or e > 1.5 * te or e < 0
            ok = learns and harm
            verdict = ("bug shown" if note.startswith("bug:") else "harms" if harm else "NO HARM") + (", twin learns" if learns else ", TWIN DOES NOT LEARN")
            row = (name, case.cls, f"{s:.3g} → {e:.3g}" + (f" ({note})" if note else ""), f"{ts:.3g} → {te:.3g}", verdict)
        bad += not ok
        print(("| " + " | ".join(row) + " |") if a.markdown else "  ".join(f"{c:28s}" for c in row), flush=True)
    print(f"\n{bad} case(s) not as they should be", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
