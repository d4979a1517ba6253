"""Findings about the model's output, its input and its weights over the run (pure numpy: no torch, no
Jupyter), from what the history already holds (no new capture cost):

* ``output_loss_mismatch``: the model ends in a module whose output the loss cannot use well — a
  ``Softmax`` over the classes fed to a loss that never gets below the floor of cross-entropy on
  probabilities, ln(1 + (C−1)/e); a ``ReLU`` as the last module with a share of exact zeros (logits
  or a regression output cut at 0: those samples get no gradient); a ``Sigmoid`` whose outputs became
  confident (std ≥ 0.35) while the loss never left [ln(1+e⁻¹), ln(1+e)], the range of
  ``BCEWithLogitsLoss`` on probabilities (a sigmoid applied twice).
* ``batch_mixed``: the model ends in a ``Softmax`` whose outputs average 1/N (N the batch) rather than
  1/C: a softmax over the batch dimension mixes the samples; a ``LogSoftmax`` whose near-uniform first
  output (std ≤ 0.5) averages −ln N (within 0.1) and not −ln C (the mean over the normalised
  dimension of size K is ≤ −ln K, and close to it while the output is near uniform).
* ``loss_at_chance``: a classifier's loss stays at ln C (C = the output's last dimension) over the
  last half of the run while every layer's weights move, and nothing else is wrong (a dead or
  saturated model also sits at chance: then that is the finding): inputs and labels unrelated?
* ``input_scale``: the first layer (a Linear/Conv fed the model's input) outputs values of std ≥ 30
  at the first step: the raw input is far outside the usual scale (normalised inputs give ~1).
* ``weight_decay_dominates``: ‖θ‖ of the stepped layers ends (median of the last fifth) at ≤ 0.5× its
  first step's while the loss does not fall: weight decay dominates the update (healthy runs' ‖θ‖ grows).
* ``dead`` (a mostly silent ReLU layer): a ``ReLU`` module whose outputs are ≥ :data:`SILENT` exact zeros (median
  over the run's last half) while the loss does not fall, though no unit is zero for every sample (``dead`` /
  ``dead_units`` do not fire): the same cause as a dead layer (a bias or init that keeps it below 0), and it stops a
  loss at chance from being blamed on the data.
* ``exploding`` / ``vanishing`` at the first step (:func:`depth_ratio`): the output gradient of the first
  layer with parameters over the last one's, at the first kept step (the init), is ≥ :data:`DEPTH_EXPLODES`
  (the gradient grows toward the input: an error, named as the gradient, not the learning rate), or ≤
  :data:`DEPTH_VANISHES` while the loss does not fall (a warning: the first layers get almost nothing).

>>> [f.code for f in run_findings(result)]                                      # doctest: +SKIP
['output_loss_mismatch']
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..capture.history import FIELD_INDEX
from .events import fmt_g
from .run_evidence import Evidence, Finding, names
from .run_findings_data import batch_statistics
from .run_findings_output import output_findings
from .steps import SUGGEST

__all__ = ["ADVICE", "DEPTH_EXPLODES", "DEPTH_VANISHES", "depth_ratio", "run_findings"]

ADVICE = {
    "output_loss_mismatch": "Give the loss what it expects: logits to F.cross_entropy / BCEWithLogitsLoss (drop the "
                            "final Softmax/Sigmoid/ReLU from the model; apply it only for predictions).",
    "batch_mixed": "Apply softmax over the class dimension (dim=-1 or dim=1), never dim=0 (the batch).",
    "loss_at_chance": "Check that inputs and labels still match (shuffled apart? the wrong column? a constant "
                      "input?): a model that learns nothing from its input stays at the chance loss.",
    "input_scale": "Normalise the input (e.g. x / 255, or subtract the mean and divide by the std per feature).",
    "weight_decay_dominates": "Lower the weight decay (typical: 1e-4–1e-2 for SGD, 0.01–0.1 for AdamW).",
    "batch_probe": "Find the operation that mixes samples (nbdebug.doctor's batch_independence check follows the "
                   "gradient): .transpose/.permute rather than .reshape/.view to reorder dimensions, batch_first=True for "
                   "nn.Transformer*/RNN layers fed (B, T, D), normalisation over features (LayerNorm) or BatchNorm.",
    "exploding_init": "Fix the initialisation scale (He/Kaiming for ReLU, Xavier for tanh, no extra gain), add "
                      "normalisation layers, and clip gradients (torch.nn.utils.clip_grad_norm_): lowering the learning "
                      "rate only hides it.",
    "vanishing_init": "Give the first layers a gradient: a standard initialisation (not scaled down), ReLU/GELU "
                      "instead of saturating activations, normalisation or residual connections (an LSTM/GRU for RNNs).",
}

#: the depth ratio's range over the zoo's healthy runs (min, max), quoted in the findings' detail
DEPTH_HEALTHY = (0.059, 23.3)


def run_findings(result: Any) -> list[Finding]:
    """The output/input/weight findings of a capture ``result`` with a history (else none)."""
    h = getattr(result, "history", None)
    if h is None or len(h) < 2 or not len(h.rows):
        return []
    v = h.values("last")
    info = list(h.row_info)
    types = [str(i.get("type", "")) for i in info]
    shapes = [tuple(i.get("shape") or ()) for i in info]
    ev = Evidence.of(h)
    out: list[Finding] = []
    last = _output_row(result, h)
    if last is not None:
        out += _output_findings(v, h.rows[last], types[last], shapes[last], v[:, last], ev)
    f = _input_scale(result, h, v, types)
    if f is not None:
        out.append(f)
    f = _weights_shrink(v, ev, h)
    if f is not None:
        out.append(f)
    f = _depth_finding(v, h, ev)
    if f is not None:
        out.append(f)
    f = _silent_relu(v, h, types, ev)
    if f is not None:
        out.append(f)
    if not any(x.code == "batch_mixed" for x in out):
        f = _batch_probe_finding(result, h)
        if f is not None:
            out.append(f)
    return out + output_findings(result)  # what the model hands the loss, its first layer's input (the output probe)


#: the batch probe's change (max |Δ output| / max |output| of the first half of the last batch, run with and
#: without its second half, in eval mode) at or above which samples mix: the zoo's 80 probed healthy runs give
#: exactly 0 on CPU (GPU kernels chosen per batch size, TF32 or bf16 can give ~1e-3); its mixing faults 0.067
#: (a transformer layer without batch_first) to 1.04 (a reshape for a transpose)
BATCH_CHANGE = 1e-2


def _batch_probe_finding(result: Any, h: Any) -> Finding | None:
    probe = (getattr(result, "loop", None) or {}).get("batch_probe")
    if not probe or not probe.get("change", 0) >= BATCH_CHANGE:
        return None
    s, b, half = int(h.step_index[-1]), int(probe["batch"]), int(probe["half"])
    if (note := batch_statistics(probe, s)) is not None:
        return note  # statistics over the batch only (a normalisation written by hand): a note
    text = (f"samples mix across the batch: the outputs of the first {half} samples of the last batch changed by "
            f"{probe['change']:.0%} of their scale when its other {b - half} were left out (eval mode, the same weights)")
    detail = (text + ": a reshape where a transpose was meant, a layer fed (B, T, D) that expects (T, B, D) "
              "(batch_first), or statistics taken over the batch at eval. Measured once, after the run, on the last call "
              "(its first dimension taken as the batch).")
    return Finding("batch_mixed", "warning", s, (), text, "samples mixed across the batch", detail,
                   ADVICE["batch_probe"], key="batch_mixed")


#: a ReLU module's share of exact zeros (median over the run's last half) at or above which the layer is mostly silent
#: when the loss does not fall. The project zoo's 94 healthy runs (review 26 R4): 0.91 in `vae_digits`' encoder (max
#: 0.96 at a step), whose units are 88% dead — ``dead_units``' case, left to it (this rule needs < 50%) — and whose loss
#: falls; every other ReLU layer ≤ 0.67 (`deep_sigmoid~`; digits MLPs/CNNs 0.50–0.57). A bias of −1.0 before a 64-unit
#: ReLU: 0.96 with no unit dead on every sample
SILENT = 0.9


def _silent_relu(v: np.ndarray, h: Any, types: list[str], ev: Evidence) -> Finding | None:
    """The most silent ReLU row at or above :data:`SILENT` over ≥ 20 kept steps while the loss does not fall, when
    neither ``dead`` (≥ 99% zeros at the last step) nor ``dead_units`` (≥ 50% of units zero for every sample) says it."""
    if len(v) < 20 or ev.falls():
        return None
    zf, du = _col(v, "zero_frac"), _col(v, "dead_unit_frac")
    best: tuple[float, int] | None = None
    for j, t in enumerate(types):
        z = zf[:, j]
        if t not in ("ReLU", "ReLU6") or not np.isfinite(z[-1]) or z[-1] >= 0.99 or du[-1, j] >= 0.5:
            continue
        late = float(np.nanmedian(z[len(z) // 2:]))
        if late >= SILENT and (best is None or late > best[0]):
            best = (late, j)
    if best is None:
        return None
    late, j = best
    row, a, n = h.rows[j], int(h.step_index[len(v) // 2]), int(h.step_index[-1])
    text = f"`{row}` (ReLU) is mostly silent: {late:.0%} of its outputs are exactly 0 over steps {a}–{n}, and the loss does not fall"
    detail = (f"{text} (healthy runs: ≤ 67%). No unit is zero for every sample, but the layer passes almost nothing "
              "forward and gets almost no gradient back: a bias or an init that keeps it below 0.")
    return Finding("dead", "warning", a, (row,), text, f"`{row}` {late:.0%} zeros", detail, SUGGEST["dead"], key=f"silent:{row}")


#: the first parametrised layer's output gradient over the last one's, at the first kept step: at or above
#: this the gradient explodes toward the input. The zoo's 80 healthy runs with a ratio lie in [0.059, 23.3]
#: (digits MLPs ~0.16, CNNs 0.2–1.4, RNNs ~0.57, LMs 3–15.7 from the embedding to the head); He init ×3
#: over 8 ReLU layers gives 6.1e3 (docs/diagnosis.md)
DEPTH_EXPLODES = 1e3
#: at or below this (and above 0: a dead layer cuts the gradient, that is the dead story) while the loss does
#: not fall, the gradient vanishes toward the input (healthy min 0.059; an RNN whose input and recurrent
#: weights were scaled ×0.01: 3.2e-3)
DEPTH_VANISHES = 1e-2


def depth_ratio(v: np.ndarray, rows: list[str]) -> tuple[float, str, str] | None:
    """(ratio, first row, last row) at the first kept step of ``v [K, R, F]``: the output-gradient norm of
    the first row with a parameter gradient over the last such row's (both finite, the last > 0)."""
    if not len(v):
        return None
    gn, pg = _col(v[0], "grad_norm"), _col(v[0], "param_grad_norm")
    with np.errstate(invalid="ignore"):
        idx = np.flatnonzero(np.isfinite(pg) & np.isfinite(gn) & (gn >= 0))
    if len(idx) < 2 or not gn[idx[-1]] > 0:
        return None
    a, b = int(idx[0]), int(idx[-1])
    return float(gn[a] / gn[b]), rows[a], rows[b]


