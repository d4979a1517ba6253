"""The host statistics while TorchDynamo traces (``torch.compile``, compiled autograd): one custom op,
``nbdebug::host_stats``, instead of a graph break at the native kernel's C entry point.

Eagerly nothing here runs per call: the hooks call the CPython module's ``stats`` directly
(METH_FASTCALL, ~0.5 µs; a dispatcher round trip would add several µs). Only a traced call takes
the op, and the choice costs the eager path nothing:

- :mod:`.native` registers its C entry points here (:func:`decline_in_graph`):
  :func:`torch.compiler.substitute_in_graph` makes TorchDynamo see, in their place, a function that
  declines (returns None, as they do for a tensor they do not take); eagerly the C function runs
  untouched. Its ctypes path declines on :data:`is_compiling` (checked only there);
- :mod:`.stats` checks :data:`is_compiling` on the branch the kernel's None already
  leads to (eagerly: the slower numpy/torch path) and calls :func:`traced_stats`: the op, whose CPU
  kernel is the eager host path itself (:func:`serve`; the values are the eager ones, bit for bit)
  and whose fake gives a float64 ``[9]`` row and a bool ``[C]`` unit mask.

Registering needs ``torch._dynamo`` (seconds to import): done at once when it is imported already,
else right after it is (:func:`~.eager.after_dynamo`), never by importing it here.
Without the op (registration failed) a traced call runs the eager host path traced, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .eager import after_dynamo

__all__ = ["OP_NAME", "decline_in_graph", "is_compiling", "serve", "status", "traced_stats"]

OP_NAME = "nbdebug::host_stats"
_SCHEMA = "(Tensor t, float[]? saturation, float sat_eps, bool units) -> (Tensor, Tensor)"

Kernel = Callable[[torch.Tensor, "tuple[float, float] | None", float, bool], "tuple[np.ndarray, np.ndarray | None]"]


def _never() -> bool:
    return False


#: True while TorchDynamo traces the calling code, else False: ``torch.compiler.is_dynamo_compiling``
#: (eagerly a bare ``return False``, the cheapest such check; TorchDynamo folds it to True), or
#: ``is_compiling`` on a torch without it, or never (before 2.3)
is_compiling: Callable[[], bool] = getattr(torch.compiler, "is_dynamo_compiling", None) or getattr(torch.compiler, "is_compiling", _never)

_lock = threading.RLock()
_kernel: Kernel | None = None  # the eager host path (stats.host_stats), given by serve()
_op: Any = None  # the custom op once defined
_pending: list[Callable[..., Any]] = []  # C entry points to decline while tracing, not registered yet
_declined: dict[int, Callable[..., Any]] = {}  # id -> entry point registered (kept alive: ids stay unique)
_status = "not registered (torch._dynamo not imported)"


def status() -> str:
    """One line: whether the op and the polyfills are registered, or why not."""
    return _status


def serve(kernel: Kernel) -> None:
    """Use ``kernel(t, saturation, sat_eps, units) -> (row, alive)`` (the eager host path, never routed
    through the op itself) as the op's CPU kernel; the op is defined as soon as TorchDynamo is there."""
    global _kernel
    with _lock:
        _kernel = kernel
    after_dynamo(_register)


def decline_in_graph(*entry_points: Callable[..., Any]) -> None:
    """Make TorchDynamo trace each C entry point as a function returning None (eagerly unchanged)."""
    with _lock:
        _pending.extend(f for f in entry_points if id(f) not in _declined)
    after_dynamo(_register)


def traced_stats(t: torch.Tensor, saturation: tuple[float, float] | None, sat_eps: float,
                 units: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """``(row, alive)`` of a CPU tensor while TorchDynamo traces: the op, results as numpy arrays
    (TorchDynamo hands them over as such). ``alive`` is the bool ``[C]`` mask when ``units`` and ``t``
    has 2 or more dims (every unit True when no value is zero: the eager path's None), else None."""
    op, kernel = _op, _kernel
    if op is None:  # not registered: the eager path, traced (graph breaks, same values)
        assert kernel is not None, "stats.host_stats is served at import"
        return kernel(t, saturation, sat_eps, units)
    row, alive = op(t.detach(), saturation, sat_eps, units)
    return row.numpy(), (alive.numpy() if units and t.dim() >= 2 else None)


def _register() -> None:
    """Define the op (once a kernel is served) and register the pending entry points; any error
    leaves the traced eager path (never raised: this runs inside an import or a hook's first call)."""
    global _op, _status
    try:
        import torch._dynamo  # imported already; waits while another thread is importing it
    except Exception as e:  # that import failed there: no tracing either
        _status = f"not registered ({type(e).__name__}: {e})"
        return
    with _lock:
        try:
            if _op is None and _kernel is not None:
                _op = _define()
            while _pending:
                f = _pending.pop()
                if id(f) not in _declined:
                    try:
                        torch.compiler.substitute_in_graph(f, skip_signature_check=True)(_declines)
                    except ValueError:  # "Duplicate ...": registered by an earlier copy of this module
                        pass
                    _declined[id(f)] = f
            _status = f"registered ({OP_NAME}; {len(_declined)} entry points declined while tracing)"
        except Exception as e:  # a torch without these APIs: graph breaks, same values
            _pending.clear()
            _status = f"not registered ({type(e).__name__}: {e})"


def _declines(*_args: object) -> None:
    """What TorchDynamo traces in place of a C entry point: None (the caller takes the op)."""
    return None


def _define() -> Any:
    """The custom op: its CPU kernel calls the served eager path, its fake gives the shapes."""

    def host_stats(t: torch.Tensor, saturation: list[float] | None, sat_eps: float, units: bool) -> tuple[torch.Tensor, torch.Tensor]:
        assert _kernel is not None
        row, alive = _kernel(t, None if saturation is None else (saturation[0], saturation[1]), sat_eps, units)
        if alive is None:
            return torch.from_numpy(row), torch.ones(_units(t, units), dtype=torch.bool)
        return torch.from_numpy(row), torch.as_tensor(alive)  # numpy, or torch's bool mask of a large tensor

    def fake(t: torch.Tensor, saturation: list[float] | None, sat_eps: float, units: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return t.new_empty(9, dtype=torch.float64), t.new_empty(_units(t, units), dtype=torch.bool)

    try:
        op = torch.library.custom_op(OP_NAME, host_stats, mutates_args=(), device_types="cpu", schema=_SCHEMA)
    except RuntimeError:  # defined already (this module imported again): that op, this kernel
        return torch.ops.nbdebug.host_stats
    op.register_fake(fake)
    return op


def _units(t: torch.Tensor, units: bool) -> Any:
    """The unit mask's length: dim 1 with ``units`` on 2 or more dims, else 0."""
    return t.shape[1] if units and t.dim() >= 2 else 0
