"""Findings about the training loop itself (pure: no torch, no Jupyter): what the capture saw of the
optimizer, the gradients and the loss that no layer statistic says (docs/diagnosis.md has each code,
its evidence and its limits).

* ``params_not_stepped``: an optimizer stepped, but none (or only some) of the parameters that got
  gradients are in it — an optimizer built from another model (an earlier run of the cell) or from a
  subset. Twin: a body frozen with ``requires_grad_(False)`` gets no gradient, so nothing is said.
* ``no_optimizer_step``: gradients every step, an optimizer holding the model's parameters stepped, and
  not one parameter moved (``step()`` before ``backward()``, ``zero_grad()`` between them); or no
  optimizer stepped at all while the loss did not fall (a hand-written update loop that works makes the
  loss fall: nothing is said then).
* ``grad_not_zeroed``: at the optimizer step, the gradient was the very tensor of the previous step's,
  step after step, and the gradient norm grew (accumulated, never zeroed). Twin: accumulation over k
  micro-batches zeroes after each optimizer step (a new tensor, or no growth).
* ``nan_in_loss``: the model's output was finite and the gradient w.r.t. it was not: the loss made it.
* ``torch_warning``: a PyTorch warning raised inside the cell that points at a bug, once each.

>>> [f.code for f in loop_findings(result)]                                     # doctest: +SKIP
['params_not_stepped']
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..capture.history import FIELD_INDEX
from .run_evidence import Evidence, Finding, names

__all__ = ["ADVICE", "loop_findings"]

ADVICE = {
    "params_not_stepped": "Build the optimizer from this model's parameters after creating the model "
                          "(torch.optim.Adam(model.parameters(), ...)) and re-run the cell that creates both.",
    "no_optimizer_step": "Call optimizer.step() after loss.backward() (order: zero_grad(), forward, loss, "
                         "backward(), step()); never zero_grad() between backward() and step().",
    "grad_not_zeroed": "Call optimizer.zero_grad() once per step (before backward): gradients accumulate "
                       "in .grad until zeroed.",
    "nan_in_loss": "The loss computation made the NaN/Inf (log of 0, 0/0, probabilities outside [0, 1]): use "
                   "the logits losses (F.cross_entropy, BCEWithLogitsLoss), clamp, or add an epsilon.",
    "graph_cut": "Keep the forward in torch between these modules: no .detach(), .item(), .numpy() or "
                 "torch.no_grad() on the path from the loss back to them.",
    "torch_warning": "Read the warning: it points at a shape or usage bug in the loss or the data.",
}


def _get(x: Any, k: str) -> Any:
    return x.get(k) if isinstance(x, dict) else getattr(x, k, None)


def loop_findings(result: Any) -> list[Finding]:
    """The loop's findings of a capture ``result`` (:class:`~nbdebug.capture.result.CaptureResult`)."""
    if result is None:
        return []
    out: list[Finding] = []
    loop = dict(getattr(result, "loop", None) or {})
    hist = getattr(result, "history", None)
    ev = Evidence.of(hist)
    loop.update(_from_history(hist, loop))
    steps = int(getattr(result, "steps", 0) or 0)
    out += _optimizer_findings(loop, ev, steps)
    f = _graph_cut(hist, loop)
    if f is not None:
        out.append(f)
    f = _nan_in_loss(result)
    if f is not None:
        out.append(f)
    for i, (msg, step) in enumerate(loop.get("warnings", [])[:3]):
        text = f"PyTorch warned inside the cell: {msg}"
        out.append(Finding("torch_warning", "warning", int(step), (), text, "a PyTorch warning", text,
                           ADVICE["torch_warning"], key=f"torch_warning:{i}"))
    return out


