"""The thermometer's findings, ranked: the root cause first, what followed from it after it.

Pure computation over what the other inspectors decided (events over the kept steps, diagnoses at
one step, the capture's incidents and first non-finite value): no torch, no Jupyter. The views'
header is :func:`headline` of these, live (:func:`live_findings`, from the history while the cell
runs) as well as at the end (:func:`findings_of`, from the report).

Ranking (documented, and what the tests hold the sentences to):

1. A finding *follows from* another when the capture's numbers tie them: units that died after
   update ratios above the healthy range in a layer feeding them follow from "learning rate too
   high"; gradients that fell, or updates that became too small, after units died follow from the
   deaths; loss spikes that came after too-large updates follow from them, and a first NaN/Inf that
   came after loss spikes follows from the spikes (a divergence, not a numerical bug: a NaN with no
   spike before it stands on its own). Nothing is tied on a guess.
2. Root causes (findings that follow from none) come first: the cell raising inside the model, then
   chains holding an error (NaN/Inf, exploding gradients) before warnings, then the earliest step.
3. Each root is followed by what follows from it, in step order.

One piece of advice per distinct text: a consequence whose cause's advice covers it carries none.

>>> findings_of(diagnose(result), result)[0].text                                # doctest: +SKIP
'learning rate too high: update ratio 0.094 at step 1 in `0`'
>>> headline(findings_of(diagnose(result), result))                              # doctest: +SKIP
'learning rate too high: update ratio 0.094 at step 1 in `0` → `1` dead from step 17, `3` from step 31; …'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from . import steps as steps_
from .events import Event, events, fmt_g
from .history import Thresholds
from .loop_findings import loop_findings
from .report import Diagnosis, ThermometerReport
from .run_evidence import Evidence, Finding, Rise, names
from .run_findings import run_findings
from .run_findings_data import data_causes, data_findings, harmless_dead_units, recovered
from .run_findings_order import order_causes, order_findings
from .steps import SUGGEST, FirstNonfinite, diagnoses_at, first_nonfinite_of, nan_part, plural

__all__ = ["SUGGEST_FINDINGS", "Finding", "as_json", "build", "findings_of", "headline", "live_findings", "rank"]

#: advice of the findings that have no event or diagnosis of their own
SUGGEST_FINDINGS = {
    "loss_spike": "Lower the learning rate or clip gradients (torch.nn.utils.clip_grad_norm_), and look at the "
                  "batches of those steps (outliers, wrong labels).",
    "nonfinite": SUGGEST["nan_origin_fwd"],
    "loss_diverged": "Lower the learning rate (a fine-tune usually wants 1e-5–1e-4; warm it up), clip gradients, "
                     "and check the labels and the loss against the model's output.",
}

#: where a first NaN/Inf appeared → the advice it gets
_NAN_ADVICE = {"forward": "nan_origin_fwd", "input": "nan_input", "between": "nan_input", "backward": "nan_origin_bwd",
               "parameter gradients": "nan_origin_bwd"}
_ERRORS = {"raised", "nonfinite", "nan_origin_fwd", "nan_origin_bwd", "exploding"}
_NAN_CODES = {"nan_origin_fwd", "nan_origin_bwd", "nonfinite"}
_BLOWN = ("lr_high", "loss_diverged", "exploding_run", "loss_spike")
_FOLLOW_INIT = {"exploding_init": _BLOWN, "vanishing_init": ("lr_low",), "exploding_forward": _BLOWN, "loss_unbounded": (*_BLOWN, "nonfinite")}


def _get(inc: Any, k: str) -> Any:
    return inc.get(k) if isinstance(inc, dict) else getattr(inc, k, None)


def _update_findings(evs: Sequence[Event], th: Thresholds, feeding: set[str], ev: Evidence,
                     harmed: bool) -> list[Finding]:
    """"learning rate too high" / "update ratio too low" from the update-ratio events (one each): a
    warning only with evidence of harm (too high: ``harmed`` — units it fed died, the loss spiked —
    or the loss then rose to ≥ 2× its first value, or gradients blew up after it; too low: the loss
    did not fall), else a note ("update_high" / "update_low")."""
    out = []
    for high in (True, False):
        es = [e for e in evs if e.code == "update_ratio" and (e.value > th.update_high) == high and math.isfinite(e.value)]
        if not es:
            continue
        s = min(e.step for e in es)
        first = [e for e in es if e.step == s]
        cited = [e for e in first if e.row in feeding] or first  # the rows feeding what died, when any did
        e = max(cited, key=lambda e: e.value) if high else min(cited, key=lambda e: e.value)
        rows = tuple(dict.fromkeys(x.row for x in es))
        if high:
            rise = None if recovered(ev) else ev.loss_rise(s)  # a rise the run came back far below is no harm
            blow = ev.grad_blowup()
            blew = blow is not None and blow[0] > s
            text = f"learning rate too high: update ratio {fmt_g(e.value)} at step {s} in `{e.row}`"
            if harmed or rise is not None or blew:
                detail = f"{text}; ‖Δθ‖/‖θ‖ above {th.update_high:g} in {names(rows)} from step {s}"
                if rise is not None:
                    detail += f"; then {_rise_clause(rise)}"
                if blew and blow is not None:
                    detail += f"; the gradient norm reached {fmt_g(blow[1])} at step {blow[0]} ({fmt_g(blow[1] / blow[2])}× its start)"
                out.append(Finding("lr_high", "warning", s, rows, text, f"update ratio above {th.update_high:g} from step {s}",
                                   detail + ".", SUGGEST["update_high"], key="lr_high"))
            else:
                note = (f"update ratios above {th.update_high:g} (rule of thumb ≈ 1e-3) from step {s}, up to "
                        f"{fmt_g(e.value)} in `{e.row}`, with no harm seen")
                came = "the loss did not rise" if (r := ev.loss_rise(s)) is None else f"the loss {_rise_clause(r, lead='')} but ended far below its start"
                detail = (f"{note}: {came}, no unit died, gradients did not blow up "
                          "(Adam's first steps move each weight by about lr: ratios of 1e-2–3e-2 are usual for small models).")
                out.append(Finding("update_high", "note", s, rows, note, note, detail, "", key="update_high"))
        else:
            text = f"update ratio too low: {fmt_g(e.value)} at step {s} in `{e.row}`"
            # every layer barely moves (the largest per-layer median ratio is below the line) and the loss
            # does not fall: one slow layer (an embedding, a vanishing gradient's first layers) is no lr
            stuck = (len(ev.steps) >= 5 and not ev.falls() and ev.diverged() is None
                     and math.isfinite(ev.move) and ev.move < th.update_low)
            if stuck:
                detail = f"{text}; ‖Δθ‖/‖θ‖ below {th.update_low:g} in {names(rows)} from step {s}, and the loss did not fall: they barely learn."
                out.append(Finding("lr_low", "warning", s, rows, text, f"{names(rows)} barely updated from step {s}",
                                   detail, SUGGEST["update_low"], key="lr_low"))
            else:
                note = f"update ratio below {th.update_low:g} in {names(rows)} from step {s} (smallest {fmt_g(e.value)} in `{e.row}`)"
                out.append(Finding("update_low", "note", s, rows, note, note, note + ("; the loss fell regardless." if ev.falls() else "; other layers moved."), "",
                                   key="update_low"))
    return out


def _rise_clause(r: Rise, lead: str = "the loss ") -> str:
    if not math.isfinite(r.value):
        return f"{lead}went non-finite at step {r.step}"
    first = math.isnan(r.scale) or r.scale == r.start
    return f"{lead}rose to {fmt_g(r.value)} at step {r.step} " + (f"({fmt_g(r.factor)}× its first value {fmt_g(r.start)})" if first
                                                                   else f"(from {fmt_g(r.start)}: {fmt_g(r.factor - 1)}× its range {fmt_g(r.scale)})")


def _loss_findings(ev: Evidence) -> list[Finding]:
    """The run's end far above its start (``loss_diverged``), and gradients that blew up (``exploding``)."""
    out = []
    d = ev.diverged()
    if d is not None:
        text = (f"loss diverged: it ends at {fmt_g(d.value)}, {fmt_g(d.factor)}× its start ({fmt_g(d.start)})")
        out.append(Finding("loss_diverged", "warning", d.step, (), text, f"loss {fmt_g(d.factor)}× its start by step {d.step}",
                           text + " (median of the last fifth of the steps vs the mean of the first tenth).",
                           SUGGEST_FINDINGS["loss_diverged"], key="loss_diverged"))
    b = ev.grad_blowup()
    if b is not None and (ev.loss_rise(b[0] - 1) is not None or d is not None):
        text = f"gradients exploded: norm {fmt_g(b[1])} at step {b[0]}, {fmt_g(b[1] / b[2])}× its first steps'"
        out.append(Finding("exploding", "error", b[0], (), text, f"gradient norm {fmt_g(b[1] / b[2])}× its start at step {b[0]}",
                           text + "; the loss rose after it.", SUGGEST["exploding"], key="exploding_run"))
    return out


