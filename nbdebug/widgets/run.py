"""The view of a distributed run (:class:`~nbdebug.distributed.run.Run`): one thermometer with a rank
selector, a per-row spread across ranks, the first NaN/Inf with its rank, step and module, the
parameters that differ across ranks, errors per rank and notes.

>>> w = run.widget()          # doctest: +SKIP  (what ``run.show()`` / ``%%nndebug --distributed`` display)
>>> w.rank = 1                # doctest: +SKIP  (the browser fetches rank 1's table)

Synced up front (small JSON): ``ranks`` (one entry per rank: steps, NaN, error, hooks left),
``nonfinite``, ``diverged``/``buffers_differ`` (name and the step they first differed),
``errors``, ``notes``, ``spread`` (``fields``, ``rows`` and binary float32 ``lo``/``hi`` [rows, fields]:
min/max across ranks at each rank's last kept step, NaN where no rank had a finite value; so that the
column follows the rank thermometer's step slider without a request, ``steps`` int32 [K] (the kept
steps the ranks' sliders show, at most :data:`SPREAD_STEP_BYTES` of values) with ``step_lo``/``step_hi``
float32 [K, rows, fields] (across the ranks that kept that step), and ``whole_lo``/``whole_hi``
[rows, fields] across the ranks' whole-run merged rows, the thermometer's "whole run") and
``rank_state``: the thermometer traits of the :attr:`Run.focus` rank (binary arrays as in
:class:`~nbdebug.widgets.thermometer.ThermometerWidget`). Other ranks cross on demand (the kernel is
idle after the run): request ``rank`` ``{rank}`` answers ``{rank, traits}`` with the arrays in
binary buffers (each array's place in ``traits`` holds ``{"__array__": name}``); ``rank_request``
``{rank, method, params}`` answers what the rank's thermometer would (histograms are not spooled:
the rank's ``histogram_note`` trait says so and its rows send no request; asked anyway, an error). ``js/src/run.ts`` draws it with the thermometer's own renderer.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import traitlets

from ..inspectors.thermometer import COLUMNS, ThermometerReport, Thresholds, diagnose
from ._base import NBWidget, rpc
from ._transport import decode_array, encode_array

__all__ = ["FALLBACK_BYTES", "SPREAD_FIELDS", "SPREAD_STEP_BYTES", "RunWidget", "spread_over_time"]

#: stats whose spread across ranks is sent (the view's "spread" column offers these)
SPREAD_FIELDS: tuple[str, ...] = ("mean", "std", "max", "grad_norm", "param_grad_norm", "nan")
#: the static fallback stays under this many bytes (rows beyond it are left out, and it says so)
FALLBACK_BYTES = 200_000
#: bytes of per-step spread (``step_lo`` + ``step_hi``) sent up front; more kept steps: evenly spaced ones
SPREAD_STEP_BYTES = 2**20


def _flatten(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``state`` with every encoded array (``{"view", "dtype", "shape"}``) replaced by
    ``{"__array__": name}``, and the arrays by name (for :func:`~nbdebug.widgets._transport.pack_arrays`)."""
    arrays: dict[str, Any] = {}

    def walk(x: Any, path: str) -> Any:
        if isinstance(x, dict):
            if "view" in x and "dtype" in x and "shape" in x:
                arrays[path] = decode_array(x)
                return {"__array__": path}
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v, f"{path}.{i}") for i, v in enumerate(x)]
        return x

    return walk(state, ""), arrays


