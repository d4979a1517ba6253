"""The pre-training checklist's judgements: measured numbers in, a pass/fail/skip verdict out.

Pure computation (no torch, no hooks): :mod:`nbdebug.doctor` runs the passes on copies of the
model and hands the numbers to one ``judge_*`` function per check. Every threshold is a module
constant with the reason it was chosen.

>>> judge_init_loss("classification", loss=2.31, classes=10, baseline=None, logit_std=0.2).status
'pass'
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CHECKS", "CheckResult", "DoctorReport", "shown_evidence", "softmax_floor"]

#: the checks, in the order they are reported
CHECKS: tuple[str, ...] = ("init_loss", "input_dependence", "batch_independence", "overfit_batch", "dead_units",
                           "gradient_flow", "nonfinite", "input_scale")

#: classification: initial loss may exceed ln C by this much. With i.i.d. logits of std s at
#: init the expected cross-entropy is ≈ ln C + s²/2, so 0.5 allows logits up to std ≈ 1 (softmax
#: still near uniform); PyTorch's default init gives s ≈ 0.1–0.6 (excess < 0.2), a last layer with
#: std 10 gives s in the tens (excess in the tens).
INIT_EXCESS = 0.5
#: classification: an initial loss below this fraction of ln C is too good for a random model
#: (labels leaking into the inputs, or a loss that is not what it seems)
INIT_TOO_LOW = 0.5
#: regression: initial loss may be this many times the loss of predicting the targets' mean
INIT_REG_RATIO = 4.0
#: input dependence: outputs on zeroed inputs that differ by less than this (relative) are "the same"
SAME_OUTPUT = 1e-6
#: batch independence: the largest gradient of sample i's output w.r.t. another sample's input,
#: relative to the gradient w.r.t. its own input. Without mixing it is exactly 0 (no path in the graph).
LEAK = 1e-6
#: overfit: "near zero" is this fraction of the chance-level loss (ln C, or predicting the mean)
OVERFIT_FRACTION = 0.05
#: overfit: a flat curve this close (relative) to the double-softmax floor ln(1 + (C−1)/e) names it
FLOOR_TOLERANCE = 0.02
#: dead units: a layer fails when more than this fraction of its units is zero for every sample
DEAD_FRACTION = 0.5
#: gradient flow: first/last layer gradient-norm ratio outside [1/RATIO, RATIO] fails
GRAD_RATIO = 1e3
#: input scale: per-channel |mean| or std above this is "not normalised" (raw 0–255 pixels: ~100);
#: [0, 1] images (mean ≈ 0.4, std ≈ 0.3) pass
SCALE_MAX = 5.0
#: input scale: a non-constant channel with std below this is suspiciously tiny
SCALE_MIN = 1e-3


@dataclass
class CheckResult:
    """One check's verdict: ``status`` ("pass" | "fail" | "skip"), ``evidence`` (numbers and short
    lists, e.g. the overfit loss curve) and ``advice`` (what to do; for a skip, why it was skipped)."""

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
    ``failed`` (the failed names in order), ``kind`` ("classification" | "regression" | "unknown"),
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

    def ordered(self) -> list[tuple[str, CheckResult]]:
        """The checks as the views list them: failed first, then the rest, each in checklist order."""
        items = list(self.checks.items())
        return [x for x in items if x[1].status == "fail"] + [x for x in items if x[1].status != "fail"]

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
        return (f"<div class='nbdebug-doctor-static'><b>nbdebug doctor</b>: {verdict} · {html.escape(self.kind)}"
                f"{f', {self.classes} classes' if self.classes else ''} · {self.elapsed_s:.2f} s"
                "<table><tr><th>check</th><th>status</th><th>evidence</th><th>advice</th></tr>"
                + "".join(rows) + "</table>" + (f"<ul>{notes}</ul>" if notes else "") + "</div>")


_MARK = {"pass": "✓", "fail": "✗", "skip": "–"}
_COLOUR = {"pass": "#1b5e20", "fail": "#b71c1c", "skip": "#616161"}  # ≥ 6:1 on white (WCAG AA)


def _short(v: Any) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def softmax_floor(classes: int) -> float:
    """The lowest cross-entropy reachable when the model's outputs are already probabilities
    (double softmax): one-hot p gives ``-log(e / (e + C - 1)) = ln(1 + (C-1)/e)``."""
    return math.log1p((classes - 1) / math.e)


def skip(reason: str, **evidence: Any) -> CheckResult:
    """A check that does not apply, with the reason."""
    return CheckResult("skip", dict(evidence), reason)


def judge_init_loss(kind: str, *, loss: float, classes: int | None, baseline: float | None, logit_std: float) -> CheckResult:
    """Classification: ``loss`` within [INIT_TOO_LOW·ln C, ln C + INIT_EXCESS]. Regression: ``loss``
    at most INIT_REG_RATIO × ``baseline`` (the loss of predicting the targets' mean)."""
    if not math.isfinite(loss):
        return skip("the initial loss is not finite (see nonfinite)", loss=loss)
    if kind == "classification" and classes and classes > 1:
        expected = math.log(classes)
        ev = {"loss": loss, "expected": expected, "classes": classes, "logit_std": logit_std}
        if loss > expected + INIT_EXCESS:
            return CheckResult("fail", ev, f"initial loss {loss:.3g} is far above ln {classes} = {expected:.3g}: the "
                               f"model starts confidently wrong (logit std {logit_std:.3g}); scale the last layer's "
                               "weights down (e.g. std 0.01, or zeros) so the first predictions are near uniform.")
        if loss < INIT_TOO_LOW * expected:
            return CheckResult("fail", ev, f"initial loss {loss:.3g} is far below chance (ln {classes} = {expected:.3g}) "
                               "for an untrained model: check that labels do not leak into the inputs.")
        return CheckResult("pass", ev, f"initial loss ≈ ln {classes}, as expected for near-uniform predictions.")
    if kind == "regression" and baseline is not None and math.isfinite(baseline):
        ev = {"loss": loss, "mean_baseline": baseline, "ratio": loss / baseline if baseline > 0 else math.inf}
        if loss > INIT_REG_RATIO * baseline and loss - baseline > 1e-12:
            return CheckResult("fail", ev, f"initial loss {loss:.3g} is {ev['ratio']:.3g}× the loss of predicting the "
                               f"targets' mean ({baseline:.3g}): standardise the targets or initialise the last "
                               "bias to their mean.")
        return CheckResult("pass", ev, "initial loss is close to the loss of predicting the targets' mean.")
    return skip("unknown loss kind: no expected initial loss (use cross_entropy/nll for classes, mse/l1 for regression)",
                loss=loss)


def judge_input_dependence(change: float, scale: float) -> CheckResult:
    """``change``: max |f(x) − f(0)|; ``scale``: max |f(x)|."""
    ev = {"max_change": change, "output_scale": scale}
    if not (math.isfinite(change) and math.isfinite(scale)):
        return skip("the outputs are not finite (see nonfinite)", **ev)
    if change <= SAME_OUTPUT * max(scale, 1e-12):
        return CheckResult("fail", ev, "the output is the same when the inputs are zeroed: the model ignores its "
                           "input (check that forward uses its argument, and the data pipeline).")
    return CheckResult("pass", ev, "the output changes when the inputs are zeroed.")


def judge_batch_independence(own: float, leak: float, leak_sample: int, sample: int, via: str) -> CheckResult:
    """``own``: max |∂out_i/∂x_i|; ``leak``: max over j ≠ i of |∂out_i/∂x_j| (at ``leak_sample``)."""
    ev = {"sample": sample, "own_grad": own, "max_leak": leak, "leak_from": leak_sample, "via": via}
    if not (math.isfinite(own) and math.isfinite(leak)):
        return skip("the gradients are not finite (see nonfinite)", **ev)
    if leak > LEAK * own and leak > 0:
        return CheckResult("fail", ev, f"sample {sample}'s output depends on sample {leak_sample}'s input (in eval "
                           "mode): a layer mixes samples across the batch (a mean/norm over dim 0, a wrong "
                           "view/transpose of the batch dim); keep operations per sample.")
    if own == 0:
        return skip(f"sample {sample}'s output does not depend on its own input (see input_dependence)", **ev)
    return CheckResult("pass", ev, "no gradient flows between samples of the batch.")


def judge_overfit(curve: list[float], *, kind: str, classes: int | None, reference: float | None, steps: int,
                  batch: int, probabilities: bool) -> CheckResult:
    """``curve``: the loss before each optimizer step and after the last; ``reference``: chance-level loss."""
    finite = [v for v in curve if math.isfinite(v)]
    floor = min(finite) if finite else math.nan
    ev: dict[str, Any] = {"batch": batch, "steps": len(curve) - 1, "initial": curve[0] if curve else math.nan,
                          "floor": floor, "final": curve[-1] if curve else math.nan}
    if reference is None or not math.isfinite(reference) or reference <= 0:
        return skip("no chance-level loss to compare with (unknown loss kind)", **ev, curve=curve)
    target = OVERFIT_FRACTION * reference
    ev["target"] = target
    reached = next((i for i, v in enumerate(curve) if v <= target), None)
    ev["reached_at"] = -1 if reached is None else reached
    ev["curve"] = curve
    if len(finite) < len(curve):
        return CheckResult("fail", ev, f"the loss became NaN/Inf at step {len(finite)} while overfitting one batch: "
                           "lower the learning rate (see nonfinite).")
    if reached is not None:
        return CheckResult("pass", ev, f"loss reached {curve[reached]:.3g} (< {target:.3g}) after {reached} steps on one batch.")
    advice = f"the loss only fell to {floor:.3g} in {steps} steps on one batch of {batch} (target {target:.3g}). "
    if kind == "classification" and classes and classes > 1:
        sf = softmax_floor(classes)
        ev["softmax_floor"] = sf
        tail = finite[-max(len(finite) // 5, 2):]
        flat = len(tail) > 1 and max(tail) - min(tail) <= 0.02 * max(abs(min(tail)), 1e-12) + 1e-4
        near = flat and abs(floor - sf) <= FLOOR_TOLERANCE * sf
        if probabilities or near:
            ev["outputs_are_probabilities"] = probabilities
            why = (f"It flattens near ln(1 + (C−1)/e) = {sf:.3g}" if near else
                   f"The outputs are already probabilities (non-negative, summing to 1), so it cannot go below "
                   f"ln(1 + (C−1)/e) = {sf:.3g}")
            return CheckResult("fail", ev, advice + why + ", the floor of a double softmax: remove the softmax at the "
                               "end of the model (cross_entropy applies log-softmax itself).")
    return CheckResult("fail", ev, advice + "Check the model can fit (capacity, learning rate, a bug in the loss or "
                       "labels); raise `steps` if the curve is still falling.")


def judge_dead_units(layers: list[tuple[str, int, int]], samples: int) -> CheckResult:
    """``layers``: (row name, dead units, units) of every float layer output (dead: zero for every sample)."""
    if not layers:
        return skip("no layer output with units to check")
    worst = max(layers, key=lambda r: r[1] / max(r[2], 1))
    bad = [(n, d, u) for n, d, u in layers if u and d / u > DEAD_FRACTION]
    ev: dict[str, Any] = {"samples": samples, "worst_frac": worst[1] / max(worst[2], 1)}
    if worst[1]:
        ev["worst_layer"] = worst[0]
        ev["layers"] = [n for n, d, _ in layers if d]
        ev["dead_frac"] = [round(d / max(u, 1), 4) for _, d, u in layers if d]
    if bad:
        names = ", ".join(f"`{n}` {d}/{u}" for n, d, u in bad[:3])
        return CheckResult("fail", ev, f"units zero for all {samples} samples: {names}. A large negative bias or "
                           "weights (or inputs far from 0) kill ReLUs: check the init and input scale, or use "
                           "LeakyReLU/GELU.")
    return CheckResult("pass", ev, f"no layer has more than {DEAD_FRACTION:.0%} of its units dead on this batch.")


def judge_gradient_flow(names: list[str], norms: list[float], unused: list[str]) -> CheckResult:
    """``names``/``norms``: parameter-gradient norm per module with parameters, in model order."""
    if not names:
        return skip("no parameter received a gradient", unused=unused)
    finite = [v for v in norms if math.isfinite(v)]
    ev: dict[str, Any] = {"first": names[0], "last": names[-1], "first_norm": norms[0], "last_norm": norms[-1],
                          "layers": names, "norms": norms}
    if len(finite) < len(norms):
        return skip("some gradients are not finite (see nonfinite)", **ev)
    ratio = norms[0] / norms[-1] if norms[-1] > 0 else (math.inf if norms[0] > 0 else math.nan)
    ev["ratio"] = ratio
    if unused:
        ev["no_grad"] = unused
    zero = [n for n, v in zip(names, norms, strict=True) if v == 0]
    if zero:
        return CheckResult("fail", ev, f"no gradient reaches {', '.join(f'`{n}`' for n in zero[:3])}: something "
                           "upstream blocks it (dead units, a detach, an argmax) — those layers cannot learn.")
    if ratio < 1 / GRAD_RATIO:
        return CheckResult("fail", ev, f"gradients vanish: the first layer's gradient norm is {ratio:.2g}× the last's; "
                           "use normalisation, residual connections or a better-scaled init.")
    if ratio > GRAD_RATIO:
        return CheckResult("fail", ev, f"gradients explode: the first layer's gradient norm is {ratio:.2g}× the last's; "
                           "lower the init scale, add normalisation, or clip gradients.")
    return CheckResult("pass", ev, "gradient norms are within three orders of magnitude from first to last layer.")


def judge_nonfinite(origin: str | None, phase: str | None, step: int | None) -> CheckResult:
    """``origin``: the first layer (or "loss"/parameter) with NaN/Inf, ``phase`` where it was seen."""
    if origin is None:
        return CheckResult("pass", {}, "no NaN/Inf in the forward, the loss, the gradients or the overfit run.")
    ev: dict[str, Any] = {"origin": origin, "phase": phase or ""}
    if step is not None:
        ev["step"] = step
        return CheckResult("fail", ev, f"the loss became NaN/Inf at overfit step {step}: lower the learning rate or "
                           "clip gradients.")
    if phase == "input":
        return CheckResult("fail", ev, "the inputs already contain NaN/Inf: clean the data (missing values, "
                           "division by a zero std in normalisation).")
    return CheckResult("fail", ev, f"NaN/Inf first appears in `{origin}` ({phase}): check that layer's inputs "
                       "(log of ≤ 0, division by ~0, overflow in half precision).")


def judge_input_scale(means: list[float], stds: list[float], integer: bool) -> CheckResult:
    """Per-channel (dim 1; the only dim of 1-D inputs) means and stds of the floating inputs."""
    if integer:
        return skip("integer inputs (token ids, indices): scale does not apply")
    if not means:
        return skip("no floating-point input")
    ev = {"mean": max(means, key=abs), "std": max(stds), "min_std": min(stds), "channels": len(means)}
    if max(abs(m) for m in means) > SCALE_MAX or max(stds) > SCALE_MAX:
        return CheckResult("fail", ev, f"inputs are not normalised (|mean| up to {abs(ev['mean']):.3g}, std up to "
                           f"{ev['std']:.3g}): standardise them ((x − mean) / std per channel; raw 0–255 pixels: "
                           "divide by 255 then normalise).")
    live = [s for s in stds if s > 0]
    if live and min(live) < SCALE_MIN:
        return CheckResult("fail", ev, f"some input channels vary by only {min(live):.2g}: rescale them to unit std.")
    return CheckResult("pass", ev, "inputs are roughly zero-mean, unit-scale.")


#: (cause, checks that fail as its consequence, what the cause is), root causes first: a failing
#: consequence's advice points at the first failed cause that explains it
_CAUSES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("nonfinite", ("init_loss", "input_dependence", "overfit_batch", "gradient_flow"), "NaN/Inf values"),
    ("input_scale", ("init_loss", "dead_units", "gradient_flow", "overfit_batch"), "the inputs are not normalised"),
    ("dead_units", ("input_dependence", "gradient_flow", "overfit_batch"), "dead units pass neither signal nor gradient"),
    ("input_dependence", ("overfit_batch",), "the output ignores the input"),
    ("init_loss", ("overfit_batch",), "the initial predictions are confidently wrong"),
)


def cross_reference(checks: dict[str, CheckResult]) -> None:
    """Append to a failed check's advice the root cause among the other failed checks (in place)."""
    explained: set[str] = set()
    for cause, effects, text in _CAUSES:
        if cause in explained or checks.get(cause) is None or checks[cause].status != "fail":
            continue
        for name in effects:
            c = checks.get(name)
            if c is not None and c.status == "fail" and name not in explained:
                c.advice += f" Possibly a consequence: {text} (see {cause})."
                explained.add(name)
