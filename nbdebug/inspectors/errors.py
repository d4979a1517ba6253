"""A cell that raised inside the model: which module, what it was given, what does not fit.

Pure computation on the metadata the capture kept (:class:`~nbdebug.capture.errors.ErrorSite`):
no tensors, no torch. :func:`explain_error` names the mismatches ("`head` expects 512 input
features, got 800 from `flat` (8×10×10)"); :func:`error_report` makes the thermometer's error card.

>>> error_report(cap.result).headline                   # doctest: +SKIP
'`head` (Linear) raised RuntimeError: `head` expects 512 input features, got 800 from `flat` (8×10×10)'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..capture.errors import ErrorSite, TensorInfo
from ..capture.result import CaptureResult

__all__ = ["ErrorReport", "error_report", "explain_error"]


@dataclass(frozen=True)
class ErrorReport:
    """The module that raised, what it was given and what it holds, and what does not fit."""

    module: str
    type: str
    error: str  # the exception's type and first line
    problems: list[str]  # "`head` expects 512 input features, got 800 from `flat` (8×10×10)"
    inputs: list[str]  # "4×800 float32 cpu, from `flat`"
    params: list[str]  # "weight 10×512 float32 cpu"
    headline: str
    suggestion: str


def _dims(shape: tuple[int, ...] | list[int]) -> str:
    return "×".join(map(str, shape)) if len(shape) else "scalar"


def _source(x: TensorInfo, per_sample: int | None = None) -> str:
    """`` from `flat` (8×10×10)``: the producing row, and its input's per-sample shape when that
    is where ``per_sample`` values came from (a Flatten or a view)."""
    if x.producer is None:
        return ""
    out = f" from `{x.producer}`"
    src = x.producer_input
    if per_sample is not None and src is not None and len(src) > 2 and int(np.prod(src[1:])) == per_sample:
        out += f" ({_dims(src[1:])})"
    return out


def explain_error(site: ErrorSite) -> list[str]:
    """What does not fit between the module that raised and its inputs (pure: metadata only)."""
    out: list[str] = []
    name = f"`{site.module or site.type}`"
    cfg = site.config
    x = site.inputs[0] if site.inputs else None
    weights = [p for p in site.params if p.name == "weight"] or list(site.params)
    if x is not None:
        nd = len(x.shape)
        if "in_features" in cfg and nd and x.shape[-1] != cfg["in_features"]:
            out.append(f"{name} expects {cfg['in_features']} input features, got {x.shape[-1]}{_source(x, x.shape[-1])}")
        if "in_channels" in cfg and weights:
            d = len(weights[0].shape) - 2  # spatial dims of the kernel
            if nd not in (d + 1, d + 2):
                out.append(f"{name} expects a {d + 1}D or {d + 2}D input (channels{', batch' if d else ''} first), got {nd}D {_dims(x.shape)}{_source(x)}")
            else:
                ch = x.shape[1] if nd == d + 2 else x.shape[0]
                if ch != cfg["in_channels"]:
                    out.append(f"{name} expects {cfg['in_channels']} input channels, got {ch}{_source(x)} ({_dims(x.shape)})")
        if "num_features" in cfg and nd >= 2 and x.shape[1] != cfg["num_features"]:
            out.append(f"{name} expects {cfg['num_features']} channels/features (dim 1), got {x.shape[1]}{_source(x)}")
        ns = cfg.get("normalized_shape")
        if isinstance(ns, tuple) and tuple(x.shape[-len(ns):]) != ns:
            out.append(f"{name} normalises over the last dims {_dims(ns)}, got an input ending in {_dims(x.shape[-len(ns):])}{_source(x)}")
        if "num_embeddings" in cfg and not x.dtype.startswith(("int", "uint")):
            out.append(f"{name} expects integer token ids, got {x.dtype}{_source(x)}")
    pdtypes = {p.dtype for p in site.params if p.dtype.startswith(("float", "bfloat"))}
    pdevices = {p.device for p in site.params}
    for t in site.inputs:
        if pdtypes and t.dtype.startswith(("float", "bfloat")) and t.dtype not in pdtypes:
            want = "/".join(sorted(pdtypes))
            out.append(f"{name} has {want} parameters, got a {t.dtype} input{_source(t)}: convert it with .to(torch.{next(iter(sorted(pdtypes)))})")
        if "meta" in pdevices and t.device != "meta":
            out.append(f"{name}'s parameters are on the meta device (never loaded): materialise them (.to_empty(device=...) and load the weights)")
        elif pdevices and t.device not in pdevices:
            out.append(f"{name}'s parameters are on {'/'.join(sorted(pdevices))}, got an input on {t.device}{_source(t)}: move it with .to('{next(iter(sorted(pdevices)))}')")
    return list(dict.fromkeys(out))


def error_report(result: CaptureResult) -> ErrorReport | None:
    """The :class:`ErrorReport` of a cell that raised inside the model (``result.error``), else None."""
    site = result.error
    if site is None:
        return None
    problems = explain_error(site)
    what = problems[0] if problems else site.error
    headline = f"`{site.module}` ({site.type}) raised {site.error.split(':')[0]}: {what}"
    suggestion = (
        "Fix the mismatch above (layer sizes, .to(dtype)/.to(device)); the rows show what ran before the error."
        if problems else "The rows show what ran before the error; compare the input shapes with the module's parameters."
    )
    return ErrorReport(
        module=site.module, type=site.type, error=site.error, problems=problems,
        inputs=[f"{_dims(t.shape)} {t.dtype} {t.device}" + (f", from `{t.producer}`" if t.producer else "") for t in site.inputs],
        params=[f"{p.name} {_dims(p.shape)} {p.dtype} {p.device}" for p in site.params],
        headline=headline, suggestion=suggestion,
    )
