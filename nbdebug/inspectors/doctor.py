"""The pre-training checklist's judgements: measured numbers in, a pass/fail/skip verdict out.

Pure computation (no torch, no hooks): :mod:`nbdebug.doctor` runs the passes on copies of the
model and hands the numbers to one ``judge_*`` function per check. Every threshold is a module
constant with the reason it was chosen.

>>> judge_init_loss("classification", loss=2.31, classes=10, baseline=None, logit_std=0.2).status
'pass'
"""

from __future__ import annotations

import math
from typing import Any

from .doctor_report import CONSEQUENCE, CheckResult, DoctorReport, shown_evidence

__all__ = ["CHECKS", "CheckResult", "DoctorReport", "judge_optimizer", "overfit_target", "shown_evidence", "smoothing_floor",
           "softmax_floor"]

#: the checks, in the order they are reported
CHECKS: tuple[str, ...] = ("init_loss", "input_dependence", "batch_independence", "overfit_batch", "optimizer",
                           "dead_units", "gradient_flow", "nonfinite", "input_scale")

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
#: classification: an initial loss above ln C + INIT_EXCESS fails only with logits of at least this std
#: (the softmax saturated at init: one class takes nearly all the probability, whatever the input);
#: below it, an over-confident start is worth a look, not a fault — default initialisations of healthy
#: standard recipes start there too (std up to ~2 in the zoos) and train
INIT_LOGIT_FAIL = 5.0
#: regression: an initial loss above INIT_REG_RATIO × the mean baseline fails only past this ratio (outputs
#: ~10× the targets' spread); targets far from 0 under a zero-centred output start near 100× mean²/var
#: and train (the zoo's sigmoid-free Friedman twin: 10×), worth a look (standardise the targets)
INIT_REG_FAIL = 100.0
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
#: overfit: a curve whose every value is within this (relative) of the first "never moved": nothing was
#: updated (one float32 step of Adam at lr 1e-3 already moves a fresh model's loss by ~1e-3 relative)
UNMOVED = 1e-6
#: overfit: the loss "rose" when its last value exceeds the first by this factor
ROSE = 1.05
#: overfit: the curve is "still falling" when its last fifth dropped by more than this fraction of the total drop
STILL_FALLING = 0.1
#: overfit: a loss that fell by less than this fraction of its first value "barely moved" (a fresh model
#: at a working learning rate loses > 10% of it in the first 20 steps on 8 samples)
BARELY = 0.01
#: overfit: a curve that flattened above the target but at or below this fraction of chance (ln C, or
#: predicting the mean) learns the batch, slowly: worth a look, not a failure. The zoos' faults that
#: flatten (an output that cannot reach its targets, a broadcasting loss) stay at or above chance
LEARNT = 0.5
#: optimizer: parameter names listed in the advice
NAMED = 4
#: input scale: per-channel |mean| or std above this is "not normalised" (raw 0–255 pixels: ~100);
#: [0, 1] images (mean ≈ 0.4, std ≈ 0.3) pass
SCALE_MAX = 5.0
#: input scale: a non-constant channel with std below this is suspiciously tiny
SCALE_MIN = 1e-3


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
            status = "fail" if logit_std >= INIT_LOGIT_FAIL else "warn"
            return CheckResult(status, ev, f"initial loss {loss:.3g} is far above ln {classes} = {expected:.3g}: the "
                               f"model starts confidently wrong (logit std {logit_std:.3g}); scale the last layer's "
                               "weights down (e.g. std 0.01, or zeros) so the first predictions are near uniform."
                               + ("" if status == "fail" else " Models start like this and still train: worth a look, "
                                  f"not a fault (it fails from logit std {INIT_LOGIT_FAIL:g})."))
        if loss < INIT_TOO_LOW * expected:
            return CheckResult("fail", ev, f"initial loss {loss:.3g} is far below chance (ln {classes} = {expected:.3g}) "
                               "for an untrained model: check that labels do not leak into the inputs.")
        return CheckResult("pass", ev, f"initial loss ≈ ln {classes}, as expected for near-uniform predictions.")
    if kind == "regression" and baseline is not None and math.isfinite(baseline):
        ev = {"loss": loss, "mean_baseline": baseline, "ratio": loss / baseline if baseline > 0 else math.inf}
        if loss > INIT_REG_RATIO * baseline and loss - baseline > 1e-12:
            status = "fail" if ev["ratio"] >= INIT_REG_FAIL else "warn"
            return CheckResult(status, ev, f"initial loss {loss:.3g} is {ev['ratio']:.3g}× the loss of predicting the "
                               f"targets' mean ({baseline:.3g}): standardise the targets or initialise the last "
                               "bias to their mean." + ("" if status == "fail" else " Worth a look, not a fault: the "
                                                         f"model can learn the offset (it fails from {INIT_REG_FAIL:g}×)."))
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


