"""The thermometer's static fallback (no scripts: nbviewer, GitHub, HTML export): the finding first,
the ranked findings with their advice once, the loss curve, the table and the timeline of events.

Every piece of model text is escaped; colours are the views' (text at WCAG AA contrast on white).

>>> page = fallback_html(report, capture, incidents=[])            # doctest: +SKIP
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..capture.result import CaptureResult
from ..inspectors.report import COLUMNS, ThermometerReport, display_flags
from ._snapshot import code_html

__all__ = ["fallback_html", "fmt", "loss_svg"]

#: the columns the static table shows (the gradient one is the loss's gradient at the layer's output)
TABLE = {"mean": "mean", "std": "std", "min": "min", "max": "max", "zero_frac": "zeros", "nan": "NaN", "inf": "Inf",
         "grad_norm": "‖∂L/∂out‖"}


def fmt(x: float) -> str:
    """A table number: 4 significant digits, exponents for tiny and huge values, "—" for NaN."""
    if x != x:
        return "—"
    if x == 0 or 1e-3 <= abs(x) < 1e4:
        return f"{x:.4g}"
    return f"{x:.3e}"


_code = code_html  # escaped text with `backticked` module names as <code> (names, never bare numbers)


def _findings_html(findings: Sequence[Any]) -> str:
    if not findings:
        return ""
    items = []
    for f in findings:
        step = f" <small>(step {f.step})</small>" if f.step else ""
        advice = f"<br><i>{_code(f.advice)}</i>" if f.advice else ""
        items.append(f"<li>{_code(f.detail)}{step}{advice}</li>")
    return f"<ol class='nbd-findings'>{''.join(items)}</ol>"


def _error_html(report: ThermometerReport) -> str:
    """The card naming the module that raised (escaped text only)."""
    e = report.error
    if e is None:
        return ""
    esc = html.escape
    items = "".join(f"<li>{esc(p)}</li>" for p in e.problems)
    return (
        '<div class="nbd-raised" style="border:1px solid #b30000;padding:4px 8px;margin:4px 0">'
        f"<p><b>raised in <code>{esc(e.module)}</code> ({esc(e.type)})</b>: {esc(e.error)}</p>"
        f"<ul>{items}</ul>"
        f"<p>inputs: {esc('; '.join(e.inputs) or 'none')}<br>parameters: {esc('; '.join(e.params) or 'none')}</p></div>"
    )


def loss_svg(capture: CaptureResult | None, width: int = 480, height: int = 60) -> str:
    """The loss per kept step as an inline SVG polyline (at most ``width`` points; no script)."""
    hist = getattr(capture, "history", None)
    if hist is None or len(hist) < 2:
        return ""
    loss, steps, first = hist.scalar("loss").astype(np.float64), hist.step_index, int(hist.bucket_first[0])
    ok = np.isfinite(loss)
    if ok.sum() < 2:
        return ""
    pick = np.unique(np.linspace(0, len(loss) - 1, min(len(loss), width)).round().astype(int))
    pick = pick[ok[pick]]
    lo, hi = float(loss[ok].min()), float(loss[ok].max())
    x = (pick / max(1, len(loss) - 1)) * (width - 2) + 1
    y = height - 2 - (loss[pick] - lo) / ((hi - lo) or 1.0) * (height - 4)
    pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x, y))
    return (f"<p>loss, steps {first}–{int(steps[-1])} (min {fmt(lo)}, max {fmt(hi)}, last {fmt(float(loss[-1]))})</p>"
            f'<svg width="{width}" height="{height}" style="border-bottom:1px solid #ccc">'
            f'<polyline fill="none" stroke="#1976d2" points="{pts}"/></svg>')


def fallback_html(report: ThermometerReport, capture: CaptureResult | None, incidents: Sequence[dict[str, Any]]) -> str:
    """A plain page of ``report`` (no scripts): headline, findings, the error card, the loss, the
    table (flags as the views name them: "update high"/"update too low"), events and incidents."""
    r = report
    idx = [COLUMNS.index(c) for c in TABLE]
    ur = r.column("update_ratio")
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["#", "layer", "type", "shape", *TABLE.values(), "flags"])
    body = []
    for i, name in enumerate(r.names):
        shape = "×".join(map(str, r.shapes[i]))
        if not r.dtypes[i].startswith(("float", "bfloat", "complex")):  # masks, indices: counts
            shape += f" {r.dtypes[i]}"
        flags = display_flags(r.flags[i], float(ur[i]))
        cells = [str(i), f"<code>{html.escape(name)}</code>", html.escape(r.types[i]), html.escape(shape)]
        cells += [fmt(r.table[i, j]) for j in idx]
        cells.append(html.escape(", ".join(f.replace("_", " ") for f in flags)))
        style = ' style="background:#fdecea"' if flags else ""
        body.append(f"<tr{style}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    timeline = sorted([(int(i["step"]), html.escape(str(i["message"]))) for i in incidents] +
                      [(e.step, _code(e.message)) for e in r.events], key=lambda t: t[0])
    events = "".join(f"<li>step {s}: {m}</li>" for s, m in timeline)
    summary = r.headline or r.summary
    step_line = f"<p>{_code(r.summary)}</p>" if r.summary != summary else ""
    notes = "".join(f"<li>{_code(n)}</li>" for n in r.notes)
    return (
        f'<div class="nbdebug-thermometer-static"><p><b>nbdebug thermometer</b>: <b>{_code(summary)}</b></p>'
        f"{_findings_html(r.findings)}{step_line}{_error_html(r)}{loss_svg(capture)}"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        + (f"<p>timeline:</p><ul>{events}</ul>" if events else "")
        + (f"<details><summary>notes</summary><ul>{notes}</ul></details>" if notes else "")
        + "</div>"
    )


def finite_or_none(x: float) -> float | None:
    """JSON cannot carry NaN: None instead."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
