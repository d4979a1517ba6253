"""The fault zoo measured (issue 26): is the header's root finding right, and silent on healthy runs?

    python benchmarks/bench_diagnosis.py              # every case, full steps (a few minutes)
    python benchmarks/bench_diagnosis.py --quick      # a few steps; every class, every case's doctor: proves the bench runs
    python benchmarks/bench_diagnosis.py --only dead  # the cases whose name contains "dead"
    python benchmarks/bench_diagnosis.py --heldout    # the held-out zoo only (benchmarks/zoo/heldout/)

Each case of :mod:`zoo` (a fault, its healthy twin ``name~``, or a healthy recipe) builds the user's
setup, runs ``nbdebug.doctor`` on the first batch where a user would (before training, with the
user's optimizer and loss), then the user's loop under ``with nbdebug.debug(model) as dbg:`` as
``%%nndebug`` runs it, and reads the run's findings. Scoring:

- the *root finding* is the first finding of severity "error" or "warning" (findings come ranked,
  root causes first); it is right when its code is in the fault's accepted set (its class's codes);
- *steps to detection*: the first step of an accepted finding;
- a *false alarm*: a healthy twin or recipe with any warning or error (notes are fine);
- *header or doctor*: the root finding right, or a doctor check that names the fault failed;
- per class *precision*: of all runs (faults, twins, recipes) whose root code names the class, the
  share that are faults of that class.

``--quick`` (``make test``'s bench-quick): 6 steps, the doctor's overfit 5, and not every case's loop:
tests/unit/test_zoo.py runs the loop of every case but the SmolLM2 Trainer (and checks the healthy runs
stay silent and the faults named today stay named), so the bench runs a sample that takes every path of
its own (``quick_sample``: each class's first fault and its twin, a recipe the doctor runs on and one it
does not apply to; a case that raises; the table's every class) and, for every other case, builds it and
runs the doctor on its first batch (which the tests do not). ``--quick --only X``: every matching case.

Findings are read from ``dbg.result.findings`` / ``.headline`` when the capture result has them, else
from the thermometer report (``nbdebug.inspectors.thermometer.diagnose``): the bench runs on either API.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import zoo
from common import Figures

import nbdebug

#: steps of the user's loop and of the doctor's overfit in --quick (every code path, figures meaningless)
QUICK_STEPS, QUICK_DOCTOR = 6, 5
#: --quick's recipes (beside each class's first fault and twin): one the doctor runs on, one it does not apply to (two optimizers)
QUICK_RECIPES = ("sgd_momentum_mlp", "gan_two_optimizers")
FULL_DOCTOR = 100
ALARM = ("error", "warning")


@dataclass
class Outcome:
    """One case's run: what the header said, what the doctor failed, and the verdicts."""

    name: str
    cls: str
    faulty: bool
    headline: str = ""
    findings: list[dict[str, Any]] = field(default_factory=list)
    root: str | None = None  # the root finding's code (None: no warning/error)
    right: bool = False  # faulty and the root names the fault
    detected_at: int | None = None  # first step of an accepted finding
    doctor_failed: list[str] = field(default_factory=list)
    doctor_right: bool = False
    raised: str = ""
    seconds: float = 0.0
    error: str = ""  # the bench itself failed on this case


def read_findings(dbg: Any) -> tuple[list[dict[str, Any]], str]:
    """The run's ranked findings (code, severity, step, rows, text) and headline, whichever API this nbdebug has."""
    res = dbg.result
    if res is None:
        return [], ""
    found = getattr(res, "findings", None)
    head = getattr(res, "headline", None)
    if found is None or callable(found):
        from nbdebug.inspectors.thermometer import diagnose

        rep = diagnose(res)
        found, head = rep.findings, rep.headline
    out = [{"code": str(f.code), "severity": str(f.severity), "step": int(getattr(f, "step", 0) or 0),
            "rows": list(getattr(f, "rows", ()) or ()), "text": str(getattr(f, "text", ""))} for f in found]
    return out, str(head or "")