def _from_history(hist: Any, loop: dict[str, Any]) -> dict[str, Any]:
    """Rows whose parameters got a gradient, rows some optimizer stepped (an update ratio), and whether
    any stepped parameter moved (None: unknown)."""
    if hist is None or not len(hist) or not len(hist.rows):
        return {}
    v = hist.values("last")
    with np.errstate(invalid="ignore"):
        pg, ur = v[:, :, FIELD_INDEX["param_grad_norm"]], v[:, :, FIELD_INDEX["update_ratio"]]
        mods = [str(i.get("module", r)) for r, i in zip(hist.rows, hist.row_info, strict=True)]
        grads = list(dict.fromkeys(m for i, m in enumerate(mods) if bool((np.isfinite(pg[:, i]) & (pg[:, i] > 0)).any())))
        # the modules an optimizer that stepped holds (the watch's plans); else those with an update ratio
        held = loop.get("held_modules")
        stepped = list(held) if held is not None else [m for i, m in enumerate(mods) if bool(np.isfinite(ur[:, i]).any())]
        known = ur[np.isfinite(ur)]
    ours, empty = int(loop.get("optimizer_steps", 0)), int(loop.get("empty_steps", 0))
    moved = True if bool((known > 0).any()) else (False if (ours and empty >= ours) or (len(known) and ours) else None)
    return {"grad_modules": grads, "stepped_modules": stepped, "moved": moved}


def _optimizer_findings(loop: dict[str, Any], ev: Evidence, steps: int) -> list[Finding]:
    grads = list(loop.get("grad_modules", []))  # modules whose parameters got a gradient
    stepped = list(loop.get("stepped_modules", []))  # modules some optimizer stepped
    ours, foreign = int(loop.get("optimizer_steps", 0)), int(loop.get("foreign_steps", 0))
    moved = loop.get("moved")  # some stepped parameter changed (None: unknown)
    if steps < 2 or not grads or "optimizer_steps" not in loop:
        return []  # (a result the optimizer watch did not fill, e.g. built by hand or read from a spool: not judged)
    out = []
    unstepped = [m for m in grads if m not in stepped]
    empty = int(loop.get("empty_steps", 0))
    if ours > 0 and empty >= 0.9 * ours:
        text = f"parameters never changed: the optimizer stepped {ours} times with no gradient to apply"
        out.append(Finding("no_optimizer_step", "error", 1, (), text, "parameters never changed",
                           text + " (step() before backward(), or zero_grad() between backward() and step()).",
                           ADVICE["no_optimizer_step"], key="no_optimizer_step"))
    elif ours == 0 and foreign > 0:
        text = (f"the optimizer stepped {foreign} times but holds none of this model's parameters "
                f"({len(grads)} modules got gradients)")
        out.append(Finding("params_not_stepped", "error", 1, tuple(grads), text, "no parameter of the model stepped",
                           text + ": an optimizer built from another model (an earlier run of the cell?).",
                           ADVICE["params_not_stepped"], key="params_not_stepped"))
    elif ours > 0 and unstepped:
        text = (f"{names(unstepped)} got gradients but no optimizer steps their parameters "
                f"({len(unstepped)} of {len(grads)} modules)")
        out.append(Finding("params_not_stepped", "error", 1, tuple(unstepped), text, f"{names(unstepped)} never stepped",
                           text + ": the optimizer was built from some of the parameters.",
                           ADVICE["params_not_stepped"], key="params_not_stepped"))
    elif ours > 0 and moved is False:
        text = f"parameters never changed: the optimizer stepped {ours} times with no gradient to apply"
        out.append(Finding("no_optimizer_step", "error", 1, (), text, "parameters never changed",
                           text + " (step() before backward(), or zero_grad() between backward() and step()).",
                           ADVICE["no_optimizer_step"], key="no_optimizer_step"))
    elif ours == 0 and foreign == 0 and len(ev.steps) >= 5 and not ev.falls():
        text = f"backward ran in {steps} steps but no optimizer stepped, and the loss did not fall"
        out.append(Finding("no_optimizer_step", "error", 1, (), text, "no optimizer step",
                           text + " (a hand-written update loop is not seen: if you have one, the loss says it did not work).",
                           ADVICE["no_optimizer_step"], key="no_optimizer_step"))
    kept, opt_steps = int(loop.get("grad_kept_steps", 0)), int(loop.get("grad_checked_steps", 0))
    if opt_steps >= 4 and kept >= opt_steps - 1 and _grows(ev):
        g = ev.gnorm[np.isfinite(ev.gnorm)]
        text = (f"gradients never zeroed: .grad held the previous steps' gradients at {kept} of {opt_steps} optimizer "
                f"steps and its norm grew from {g[0]:.3g} to {g[-1]:.3g}")
        out.append(Finding("grad_not_zeroed", "error", 2, (), text, "gradients accumulated across steps",
                           text + ".", ADVICE["grad_not_zeroed"], key="grad_not_zeroed"))
    return out


