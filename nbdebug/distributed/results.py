"""A rank's :class:`~nbdebug.capture.result.CaptureResult` as JSON (written to ``final.json`` at exit)
and back, with the history rebuilt from the spool's chunks."""

from __future__ import annotations

import math
from typing import Any

from ..capture.spool import RankSpool, jsonable

__all__ = ["incident_json", "result_of", "summary_of"]

_DROP = ("layers", "history", "incidents", "error")  # written apart, or not at all (ErrorSite: as text)


def summary_of(result: Any) -> dict[str, Any]:
    """A :class:`~nbdebug.capture.result.CaptureResult` as JSON data: its fields, the merged rows
    (without samples and histograms), incidents (without tensor copies), the error site as text."""
    from dataclasses import fields

    out: dict[str, Any] = {f.name: jsonable(getattr(result, f.name)) for f in fields(result) if f.name not in _DROP}
    out["layers"] = [{f.name: jsonable(getattr(r, f.name)) for f in fields(r) if f.name not in ("sample", "histogram")}
                     for r in result.layers]
    out["incidents"] = [incident_json(i) for i in result.incidents]
    site = result.error
    out["error_site"] = None if site is None else {"module": site.module, "type": site.type, "error": site.error}
    return out


def incident_json(inc: Any) -> dict[str, Any]:
    """An incident's plain fields (its CPU tensor copies are not spooled)."""
    keys = ("kind", "step", "module", "row", "phase", "message", "params", "previous", "optimizer", "value", "median")
    return {k: jsonable(getattr(inc, k, None)) for k in keys}


def _incident(d: dict[str, Any]) -> Any:
    from ..capture.incidents import Incident

    return Incident(**{k: d.get(k) for k in ("kind", "step", "module", "row", "phase", "message")},
                    params=d.get("params") or {}, previous=d.get("previous"), optimizer=d.get("optimizer") or {},
                    value=d.get("value"), median=d.get("median"))


def result_of(spool: RankSpool) -> Any:
    """The rank's :class:`~nbdebug.capture.result.CaptureResult`: the merged rows and counters from
    ``final.json`` and the history from the chunks; a process that never closed its capture gets the
    history alone (``layers`` empty) and a note saying so."""
    from dataclasses import fields

    from ..capture.result import CaptureResult, LayerRecord

    names = {f.name for f in fields(CaptureResult)}
    summary = (spool.final or {}).get("result")
    if summary is None:
        steps = spool.history.steps if spool.history is not None else spool.step
        res = CaptureResult(layers=[], forward_passes=steps, backward_ran=False, calls_recorded=0, truncated=False,
                            sample_size=0, near_zero_eps=0.0, bytes_kept=0, budget_exceeded=False,
                            forward_nonfinite_call=None, backward_nonfinite_row=None, elapsed_s=math.nan, steps=steps)
        res.notes.append(f"rank {spool.rank} (pid {spool.pid}) never closed its capture (killed, or still running): "
                         f"what it wrote up to step {spool.step}")
    else:
        kw = {k: v for k, v in summary.items() if k in names and k not in _DROP}
        for k in ("forward_nonfinite_call",):
            if kw.get(k) is not None:
                kw[k] = tuple(kw[k])
        kw["layers"] = [LayerRecord(**{**r, "shape": tuple(r["shape"]), "inputs": tuple(r.get("inputs") or ())})
                        for r in summary.get("layers", [])]
        kw["incidents"] = [_incident(d) for d in summary.get("incidents", [])]
        res = CaptureResult(**kw)
    if not res.incidents and spool.incidents:
        res.incidents = [_incident(d) for d in spool.incidents]
    res.history = spool.history
    if summary is None:  # rows and first NaN/Inf from what the steps wrote
        h = spool.history
        if h is not None and len(h):
            res.layers = res.at(int(h.step_index[-1]))
            res.notes.append(f"rows show step {int(h.step_index[-1])} (no whole-run summary)")
        attr = {"forward": "forward_nonfinite_step", "output_grad": "backward_nonfinite_step",
                "param_grad": "param_grad_nonfinite_step"}
        for inc in res.incidents:
            name = attr.get(getattr(inc, "phase", None) or "")
            if inc.kind == "nonfinite" and name and getattr(res, name) is None:
                setattr(res, name, int(inc.step))
    return res
