"""Where a cell raised inside the model: the module, its inputs and its parameters, as plain data.

>>> site = locate(exc, model, producer)        # doctest: +SKIP
>>> site.module, site.inputs[0].shape, site.inputs[0].producer   # doctest: +SKIP
('head', (4, 800), 'flat')

No hooks: the traceback already holds every frame that was running. The innermost frame whose
``self`` is one of the model's modules is the module that raised; its ``_call_impl`` frame holds
the arguments exactly as they were passed. Only shapes, dtypes and devices are kept (never a
tensor or a frame), so nothing here keeps the user's tensors alive. The messages that say what
does not fit are computed from this data by :func:`nbdebug.inspectors.thermometer.explain_error`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Any

import torch
from torch import nn

from .leaves import tensor_leaves
from .select import unwrap_compiled

__all__ = ["ErrorSite", "ParamInfo", "TensorInfo", "locate"]

# Module attributes that say what a module expects of its input.
CONFIG_KEYS = (
    "in_features", "out_features", "in_channels", "out_channels", "groups", "num_features",
    "normalized_shape", "num_embeddings", "embedding_dim", "kernel_size",
)
_CALL_FRAMES = ("_call_impl", "_wrapped_call_impl")


@dataclass(frozen=True)
class TensorInfo:
    """An input of the module that raised."""

    shape: tuple[int, ...]
    dtype: str
    device: str
    producer: str | None = None  # row name of the captured call that produced it, if any
    producer_input: tuple[int, ...] | None = None  # shape of that call's own (first) input


@dataclass(frozen=True)
class ParamInfo:
    """One of the module's own parameters."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str


@dataclass(frozen=True)
class ErrorSite:
    """The innermost module whose forward was running when the cell raised."""

    module: str  # qualified name ("" for the model itself)
    type: str
    error: str  # "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x800 and 512x10)"
    inputs: tuple[TensorInfo, ...]
    params: tuple[ParamInfo, ...]
    config: dict[str, Any] = field(default_factory=dict)  # in_features, in_channels, ... when present


Producer = Callable[[torch.Tensor], "tuple[str, tuple[int, ...] | None] | None"]


def _dtype(t: torch.Tensor | nn.Parameter) -> str:
    return str(t.dtype).replace("torch.", "")


def _frames(tb: TracebackType | None) -> list[FrameType]:
    out = []
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


def _call_args(frames: list[FrameType], module: nn.Module) -> Any:
    """The module's arguments as passed (its ``_call_impl`` frame), else its forward's parameters."""
    for f in reversed(frames):
        loc = f.f_locals
        if loc.get("self") is module and f.f_code.co_name in _CALL_FRAMES:
            return loc.get("args", ()), loc.get("kwargs", {})
    for f in reversed(frames):
        loc = f.f_locals
        if loc.get("self") is module:
            code = f.f_code
            return tuple(loc.get(v) for v in code.co_varnames[1 : code.co_argcount])
    return ()


def locate(
    exc: BaseException, model: nn.Module, producer: Producer | None = None, tb: TracebackType | None = None
) -> ErrorSite | None:
    """The :class:`ErrorSite` of ``exc`` in ``model``, or None when no module of it was running.

    ``producer(t)`` names the captured call that produced an input tensor (and that call's input
    shape), from the capture's tensor → call map.
    """
    names = {id(m): n for n, m in unwrap_compiled(model).named_modules()}
    frames = _frames(tb if tb is not None else exc.__traceback__)
    module = None
    for f in reversed(frames):
        obj = f.f_locals.get("self")
        if isinstance(obj, nn.Module) and id(obj) in names:
            module = obj
            break
    if module is None:
        return None
    inputs = []
    for _, t in tensor_leaves(_call_args(frames, module)):
        made = producer(t) if producer is not None else None
        inputs.append(TensorInfo(tuple(t.shape), _dtype(t), str(t.device), made[0] if made else None, made[1] if made else None))
    params = tuple(
        ParamInfo(n, tuple(p.shape), _dtype(p), str(p.device)) for n, p in module.named_parameters(recurse=False)
    )
    config = {}
    for key in CONFIG_KEYS:
        v = getattr(module, key, None)
        if isinstance(v, (int, tuple)) and not isinstance(v, bool):
            config[key] = v
    text = str(exc).strip().splitlines()
    error = type(exc).__name__ + (f": {text[0]}" if text else "")
    return ErrorSite(names[id(module)], type(module).__name__, error, tuple(inputs), params, config)
