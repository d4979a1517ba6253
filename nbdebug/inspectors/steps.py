"""The thermometer at one kept step of a capture's history: the diagnoses, the summary parts and
the :class:`~nbdebug.inspectors.thermometer.ThermometerReport` (pure numpy: no torch, no Jupyter).

The flags come from :func:`~nbdebug.inspectors.history.step_flags` (every kept step at once), the
events from :func:`~nbdebug.inspectors.events.events`; at the run's first non-finite step the
capture's per-call check decides the origins exactly (a NaN that came in with the model's input has
no origin layer). Every number a diagnosis cites is the table's at
that step, except the dead-unit story, which cites its became-dead event's own steps.

>>> rep = diagnose_at(result, Thresholds(), None)          # the last kept step   # doctest: +SKIP
>>> rep.summary                                                                  # doctest: +SKIP
'step 5: 4 layers: dead units in 1 layer (1) from step 3 (learning rate too high)'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..capture.history import FIELD_INDEX
from ..capture.result import CaptureResult
from .events import SUGGEST_EVENTS, Event, events, fmt_g, fmt_pct
from .history import FLAG_BITS, Thresholds, flag_names, input_graph, step_flags
from .report import COLUMNS, Diagnosis, ThermometerReport

__all__ = ["SUGGEST", "FirstNonfinite", "dead_summary", "diagnose_at", "diagnoses_at", "first_nonfinite_of", "nonfinite_of_incidents", "plural"]


def plural(n: int, word: str) -> str:
    """``"1 layer"``, ``"3 layers"``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


SUGGEST = {
    "dead": "Check the init (Kaiming/He for ReLU layers) and the bias of the layer before it, lower the learning rate, or try LeakyReLU/GELU.",
    "saturated": "Scale the pre-activations down (init, normalisation before the activation) or lower the learning rate.",
    "nan_origin_fwd": "Look at this layer's op for log/sqrt/division of values ≤ 0 or overflow (add an epsilon, clamp), and at its weights (NaN from an earlier bad step?).",
    "nan_input": "Check the input batch (torch.isfinite(x).all()) and functional ops in the parent module's forward().",
    "nan_origin_bwd": "The backward of this layer produced NaN/Inf from finite gradients: look for sqrt/log/pow at 0, division by small numbers; clip gradients or add an epsilon.",
    "exploding": "Clip gradients (torch.nn.utils.clip_grad_norm_), lower the learning rate, or add normalisation.",
    "vanishing": "Use residual connections or normalisation, ReLU-family activations, and check the init scale.",
    "dead_units": "These units output zero for every sample: check the init and the bias of the layer before, lower the learning rate, or try LeakyReLU/GELU.",
    # the same texts as the update-ratio events': one piece of advice is said once (the views dedupe by text)
    "update_high": SUGGEST_EVENTS["update_high"],
    "update_high_seen": SUGGEST_EVENTS["update_high_seen"],
    "update_low": SUGGEST_EVENTS["update_low"],
}


class FirstNonfinite(NamedTuple):
    """The run's first NaN/Inf: its step, a row name and where it appeared: "forward" (``row`` made it
    from finite inputs), "input" (it came in with the model's input; ``row`` is the first layer to see
    it), "between" (already in ``row``'s input, made by code between captured modules or the input),
    "backward" (the gradient went non-finite in ``row``'s backward) or "parameter gradients"."""

    step: int
    row: str | None
    where: str


def first_nonfinite_of(result: CaptureResult) -> FirstNonfinite | None:
    """:class:`FirstNonfinite` of ``result`` (None when everything stayed finite)."""
    step, phase = result.first_nonfinite_step, result.first_nonfinite_phase
    if step is None:
        return None
    rows = result.layers
    inc = getattr(result, "incident", None)
    row = inc.row if inc is not None else None
    if phase == "forward":
        call = result.forward_nonfinite_call
        where = "forward"
        if call is not None:
            row = row or rows[call[0]].name
            if call[1] is False:  # the first non-finite output had a non-finite input: no layer made it
                where = input_where(rows, call[0])
        return FirstNonfinite(step, row, where)
    if phase == "output_grad":
        g = result.backward_origin_row if result.backward_origin_row is not None else result.backward_nonfinite_row
        return FirstNonfinite(step, row or (rows[g].name if g is not None else None), "backward")
    return FirstNonfinite(step, row, "parameter gradients")