def _dead_finding(evs: Sequence[Event]) -> Finding | None:
    es = sorted((e for e in evs if e.code == "became_dead"), key=lambda e: e.step)
    if not es:
        return None
    first = f"`{es[0].row}` dead from step {es[0].step}"
    rest = [f"`{e.row}` from step {e.step}" if e.step != es[0].step else f"`{e.row}`" for e in es[1:3]]
    short = ", ".join([first, *rest]) + (f" and {len(es) - 3} more" if len(es) > 3 else "")
    if all(e.step == es[0].step for e in es[:3]) and len(es) > 1:
        short = f"{names([e.row for e in es])} dead from step {es[0].step}"
    detail = "; ".join(f"`{e.row}`: {e.value:.0%} of its units dead from step {e.step}" if math.isfinite(e.value)
                       else f"`{e.row}` dead from step {e.step}" for e in es) + "."
    return Finding("became_dead", "warning", es[0].step, tuple(e.row for e in es), short, short, detail,
                   es[0].suggestion, key="became_dead")


def _fell_finding(evs: Sequence[Event]) -> Finding | None:
    es = sorted((e for e in evs if e.code == "grad_fell"), key=lambda e: e.step)
    if not es:
        return None
    s, last = es[0].step, max(e.step for e in es)
    rows = [e.row for e in es]
    to_zero = all(e.value == 0 for e in es)
    what = "fell to 0" if to_zero else "fell by orders of magnitude"
    # each row's fall is measured from its first step: the steps are when each had fallen, not a span
    when = f"by step {s}" if s == last else f"by steps {s}–{last}"
    short = f"gradients of {names(rows)} {what} {when}"
    return Finding("grad_fell", "warning", s, tuple(rows), short, short, short + ".", es[0].suggestion, key="grad_fell")