class RunWidget(NBWidget):
    """Every rank of a :class:`~nbdebug.distributed.run.Run` in one view (see the module doc).

    Traits: ``ranks``, ``rank`` (the rank shown; synced both ways), ``focus``, ``summary``,
    ``nonfinite``, ``diverged``, ``buffers_differ``, ``compared_step``, ``errors``, ``notes``,
    ``spread``, ``spread_stat`` (the field of the spread column), ``rank_state``. ``run`` keeps the
    Python-side data; :attr:`report` is the shown rank's thermometer report.
    """

    _view_name_ = "run"

    ranks = traitlets.List().tag(sync=True)
    rank = traitlets.Int(0).tag(sync=True)
    focus = traitlets.Int(0).tag(sync=True)
    world_size = traitlets.Int(0).tag(sync=True)
    summary = traitlets.Unicode("").tag(sync=True)
    nonfinite = traitlets.List().tag(sync=True)
    diverged = traitlets.List().tag(sync=True)
    buffers_differ = traitlets.List().tag(sync=True)
    compared_step = traitlets.Int(0).tag(sync=True)
    errors = traitlets.List().tag(sync=True)
    notes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    spread = traitlets.Dict().tag(sync=True)
    spread_stat = traitlets.Unicode("mean").tag(sync=True)
    rank_state = traitlets.Dict().tag(sync=True)

    def __init__(self, run: Any, rank: int | None = None, thresholds: Thresholds | None = None, **kwargs: Any) -> None:
        self.run = run
        self.thresholds = thresholds
        self._reports: dict[int, ThermometerReport] = {}
        recorded = [r for r, res in enumerate(run.ranks) if res is not None]
        focus = run.focus if run.focus is not None else (recorded[0] if recorded else 0)
        shown = focus if rank is None else int(rank)
        if recorded and shown not in recorded:
            raise LookupError(f"rank {shown} recorded nothing; recorded: {recorded}")
        super().__init__(**self._state(run, focus, shown), **kwargs)

    def _state(self, run: Any, focus: int, shown: int) -> dict[str, Any]:
        nf_ranks = {f.rank for f in run.first_nonfinite}
        ranks = []
        for r, res in enumerate(run.ranks):
            err = run.errors.get(r, "")
            ranks.append({
                "rank": r, "recorded": res is not None, "steps": 0 if res is None else int(res.steps),
                "nonfinite": r in nf_ranks, "error": err, "hooks_left": int(run.hooks_left.get(r, 0)),
                "closed": r in run.hooks_left,
            })
        steps = dict(run.diverged_steps)
        per_field = [run.spread(f) for f in SPREAD_FIELDS]
        rows = list(dict.fromkeys(r for sp in per_field for r in sp))
        for res in run.ranks:  # rows seen at other steps only, and merged rows, have a spread too
            if res is not None:
                rows = list(dict.fromkeys([*rows, *(res.history.rows if res.history is not None else ()),
                                           *(r.name for r in res.layers)]))
        lo = np.full((len(rows), len(SPREAD_FIELDS)), np.nan, np.float32)
        hi = lo.copy()
        at = {r: i for i, r in enumerate(rows)}
        for j, sp in enumerate(per_field):
            for row, (a, b) in sp.items():
                lo[at[row], j], hi[at[row], j] = a, b
        spread = {"fields": list(SPREAD_FIELDS), "rows": rows, "lo": encode_array(lo), "hi": encode_array(hi)}
        spread.update({k: encode_array(v) for k, v in spread_over_time(run, rows).items()})
        state = dict(
            ranks=ranks, rank=shown, focus=focus, world_size=int(run.world_size), summary=run.summary(),
            nonfinite=[{"rank": f.rank, "step": f.step, "phase": f.phase, "module": f.module, "row": f.row,
                        "message": f.message} for f in run.first_nonfinite],
            diverged=[{"name": n, "step": steps.get(n)} for n in run.diverged],
            buffers_differ=[{"name": n, "step": steps.get("buffer:" + n)} for n in run.buffers_differ],
            compared_step=int(run.compared_step or 0),
            errors=[{"rank": r, "error": e, "traceback": run.tracebacks.get(r, "")[-2000:]} for r, e in run.errors.items()],
            notes=list(run.notes), spread=spread,
        )
        if shown < len(run.ranks) and run.ranks[shown] is not None:
            state["rank_state"] = {"rank": shown, "traits": self.rank_traits(shown)}
        return state

    def spread_range(self, row: str, field: str = "mean") -> tuple[float, float]:
        """``(min, max)`` of ``field`` for ``row`` across ranks as sent (NaN, NaN when no rank had a finite value)."""
        rows = self.spread.get("rows", [])
        if row not in rows:
            return math.nan, math.nan
        i, j = rows.index(row), SPREAD_FIELDS.index(field)
        return float(decode_array(self.spread["lo"])[i, j]), float(decode_array(self.spread["hi"])[i, j])

    # -- one rank's thermometer ------------------------------------------------------------------
    def report_of(self, rank: int) -> ThermometerReport:
        """Rank ``rank``'s thermometer report (computed once)."""
        if not 0 <= rank < len(self.run.ranks) or self.run.ranks[rank] is None:
            recorded = [r for r, res in enumerate(self.run.ranks) if res is not None]
            raise LookupError(f"rank {rank} recorded nothing (it never entered nbdebug.debug); recorded: {recorded}")
        if rank not in self._reports:
            self._reports[rank] = diagnose(self.run.ranks[rank], self.thresholds)
        return self._reports[rank]

    @property
    def report(self) -> ThermometerReport:
        """The shown rank's thermometer report."""
        return self.report_of(self.rank)

    def rank_traits(self, rank: int) -> dict[str, Any]:
        """The traits a :class:`~nbdebug.widgets.thermometer.ThermometerWidget` of ``rank`` would have."""
        from .thermometer import ThermometerWidget

        report = self.report_of(rank)
        return ThermometerWidget.state_of(report, self.run.ranks[rank], self.thresholds)

    @rpc("rank")
    def _rank(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        rank = int(params["rank"])
        traits, arrays = _flatten(self.rank_traits(rank))
        return {"rank": rank, "traits": traits}, arrays

    @rpc("rank_request")
    def _rank_request(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        rank, method = int(params["rank"]), str(params.get("method"))
        self.report_of(rank)  # a rank that recorded nothing says so
        if method == "histogram":  # the rank's table says when none is kept (histogram_note): no request then
            from .thermometer import histogram_answer

            cap = self.run.ranks[rank]
            if any(r.sample is not None or r.histogram is not None for r in cap.layers):
                return histogram_answer(cap, int(params.get("params", {}).get("row", -1)))
            raise ValueError(f"histograms are not kept across processes (rank {rank}): the spool carries each "
                             "step's statistics only; run the rank's code in this kernel with nbdebug.debug for values")
        raise KeyError(f"unknown request {method!r} for rank {rank}")

    def export_requests(self) -> list[tuple[str, dict[str, Any]]]:
        """Every recorded rank's table (what choosing it in the selector asks for)."""
        return [("rank", {"rank": r}) for r, res in enumerate(self.run.ranks) if res is not None]

    # -- static fallback and repr ----------------------------------------------------------------
    def fallback_html(self) -> str:
        """The summary, the cards and the shown rank's rows with their spread (no scripts, escaped)."""
        esc = html.escape
        parts = [f'<div class="nbdebug-run-static"><p><b>nbdebug: {self.world_size} rank(s)</b>: {esc(self.summary)}</p>']
        marks = "".join(
            f"<li>rank {r['rank']}: {r['steps']} step(s)" + (" · NaN/Inf" if r["nonfinite"] else "")
            + (f" · raised {esc(r['error'])}" if r["error"] else "") + (f" · {r['hooks_left']} hooks left" if r["hooks_left"] else "")
            + ("" if r["recorded"] else " · recorded nothing") + "</li>" for r in self.ranks)
        parts.append(f"<ul>{marks}</ul>")
        if self.nonfinite:
            f = self.nonfinite[0]
            also = "; ".join(f"rank {x['rank']} at step {x['step']} ({esc(str(x['phase']))})" for x in self.nonfinite[1:])
            parts.append('<p style="border-left:4px solid #b30000;padding-left:6px">first NaN/Inf: '
                         f"rank {f['rank']}, step {f['step']}, <code>{esc(str(f['module']))}</code> ({esc(str(f['phase']))})"
                         + (f"; also {also}" if also else "") + "</p>")
        for title, items in (("parameters that differ across ranks", self.diverged),
                             ("buffers that differ (not divergence)", self.buffers_differ)):
            if items:
                lis = "".join(f"<li><code>{esc(d['name'])}</code> from step {d['step']}</li>" for d in items[:100])
                lis += f"<li>… {len(items) - 100} more</li>" if len(items) > 100 else ""
                parts.append(f"<p>{title}:</p><ul>{lis}</ul>")
        parts += [f"<p>rank {e['rank']} raised {esc(e['error'])}</p>" for e in self.errors]
        parts.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in self.notes) + "</ul>")
        parts.append(self._table_html(FALLBACK_BYTES - sum(len(p.encode()) for p in parts) - 200))
        return "".join(parts) + "</div>"

    def _table_html(self, budget: int) -> str:
        esc = html.escape
        try:
            r = self.report
        except LookupError:
            return ""
        cols = ["mean", "std", "min", "max", "nan", "inf", "grad_norm"]
        idx = [COLUMNS.index(c) for c in cols]
        j = SPREAD_FIELDS.index(self.spread_stat) if self.spread_stat in SPREAD_FIELDS else 0
        head = "".join(f"<th>{c}</th>" for c in ["layer", "type", *cols, f"{SPREAD_FIELDS[j]} across ranks"])
        where = {n: i for i, n in enumerate(self.spread.get("rows", []))}
        lo, hi = decode_array(self.spread["lo"]), decode_array(self.spread["hi"])
        rows, used = [], 0
        for i, name in enumerate(r.names):
            k = where.get(name)
            a, b = (math.nan, math.nan) if k is None else (float(lo[k, j]), float(hi[k, j]))
            spread = "—" if a != a else f"{_fmt(a)} … {_fmt(b)}"
            cells = [esc(name), esc(r.types[i]), *(_fmt(float(r.table[i, c])) for c in idx), spread]
            row = "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
            size = len(row.encode())
            if used + size > budget:
                rows.append(f"<tr><td colspan='{len(cols) + 3}'>… {len(r.names) - i} more rows left out</td></tr>")
                break
            rows.append(row)
            used += size
        return (f"<p>rank {self.rank}</p><table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")

    def __repr__(self) -> str:
        try:
            shown = f"; rank {self.rank}: ThermometerWidget({self.report.summary})"
        except LookupError:
            shown = ""
        return f"RunWidget({self.world_size} ranks{shown})"