_SUGGEST_WHERE = {"forward": "nan_origin_fwd", "input": "nan_input", "between": "nan_input"}


def input_where(layers: Sequence[Any], row: int) -> str:
    """Where a NaN/Inf already in the input of ``layers[row]`` (the first non-finite output) came from:
    "input" when that row runs first and no captured row fed it (the model's input), else "between"
    (code between captured modules, e.g. ``torch.log`` in a parent's forward, or a later input)."""
    return "input" if row == 0 and not layers[row].inputs else "between"


def nonfinite_where(row: str | None, where: str) -> str:
    """``in `b` (forward)``, ``from the model's input (first seen in `a`)``… (see :class:`FirstNonfinite`)."""
    if where == "input":
        return "from the model's input" + (f" (first seen in `{row}`)" if row else "")
    if where == "between":
        return f"before `{row}` (its input was already non-finite)"
    return f"in `{row}` ({where})" if row else f"({where})"


def nan_part(first: FirstNonfinite, many: bool = True) -> str:
    """The summary's part for the first NaN/Inf: ``first non-finite value at step 3, in `b` (forward)``
    (one step: ``NaN first appears in `b` (forward)``, ``NaN comes from the model's input …``)."""
    where = nonfinite_where(first.row, first.where)
    if many:
        return f"first non-finite value at step {first.step}, {where}"
    return f"NaN comes {where}" if first.where == "input" else f"NaN first appears {where}"


def input_nan_message(who: str, at: str, direct: bool) -> str:
    """A NaN/Inf that no captured layer made: ``who`` (the first layer to see it) got it with its input."""
    if direct:
        return f"NaN/Inf{at} comes from the model's input: {who}, the first layer to see it, was given a non-finite input."
    return (f"NaN/Inf{at} was already in the input of {who}, the first layer to see it: it comes from the model's "
            "input or from code between captured modules.")


def _names(xs: list[str]) -> str:
    """Module names as names in prose (`` `3` ``, never a bare number): ``"`1`, `3`"``."""
    return ", ".join(f"`{x}`" for x in xs[:3]) + ("…" if len(xs) > 3 else "")


def dead_summary(dead: list[str], units: list[str], story: dict[str, Event]) -> list[str]:
    """Summary parts for dead layers and layers with dead units; the earliest became-dead story among
    them adds "from step k (learning rate too high)" to the last part."""
    parts = []
    if dead:
        parts.append(f"{len(dead)} dead layer{'s' * (len(dead) != 1)} ({_names(dead)})")
    if units:
        parts.append(f"dead units in {len(units)} layer{'s' * (len(units) != 1)} ({_names(units)})")
    told = [story[n] for n in dead + units if n in story]
    if told and parts:
        e = min(told, key=lambda e: e.step)
        parts[-1] += f" from step {e.step}" + (" (learning rate too high)" if "learning rate too high" in e.message else "")
    return parts