def run_doctor(case: zoo.Case, setup: zoo.Setup, steps: int) -> list[str]:
    """The doctor's failed checks on the user's first batch, with the user's loss and optimizer."""
    if setup.doctor is None:
        return []
    x, y, loss_fn, opt = setup.doctor
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = nbdebug.doctor(setup.model, x, y, loss_fn=loss_fn, optimizer=opt, steps=steps)
    return list(report.failed)


def run_case(case: zoo.Case, *, quick: bool, doctor: bool = True) -> Outcome:
    """Build ``case``, run the doctor then the loop under ``nbdebug.debug``, score it."""
    out = Outcome(case.name, case.cls, case.faulty)
    t0 = time.perf_counter()
    try:
        torch.manual_seed(0)
        setup = case.build()
        if doctor:
            out.doctor_failed = run_doctor(case, setup, QUICK_DOCTOR if quick else FULL_DOCTOR)
        steps = min(QUICK_STEPS, setup.steps) if quick else setup.steps
        dbg = nbdebug.debug(setup.model)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            try:
                with dbg:
                    setup.loop(steps)
            except Exception as exc:  # the cell raised: the header should say so
                out.raised = f"{type(exc).__name__}: {exc}"[:200]
        out.findings, out.headline = read_findings(dbg)
    except Exception as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    alarms = [f for f in out.findings if f["severity"] in ALARM]
    out.root = alarms[0]["code"] if alarms else None
    if case.faulty:
        out.right = out.root in case.accepted
        hits = [f["step"] for f in alarms if f["code"] in case.accepted]
        out.detected_at = min(hits) if hits else None
        out.doctor_right = bool(set(out.doctor_failed) & case.doctor_checks)
    out.seconds = time.perf_counter() - t0
    return out


def quick_sample(cases: list[zoo.Case]) -> list[zoo.Case]:
    """The cases ``--quick`` runs in full (loop and doctor), in zoo order: each fault class's first fault and
    its twin, and ``QUICK_RECIPES``."""
    firsts = {}
    for c in cases:
        if c.faulty:
            firsts.setdefault(c.cls, c.name)
    names = {*firsts.values(), *(n + "~" for n in firsts.values()), *QUICK_RECIPES}
    missing = set(QUICK_RECIPES) - {c.name for c in cases}
    if missing:
        raise SystemExit(f"bench_diagnosis: QUICK_RECIPES names no zoo case: {sorted(missing)}")
    return [c for c in cases if c.name in names]


def doctor_only(cases: list[zoo.Case]) -> list[str]:
    """Each case built and the doctor run on its first batch, as ``run_case`` does before the loop; the
    names of the cases where that raised (traceback printed)."""
    failed = []
    for case in cases:
        try:
            torch.manual_seed(0)
            run_doctor(case, case.build(), QUICK_DOCTOR)
        except Exception:
            failed.append(case.name)
            traceback.print_exc()
    return failed


def _pct(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / n:.0f}%)" if n else "–"


