"""Findings about what the model hands the loss and what its first layer is fed, where the capture's rows
cannot tell (pure numpy: no torch, no Jupyter). Evidence: the run's loss and rows (the history) and the
output probe (:mod:`nbdebug.runs.output_probe`: the last call run once more after the cell, its model output
and its first layer's input read once), ``result.loop["output_probe"]``. Nothing per step is added.

* ``output_loss_mismatch``:
  - *probabilities fed to cross-entropy* — the model's output (after whatever its ``forward`` does past its
    last layer: ``torch.sigmoid``, ``F.softmax``) lies in [0, 1] (N×C, C ≥ 2), is confident (its std ≥
    :data:`CONFIDENT` × that of one-hot rows), and the loss never went below 0.98 × ln(1 + (C−1)/e), the floor
    of cross-entropy on values in [0, 1], nor above 1.02 × ln(C·e), its ceiling (a loss summed over the batch,
    ``BCELoss(reduction="sum")`` on a multi-label sigmoid, is not cross-entropy's mean);
  - *a bounded output pinned at its bound* — the output lies in (0, 1) or (−1, 1) and sits at one bound
    (mean within :data:`PINNED` of the range from it, std ≤ :data:`PINNED` of the range) while the loss
    never went below the range squared (the largest squared error an output in the range can have
    against a target in it): the targets lie outside what the model can output;
  - *a likelihood loss fed scores* — a classifier-shaped output (N×C, C ≥ 2) and a loss that went below
    :data:`NEGATIVE` and below its start, down to :data:`UNBOUNDED` and still falling in the run's last quarter:
    the negative log-likelihood of a class cannot be negative (``F.nll_loss`` on raw scores rather than
    log-probabilities), and a loss negative by design (a Gaussian NLL, a policy gradient, −cosine) is bounded.
* ``input_scale`` for a first layer the output rule cannot judge (a recurrent layer's output is bounded):
  the first leaf module, fed the model's own input tensor, gets an input of root mean square ≥ :data:`RAW_RMS`.
* ``exploding`` at initialisation, seen in the forward: the model's output at the first step has std ≥
  :data:`OUT_EXPLODES` while its first layer's is below the raw-input line (30): the init's scale grows
  the activations layer after layer (the gradient with them).
* ``nonfinite`` after the model's last module: the first NaN/Inf was the gradient w.r.t. the last module's
  output and no layer's backward made it, but the model's ``forward`` computes its output *from* that
  module's (the probe: the output is neither that tensor nor a view of it), so "the loss made it" cannot be said: the model's
  own code after its last module, or the loss. When the probe finds that code making NaN/Inf from a finite
  last-module output, it says so.

>>> [f.code for f in output_findings(result)]                                 # doctest: +SKIP
['output_loss_mismatch']
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..capture.history import FIELD_INDEX
from .events import fmt_g
from .run_evidence import Evidence, Finding

__all__ = ["CONFIDENT", "NEGATIVE", "OUT_EXPLODES", "PINNED", "RAW_RMS", "UNBOUNDED", "nan_after_model",
           "output_findings", "probabilities_fed_to_ce"]

#: the output's std over that of one-hot rows (√(C−1)/C) at or above which probabilities are confident.
#: The zoo's healthy runs never give a [0, 1] output of N×C, C ≥ 2; the planted sigmoid → cross-entropy 1.0
CONFIDENT = 0.8
#: a bounded output within this share of its range from a bound, with a std below this share: pinned
PINNED = 0.05
#: a loss below this (and below its first value) is negative beyond rounding; the zoo's 81 healthy runs'
#: smallest loss is ≥ 0 (nll_loss on raw scores reaches −3.6e20)
NEGATIVE = -0.05
#: a loss negative on purpose stays bounded (a Gaussian NLL −1.7, REINFORCE −0.4, SimSiam's −cos ≥ −1 on
#: classifier-shaped outputs): a likelihood fed raw scores is unbounded, so the loss must reach this and be
#: still falling in the last quarter of the run (nll_loss on raw scores: −10 by step 8–14, −9e4 by step 40)
UNBOUNDED = -10.0
#: the root mean square of the first layer's input at or above which the input is raw (healthy zoo: ≤ 1.12;
#: an LSTM fed watts: 2,074); the same 30 as the first layer's output std of ``input_scale``
RAW_RMS = 30.0
#: the model output's std at the first step at or above which the forward explodes at init: the zoo's 80
#: healthy runs give ≤ 12.8 (a twin whose last layer is ×60 on purpose), then 2.6; N(0, 1) conv init 3.4e3
OUT_EXPLODES = 100.0
#: the first layer's output std at the first step at or above which the input is raw (``input_scale``)
FIRST_RAW = 30.0

ADVICE = {
    "probs": "Give cross-entropy raw scores (logits): drop the sigmoid/softmax from forward (apply it only for "
             "predictions), or use the loss that expects probabilities (BCELoss; NLLLoss on their log).",
    "pinned": "Let the output reach the targets: drop the final sigmoid/tanh of a regression (or scale the "
              "targets into its range, or scale its output to theirs).",
    "scores": "F.nll_loss expects log-probabilities: apply F.log_softmax to the scores first, or use "
              "F.cross_entropy on the raw scores.",
    "raw": "Normalise the input (subtract the mean and divide by the std per feature, on the training set) "
           "before the first layer.",
    "init": "Use a standard initialisation (PyTorch's default, He/Kaiming for ReLU, Xavier for tanh), not "
            "N(0, 1) weights; normalisation layers also keep the activations' scale.",
    "after": "Find the operation after the model's last module that makes the NaN/Inf (an exp or a division "
             "in half precision overflows past 65,504; log of 0; 0/0): compute it in float32, or with "
             "log_softmax/logsumexp, or add an ε.",
}

_RNN = ("RNN", "GRU", "LSTM", "RNNCell", "GRUCell", "LSTMCell")


def _probe(result: Any) -> dict[str, Any] | None:
    p = (getattr(result, "loop", None) or {}).get("output_probe")
    return p if isinstance(p, dict) else None


def output_findings(result: Any) -> list[Finding]:
    """The findings of this module for a capture ``result`` with a history (else none)."""
    h = getattr(result, "history", None)
    if h is None or len(h) < 2 or not len(h.rows):
        return []
    ev, probe = Evidence.of(h), _probe(result)
    out: list[Finding] = []
    s0 = int(h.step_index[0])
    if probe is not None:
        for rule in (probabilities_fed_to_ce, _pinned):
            f = rule(probe, ev, s0)
            if f is not None:
                out.append(f)
                break
        f = _raw_input(result, probe, s0)
        if f is not None:
            out.append(f)
    f = _negative_loss(result, h, ev)
    if f is not None and not out:
        out.append(f)
    f = _forward_explodes(result, h, ev)
    if f is not None:
        out.append(f)
    f = nan_after_model(result)
    if f is not None:
        out.append(f)
    return out


def _loss(ev: Evidence) -> np.ndarray:
    return ev.loss[np.isfinite(ev.loss)]


def probabilities_fed_to_ce(p: dict[str, Any], ev: Evidence, s0: int) -> Finding | None:
    shape = p.get("shape") or []
    loss = _loss(ev)
    if len(shape) != 2 or shape[1] < 2 or not p.get("finite") or len(loss) < 20:
        return None
    if not (p["min"] >= 0.0 and p["max"] <= 1.0):
        return None
    c = int(shape[1])
    onehot = math.sqrt(c - 1) / c
    floor = math.log(1 + (c - 1) / math.e)
    if p["std"] < CONFIDENT * onehot or float(loss.min()) < 0.98 * floor:
        return None
    if float(loss.max()) > 1.02 * (1 + math.log(c)):  # above ln(C·e), the most CE on [0, 1] values can be (even
        return None  # label-smoothed): a loss summed over the batch or other than CE (BCELoss(reduction="sum"))
    text = (f"the model outputs values in [0, 1] (probabilities: near 0 and 1, std {fmt_g(p['std'])}) and the loss "
            f"never went below {fmt_g(floor)}, the floor of cross-entropy on such values for {c} classes: a "
            "sigmoid/softmax before cross-entropy?")
    detail = (text + " (the model's output as its forward returns it, re-run once on the last batch after the run; "
              "cross-entropy applies its own softmax, so values in [0, 1] can never make it confident).")
    return Finding("output_loss_mismatch", "warning", s0, (), text, "probabilities fed to cross-entropy", detail,
                   ADVICE["probs"], key="output_loss_mismatch")


def _pinned(p: dict[str, Any], ev: Evidence, s0: int) -> Finding | None:
    loss = _loss(ev)
    if not p.get("finite") or len(loss) < 10:
        return None
    lo, hi = (0.0, 1.0) if p["min"] >= 0.0 else (-1.0, 1.0)
    if not (p["min"] >= lo and p["max"] <= hi):
        return None
    span = hi - lo
    at = hi if abs(hi - p["mean"]) <= abs(p["mean"] - lo) else lo
    if abs(p["mean"] - at) > PINNED * span or p["std"] > PINNED * span:
        return None
    late = loss[len(loss) // 2:]
    if float(late.min()) < span ** 2:
        return None
    text = (f"the model's output is bounded in ({fmt_g(lo)}, {fmt_g(hi)}) and pinned at {fmt_g(at)} (mean "
            f"{fmt_g(p['mean'])}, std {fmt_g(p['std'])}) while the loss stays ≥ {fmt_g(float(late.min()))}: "
            "the targets lie outside what the model can output (a sigmoid/tanh on a regression?)")
    detail = (text + f". No target inside ({fmt_g(lo)}, {fmt_g(hi)}) can leave a squared error above "
              f"{fmt_g(span ** 2)}; the output was read once on the last batch after the run.")
    return Finding("output_loss_mismatch", "warning", s0, (), text, "a bounded output far from the targets", detail,
                   ADVICE["pinned"], key="output_loss_mismatch")


def _out_shape(result: Any, h: Any) -> tuple[str, tuple[int, ...]] | None:
    layers = list(getattr(result, "layers", None) or [])
    fed = {j for r in layers for j in r.inputs}
    outs = [i for i in range(len(layers)) if i not in fed]
    if not outs or layers[outs[-1]].name not in h.rows:
        return None
    i = h.rows.index(layers[outs[-1]].name)
    return h.rows[i], tuple(h.row_info[i].get("shape") or ())


def _negative_loss(result: Any, h: Any, ev: Evidence) -> Finding | None:
    o = _out_shape(result, h)
    loss, steps = ev.loss[np.isfinite(ev.loss)], ev.steps[np.isfinite(ev.loss)]
    if o is None or len(o[1]) != 2 or o[1][1] < 2 or len(loss) < 3:
        return None
    below = np.flatnonzero((loss < NEGATIVE) & (loss < loss[0]))
    if not len(below) or not (float(loss.min()) <= UNBOUNDED and int(np.argmin(loss)) >= 3 * len(loss) // 4):
        return None  # negative but bounded (a Gaussian NLL, a policy gradient, −cosine): negative by design
    s, low = int(steps[below[0]]), float(loss.min())
    text = (f"the loss went negative ({fmt_g(float(loss[below[0]]))} at step {s}, down to {fmt_g(low)}): the negative "
            f"log-likelihood of a class cannot be below 0, so the loss is fed scores, not log-probabilities "
            f"(`{o[0]}` outputs {o[1][1]} raw scores)")
    return Finding("output_loss_mismatch", "warning", s, (o[0],), text, "a likelihood loss fed raw scores",
                   text + ": minimising it pushes the scores up without bound.", ADVICE["scores"], key="loss_unbounded")


def _col(h: Any, v: np.ndarray, row: str, f: str) -> float:
    return float(v[0, h.rows.index(row), FIELD_INDEX[f]])


def _raw_input(result: Any, p: dict[str, Any], s0: int) -> Finding | None:
    """A first layer fed the model's input that the output-std rule cannot judge (a recurrent layer)."""
    typ, rms, name = str(p.get("first_type") or ""), p.get("in_rms"), p.get("first")
    if typ not in _RNN or not p.get("first_is_input") or rms is None or not (rms >= RAW_RMS):
        return None
    text = (f"the first layer `{name}` ({typ}) is fed values of root mean square {fmt_g(rms)} (normalised inputs "
            "give about 1): the input is far outside the usual scale")
    detail = text + "; its gates and tanh saturate. Read once after the run, on the last batch."
    return Finding("input_scale", "warning", s0, (name,), text, "raw inputs", detail, ADVICE["raw"], key="input_scale")