def _spike_finding(incidents: Sequence[Any]) -> Finding | None:
    sp = [i for i in incidents if _get(i, "kind") == "loss_spike"]
    if not sp:
        return None
    steps = [int(_get(i, "step") or 0) for i in sp]
    vals = [float(_get(i, "value")) if _get(i, "value") is not None else math.nan for i in sp]
    s = min(steps)
    if len(sp) == 1:
        short = f"loss spike at step {s}"
        text = f"loss spike at step {s}" + (f": {fmt_g(vals[0])}, over 10× the running median" if math.isfinite(vals[0]) else "")
    else:
        short = f"loss spikes from step {s}"
        big = int(np.nanargmax(vals)) if any(math.isfinite(v) for v in vals) else -1
        top = f" (largest {fmt_g(vals[big])} at step {steps[big]})" if big >= 0 else ""
        text = f"loss spikes (over 10× the running median) at {len(sp)} steps from step {s}{top}"
    return Finding("loss_spike", "warning", s, (), text, short, text + ".", SUGGEST_FINDINGS["loss_spike"], key="loss_spike")


def _nan_finding(first: FirstNonfinite, incidents: Sequence[Any]) -> Finding:
    rows = (first.row,) if first.row else ()
    where = f" in `{first.row}`" if first.row else ""
    short = f"first NaN/Inf at step {first.step}{where}"
    text = nan_part(first)
    msg = next((str(_get(i, "message")) for i in incidents if _get(i, "kind") == "nonfinite" and _get(i, "message")), "")
    detail = (msg if msg else text) + ("" if (msg or text).endswith(".") else ".")
    return Finding("nonfinite", "error", first.step, rows, text, short, detail, SUGGEST[_NAN_ADVICE.get(first.where, "nan_origin_fwd")],
                   key="nonfinite")


