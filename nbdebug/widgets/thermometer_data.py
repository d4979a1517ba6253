"""The thermometer widget's binary data: its per-step history (trait and live messages) and the
histograms fetched when a row is clicked. Pure numpy on the capture; the widget
(:mod:`nbdebug.widgets.thermometer`, which re-exports the public names) sends what is built here.

History (``history`` trait and live messages, read by ``js/src/thermometer/history.ts``): JSON
``fields`` (:data:`WIRE_FIELDS`), ``rows`` (name, module, type, shape, dtype), ``flag_bits``,
``total_steps``, ``first_nonfinite_step``, ``group`` (kept slots merged per sent slot) and arrays
``steps`` int32 [K], ``last`` float32 [K, R, F] (the bucket's last step), ``lo``/``hi`` (its min/max,
only when steps were merged), ``flags`` uint16 [K, R], ``loss``/``loss_lo``/``loss_hi``/``lr``/
``skipped`` [K]. While the cell runs, :meth:`~nbdebug.widgets.thermometer.ThermometerWidget.push_history`
sends only the slots changed since the last push as a custom message ``{"type": "history", "from": slot,
"reset": bool}`` with binary buffers (a decimation of the history, or more than :data:`LIVE_BYTES` in
the browser, resends the whole, downsampled to :data:`TRAIT_BYTES`). The final state is in the traits,
downsampled to :data:`TRAIT_BYTES` (a note says so) so a saved notebook stays small.

Histograms (the ``histogram`` request, :func:`histogram_answer`): the clicked row's kept values
binned, with the kept step they come from; :func:`no_histogram_reason` says why a capture has none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..capture.history import FIELD_INDEX, History
from ..capture.result import CaptureResult
from ..inspectors.history import FLAG_BITS, step_flags
from ..inspectors.thermometer import ThermometerReport, Thresholds

__all__ = ["LIVE_BYTES", "TRAIT_BYTES", "WIRE_FIELDS", "group_for", "histogram_answer", "history_payload",
           "no_histogram_reason", "report_flags_by_row", "sent_slot_bytes"]


#: per-row history fields sent to the browser (what the table, the detail panel and sparklines show)
WIRE_FIELDS: tuple[str, ...] = (
    "mean", "std", "min", "max", "zero_frac", "nan", "inf", "dead_unit_frac", "saturated_frac",
    "grad_norm", "grad_std", "grad_nan", "grad_inf", "param_grad_norm", "update_ratio",
)
_WIRE_IDX = np.array([FIELD_INDEX[f] for f in WIRE_FIELDS], dtype=np.intp)
_NONFINITE = np.array([WIRE_FIELDS.index(f) for f in ("nan", "inf", "grad_nan", "grad_inf")], dtype=np.intp)
#: bytes of history in the traits (the initial payload stays under 4 MB with the rows' JSON)
TRAIT_BYTES = 3_500_000
#: bytes of history a running cell lets the browser hold before it resends a downsampled whole
LIVE_BYTES = 16 * 2**20


def sent_slot_bytes(rows: int, banded: bool) -> int:
    """Bytes one sent slot costs: the fields (and their min/max when banded), flags, scalars."""
    return rows * (len(WIRE_FIELDS) * 4 * (3 if banded else 1) + 2) + 32


def group_for(k: int, rows: int, decimated: bool, budget: int) -> int:
    """Kept slots per sent slot so that ``k`` kept slots fit in ``budget`` bytes (1: every slot)."""
    if k * sent_slot_bytes(rows, decimated) <= budget:
        return 1
    fit = max(1, budget // sent_slot_bytes(rows, True))
    return -(-k // fit)


def history_payload(h: History, start: int, group: int, *, flags: np.ndarray | None = None, types: Sequence[str] = (),
             thresholds: Thresholds | None = None, first_nonfinite: int = 0) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays and JSON of the sent slots from ``start`` on (``group`` kept slots each: the last one's
    values, the min/max over the group). ``flags`` [K, R] (the final report's) or computed per step."""
    s0 = start * group
    last = h.values("last", s0)
    n = last.shape[0]
    starts = np.arange(0, n, group)
    ends = np.minimum(starts + group, n) - 1
    banded = h.decimated or group > 1
    skipped = np.fmax.reduceat(h.scalar("skipped", "max", s0), starts) if n else np.zeros(0, np.float32)
    if flags is None:  # a GradScaler-skipped step's inf gradients are expected: not flags
        bits = step_flags(last[ends], list(types), thresholds, dtypes=[str(i.get("dtype", "")) for i in h.row_info],
                          skipped=h.scalar("skipped", "last", s0)[ends] > 0,
                          shapes=[tuple(i.get("shape") or ()) or None for i in h.row_info])
    else:
        bits = np.ascontiguousarray(flags[s0:][ends], dtype=np.uint16)
    arrays: dict[str, np.ndarray] = {
        "steps": h.step_index[s0:][ends],
        "last": last[ends][:, :, _WIRE_IDX],
        "flags": bits,
        "loss": h.scalar("loss", "last", s0)[ends],
        "lr": h.scalar("lr", "last", s0)[ends],
        "skipped": skipped,
    }
    if banded and n:
        arrays["lo"] = np.fmin.reduceat(h.values("min", s0)[:, :, _WIRE_IDX], starts, axis=0)
        arrays["hi"] = np.fmax.reduceat(h.values("max", s0)[:, :, _WIRE_IDX], starts, axis=0)
        arrays["loss_lo"] = np.fmin.reduceat(h.scalar("loss", "min", s0), starts)
        arrays["loss_hi"] = np.fmax.reduceat(h.scalar("loss", "max", s0), starts)
    if not first_nonfinite and n:  # NaN/Inf counts (gradients: not on steps a GradScaler skipped)
        counts = np.nan_to_num(arrays.get("hi", arrays["last"])[:, :, _NONFINITE], nan=0.0) > 0
        bad = np.flatnonzero(counts[:, :, :2].any(axis=(1, 2)) | (counts[:, :, 2:].any(axis=(1, 2)) & ~(skipped > 0)))
        if bad.size:
            first_nonfinite = int(arrays["steps"][bad[0]])
    meta = {
        "fields": list(WIRE_FIELDS),
        "rows": [{"name": str(i.get("name")), "module": str(i.get("module", "")), "type": str(i.get("type", "")),
                  "shape": [int(x) for x in (i.get("shape") or ())], "dtype": str(i.get("dtype", ""))} for i in h.row_info],
        "flag_bits": dict(FLAG_BITS),
        "total_steps": int(h.steps),
        "first_nonfinite_step": int(first_nonfinite),
        "group": int(group),
    }
    return arrays, meta