def _depth_finding(v: np.ndarray, h: Any, ev: Evidence) -> Finding | None:
    d = depth_ratio(v, list(h.rows))
    if d is None:
        return None
    r, first, last = d
    s = int(h.step_index[0])
    if r >= DEPTH_EXPLODES:
        loss0 = ev.loss[0] if len(ev.loss) else math.nan
        said = f"; the first loss was {fmt_g(float(loss0))}" if math.isfinite(loss0) else ""
        text = (f"gradients explode toward the input at step {s}: the output gradient of `{first}` is {fmt_g(r)}× "
                f"that of `{last}`")
        detail = (f"{text} (healthy runs: ≤ {DEPTH_HEALTHY[1]:g}×){said}: the initialisation scale, not the learning "
                  "rate, makes the gradient grow layer after layer.")
        return Finding("exploding", "error", s, (first, last), text, f"gradient {fmt_g(r)}× larger at `{first}` than at `{last}`",
                       detail, ADVICE["exploding_init"], key="exploding_init")
    if 0 < r <= DEPTH_VANISHES and len(ev.steps) >= 20 and not ev.falls():
        text = (f"gradients vanish toward the input: at step {s} the output gradient of `{first}` is {fmt_g(r)}× that of "
                f"`{last}`, and the loss did not fall")
        detail = (f"{text} (healthy runs: ≥ {DEPTH_HEALTHY[0]:g}×): the first layers get almost no gradient and barely learn.")
        return Finding("vanishing", "warning", s, (first, last), text, f"gradient {fmt_g(r)}× smaller at `{first}`",
                       detail, ADVICE["vanishing_init"], key="vanishing_init")
    return None