def _diag_finding(d: Diagnosis, step: int) -> Finding:
    text = d.message.rstrip(".")
    rows = (d.layer,) if d.layer else ()
    short = text if len(text) <= 80 else text[:77].rsplit(" ", 1)[0] + "…"
    return Finding(d.code, "error" if d.code in _ERRORS or d.severity == "error" else "warning", step, rows, text,
                   short, d.message, d.suggestion, key=f"{d.code}:{d.layer}:{d.message[:40]}")


def rank(items: list[Finding], causes: dict[str, str]) -> list[Finding]:
    """``items`` ranked (see the module doc); ``causes``: key → the key of the finding it follows from."""
    by_key = {f.key: f for f in items}
    causes = {k: c for k, c in causes.items() if k in by_key and c in by_key and k != c}
    kids: dict[str, list[Finding]] = {}
    for f in items:
        if f.key in causes:
            kids.setdefault(causes[f.key], []).append(f)

    def chain(f: Finding) -> list[Finding]:
        out = [f]
        for k in sorted(kids.get(f.key, []), key=lambda x: x.step):
            out += chain(k)
        return out

    roots = [f for f in items if f.key not in causes]
    order = {f.key: i for i, f in enumerate(items)}

    def weight(f: Finding) -> tuple[int, int, int, int, int]:
        members = chain(f)
        return (0 if f.code == "raised" else 1, 1 if f.severity == "note" else 0,
                0 if any(m.severity == "error" for m in members) else 1, f.step, order[f.key])

    ranked: list[Finding] = []
    for r in sorted(roots, key=weight):
        ranked += chain(r)
    at = {f.key: i for i, f in enumerate(ranked)}
    out = []
    said: set[str] = set()
    for f in ranked:
        cause = at[causes[f.key]] if f.key in causes else -1
        advice = f.advice
        if advice in said or (cause >= 0 and ranked[cause].advice and f.code in ("grad_fell", "lr_low", "became_dead")
                              and ranked[cause].code != "nonfinite"):
            advice = ""  # said already, or the cause's advice is the fix
        said.add(f.advice)
        out.append(replace(f, cause=cause, advice=advice))
    return out