def _slider_steps(hist: Any) -> np.ndarray:
    """The kept steps a rank's thermometer slider shows (its history trait: every kept step, or the
    last of each group when downsampled to the trait budget)."""
    from .thermometer_data import TRAIT_BYTES, group_for

    k = len(hist)
    group = group_for(k, len(hist.rows), hist.decimated, TRAIT_BYTES)
    return hist.step_index[np.minimum(np.arange(0, k, group) + group, k) - 1]


def _merged(rec: Any, field: str) -> float:
    """A merged (whole-run) row's value of ``field`` as the thermometer's whole-run table has it."""
    if field == "param_grad_norm":
        return math.nan if rec.param_grad_norm is None else float(rec.param_grad_norm)
    if field.startswith("grad_"):
        return math.nan if rec.grad is None else float(rec.grad.get(field[5:], math.nan))
    return float(rec.stats.get(field, math.nan))


def spread_over_time(run: Any, rows: list[str], max_bytes: int = SPREAD_STEP_BYTES) -> dict[str, np.ndarray]:
    """Min/max of :data:`SPREAD_FIELDS` across ranks, per kept step and over the whole run.

    ``steps`` int32 [K]: the kept steps the ranks' sliders show (their union; evenly spaced ones, the
    last always, when ``step_lo`` + ``step_hi`` would pass ``max_bytes``); ``step_lo``/``step_hi``
    float32 [K, rows, fields]: over the ranks that kept that step (the bucket's last value, as
    ``CaptureResult.series``); ``whole_lo``/``whole_hi`` float32 [rows, fields]: over the ranks'
    merged rows (``CaptureResult.layers``). NaN where no rank had a finite value.
    """
    from ..capture.history import FIELD_INDEX

    hists = [res.history for res in run.ranks if res is not None and res.history is not None and len(res.history)]
    steps = np.unique(np.concatenate([_slider_steps(h) for h in hists])) if hists else np.zeros(0, np.int64)
    per_step = max(1, len(rows) * len(SPREAD_FIELDS) * 8)
    if len(steps) * per_step > max_bytes:
        n = max(1, max_bytes // per_step)
        steps = steps[np.unique(np.linspace(0 if n > 1 else len(steps) - 1, len(steps) - 1, n).round().astype(int))]
    F = [FIELD_INDEX[f] for f in SPREAD_FIELDS]
    at = {r: i for i, r in enumerate(rows)}
    lo = np.full((len(steps), len(rows), len(SPREAD_FIELDS)), np.nan, np.float32)
    hi = lo.copy()
    for h in hists:
        slot = np.searchsorted(h.step_index, steps)
        kept = slot < len(h.step_index)
        kept[kept] = h.step_index[slot[kept]] == steps[kept]
        mine = [(at[name], j) for j, name in enumerate(h.rows) if name in at]
        if not mine or not kept.any():
            continue
        dst, src = (np.asarray(x) for x in zip(*mine))
        v = h.values("last")[slot[kept]][:, src][:, :, F].astype(np.float32)
        ks = np.flatnonzero(kept)
        lo[np.ix_(ks, dst)] = np.fmin(lo[np.ix_(ks, dst)], v)
        hi[np.ix_(ks, dst)] = np.fmax(hi[np.ix_(ks, dst)], v)
    wlo = np.full((len(rows), len(SPREAD_FIELDS)), np.nan, np.float32)
    whi = wlo.copy()
    for res in run.ranks:
        for rec in [] if res is None else res.layers:
            if rec.name in at:
                v = np.asarray([_merged(rec, f) for f in SPREAD_FIELDS], np.float32)
                i = at[rec.name]
                wlo[i], whi[i] = np.fmin(wlo[i], v), np.fmax(whi[i], v)
    return {"steps": steps.astype(np.int32), "step_lo": lo, "step_hi": hi, "whole_lo": wlo, "whole_hi": whi}


def _fmt(x: float | None) -> str:
    if x is None or x != x:
        return "—"
    if x == 0 or 1e-3 <= abs(x) < 1e4:
        return f"{x:.4g}"
    return f"{x:.3e}"