def _grows(ev: Evidence) -> bool:
    """The total gradient norm grew: its last fifth's median ≥ 3× its first steps', rising at most steps."""
    g = ev.gnorm[np.isfinite(ev.gnorm) & (ev.gnorm > 0)]
    if len(g) < 4:
        return False
    up = float(np.mean(np.diff(g) > 0))
    return float(np.median(g[-max(2, len(g) // 5):])) >= 3.0 * float(g[0]) and up >= 0.6


def _nan_in_loss(result: Any) -> Finding | None:
    """The first NaN/Inf was the gradient w.r.t. the model's output (its last row), in a step whose
    forward stayed finite: the loss (or code after the model) made it."""
    step, phase = getattr(result, "first_nonfinite_step", None), getattr(result, "first_nonfinite_phase", None)
    layers = list(getattr(result, "layers", None) or [])
    if step is None or phase != "output_grad" or not layers:
        return None
    if getattr(result, "backward_origin_row", None) is not None:
        return None  # a layer's backward made it
    row = getattr(result, "backward_nonfinite_row", None)
    fed = {j for r in layers for j in _get(r, "inputs") or ()}
    outputs = [i for i in range(len(layers)) if i not in fed]
    if row is None or row not in outputs:
        return None
    if not ((getattr(result, "loop", None) or {}).get("output_probe") or {}).get("out_is_leaf", True):
        return None  # the model's forward computes more after this row: run_findings_output.nan_after_model
    name = layers[row].name
    text = (f"the loss made the NaN/Inf at step {step}: the model's output (`{name}`) was finite, "
            "the gradient of the loss w.r.t. it was not")
    return Finding("nan_in_loss", "error", int(step), (name,), text, f"NaN/Inf from the loss at step {step}", text + ".",
                   ADVICE["nan_in_loss"], key="nan_in_loss")


def _graph_cut(hist: Any, loop: dict[str, Any]) -> Finding | None:
    """Rows of modules with trainable parameters whose parameters never got a gradient (NaN at every
    step: no backward reached them) before a row whose gradient is known: the graph is cut between the
    last of them and that row. A body frozen with ``requires_grad_(False)`` has no trainable parameter."""
    trainable = set(loop.get("trainable_modules", []))
    if hist is None or len(hist) < 2 or not trainable:
        return None
    v = hist.values("last")
    pg, gn = v[:, :, FIELD_INDEX["param_grad_norm"]], v[:, :, FIELD_INDEX["grad_norm"]]
    mods = [str(i.get("module", r)) for r, i in zip(hist.rows, hist.row_info, strict=True)]
    got = np.isfinite(pg).any(axis=0) | np.isfinite(gn).any(axis=0)
    reached = {m for m, g in zip(mods, got, strict=True) if g}  # a module any of whose rows a gradient reached
    cut = [i for i, m in enumerate(mods) if m in trainable and m not in reached]
    if not cut or not bool(np.isfinite(pg).any()):
        return None
    down = next((i for i in range(cut[-1] + 1, len(mods)) if got[i]), None)
    if down is None:
        return None
    up = max(i for i in range(down) if not got[i])  # the last row before it that no gradient reached
    cut_rows = [hist.rows[i] for i in cut]
    text = (f"the gradient stops between `{hist.rows[up]}` and `{hist.rows[down]}`: {names(cut_rows)} "
            "got no gradient at any step, though trainable")
    return Finding("graph_cut", "error", int(hist.step_index[0]), (hist.rows[up], hist.rows[down]), text,
                   f"no gradient reaches {names(cut_rows)}", text + " (a .detach(), .item(), a numpy round trip or "
                   "torch.no_grad() in the forward between them).", ADVICE["graph_cut"], key="graph_cut")
