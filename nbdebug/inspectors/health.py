"""``nbdebug.assert_healthy``: a training script's own test of its run (pure: no torch, no Jupyter).

>>> with nbdebug.debug(model) as dbg:                                           # doctest: +SKIP
...     train(model, opt, loader)
>>> nbdebug.assert_healthy(dbg, allow=["loss_spike"])                          # doctest: +SKIP
AssertionError: 1 finding (allowed: loss_spike):
[warning] lr_high (step 1): learning rate too high: update ratio 0.094 at step 1 in `0` — Lower the learning rate …
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .run_evidence import Finding
from .thermometer import diagnose

__all__ = ["assert_healthy", "findings_in"]


def findings_in(run: Any) -> list[Finding]:
    """The ranked findings of ``run``: a :class:`~nbdebug.api.Debug` (its thermometer's), a
    :class:`~nbdebug.capture.result.CaptureResult` (its ``findings``; diagnosed now when nothing filled
    them, e.g. a ``nbdebug.Capture`` of your own), a ``ThermometerReport`` or a list of findings."""
    if isinstance(run, (list, tuple)):
        return list(run)
    results = getattr(run, "results", None)
    if isinstance(results, dict):
        if "thermometer" not in results:
            raise TypeError("assert_healthy: this debug session has no thermometer result: run it with "
                            "view='thermometer' (the default) and call assert_healthy after the with-block")
        run = results["thermometer"]
    if hasattr(run, "layers") and hasattr(run, "findings"):
        if not run.headline:  # a result nothing diagnosed yet
            rep = diagnose(run)
            run.findings, run.headline = list(rep.findings), rep.headline
        return list(run.findings)
    if hasattr(run, "findings"):
        return list(run.findings)
    raise TypeError(f"assert_healthy: expected a nbdebug.debug session, a CaptureResult or findings, got {type(run).__name__}")


def assert_healthy(run: Any, allow: Iterable[str] = (), severities: Sequence[str] = ("error", "warning")) -> None:
    """Raise AssertionError when ``run`` (see :func:`findings_in`) has a finding of one of ``severities``
    (notes never fail) whose code is not in ``allow``; the message lists those findings, ranked, each
    with its advice."""
    allowed = set(allow)
    bad = [f for f in findings_in(run) if f.severity in severities and f.code not in allowed]
    if bad:
        head = f"{len(bad)} finding{'s' * (len(bad) != 1)}" + (f" (allowed: {', '.join(sorted(allowed))})" if allowed else "")
        raise AssertionError(head + ":\n" + "\n".join(str(f) for f in bad))