def diagnoses_at(j: int, values: np.ndarray, steps: np.ndarray, rows: Sequence[str], types: Sequence[str],
                 bits: np.ndarray, evs: Sequence[Event], thresholds: Thresholds | None = None,
                 first_nonfinite: FirstNonfinite | tuple[int, str | None] | None = None,
                 inputs: Sequence[Sequence[int]] | None = None) -> tuple[list[Diagnosis], list[str], float | None]:
    """Diagnoses, summary parts and the first/last gradient-norm ratio at kept slot ``j`` of ``values [K, R, F]`` with flags ``bits [K, R]``.

    Every number cited is ``values[j]`` (the table at that step), except the dead-unit story, which
    cites the became-dead event's own steps. ``first_nonfinite``: the run's first NaN/Inf
    (:class:`FirstNonfinite`; a ``(step, row)`` pair is taken as a forward one), to say where it came
    from at its step, and when a later step's NaN is inherited from it. ``inputs``: the row input graph;
    a forward origin no captured row feeds is only known to have had finite inputs at the step the
    capture checked.
    """
    th = thresholds or Thresholds()
    s = int(steps[j])
    x = {f: values[j, :, i] for f, i in FIELD_INDEX.items()}
    fl = [flag_names(int(b)) for b in bits[j]]
    story = {e.row: e for e in evs if e.code == "became_dead" and e.step <= s}
    diags: list[Diagnosis] = []
    parts: list[str] = []
    first = None if first_nonfinite is None else FirstNonfinite(*first_nonfinite, *(("forward",) if len(first_nonfinite) == 2 else ()))

    def rows_with(code: str) -> list[int]:
        return [i for i, f in enumerate(fl) if code in f]

    def name(i: int) -> str:
        return f"`{rows[i]}` ({types[i]})" if types[i] else f"`{rows[i]}`"

    later = ""
    if first is not None and first.step < s:
        later = f" The first non-finite value was at step {first.step}, {nonfinite_where(first.row, first.where)}: the weights may hold NaN since."
    if first is not None and first.step == s and first.where in ("input", "between"):
        who = name(list(rows).index(first.row)) if first.row in rows else f"`{first.row}`"
        diags.append(Diagnosis("nonfinite", "error", first.row or "", input_nan_message(who, f" at step {s}", first.where == "input"),
                               SUGGEST["nan_input"]))
    checked = first is not None and first.step == s and first.where == "forward"
    for i in rows_with("nan_origin_fwd"):
        fed = inputs is None or bool(inputs[i]) or (checked and first is not None and first.row == rows[i])
        what = " while its inputs were finite" if fed else "; no captured layer feeds it: its input (the model's input?) or its weights hold NaN/Inf"
        diags.append(Diagnosis("nan_origin_fwd", "error", rows[i],
                               f"{name(i)} outputs NaN/Inf at step {s}{what}.{later}", SUGGEST["nan_origin_fwd"]))
    for i in rows_with("nan_origin_bwd"):
        diags.append(Diagnosis("nan_origin_bwd", "error", rows[i],
                               f"Backward: the gradient becomes NaN/Inf at step {s} in or just after {name(i)}.{later}", SUGGEST["nan_origin_bwd"]))
    if first is not None and first.step <= s:
        parts.append(nan_part(first))
        if first.step < s and not any({"nan_origin_fwd", "nan_origin_bwd", "nonfinite"} & set(f) for f in fl):
            diags.append(Diagnosis("nonfinite", "error", first.row or "",
                                   f"NaN/Inf first appeared at step {first.step} {nonfinite_where(first.row, first.where)}"
                                   f"; step {s} is finite again (choose step {first.step} to see where it came from).",
                                   SUGGEST[_SUGGEST_WHERE.get(first.where, "nan_origin_bwd")]))
    dead, units = rows_with("dead"), [i for i in rows_with("dead_units") if "dead" not in fl[i]]
    for code, idx in (("dead", dead), ("dead_units", units)):
        for i in idx:
            now = (f"{name(i)} outputs {x['zero_frac'][i]:.1%} exact zeros at step {s}: its units are dead and pass no gradient"
                   if code == "dead" else f"{name(i)}: {fmt_pct(float(x['dead_unit_frac'][i]))} of its units are zero for every sample at step {s}")
            e = story.get(rows[i])
            if e is not None:
                now = (f"{x['zero_frac'][i]:.1%} exact zeros at step {s}" if code == "dead"
                       else f"{fmt_pct(float(x['dead_unit_frac'][i]))} at step {s}")
            msg = f"{e.message}; {now}." if e else now + "."
            diags.append(Diagnosis(code, "warning", rows[i], msg, e.suggestion if e else SUGGEST[code]))
    parts += dead_summary([rows[i] for i in dead], [rows[i] for i in units], story)
    for i in rows_with("saturated"):
        diags.append(Diagnosis("saturated", "warning", rows[i],
                               f"{name(i)} has {x['saturated_frac'][i]:.1%} of its outputs within 1e-3 of its bounds at step {s}: saturated, gradients vanish there.",
                               SUGGEST["saturated"]))
    if rows_with("saturated"):
        parts.append(f"{len(rows_with('saturated'))} saturated layer{'s' * (len(rows_with('saturated')) != 1)}")
    explo, vani = rows_with("exploding"), rows_with("vanishing")
    if explo:
        big = np.fmax(x["grad_norm"][explo], x["param_grad_norm"][explo])
        diags.append(Diagnosis("exploding", "error", rows[explo[0]],
                               f"gradient norm above the threshold at step {s} in {len(explo)} layer{'s' * (len(explo) != 1)} (largest {fmt_g(float(np.nanmax(big)))}, first at `{rows[explo[0]]}`).",
                               SUGGEST["exploding"]))
        parts.append(f"exploding gradients in {len(explo)} layer{'s' * (len(explo) != 1)}")
    if vani:
        diags.append(Diagnosis("vanishing", "warning", rows[vani[0]],
                               f"gradient norm below the threshold at step {s} in {len(vani)} layer{'s' * (len(vani) != 1)} (first at `{rows[vani[0]]}`).",
                               SUGGEST["vanishing"]))
        parts.append("vanishing gradients")
    ur = x["update_ratio"]
    upd = rows_with("update_ratio")
    for high in (True, False):  # too high and too low are two findings (two fixes), never one flag for both
        idx = [i for i in upd if (ur[i] > th.update_high) == high]
        if not idx:
            continue
        listed = ", ".join(f"`{rows[i]}` {fmt_g(float(ur[i]))}" for i in idx[:3]) + ("…" if len(idx) > 3 else "")
        how = f"high (above {th.update_high:g})" if high else f"too low (below {th.update_low:g})"
        # high alone is no harm (docs/diagnosis.md): "info", as the browser's step texts say it (h-review T3)
        diags.append(Diagnosis("update_ratio", "info" if high else "warning", rows[idx[0]],
                               f"update ratio ‖Δθ‖/‖θ‖ {how} at step {s} in {plural(len(idx), 'layer')}: {listed}.",
                               SUGGEST["update_high_seen" if high else "update_low"]))
        parts.append(f"update ratio {'high' if high else 'too low'} in {plural(len(idx), 'layer')}")
    # First/last layer output-gradient ratio; behind dead units the gradient is cut: not "vanishing".
    ratio = None
    gn = x["grad_norm"]
    act = np.flatnonzero(np.isfinite(gn))
    if len(act) >= 2 and gn[act[-1]] > 0:
        ratio = float(gn[act[0]] / gn[act[-1]])
        if any("dead" in f or "dead_units" in f for f in fl):
            pass
        elif ratio < th.ratio:
            diags.append(Diagnosis("vanishing", "warning", "", f"the gradient norm at the first layer is {ratio:.2g}× the last layer's at step {s}: gradients vanish toward the input.", SUGGEST["vanishing"]))
            if "vanishing gradients" not in parts:
                parts.append("vanishing gradients")
        elif ratio > 1 / th.ratio:
            diags.append(Diagnosis("exploding", "warning", "", f"the gradient norm at the first layer is {ratio:.2g}× the last layer's at step {s}: gradients grow toward the input.", SUGGEST["exploding"]))
    return diags, parts, ratio