def table(results: list[Outcome]) -> list[str]:
    """The per-class markdown table and the totals."""
    faults = [r for r in results if r.faulty]
    healthy = [r for r in results if not r.faulty]
    lines = ["| class | faults | root right (recall) | precision | steps to detection (median) | header or doctor | "
             "twins: false alarms |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for cls, codes in zoo.CLASSES.items():
        fs = [r for r in faults if r.cls == cls]
        if not fs:
            continue
        named = [r for r in results if r.root in codes]
        prec = _pct(sum(1 for r in named if r.faulty and r.cls == cls), len(named))
        steps = [r.detected_at for r in fs if r.right and r.detected_at is not None]
        twins = [r for r in healthy if r.cls == cls]
        lines.append(f"| {cls} | {len(fs)} | {_pct(sum(r.right for r in fs), len(fs))} | {prec} | "
                     f"{statistics.median(steps) if steps else '–'} | {_pct(sum(r.right or r.doctor_right for r in fs), len(fs))} | "
                     f"{sum(r.root is not None for r in twins)}/{len(twins)} |")
    recipes = [r for r in healthy if r.cls == "healthy"]
    lines += ["", f"- root finding right: {_pct(sum(r.right for r in faults), len(faults))} of faults; header or doctor: "
              f"{_pct(sum(r.right or r.doctor_right for r in faults), len(faults))}",
              f"- false alarms (a warning or error) on healthy runs: {sum(r.root is not None for r in healthy)} of "
              f"{len(healthy)} ({sum(r.root is not None for r in recipes)} of {len(recipes)} recipes, "
              f"{sum(r.root is not None for r in healthy if r.cls != 'healthy')} of {len(healthy) - len(recipes)} twins)",
              f"- doctor checks failed on healthy runs: {sum(bool(r.doctor_failed) for r in healthy)} of {len(healthy)}"]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few steps, no SmolLM2; a sample of every class, the doctor on the rest: proves the bench runs")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--no-doctor", action="store_true", help="skip nbdebug.doctor")
    ap.add_argument("--heldout", action="store_true", help="run the held-out zoo (zoo/heldout) instead of the project zoo")
    ap.add_argument("--json", default="", help="write every outcome to this file")
    ap.add_argument("--table", nargs="+", default=[], metavar="JSON",
                    help="print the table of saved outcomes (later files replace earlier ones' cases by name)")
    args = ap.parse_args(argv)
    if args.table:
        saved: dict[str, Outcome] = {}
        for path in args.table:
            with open(path) as f:
                saved.update({d["name"]: Outcome(**d) for d in json.load(f)})
        print("\n".join(table(list(saved.values()))))
        return 0
    torch.set_num_threads(1)
    if args.heldout:
        from zoo import heldout
    cases = [c for c in (heldout.CASES if args.heldout else zoo.CASES) if args.only in c.name and not (args.quick and c.full_only)]
    rest: list[zoo.Case] = []
    if args.quick and not args.only and not args.heldout:
        sample = quick_sample(cases)
        cases, rest = sample, [c for c in cases if c not in sample]
    others = "not run: --no-doctor" if args.no_doctor else "the doctor only"
    of = f" of {len(cases) + len(rest)} (the others: {others})" if rest else ""
    print(f"# bench_diagnosis{' --quick' if args.quick else ''}{' --heldout' if args.heldout else ''}: {len(cases)} cases{of}, nbdebug from {nbdebug.__file__}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    results: list[Outcome] = []
    t0 = time.perf_counter()
    for case in cases:
        r = run_case(case, quick=args.quick, doctor=not args.no_doctor)
        results.append(r)
        verdict = ("ok " if r.right else "MISS") if r.faulty else ("ok " if r.root is None else "FALSE")
        doc = ",".join(r.doctor_failed) or "-"
        print(f"{verdict:5s} {r.name:36s} root={r.root or '-':16s} step={r.detected_at if r.detected_at is not None else '-'!s:4s} "
              f"doctor={doc:28s} {r.seconds:5.1f}s | {r.headline[:110]}", flush=True)
        if r.error:
            print(f"      bench error: {r.error}")
    print(f"\n{len(results)} cases in {time.perf_counter() - t0:.0f} s\n")
    doctor_failed = []
    if rest and not args.no_doctor:
        t0 = time.perf_counter()
        doctor_failed = doctor_only(rest)
        print(f"the doctor on the other {len(rest)} cases (their loops: tests/unit/test_zoo.py): "
              f"{'raised on ' + ', '.join(doctor_failed) if doctor_failed else 'ran on each'}, {time.perf_counter() - t0:.0f} s\n")
    lines = table(results)
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    faults = [r for r in results if r.faulty]
    healthy = [r for r in results if not r.faulty]
    fig = Figures("benchmarks/zoo/README.md (the measured table)")
    fig.add("faults, healthy twins, recipes", f"{len(faults)}, {sum(r.cls != 'healthy' for r in healthy)}, "
            f"{sum(r.cls == 'healthy' for r in healthy)}")
    fig.add("root finding right", _pct(sum(r.right for r in faults), len(faults)))
    fig.add("header or doctor", _pct(sum(r.right or r.doctor_right for r in faults), len(faults)))
    fig.add("healthy runs with a warning/error", f"{sum(r.root is not None for r in healthy)}/{len(healthy)}")
    fig.print()
    return 1 if any(r.error for r in results) or doctor_failed else 0


if __name__ == "__main__":
    sys.exit(main())