def build(evs: Sequence[Event], diags: Sequence[Diagnosis], *, incidents: Sequence[Any] = (),
          first_nonfinite: FirstNonfinite | None = None, step: int = 0, th: Thresholds | None = None,
          history: bool = True, evidence: Evidence | None = None, extra: Sequence[Finding] = ()) -> list[Finding]:
    """The ranked findings of events ``evs`` (over the kept steps), diagnoses ``diags`` (at ``step``),
    the capture's ``incidents`` and its first NaN/Inf; ``history`` False: one step (the diagnoses only).
    ``evidence``: the run's loss and gradient norms (:class:`~nbdebug.inspectors.run_evidence.Evidence`);
    ``extra``: findings made elsewhere (the loop's, :mod:`~nbdebug.inspectors.loop_findings`), roots."""
    th = th or Thresholds()
    ev = evidence if evidence is not None else Evidence.of(None)
    items: list[Finding] = []
    causes: dict[str, str] = {}
    raised = [d for d in diags if d.code == "raised"]
    items += [replace(_diag_finding(d, 0), key="raised") for d in raised[:1]]
    if not history:
        items += [_diag_finding(d, step) for d in diags if d.code != "raised"]
        return rank(items, causes)
    dead = _dead_finding(evs)
    feeding = {r for e in evs if e.code == "became_dead" for r in e.related}
    fell, spikes = _fell_finding(evs), _spike_finding(incidents)
    highs = [e.step for e in evs if e.code == "update_ratio" and e.value > th.update_high]
    harmed = bool(highs) and (bool(feeding and dead) or (spikes is not None and spikes.step > min(highs)) or (
        ev.loss_rise(min(highs)) is not None and any(d.code == "dead" for d in diags)))  # a rise, and a layer dead at the end
    upd = _update_findings(evs, th, feeding, ev, harmed)
    nan = _nan_finding(first_nonfinite, incidents) if first_nonfinite is not None else None
    lossy = _loss_findings(ev)
    serious = any(f is not None and f.severity != "note" for f in (nan, *upd, dead, spikes, fell, *lossy)) or any(
        f.code != "loss_at_chance" for f in extra) or any(d.code in ("dead", "saturated", "vanishing") for d in diags)
    # a loss at chance is the finding only when nothing else explains it (dead, saturated, vanishing, a loop bug)
    extra = [f for f in extra if f.code != "loss_at_chance" or not serious]
    items += [f for f in (nan, *upd, dead, spikes, fell, *lossy, *extra) if f is not None]
    lr_high = next((f for f in upd if f.code == "lr_high"), None)
    for f in lossy:
        if f.code == "exploding" and lr_high is not None and f.step <= lr_high.step:
            causes["lr_high"] = f.key  # the gradient blew up first: the large updates follow from it
        elif lr_high is not None and f.step >= lr_high.step:
            causes[f.key] = "lr_high"
    if spikes is not None and lr_high is None and any(f.code == "exploding" and f.step <= spikes.step for f in lossy):
        causes["loss_spike"] = "exploding_run"
    if dead is not None and lr_high is not None and feeding:
        causes["became_dead"] = "lr_high"
    if fell is not None and dead is not None and dead.step <= fell.step:
        causes["grad_fell"] = "became_dead"
    elif fell is not None and ev.falls() and not any(f.code == "exploding" for f in lossy):
        # gradients shrink as a loss that falls converges: with no death before it, no harm is seen
        items[items.index(fell)] = replace(fell, severity="note", advice="",
                                           detail=fell.detail.rstrip(".") + ", while the loss fell (converging?).")
    low = next((f for f in upd if f.code == "lr_low"), None)
    if low is not None and dead is not None and dead.step <= low.step:
        causes["lr_low"] = "became_dead"
    causes.update(data_causes(extra))  # what follows from weights decayed to 0, or from an lr decayed far too soon
    if spikes is not None and lr_high is not None and lr_high.step < spikes.step:
        causes["loss_spike"] = "lr_high"
    if nan is not None and spikes is not None and spikes.step < nan.step:
        causes["nonfinite"] = "loss_spike"
    for f in extra:
        if nan is not None and f.key in ("nan_in_loss", "nan_after_model"):
            causes["nonfinite"] = f.key  # the same NaN: the loss made it, or the model's code after its last module
        for k in _FOLLOW_INIT.get(f.key, ()):  # a gradient out of scale from the first step: they follow from it
            causes.setdefault(k, f.key)
        if f.code == "input_scale" and lr_high is not None and f.step <= lr_high.step:
            causes.setdefault("lr_high", f.key)  # raw inputs from the first step: the large updates after (any layer) follow
        if f.code in ("params_not_stepped", "no_optimizer_step", "grad_not_zeroed"):
            for k in ("lr_high", "lr_low", "loss_diverged", "exploding_run", "loss_spike"):
                causes.setdefault(k, f.key)  # the loop bug explains what the updates and the loss did
    causes.update({k: c for k, c in order_causes(items).items() if k not in causes})  # follows from one-class batches
    # the state at the report's step, where no event over the run already says it
    told = {(e.code, e.row) for e in evs}
    for d in diags:
        if d.code == "raised" or (d.code in _NAN_CODES and nan is not None):
            continue
        if d.code in ("dead", "dead_units") and ("became_dead", d.layer) in told:
            continue
        if d.code == "update_ratio" and upd:
            continue  # the run's update finding (a warning with its harm, or a note) says it
        f = _diag_finding(d, step)
        f = harmless_dead_units(f, ev)  # some units silent while the loss falls: a note
        if d.code == "update_ratio" or (d.code == "exploding" and ev.falls() and not lossy):
            # one statistic past a rule of thumb, while the loss falls: no harm seen (a clipped LSTM's raw norm)
            f = replace(f, severity="note", advice="")
        items.append(f)
        if nan is not None and nan.step < step:
            causes[f.key] = "nonfinite"  # the weights may hold NaN since then: what the last step shows follows
        elif dead is not None and dead.step < step and d.code == "update_ratio" and "too low" in d.message:
            causes[f.key] = "became_dead"  # dead units pass no gradient: their layers stop moving
    return rank(items, causes)


