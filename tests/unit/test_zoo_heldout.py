"""The held-out zoo (benchmarks/zoo/heldout): registered apart from the project zoo (whose cases stay
exactly as they were), every fault of a project class with its twin, and its curve check telling a
harmful fault from its learning twin (one cheap pair: ``optimizer.step`` without parentheses)."""

from __future__ import annotations

import pathlib
import sys

BENCH = str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import zoo  # noqa: E402


def test_heldout_is_registered_apart_and_complete() -> None:
    before = [c.name for c in zoo.CASES]
    from zoo import heldout
    from zoo.heldout import curves

    assert [c.name for c in zoo.CASES] == before  # importing it leaves the project zoo unchanged
    names = [c.name for c in heldout.CASES]
    assert len(set(names)) == len(names) and not set(names) & set(before)
    faults = [c for c in heldout.CASES if c.faulty]
    assert len(faults) >= 25 and sum(c.cls == "healthy" for c in heldout.CASES) >= 10
    for c in faults:
        assert c.cls in zoo.CLASSES and c.name + "~" in names and c.what, c.name
    assert set(curves.BUG_CHECKS) <= set(names)


def test_curve_tells_the_fault_from_its_twin() -> None:
    import torch
    from zoo.heldout import CASES, curves

    by = {c.name: c for c in CASES}
    s, e, note = curves.curve(by["ho_step_without_parentheses"])
    ts, te, tnote = curves.curve(by["ho_step_without_parentheses~"])
    assert abs(s - e) < 0.05 and not note  # only the batches change the loss
    assert te < 0.7 * ts and not tnote and e > 1.5 * te
    setup = by["ho_step_without_parentheses"].build()
    start = [p.clone() for p in setup.model.parameters()]
    setup.loop(5)
    assert all(torch.equal(a, b) for a, b in zip(start, setup.model.parameters(), strict=True))  # opt.step: never called