def diagnose_at(result: CaptureResult, th: Thresholds, step: int | None) -> ThermometerReport:
    """The report at one kept step of ``result.history`` (the last when ``step`` is None)."""
    h = result.history
    steps = h.step_index
    j = len(steps) - 1 if step is None else h.slot_of(step)
    s = int(steps[j])
    rows = result.layers
    hrows = list(h.rows)
    graph = input_graph(rows, hrows)
    info = h.row_info
    values = h.values("last")
    layer_type = {r.name: r.type for r in rows}
    types = [layer_type.get(n) or str(i.get("type", "")) for n, i in zip(hrows, info)]
    skipped = h.scalar("skipped") == 1
    bits = step_flags(values, types, th, dtypes=[str(i.get("dtype", "")) for i in info], inputs=graph, skipped=skipped,
                      shapes=[i.get("shape") for i in info])
    # At the run's first non-finite step, the capture's per-call check names the origins exactly: a
    # forward origin (none when the NaN came in with an input), and a backward origin only at a step
    # whose forward was finite (else the gradient carries the forward's NaN back: inherited).
    hid = {n: i for i, n in enumerate(hrows)}
    nonfinite = np.uint16(FLAG_BITS["nonfinite"])

    def slot(st: int | None) -> int | None:
        k = np.flatnonzero(steps == st) if st is not None else []
        return int(k[0]) if len(k) else None

    def make_origin(k: int, row: int | None, code: str) -> None:
        b = np.uint16(FLAG_BITS[code])
        bad = (bits[k] & b) > 0
        bits[k, bad] = (bits[k, bad] & ~b) | nonfinite
        if row is not None and rows[row].name in hid:
            bits[k, hid[rows[row].name]] = (bits[k, hid[rows[row].name]] & ~nonfinite) | b

    call, k = result.forward_nonfinite_call, slot(result.forward_nonfinite_step)
    if call is not None and k is not None and (rows[call[0]].name in hid or not call[1]):
        make_origin(k, call[0] if call[1] else None, "nan_origin_fwd")
    g = result.backward_origin_row if result.backward_origin_row is not None else result.backward_nonfinite_row
    k = slot(result.backward_nonfinite_step)
    fwd_bad = [FIELD_INDEX["nan"], FIELD_INDEX["inf"]]
    if g is not None and k is not None and rows[g].name in hid and not skipped[k] and not (np.nan_to_num(values[k][:, fwd_bad]) > 0).any():
        make_origin(k, g, "nan_origin_bwd")
    evs = events(h, th, inputs=graph, flags=bits)
    first_nf = first_nonfinite_of(result)
    first = None if first_nf is None else first_nf.step
    diags, parts, ratio = diagnoses_at(j, values, steps, hrows, types, bits, evs, th, first_nf, graph)
    # The table in result.layers order (the widget's row index is the layer index).
    table = np.full((len(rows), len(COLUMNS)), np.nan)
    pick = [hid.get(r.name, -1) for r in rows]
    for c, col in enumerate(COLUMNS):
        if col in FIELD_INDEX:
            table[:, c] = [values[j, i, FIELD_INDEX[col]] if i >= 0 else np.nan for i in pick]
    present = np.isfinite(table).any(axis=1)
    table[:, COLUMNS.index("numel")] = [float(np.prod(r.shape)) if p else np.nan for r, p in zip(rows, present)]
    flags = [flag_names(int(bits[j, i])) if i >= 0 else [] for i in pick]
    hflags = np.stack([bits[:, i] if i >= 0 else np.zeros(len(steps), np.uint16) for i in pick], axis=1) if rows else bits[:, :0]
    if result.raised is not None:
        parts.append(f"the cell raised {result.raised.split(':')[0]}")
    head = f"step {s}: {plural(len(rows), 'layer')}"
    summary = f"{head}: " + ", ".join(parts) if parts else f"{head}: no problems found"
    notes = list(result.notes) + list(getattr(h, "notes", []))
    notes.append(f"table and flags at step {s} of {result.steps} ({plural(len(steps), 'kept step')}); flags are decided "
                 "per step, events over the kept steps; numel is one call's, near-zero is only in the whole-run table")
    return ThermometerReport(
        names=[r.name for r in rows], modules=[r.module for r in rows], types=[r.type for r in rows],
        shapes=[r.shape for r in rows], dtypes=[r.dtype for r in rows], calls=[r.calls for r in rows],
        table=table, flags=flags, diagnoses=diags, summary=summary, notes=list(dict.fromkeys(notes)), grad_ratio=ratio,
        steps=result.steps, first_nonfinite_step=first, step=s, events=evs, step_index=steps, history_flags=hflags,
    )


def nonfinite_of_incidents(incidents: Sequence[Any]) -> FirstNonfinite | None:
    """The first NaN/Inf from the capture's incidents (dicts or objects; the live view has no result yet)."""
    phase = {"forward": "forward", "output_grad": "backward", "param_grad": "parameter gradients"}
    for inc in incidents:
        get = inc.get if isinstance(inc, dict) else (lambda k, inc=inc: getattr(inc, k, None))
        if get("kind") == "nonfinite":
            return FirstNonfinite(int(get("step") or 0), get("row"), phase.get(str(get("phase")), "forward"))
    return None