def judge_batch_independence(own: float, leak: float, leak_sample: int, sample: int, via: str,
                             changes: bool | None = None) -> CheckResult:
    """``own``: max |∂out_i/∂x_i|; ``leak``: max over j ≠ i of |∂out_i/∂x_j| (at ``leak_sample``);
    ``changes``: whether the output changed when the inputs were zeroed (input_dependence), for the
    wording when no gradient reaches the input."""
    ev = {"sample": sample, "own_grad": own, "max_leak": leak, "leak_from": leak_sample, "via": via}
    if not (math.isfinite(own) and math.isfinite(leak)):
        return skip("the gradients are not finite (see nonfinite)", **ev)
    if leak > LEAK * own and leak > 0:
        return CheckResult("fail", ev, f"sample {sample}'s output depends on sample {leak_sample}'s input (in eval "
                           "mode): a layer mixes samples across the batch (a mean/norm over dim 0, a wrong "
                           "view/transpose of the batch dim); keep operations per sample.")
    if own == 0:
        where = "the input" if via == "input" else f"the input ({via})"
        why = (f"no gradient reaches {where} from sample {sample}'s output (own_grad = 0: ∂out/∂x is "
               "exactly zero), so mixing across the batch cannot be measured")
        if changes:
            why += ("; yet the output changes with the input (input_dependence): the graph is cut on the way "
                    "(a .detach(), .item(), a numpy round trip or torch.no_grad() in forward) and nothing "
                    "before the cut can learn (see gradient_flow).")
        else:
            why += " (see input_dependence)."
        return skip(why, **ev)
    return CheckResult("pass", ev, "no gradient flows between samples of the batch.")


def smoothing_floor(eps: float, classes: int) -> float:
    """The lowest cross-entropy reachable with label smoothing ``eps`` over ``classes`` classes: the entropy
    of the smoothed target (1 − ε + ε/C on the label, ε/C elsewhere); 0 without smoothing."""
    if eps <= 0 or classes < 2:
        return 0.0
    hit, other = 1 - eps + eps / classes, eps / classes
    return -hit * math.log(hit) - (classes - 1) * other * math.log(other)


def overfit_target(reference: float, floor: float = 0.0) -> float:
    """"Near zero" for the overfit run: the loss's own floor (label smoothing) + OVERFIT_FRACTION × chance."""
    return floor + OVERFIT_FRACTION * reference


def judge_overfit(curve: list[float], *, kind: str, classes: int | None, reference: float | None, steps: int,
                  batch: int, probabilities: bool, lowest: float = 0.0) -> CheckResult:
    """``curve``: the loss before each optimizer step and after the last; ``reference``: chance-level loss;
    ``lowest``: the lowest loss reachable (label smoothing's, :func:`smoothing_floor`; 0 otherwise)."""
    finite = [v for v in curve if math.isfinite(v)]
    floor = min(finite) if finite else math.nan
    ev: dict[str, Any] = {"batch": batch, "steps": len(curve) - 1, "initial": curve[0] if curve else math.nan,
                          "floor": floor, "final": curve[-1] if curve else math.nan}
    if reference is None or not math.isfinite(reference) or reference <= 0:
        return skip("no chance-level loss to compare with (unknown loss kind)", **ev, curve=curve)
    target = overfit_target(reference, lowest)
    ev["target"] = target
    if lowest > 0:
        ev["smoothing_floor"] = lowest
    reached = next((i for i, v in enumerate(curve) if v <= target), None)
    ev["reached_at"] = -1 if reached is None else reached
    ev["curve"] = curve
    if len(finite) < len(curve):
        return CheckResult("fail", ev, f"the loss became NaN/Inf at step {len(finite)} while overfitting one batch: "
                           "lower the learning rate (see nonfinite).")
    if reached is not None:
        return CheckResult("pass", ev, f"loss reached {curve[reached]:.3g} (< {target:.3g}) after {reached} steps on one batch.")
    if len(curve) > 1 and max(abs(v - curve[0]) for v in curve) <= UNMOVED * max(abs(curve[0]), 1e-12):
        ev["moved"] = False
        return CheckResult("fail", ev, f"the loss never moved ({curve[0]:.4g} at each of {len(curve) - 1} steps on one "
                           f"batch of {batch}): nothing was updated. The optimizer holds none of these parameters "
                           "(see optimizer), no gradient reaches them (see gradient_flow), or the learning rate is 0.")
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
    text = _overfit_advice(advice, finite, ev)
    if ev["shape"] == "still falling" or (ev["shape"] == "flat" and floor <= LEARNT * reference):
        # it learns this batch, only not to the target within the budget: what healthy models at the
        # user's own learning rate also do (a GRU regression, a cyclic schedule's low phase)
        return CheckResult("warn", ev, text + f" It did fall to {floor:.3g}, {floor / reference:.0%} of chance "
                           f"({reference:.3g}): the model learns this batch, slowly — worth a look, not a fault.")
    return CheckResult("fail", ev, text)