def _forward_explodes(result: Any, h: Any, ev: Evidence) -> Finding | None:
    o = _out_shape(result, h)
    layers = list(getattr(result, "layers", None) or [])
    first = next((r for r in layers if not r.inputs), None)
    if o is None or first is None or first.name not in h.rows:
        return None
    v = h.values("last")
    out_std, first_std = _col(h, v, o[0], "std"), _col(h, v, first.name, "std")
    if not (math.isfinite(out_std) and out_std >= OUT_EXPLODES) or not (first_std < FIRST_RAW):
        return None
    s = int(h.step_index[0])
    loss0 = float(ev.loss[0]) if len(ev.loss) and math.isfinite(ev.loss[0]) else math.nan
    said = f"; the first loss was {fmt_g(loss0)}" if math.isfinite(loss0) else ""
    text = (f"activations explode at initialisation: at step {s} the model's output `{o[0]}` has std {fmt_g(out_std)}, "
            f"its first layer `{first.name}` {fmt_g(first_std)}")
    detail = (f"{text} (healthy runs: ≤ 13 at the output){said}: the weights' scale multiplies the activations layer "
              "after layer, and the gradient with them; the learning rate is not the cause.")
    return Finding("exploding", "error", s, (first.name, o[0]), text, f"output std {fmt_g(out_std)} at step {s}", detail,
                   ADVICE["init"], key="exploding_forward")


