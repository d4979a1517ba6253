"""What the model hands the loss, and what its first layer is fed: one probe, run once after a training cell.

The per-step capture sees every leaf module's output, never the model's own output (a ``torch.sigmoid``,
a softmax, a division written in the top module's ``forward`` after its last layer is no module) nor a
recurrent layer's input scale (its output is bounded). After a cell that ran backward, the model's last
call is run once more as nbdebug's own pass (:func:`~nbdebug.runs.own.own_pass`: no grad, buffers cloned,
RNG forked, the user's hooks set aside) in eval mode (the modes and every attribute a forward rebinds are
put back), with a forward hook of its own on every leaf module for that pass only (references to the first
floating-point input and to the last output: no host read). Two host reads at the end (is the output finite;
then every statistic at once, in the output's own dtype: no float32 copy of a finite output) give:

* ``out``: the model's output (:func:`~nbdebug.adapters.outputs.logits_of`) — its shape, min, max, mean,
  std and whether it is finite;
* ``out_is_leaf``: whether that output is the very tensor the last leaf module returned, or a view of it (the
  model's ``forward`` computes nothing after its last module, ``.squeeze(1)`` aside: what the capture saw of that
  row *is* the model's output);
  ``leaf_finite``: whether the last leaf's output was finite;
* ``first``, ``first_type``, ``in_rms``: the first leaf module fed a floating-point tensor, its type and the
  root mean square of that input; ``first_is_input``: whether that input is the model's own input (the same
  storage and size: a view of it, not a copy the forward normalised); ``model_type``: the model's class name.

>>> output_probe(model, ((x,), {}))                                   # doctest: +SKIP
{'shape': [64, 3], 'min': 0.001, 'max': 0.999, 'mean': 0.34, 'std': 0.46, 'finite': True, 'out_is_leaf': False, ...}
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from ..adapters.outputs import logits_of
from ..capture.state import preserve_modes
from .batch_probe import attributes_kept, batch_rest, plain
from .own import own_pass

__all__ = ["output_probe", "probes_after_cell"]


def _first_float(args: Any) -> torch.Tensor | None:
    return next((t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()), None)


def _view_of(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` is ``b`` seen through a view (``.squeeze``, ``.view``, ``.reshape`` without a copy): no computation."""
    return a.data_ptr() == b.data_ptr() and a.numel() == b.numel() and a.dtype == b.dtype


def output_probe(model: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]]) -> dict[str, Any] | None:
    """The model's output and its first layer's input on the last call (see the module docstring); None
    when it cannot be run again (a distributed, compiled or offloaded model; the model raising; no
    floating-point output)."""
    return probes_after_cell(model, inputs, batch=False).get("output_probe")


def probes_after_cell(model: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]], *,
                      batch: bool = True) -> dict[str, dict[str, Any]]:
    """Both post-cell probes from ONE own pass over the whole batch (eval mode, no grad, buffers cloned, RNG forked,
    the user's hooks set aside): this probe's hooks ride on it, then (``batch``) the batch probe's half-batch pass
    follows (:func:`~nbdebug.runs.batch_probe.batch_rest`) — one forward fewer than running the two probes apart.
    ``{"batch_probe": …, "output_probe": …}``, each key only when its probe gave a result."""
    if not plain(model):
        return {}
    args, kwargs = inputs
    seen: dict[str, Any] = {}
    names = {m: n for n, m in model.named_modules()}

    def hook(m: nn.Module, a: tuple[Any, ...], out: Any) -> None:
        if "first" not in seen:
            x = _first_float(a)
            if x is not None:
                seen["first"], seen["first_type"], seen["x"] = names.get(m, ""), type(m).__name__, x
        seen["leaf"] = out

    leaves = [m for m in model.modules() if not list(m.children())]
    handles: list[Any] = []
    found: dict[str, dict[str, Any]] = {}
    try:
        with own_pass(model), preserve_modes(model), attributes_kept(model):
            model.eval()
            handles = [m.register_forward_hook(hook) for m in leaves]
            try:
                raw = model(*args, **kwargs)
            finally:
                for h in handles:
                    h.remove()
            b = batch_rest(model, inputs, raw) if batch else None  # the whole batch's pass serves both probes
            if b is not None:
                found["batch_probe"] = b
    except Exception:  # a model that cannot be run again here: no probe
        return {}
    finally:
        for h in handles:
            h.remove()
    out = _summary(model, raw, seen, inputs)
    if out is not None:
        found["output_probe"] = out
    return found


def _summary(model: nn.Module, raw: Any, seen: dict[str, Any],
             inputs: tuple[tuple[Any, ...], dict[str, Any]]) -> dict[str, Any] | None:
    """The output probe's result from the whole batch's output ``raw`` and what its hooks ``seen`` (two host reads)."""
    args, kwargs = inputs
    out = logits_of(raw)
    if not (isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel()):
        return None
    leaf = seen.get("leaf")
    o = out.detach()
    finite = bool(torch.isfinite(o).all())
    # no float32 copy of a finite output (a half-precision LM's logits can be large): its own dtype's statistics
    vals = o.reshape(-1) if finite else o[torch.isfinite(o)].float()
    vals = vals if vals.numel() else o.new_zeros(1, dtype=torch.float32)
    var, mean = torch.var_mean(vals, correction=1) if vals.numel() > 1 else (vals.new_zeros(()), vals.mean())
    parts = [vals.amin(), vals.amax(), mean, var.sqrt()]
    parts = [t.float().to(o.device) for t in parts]
    leaf_t = leaf if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() else None
    one = torch.ones((), device=o.device)
    parts.append(torch.isfinite(leaf_t.detach()).all().float().to(o.device) if leaf_t is not None else one)
    x = seen.get("x")
    parts.append(x.detach().pow(2).mean(dtype=torch.float32).sqrt().to(o.device) if x is not None else one * math.nan)
    lo, hi, mean, std, leaf_finite, rms = torch.stack([p.reshape(()) for p in parts]).tolist()  # one host read
    xs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    is_input = x is not None and any(t.data_ptr() == x.data_ptr() and t.numel() == x.numel() for t in xs)
    return {"shape": list(out.shape), "min": lo, "max": hi, "mean": mean, "std": std, "finite": finite,
            "out_is_leaf": leaf_t is not None and (out is leaf_t or _view_of(out, leaf_t)), "leaf_finite": bool(leaf_finite),
            "first": seen.get("first"), "first_type": seen.get("first_type"), "in_rms": rms,
            "first_is_input": is_input, "model_type": type(model).__name__}