def report_flags_by_row(report: ThermometerReport, h: History) -> np.ndarray | None:
    """The report's per-step flags ([K, layers], origins decided exactly) in the history's row order."""
    hf = report.history_flags
    if hf is None or hf.shape[0] != len(h):
        return None
    out = np.zeros((len(h), len(h.rows)), np.uint16)
    pos = {n: i for i, n in enumerate(h.rows)}
    for j, name in enumerate(report.names):
        if name in pos:
            out[:, pos[name]] = hf[:, j]
    return out

def histogram_answer(capture: CaptureResult | None, row: int, bins: int = 32) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``histogram`` request's answer: ``{name, min, max, total, sampled, exact, first_step,
    last_step}`` and float32 ``counts``/``edges`` of row ``row``'s kept values (its exact device
    histogram, else its sample). Values are kept at the row's first call only: ``first_step`` …
    ``last_step`` is the kept step (bucket) they come from (0: unknown), which the browser names
    next to the histogram when the slider is elsewhere."""
    if capture is None or not 0 <= row < len(capture.layers):
        raise IndexError(f"row {row} out of range")
    rec = capture.layers[row]
    first, last = _first_kept(capture, rec.name)
    if rec.histogram is not None:
        counts, edges = rec.histogram
        return _hist_answer(rec, counts, edges, exact=True, sampled=int(rec.stats["numel"]), steps=(first, last))
    if rec.sample is None:
        raise ValueError(f"no values kept for `{rec.name}` (byte budget reached): re-run with a larger max_bytes")
    fin = rec.sample[np.isfinite(rec.sample)].astype(np.float64)
    lo, hi = rec.stats["min"], rec.stats["max"]
    if getattr(capture, "steps", 1) > 1 or not (math.isfinite(lo) and math.isfinite(hi)):
        # over several steps the rows' min/max are the run's: the first call's sample spans its own range
        lo, hi = (float(fin.min()), float(fin.max())) if fin.size else (0.0, 1.0)
    if hi <= lo:
        hi = lo + 1.0
    counts, edges = np.histogram(fin, bins=bins, range=(lo, hi))
    exact = rec.sample.size >= rec.stats["numel"]
    return _hist_answer(rec, counts, edges, exact=exact, sampled=int(rec.sample.size), steps=(first, last))


def _hist_answer(rec: Any, counts: np.ndarray, edges: np.ndarray, *, exact: bool, sampled: int,
                 steps: tuple[int, int]) -> tuple[dict[str, Any], dict[str, Any]]:
    result = {
        "name": rec.name,
        "min": float(edges[0]),
        "max": float(edges[-1]),
        "total": int(rec.stats["numel"]),
        "sampled": sampled,
        "exact": bool(exact),
        "first_step": int(steps[0]),
        "last_step": int(steps[1]),
    }
    return result, {"counts": np.asarray(counts, dtype=np.float32), "edges": np.asarray(edges, dtype=np.float32)}


def _first_kept(capture: CaptureResult, name: str) -> tuple[int, int]:
    """The first and last step of the first kept bucket where row ``name`` has values (its first
    call, where its histogram values were kept); (1, 1) for a single-step capture, (0, 0) unknown."""
    hist = getattr(capture, "history", None)
    if hist is None or not len(hist):
        return (1, 1) if getattr(capture, "steps", 1) == 1 else (0, 0)
    try:
        series = np.asarray(hist.series(name, "nan"), dtype=np.float64)  # a count: NaN only where the row is absent
    except (KeyError, ValueError):
        return 0, 0
    seen = np.flatnonzero(~np.isnan(series))
    if not seen.size:
        return 0, 0
    j = int(seen[0])
    return int(hist.bucket_first[j]), int(hist.step_index[j])


def no_histogram_reason(capture: CaptureResult | None) -> str:
    """Why no row of ``capture`` has a histogram ("" when some row has kept values): a rank of a
    distributed run, whose spool carries statistics only."""
    if capture is None or not capture.layers:
        return ""
    if any(r.sample is not None or r.histogram is not None for r in capture.layers):
        return ""
    return ("no histogram: values are not kept across processes (each rank's spool carries per-step statistics "
            "only); run the rank's code in this kernel with nbdebug.debug for histograms")