def _output_row(result: Any, h: Any) -> int | None:
    """The history row of the model's output: the last captured layer no other layer consumed."""
    layers = list(getattr(result, "layers", None) or [])
    if not layers:
        return len(h.rows) - 1
    fed = {j for r in layers for j in r.inputs}
    outs = [i for i in range(len(layers)) if i not in fed]
    if not outs:
        return None
    name = layers[outs[-1]].name
    return h.rows.index(name) if name in h.rows else None


def _col(x: np.ndarray, f: str) -> np.ndarray:
    return np.asarray(x[..., FIELD_INDEX[f]], np.float64)


def _output_findings(v: np.ndarray, row: str, typ: str, shape: tuple[int, ...], x: np.ndarray, ev: Evidence) -> list[Finding]:
    out: list[Finding] = []
    _, loss = ev.steps, ev.loss[np.isfinite(ev.loss)]
    if typ == "Softmax" and len(shape) == 2 and shape[0] > 1 and shape[1] > 1:
        n, c = shape
        mean = float(np.nanmedian(_col(x, "mean")))
        if c != n and abs(mean * n - 1) < 0.02 and abs(mean * c - 1) > 0.1:
            text = f"softmax over the batch: the outputs of `{row}` average 1/{n} (the batch), not 1/{c} (the classes)"
            out.append(Finding("batch_mixed", "warning", 1, (row,), text, "softmax over the batch", text + ": each "
                               "sample's output depends on the other samples.", ADVICE["batch_mixed"], key="batch_mixed"))
        elif abs(mean * c - 1) < 0.02 and len(loss) >= 5:
            floor = math.log(1 + (c - 1) / math.e)
            if float(loss.min()) >= 0.98 * floor:
                text = (f"the model outputs probabilities (`{row}` is a Softmax) and the loss never went below "
                        f"{fmt_g(floor)}, the floor of cross-entropy on probabilities: softmax applied twice?")
                out.append(Finding("output_loss_mismatch", "warning", 1, (row,), text, "probabilities fed to the loss",
                                   text, ADVICE["output_loss_mismatch"], key="output_loss_mismatch"))
    if typ == "LogSoftmax" and len(shape) == 2 and shape[0] > 1 and shape[1] > 1 and shape[0] != shape[1]:
        f = _log_softmax_over_batch(x, row, shape)
        if f is not None:
            out.append(f)
    if typ == "Sigmoid" and len(shape) >= 2 and len(loss) >= 20:
        f = _sigmoid_twice(x, row, loss)
        if f is not None:
            out.append(f)
    if typ in ("ReLU", "ReLU6") and len(shape) >= 2:
        zf = _col(x, "zero_frac")
        late = zf[np.isfinite(zf)][-max(1, len(zf) // 2):]
        if len(late) and float(np.median(late)) >= 0.1:
            text = (f"the model ends in a ReLU (`{row}`): {float(np.median(late)):.0%} of its outputs are exactly 0, "
                    "and those samples get no gradient from the loss")
            out.append(Finding("output_loss_mismatch", "warning", 1, (row,), text, "a ReLU on the output", text + ".",
                               ADVICE["output_loss_mismatch"], key="output_loss_mismatch"))
    if typ not in ("Softmax", "LogSoftmax", "Sigmoid", "ReLU", "ReLU6") and len(shape) == 2 and shape[1] >= 2:
        f = _at_chance(v, row, shape[1], ev)
        if f is not None:
            out.append(f)
    return out


#: BCEWithLogitsLoss of a probability p ∈ (0, 1): at least ln(1 + e^−1) (target 1, p → 1), at most ln(1 + e)
BCE_ON_P = (math.log1p(math.exp(-1.0)), math.log1p(math.e))


def _log_softmax_over_batch(x: np.ndarray, row: str, shape: tuple[int, ...]) -> Finding | None:
    """A LogSoftmax output of N×C whose mean at the first kept step is −ln N (the batch), not −ln C.
    The mean of log-probabilities over the normalised dimension of size K is ≤ −ln K (Jensen), and
    within a few hundredths of it while the output is near uniform (its std ≤ 0.5: the gap is ≈ std²/2):
    so a near-uniform first output whose mean is within 0.1 of −ln N and ≥ 0.3 from −ln C was
    normalised over the batch."""
    n, c = shape
    mean, std = float(_col(x[0], "mean")), float(_col(x[0], "std"))
    if not (math.isfinite(mean) and math.isfinite(std)) or std > 0.5:
        return None
    if abs(mean + math.log(n)) > 0.1 or abs(mean + math.log(c)) < 0.3:
        return None
    text = (f"log-softmax over the batch: the log-probabilities of `{row}` average {fmt_g(mean)} at the first step, "
            f"−ln {n} (the batch), not −ln {c} = {fmt_g(-math.log(c))} (the classes)")
    return Finding("batch_mixed", "warning", 1, (row,), text, "softmax over the batch", text + ": each sample's "
                   "output depends on the other samples.", ADVICE["batch_mixed"], key="batch_mixed")


def _sigmoid_twice(x: np.ndarray, row: str, loss: np.ndarray) -> Finding | None:
    """A model ending in a Sigmoid whose loss stays inside [ln(1+e^−1), ln(1+e)] (every kept step of the
    run: BCEWithLogitsLoss fed probabilities can leave neither bound) while its outputs have become
    confident (std ≥ 0.35 over the last fifth: near 0 and 1): a BCELoss on such outputs would be near 0."""
    lo, hi = BCE_ON_P
    if float(loss.min()) < 0.98 * lo or float(loss[len(loss) // 2:].max()) > 1.02 * hi:
        return None
    sd, mu = _col(x, "std"), _col(x, "mean")
    ok = np.isfinite(sd) & np.isfinite(mu)
    sd, mu = sd[ok], mu[ok]
    k = max(2, len(sd) // 5)
    late = float(np.median(sd[-k:])) if len(sd) else math.nan
    if not (late >= 0.35):
        return None
    # confident outputs with a share m of them near 1: BCEWithLogitsLoss on them cannot go below m·ln(1+e⁻¹) +
    # (1−m)·ln 2 (targets 1 cost ≥ 0.313, targets 0 ≥ 0.693). A BCELoss on soft targets (an autoencoder's
    # pixels, distillation) sits at the targets' entropy, below that floor: not named (h-review T2)
    m = float(np.median(mu[-k:]))
    floor = m * lo + (1 - m) * math.log(2)
    if float(loss[len(loss) // 2:].min()) < 0.98 * floor:
        return None
    text = (f"the model outputs probabilities (`{row}` is a Sigmoid, its outputs near 0 and 1: std {fmt_g(late)}) and "
            f"the loss stays above {fmt_g(floor)}, the floor of BCEWithLogitsLoss on such probabilities (mean "
            f"{fmt_g(m)}): sigmoid applied twice?")
    return Finding("output_loss_mismatch", "warning", 1, (row,), text, "probabilities fed to the loss", text,
                   ADVICE["output_loss_mismatch"], key="output_loss_mismatch")


#: below this many steps (step numbers, not kept steps) a loss at chance is a note: healthy runs can sit on
#: their first plateau that
#: long (the README's digits CNN, SGD lr=0.05 + momentum 0.9, batch 64: 2.29 ≈ ln 10 at step 20, 1.07 at
#: step 46); the zoo's unrelated-label faults run 80 steps and stay at ln 10 throughout
EARLY_STEPS = 50


def _at_chance(v: np.ndarray, row: str, c: int, ev: Evidence) -> Finding | None:
    """The loss of the last half within ±5% of ln C, never below 0.9 ln C there, over ≥ 20 kept
    steps, while some layer moved by ≥ 1e-4 of its norm per step (not a learning rate too low); a
    warning from step :data:`EARLY_STEPS` on, a note before."""
    s, loss = ev.steps[np.isfinite(ev.loss)], ev.loss[np.isfinite(ev.loss)]
    if len(loss) < 20:
        return None
    chance = math.log(c)
    half = loss[len(loss) // 2:]
    if abs(float(np.median(half)) / chance - 1) > 0.05 or float(half.min()) < 0.9 * chance:
        return None
    # and flat there: a model that learns slowly (its loss still falling through chance) is not at chance
    decline = -float(np.polyfit(np.arange(len(half)), half, 1)[0]) * (len(half) - 1)
    if decline >= 0.01 * chance:
        return None
    ur = _col(v, "update_ratio")
    cols = np.isfinite(ur).any(axis=0)
    # every layer with an update ratio moves (a vanishing gradient's first layers do not: that is not chance)
    if not cols.any() or float(np.min(np.nanmedian(ur[:, cols], axis=0))) < 1e-4:
        return None
    # steps, not kept steps: with every= (or buckets merged under --max-bytes) a long run keeps few (h-review T1)
    n, a = int(s[-1]), int(s[len(loss) // 2])
    if n < EARLY_STEPS:  # a healthy run may still be on its first plateau: a note, not a warning
        text = (f"the loss is still at chance after {n} steps ({fmt_g(float(np.median(half)))}, ln {c} = "
                f"{fmt_g(chance)}): too early to tell a slow start from inputs and labels that do not match")
        return Finding("loss_at_chance", "note", int(s[len(loss) // 2]), (row,), text, "loss at chance", text + ".",
                       ADVICE["loss_at_chance"], key="loss_at_chance")
    text = (f"the loss stays at chance: {fmt_g(float(np.median(half)))} over steps {a}–{n}, "
            f"ln {c} = {fmt_g(chance)}, while the weights move")
    return Finding("loss_at_chance", "warning", int(s[len(loss) // 2]), (row,), text, "loss at chance", text +
                   ": inputs and labels unrelated? (labels shuffled apart, a constant input, the wrong column)",
                   ADVICE["loss_at_chance"], key="loss_at_chance")


def _input_scale(result: Any, h: Any, v: np.ndarray, types: list[str]) -> Finding | None:
    layers = list(getattr(result, "layers", None) or [])
    first = next((r for r in layers if not r.inputs), None)
    if first is None or first.name not in h.rows or not any(first.type.startswith(t) for t in ("Linear", "Conv")):
        return None
    i = h.rows.index(first.name)
    std = float(_col(v[0, i], "std"))
    if not (math.isfinite(std) and std >= 30):
        return None
    text = (f"the first layer `{first.name}` outputs values of std {fmt_g(std)} at step {int(h.step_index[0])} "
            "(normalised inputs give about 1): the input is far outside the usual scale")
    return Finding("input_scale", "warning", int(h.step_index[0]), (first.name,), text, "raw inputs", text + ".",
                   ADVICE["input_scale"], key="input_scale")


def _weights_shrink(v: np.ndarray, ev: Evidence, h: Any) -> Finding | None:
    pn = _col(v, "param_norm")
    ok = np.isfinite(pn).all(axis=0) & (pn > 0).all(axis=0)
    if ok.sum() == 0 or len(pn) < 10:
        return None
    total = np.sqrt((pn[:, ok] ** 2).sum(axis=1))
    end = float(np.median(total[-max(2, len(total) // 5):]))
    if end > 0.5 * float(total[0]) or ev.falls():
        return None
    rows = [r for r, k in zip(h.rows, ok, strict=True) if k]
    text = (f"the weights shrank: ‖θ‖ of {names(rows)} fell from {fmt_g(float(total[0]))} to "
            f"{fmt_g(end)} ({fmt_g(end / float(total[0]))}× its start) while the loss did not fall")
    return Finding("weight_decay_dominates", "warning", int(h.step_index[-1]), tuple(rows), text, "weights shrinking",
                   text + ": weight decay dominates the update.", ADVICE["weight_decay_dominates"], key="weight_decay_dominates")
