"""The doctor's report as plain data: one :class:`CheckResult` per check and the :class:`DoctorReport`
that holds them, with a text and a static HTML table (the checklist widget is in
:mod:`nbdebug.widgets.doctor`). The judgements that fill them are in :mod:`nbdebug.inspectors.doctor`.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CONSEQUENCE", "CheckResult", "DoctorReport", "shown_evidence"]

#: the words a failed check's advice gets when another failed check explains it
CONSEQUENCE = "Possibly a consequence:"


@dataclass
class CheckResult:
    """One check's verdict: ``status`` ("pass" | "warn" | "fail" | "skip"), ``evidence`` (numbers and
    short lists, e.g. the overfit loss curve) and ``advice`` (what to do; for a skip, why it was skipped).
    "warn": worth a look, not a fault — what healthy runs of standard recipes also show (a default
    initialisation a little over-confident, a batch the user's own learning rate fits slowly)."""

    status: str
    evidence: dict[str, Any] = field(default_factory=dict)
    advice: str = ""

    def __repr__(self) -> str:
        ev = ", ".join(f"{k}={_short(v)}" for k, v in shown_evidence(self) if not isinstance(v, (list, tuple)))
        return f"CheckResult({self.status!r}, {ev}{' — ' if self.advice else ''}{self.advice})"


def shown_evidence(check: CheckResult) -> list[tuple[str, Any]]:
    """``check.evidence`` as the views show it: no internal placeholder (``reached_at`` = -1 reads
    "target reached: never"), the loss curve left to its plot."""
    out: list[tuple[str, Any]] = []
    for k, v in check.evidence.items():
        if k == "curve":
            continue
        if k == "reached_at":
            out.append(("target reached", "never" if v is None or v < 0 else f"after {v} steps"))
            continue
        out.append((k, v))
    return out


@dataclass
class DoctorReport:
    """What :func:`nbdebug.doctor` found: ``checks`` (name → :class:`CheckResult`, in checklist order),
    ``failed`` (the failed names in order), ``warned`` (the checks worth a look, not failed), ``kind`` ("classification" | "regression" | "unknown"),
    ``classes``, ``elapsed_s``. Plain data with a text and a static HTML table; the one
    :func:`nbdebug.doctor` returns (:class:`nbdebug.doctor.DoctorReport`) shows as the checklist widget.

    >>> report = nbdebug.doctor(model, x, y)            # doctest: +SKIP
    >>> report.failed, report.checks["overfit_batch"].evidence["floor"]   # doctest: +SKIP
    (['overfit_batch'], 1.46)
    """

    checks: dict[str, CheckResult]
    kind: str = "unknown"
    classes: int | None = None
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[str]:
        """Names of the failed checks, in checklist order."""
        return [n for n, c in self.checks.items() if c.status == "fail"]

    @property
    def warned(self) -> list[str]:
        """Names of the checks worth a look (status "warn"), in checklist order."""
        return [n for n, c in self.checks.items() if c.status == "warn"]

    @property
    def headline(self) -> str:
        """The report in one sentence: the first failed check that no other failed check explains (its
        advice's first sentence), and how many more failed; "nothing failed" otherwise (and the checks
        worth a look)."""
        failed = self.failed
        if not failed:
            passed = sum(c.status == "pass" for c in self.checks.values())
            look = f"; worth a look: {', '.join(self.warned)}" if self.warned else ""
            return f"nothing failed ({passed} checks passed{look})"
        roots = [n for n in failed if CONSEQUENCE not in self.checks[n].advice] or failed
        name = roots[0]
        first = self.checks[name].advice.split(". ")[0].split(": ")[0].rstrip(".")
        more = len(failed) - 1
        return f"{name} failed: {first}" + (f" (and {more} more failed)" if more else "")

    def ordered(self) -> list[tuple[str, CheckResult]]:
        """The checks as the views list them: failed first, then those worth a look, then the rest, each in
        checklist order."""
        items = list(self.checks.items())
        rank = {"fail": 0, "warn": 1}
        return sorted(items, key=lambda x: rank.get(x[1].status, 2))

    def __repr__(self) -> str:
        head = f"DoctorReport({self.kind}{f', {self.classes} classes' if self.classes else ''}, {self.elapsed_s:.2f} s)"
        lines = [head]
        for name, c in self.checks.items():
            ev = ", ".join(f"{k}={_short(v)}" for k, v in shown_evidence(c) if not isinstance(v, (list, tuple)))
            lines.append(f"  {_MARK[c.status]} {name:<18} {ev}")
            if c.advice and c.status != "pass":
                lines.append(f"      {c.advice}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = []
        for name, c in self.ordered():
            ev = "; ".join(f"{k} = {_short(v)}" for k, v in shown_evidence(c) if not isinstance(v, (list, tuple)))
            colour = _COLOUR[c.status]
            rows.append(f"<tr><td><code>{html.escape(name)}</code></td><td style='color:{colour};font-weight:bold'>"
                        f"{_MARK[c.status]} {c.status}</td><td>{html.escape(ev)}</td><td>{html.escape(c.advice)}</td></tr>")
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        n = len(self.failed)
        verdict = (f"<b style='color:{_COLOUR['fail']}'>{n} failed</b>" if n else f"<b style='color:{_COLOUR['pass']}'>nothing failed</b>")
        if self.warned:
            verdict += f" · <b style='color:{_COLOUR['warn']}'>{len(self.warned)} worth a look</b>"
        return (f"<div class='nbdebug-doctor-static'><b>nbdebug doctor</b>: {verdict} · {html.escape(self.kind)}"
                f"{f', {self.classes} classes' if self.classes else ''} · {self.elapsed_s:.2f} s"
                "<table><tr><th>check</th><th>status</th><th>evidence</th><th>advice</th></tr>"
                + "".join(rows) + "</table>" + (f"<ul>{notes}</ul>" if notes else "") + "</div>")


_MARK = {"pass": "✓", "warn": "!", "fail": "✗", "skip": "–"}
_COLOUR = {"pass": "#1b5e20", "warn": "#8a4b00", "fail": "#b71c1c", "skip": "#616161"}  # ≥ 6:1 on white (WCAG AA)


def _short(v: Any) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return str(v)