def nan_after_model(result: Any) -> Finding | None:
    """The first NaN/Inf was the gradient w.r.t. the last module's output (no layer's backward made it) while
    the model's forward computes its output from that module's: the model's own code after it, or the loss."""
    p = _probe(result)
    step, phase = getattr(result, "first_nonfinite_step", None), getattr(result, "first_nonfinite_phase", None)
    if p is None or p.get("out_is_leaf", True) or step is None or phase != "output_grad":
        return None
    if getattr(result, "backward_origin_row", None) is not None:
        return None
    layers = list(getattr(result, "layers", None) or [])
    row = getattr(result, "backward_nonfinite_row", None)
    fed = {j for r in layers for j in r.inputs}
    if row is None or row in fed or row >= len(layers):
        return None
    name, top = layers[row].name, str(p.get("model_type") or "the model")
    if p.get("leaf_finite") and not p.get("finite"):
        text = (f"the model's own forward makes the NaN/Inf after its last module `{name}` (first at step {step}): "
                f"re-run on the last batch, `{name}`'s output is finite and the model's output is not")
        detail = text + f" (code in `{top}.forward` after `{name}`: an exp or a division overflowing, a log of 0, 0/0)."
    else:
        text = (f"first NaN/Inf at step {step} after the model's last module `{name}` (its output was finite): made by "
                f"`{top}.forward`'s own code after `{name}` or by the loss")
        detail = text + (". The model's forward computes its output from that module's, so the loss cannot be told "
                         "apart from that code here; nbdebug.doctor's nonfinite check runs the forward alone.")
    return Finding("nonfinite", "error", int(step), (name,), text, f"NaN/Inf after `{name}` at step {step}", detail,
                   ADVICE["after"], key="nan_after_model")
