"""Runs side by side: ``nbdebug.compare(run_a, run_b, ...)`` overlays the loss and any row's series of
two or more captured runs (lr=3.0 against lr=0.1), aligned by step, with the first step where each
run diverges from the first one marked (the definition is in :mod:`nbdebug.inspectors.compare`):
what W&B users do across runs, here in the notebook, offline.

>>> w = nbdebug.compare(fast, slow, labels=["lr=3.0", "lr=0.1"])      # doctest: +SKIP
>>> w.divergence["loss"]                                               # doctest: +SKIP
[{'run': 1, 'step': 3, 'a': 4.1, 'b': 2.09, 'scale': 2.2, 'rtol': 0.1}]
>>> w.row, w.field = "3", "dead_unit_frac"                             # doctest: +SKIP  (the browser's selects do this)

Synced state is small: the labels, the union of the kept steps (int32 [S]) and the loss of every run
on them (float32 [runs, S], NaN where a run did not keep a step), the row names and fields offered,
and the chosen row's series (float32 [runs, S]), recomputed in the kernel when ``row``/``field``
change; the divergences, each run's outcome and colour, and the headline (:func:`~nbdebug.inspectors.compare.compare_headline`).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import numpy as np
import traitlets

from ..inspectors.compare import (
    FIELDS,
    RTOL,
    aligned,
    as_result,
    compare_headline,
    divergence_sentence,
    first_divergence,
    log_scale,
    most_different_row,
    outcome,
    row_names,
    run_series,
    union_steps,
)
from ._base import NBWidget
from ._snapshot import code_html
from ._transport import encode_array

__all__ = ["CompareWidget", "compare"]

#: line colours of healthy runs (no red: red is kept for a run that went wrong), in order
PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
#: the line colour of a run whose loss went wrong (blew up or broke)
WRONG = "#d62728"


def run_colours(wrong: Sequence[bool]) -> list[str]:
    """One line colour per run: red for a run that went wrong, the palette in order for the others."""
    out, k = [], 0
    for w in wrong:
        if w:
            out.append(WRONG)
        else:
            out.append(PALETTE[k % len(PALETTE)])
            k += 1
    return out


class CompareWidget(NBWidget):
    """Two or more runs overlaid (see the module doc).

    Traits: ``labels``, ``steps`` (int32 [S]: every step a run kept), ``loss`` (float32 [runs, S]),
    ``rows`` and ``fields`` (what ``row``/``field`` may be), ``row`` and ``field`` (the chosen series;
    ``row`` "" for none; synced both ways), ``series`` (float32 [runs, S] of the chosen row and field;
    {} for none), ``divergence`` (``{"loss": [...], "series": [...]}``: per run after the first, its
    :class:`~nbdebug.inspectors.compare.Divergence` as JSON, or None), ``rtol``, ``summary`` (the
    header sentence) and ``notes``. ``results`` keeps the runs' Python-side data.
    """

    _view_name_ = "compare"

    labels = traitlets.List(traitlets.Unicode()).tag(sync=True)
    steps = traitlets.Dict().tag(sync=True)
    loss = traitlets.Dict().tag(sync=True)
    rows = traitlets.List(traitlets.Unicode()).tag(sync=True)
    fields = traitlets.List(traitlets.Unicode()).tag(sync=True)
    row = traitlets.Unicode("").tag(sync=True)
    field = traitlets.Unicode("mean").tag(sync=True)
    series = traitlets.Dict().tag(sync=True)
    divergence = traitlets.Dict().tag(sync=True)
    rtol = traitlets.Float(RTOL).tag(sync=True)
    summary = traitlets.Unicode("").tag(sync=True)
    #: per run its loss outcome (:class:`~nbdebug.inspectors.compare.Outcome` as JSON, None without a loss)
    outcomes = traitlets.List().tag(sync=True)
    #: per run its line colour (red only for a run that went wrong)
    colours = traitlets.List(traitlets.Unicode()).tag(sync=True)
    #: the loss chart on a log axis (its positive values span more than 10×)
    loss_log = traitlets.Bool(False).tag(sync=True)
    notes = traitlets.List(traitlets.Unicode()).tag(sync=True)

    def __init__(self, results: Sequence[Any], labels: Sequence[str] | None = None, *, row: str | None = None,
                 field: str = "mean", rtol: float = RTOL, **kwargs: Any) -> None:
        self.results = [as_result(r) for r in results]
        if len(self.results) < 2:
            raise ValueError(f"compare needs two or more runs, got {len(self.results)}")
        names = [str(x) for x in labels] if labels is not None else [f"run {i + 1}" for i in range(len(self.results))]
        if len(names) != len(self.results):
            raise ValueError(f"{len(names)} labels for {len(self.results)} runs")
        if field not in FIELDS:
            raise ValueError(f"no field {field!r}; fields: {', '.join(FIELDS)}")
        self._on = union_steps([r.step_index for r in self.results])
        rows = row_names(self.results)
        if row is None:  # preselect the row where the runs differ most
            row = most_different_row(self.results, rows, field)
        if row and row not in rows:
            raise KeyError(f"no row {row!r} in these runs; rows: {', '.join(map(repr, rows[:20]))}")
        loss = np.stack([aligned(r.step_index, run_series(r, None, None), self._on) for r in self.results])
        outs = [outcome(n, r.step_index, run_series(r, None, None)) for n, r in zip(names, self.results)]
        self._wrong = [o is not None and o.wrong for o in outs]
        super().__init__(labels=names, steps=encode_array(self._on.astype(np.int32)), loss=encode_array(loss),
                         rows=rows, fields=list(FIELDS), rtol=float(rtol), notes=self._notes(),
                         outcomes=[None if o is None else o.as_json() for o in outs], colours=run_colours(self._wrong),
                         loss_log=log_scale(loss), **kwargs)
        divs = self._divergences(None, None)
        self.divergence = {"loss": divs, "series": [], "loss_text": divergence_sentence(divs, names, self._wrong, "loss", self.rtol),
                           "series_text": ""}
        self.summary = self.headline = compare_headline(outs, names)
        self.observe(self._on_choice, names=["row", "field"])
        self.row, self.field = row, field
        if not row and field == "mean":
            self._on_choice()

    # -- what is synced ---------------------------------------------------------------------------
    def _divergences(self, row: str | None, field: str | None) -> list[dict[str, Any] | None]:
        base = self.results[0]
        a = run_series(base, row, field)
        out: list[dict[str, Any] | None] = []
        for i, r in enumerate(self.results[1:], start=1):
            d = first_divergence(base.step_index, a, r.step_index, run_series(r, row, field), self.rtol, run=i)
            out.append(None if d is None else d.as_json())
        return out

    @traitlets.validate("row")
    def _check_row(self, proposal: Any) -> str:
        value = str(proposal["value"] or "")
        if value and value not in self.rows:
            raise traitlets.TraitError(f"no row {value!r} in these runs; rows: {', '.join(map(repr, self.rows[:20]))}")
        return value

    @traitlets.validate("field")
    def _check_field(self, proposal: Any) -> str:
        if proposal["value"] not in FIELDS:
            raise traitlets.TraitError(f"no field {proposal['value']!r}; fields: {', '.join(FIELDS)}")
        return str(proposal["value"])

    def _on_choice(self, change: Any = None) -> None:
        """The chosen row's series and its divergences, recomputed (the browser's selects set the traits)."""
        with self.hold_sync():
            if not self.row:
                self.series = {}
                self.divergence = {**self.divergence, "series": [], "series_text": ""}
                return
            vals = np.stack([aligned(r.step_index, run_series(r, self.row, self.field), self._on) for r in self.results])
            self.series = encode_array(vals.astype(np.float32))
            divs = self._divergences(self.row, self.field)
            text = divergence_sentence(divs, self.labels, self._wrong, f"{self.field} of `{self.row}`", self.rtol)
            self.divergence = {**self.divergence, "series": divs, "series_text": text, "series_log": log_scale(vals)}

    def _notes(self) -> list[str]:
        notes = []
        kept = [len(r.step_index) for r in self.results]
        if len(set(kept)) > 1 or any(getattr(getattr(r, "history", None), "decimated", False) for r in self.results):
            notes.append("the runs kept different steps (a long run is decimated to fit its byte budget): each pair "
                         "is compared on the steps both kept")
        if any(not np.isfinite(run_series(r, None, None)).any() for r in self.results):
            notes.append("a run has no loss: a step's loss is what .backward() ran on (or --loss names it)")
        notes.append(f"first divergence: the first step both runs kept from which they differ by more than {self.rtol:g}× "
                     "the series' typical magnitude (the larger median |value|), or one is NaN/Inf and the other not, "
                     "for 2 kept steps in a row; a run went wrong when its loss rose above 1.5× its first value or "
                     "became NaN/Inf (drawn red)")
        return notes

    # -- static fallback and repr -----------------------------------------------------------------
    def fallback_html(self, width: int = 480, height: int = 90) -> str:
        """The header and the losses as inline SVG polylines (no script)."""
        esc = html.escape
        loss = np.stack([aligned(r.step_index, run_series(r, None, None), self._on) for r in self.results]).astype(np.float64)
        ok = np.isfinite(loss)
        lines = []
        if ok.any() and len(self._on) > 1:
            if self.loss_log:
                loss = np.log10(np.where(ok, loss, 1.0))
            lo, hi = float(loss[ok].min()), float(loss[ok].max())
            x = (self._on - self._on[0]) / max(1, self._on[-1] - self._on[0]) * (width - 2) + 1
            for k, row in enumerate(loss):
                pts = " ".join(f"{a:.1f},{height - 2 - (v - lo) / ((hi - lo) or 1.0) * (height - 4):.1f}"
                               for a, v in zip(x, row) if np.isfinite(v))
                lines.append(f'<polyline fill="none" stroke="{self.colours[k]}" points="{pts}"/>')
        legend = " ".join(f'<span style="color:{self.colours[k]}">■</span> {esc(lab)}' for k, lab in enumerate(self.labels))
        axis = "loss of each run (log scale)" if self.loss_log else "loss of each run"
        svg = f'<svg width="{width}" height="{height}" role="img" aria-label="{axis}">{"".join(lines)}</svg>' if lines else ""
        summary = code_html(self.headline)
        div = code_html(self.divergence.get("loss_text", ""))
        notes = "".join(f"<li>{esc(n)}</li>" for n in self.notes)
        return (f'<div class="nbdebug-compare-static"><p><b>nbdebug compare</b>: {summary}</p><p>{legend}</p>{svg}'
                f"<p>{div}</p><ul>{notes}</ul></div>")

    def __repr__(self) -> str:
        return f"CompareWidget({len(self.results)} runs: {', '.join(self.labels)})"


def compare(*runs: Any, labels: Sequence[str] | None = None, row: str | None = None, field: str = "mean",
            rtol: float = RTOL) -> CompareWidget:
    """Overlay two or more runs' loss (and ``field`` of ``row``), aligned by step, the first divergence
    of each from the first run marked. ``runs``: the results of ``%%nndebug model -o run`` (or of
    ``nbdebug.debug``); ``labels``: one per run (default "run 1", "run 2", …); ``row``: the row shown first (default: the
    one where the runs differ most; "" for none); ``rtol``: the
    divergence tolerance, relative to the series' typical magnitude
    (:func:`~nbdebug.inspectors.compare.first_divergence`).

    >>> nbdebug.compare(fast, slow, labels=["lr=3.0", "lr=0.1"], row="3", field="dead_unit_frac")  # doctest: +SKIP
    """
    return CompareWidget(runs, labels, row=row, field=field, rtol=rtol)