def headline(findings: Sequence[Finding], fallback: str = "") -> str:
    """The header: the top root cause's sentence, then (→) up to three of the findings that follow
    from it, in step order, and how many other root causes the list below has; ``fallback`` when
    there is none."""
    if not findings or findings[0].severity == "note":
        notes = sum(1 for f in findings if f.cause < 0)
        return fallback + (f" ({plural(notes, 'note')} below)" if notes and fallback else "")
    root = findings[0]
    follow = sorted((f for f in findings[1:] if f.cause >= 0 and _root_of(findings, f) == 0), key=lambda f: f.step)
    out = root.text
    if follow:
        out += " → " + ", ".join(f.short for f in follow[:3]) + (f" (and {len(follow) - 3} more)" if len(follow) > 3 else "")
    others = sum(1 for i, f in enumerate(findings) if f.cause < 0 and i > 0 and f.severity != "note")
    if others:
        out += f"; {plural(others, 'other finding')} below"
    return out


def _root_of(findings: Sequence[Finding], f: Finding) -> int:
    i = findings.index(f)
    while findings[i].cause >= 0:
        i = findings[i].cause
    return i


def findings_of(report: ThermometerReport, result: Any = None, thresholds: Thresholds | None = None) -> list[Finding]:
    """The ranked findings of a thermometer ``report`` (its events, its diagnoses at ``report.step``)
    and of ``result`` (the capture: incidents, first NaN/Inf)."""
    incidents = list(getattr(result, "incidents", None) or [])
    timed = report.step is not None or bool(report.events)
    first = first_nonfinite_of(result) if (result is not None and timed and getattr(result, "history", None) is not None) else None
    hist = getattr(result, "history", None) if timed else None
    return build(report.events, report.diagnoses, incidents=incidents, first_nonfinite=first, step=int(report.step or 0),
                 th=thresholds, history=timed, evidence=Evidence.of(hist), extra=[*loop_findings(result), *run_findings(result), *data_findings(result),
                        *order_findings(result)] if timed else ())


def live_findings(history: Any, thresholds: Thresholds | None = None, *, flags: np.ndarray,
                  incidents: Sequence[Any] = ()) -> list[Finding]:
    """The ranked findings of a running capture's ``history`` (rows as a chain: the input graph comes
    with the result), its per-step ``flags`` ([K, R], :func:`~nbdebug.inspectors.history.step_flags`)
    and the incidents so far; diagnoses at the last kept step."""
    th = thresholds or Thresholds()
    if not len(history) or not len(history.rows):
        return []
    evs = events(history, th, flags=flags)
    types = [str(i.get("type", "")) for i in history.row_info]
    first = steps_.nonfinite_of_incidents(incidents)
    steps = np.asarray(history.step_index)
    j = len(steps) - 1
    diags, _, _ = diagnoses_at(j, history.values("last"), steps, list(history.rows), types, flags, evs, th, first)
    return build(evs, diags, incidents=incidents, first_nonfinite=first, step=int(steps[j]), th=th, evidence=Evidence.of(history))


def as_json(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """The findings as the widgets sync them (plain JSON)."""
    keys = ("code", "severity", "step", "text", "short", "detail", "advice", "cause")
    return [{**{k: getattr(f, k) for k in keys}, "rows": list(f.rows)} for f in findings]