def _overfit_advice(advice: str, finite: list[float], ev: dict[str, Any]) -> str:
    """What the curve says: it rose (updates overshoot), it is still falling (more steps), or it flattened
    above the target (the model cannot fit this batch)."""
    first, last = finite[0], finite[-1]
    k = max(len(finite) // 5, 1)
    tail_drop, drop = finite[-k - 1] - last if len(finite) > k else 0.0, first - min(finite)
    if last > ROSE * first:
        ev["shape"] = "rose"
        return advice + (f"It rose from {first:.3g} to {last:.3g}: the updates overshoot; lower the learning rate "
                         "(or clip gradients).")
    if drop < BARELY * abs(first):
        ev["shape"] = "barely moved"
        return advice + (f"It barely moved ({first:.4g} → {min(finite):.4g}, {drop / max(abs(first), 1e-12):.1%}): the "
                         "updates are far too small; raise the learning rate (or check clipping and the scheduler).")
    if drop > 0 and tail_drop > STILL_FALLING * drop:
        ev["shape"] = "still falling"
        return advice + (f"It is still falling ({finite[-k - 1]:.3g} → {last:.3g} over the last {k} steps): raise "
                         "`steps` (or the learning rate) and run it again.")
    ev["shape"] = "flat"
    return advice + (f"It flattened at {min(finite):.3g}, well above the target: the model cannot fit even this batch. "
                     "Check that the output and the loss agree (no ReLU, sigmoid or softmax before a loss that "
                     "expects raw scores), the labels, and the capacity.")


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


def _ticks(names: list[str], n: int = 3) -> str:
    return ", ".join(f"`{x}`" for x in names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


_CUT = "a .detach(), .item(), a numpy round trip or torch.no_grad() in forward"


def judge_gradient_flow(names: list[str], norms: list[float], unused: list[str]) -> CheckResult:
    """``names``/``norms``: parameter-gradient norm per module with parameters, in model order;
    ``unused``: modules with trainable parameters whose ``.grad`` stayed None after the backward."""
    if not names:
        if unused:
            return CheckResult("fail", {"no_grad": unused}, f"no parameter received a gradient ({_ticks(unused)}): the "
                               f"loss does not reach the model through autograd ({_CUT}?).")
        return skip("no trainable parameter")
    finite = [v for v in norms if math.isfinite(v)]
    ev: dict[str, Any] = {"first": names[0], "last": names[-1], "first_norm": norms[0], "last_norm": norms[-1],
                          "layers": names, "norms": norms}
    if len(finite) < len(norms):
        return skip("some gradients are not finite (see nonfinite)", **ev)
    ratio = norms[0] / norms[-1] if norms[-1] > 0 else (math.inf if norms[0] > 0 else math.nan)
    ev["ratio"] = ratio
    if unused:
        ev["no_grad"] = unused
    if unused:
        return CheckResult("fail", ev, f"no gradient reaches {_ticks(unused)} (.grad stayed None after backward) while "
                           f"{_ticks(names, 2)} {'gets' if len(names) == 1 else 'get'} one: the graph is cut between them ({_CUT}), or they are not used "
                           "by the loss. Those layers cannot learn.")
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


def judge_optimizer(trainable: list[str], missing: list[str], held: int, given: bool) -> CheckResult:
    """``trainable``: the model's trainable parameter names; ``missing``: those the user's optimizer does
    not hold; ``held``: parameters the optimizer holds (any model's); ``given``: an optimizer was passed."""
    if not given:
        return skip("no optimizer given: pass optimizer=<yours> to check it holds the model's trainable parameters "
                    "(the overfit run then uses a copy of it; default Adam, lr 1e-3)")
    if not trainable:
        return skip("the model has no trainable parameter", in_optimizer=held)
    ev: dict[str, Any] = {"trainable": len(trainable), "in_optimizer": held, "missing": len(missing)}
    if missing and len(missing) == len(trainable):
        return CheckResult("fail", ev, f"the optimizer holds {held} parameters, none of this model's {len(trainable)} "
                           "trainable ones: it was built from another model (the model's cell run again after the "
                           "optimizer's?). Build it from model.parameters() after the model.")
    if missing:
        ev["not_in_optimizer"] = missing
        return CheckResult("fail", ev, f"{len(missing)} of the model's {len(trainable)} trainable parameters are in no "
                           f"param group: {_ticks(missing, NAMED)}. They get gradients but are never updated: build "
                           "the optimizer from model.parameters(), or freeze them on purpose (requires_grad_(False)).")
    return CheckResult("pass", ev, f"the optimizer holds all {len(trainable)} trainable parameters.")


#: (cause, checks that fail as its consequence, what the cause is), root causes first: a failing
#: consequence's advice points at the first failed cause that explains it
_CAUSES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("nonfinite", ("init_loss", "input_dependence", "overfit_batch", "gradient_flow"), "NaN/Inf values"),
    ("optimizer", ("overfit_batch",), "the optimizer does not hold the model's parameters"),
    ("input_scale", ("init_loss", "dead_units", "gradient_flow", "overfit_batch"), "the inputs are not normalised"),
    ("dead_units", ("input_dependence", "gradient_flow", "overfit_batch"), "dead units pass neither signal nor gradient"),
    ("input_dependence", ("overfit_batch",), "the output ignores the input"),
    ("init_loss", ("overfit_batch",), "the initial predictions are confidently wrong"),
    ("gradient_flow", ("overfit_batch",), "some layers get no usable gradient"),
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
                c.advice += f" {CONSEQUENCE} {text} (see {cause})."
                explained.add(name)
