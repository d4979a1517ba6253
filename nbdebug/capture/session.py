"""`Capture`: per-layer statistics of outputs and output gradients while user code runs.

>>> with Capture(model) as cap:                      # doctest: +SKIP
...     loss = criterion(model(x), y); loss.backward()
>>> cap.result.layers[0].name, cap.result.layers[0].stats["mean"]   # doctest: +SKIP

Everything is computed on the tensors' device; the host sees the numbers once, at ``__exit__``.
A *step* is one call of the model's top-level ``forward``: rows merge every step, and the NaN/Inf
origin is decided in the first step where a non-finite value appeared. Forward passes that
autograd runs during backward (gradient checkpointing recomputation) are not new calls: their
output gradients land on the original rows.
Hooks are removed on every exit path (exception, KeyboardInterrupt included) and the model is left
exactly as it was: no attributes, no ``.grad`` of our own, no mode changes.
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any

import numpy as np
import torch
from torch import nn

from .budget import DEFAULT_MAX_BYTES
from .errors import ErrorSite, locate
from .hooks import HookSet
from .leaves import tensor_leaves
from .names import call_name
from .result import CaptureResult, LayerRecord
from .select import LayerFilter, select_modules
from .stats import IDX, SATURATING, Raw, device_histogram, merge_raw, tensor_stats
from .weak import ModelRef

__all__ = ["Capture", "CaptureResult", "LayerRecord"]

_NAN, _INF = IDX["nan"], IDX["inf"]
MAX_CALLS = 200_000  # per-call records kept (a long training loop in one cell is summarised)


class _Call:
    """One recorded tensor leaf of one module call (device tensors until the final sync)."""

    __slots__ = ("dtype", "grad_order", "grad_stats", "hist", "hooked", "input_calls", "input_checks",
                 "key", "module", "raw", "sample", "shape", "step", "type")

    def __init__(self, key: str, module: str, type_: str, shape: tuple[int, ...], dtype: str, step: int) -> None:
        self.key, self.module, self.type, self.shape, self.dtype, self.step = key, module, type_, shape, dtype, step
        self.raw: Raw | None = None
        self.grad_stats: Raw | None = None
        self.grad_order = -1
        self.hooked = False  # an output-gradient hook was registered in the original forward
        self.sample: torch.Tensor | None = None
        self.hist: torch.Tensor | None = None
        self.input_calls: list[int] = []
        self.input_checks: list[torch.Tensor] = []


def _in_backward() -> bool:
    """True while autograd runs a backward on this thread (checkpoint recomputation happens there)."""
    return torch._C._current_graph_task_id() != -1


def _version(t: torch.Tensor) -> int | None:
    """The version counter, or None for inference tensors (they have none)."""
    return None if t.is_inference() else t._version


def device_path_default() -> bool:
    """``NBDEBUG_DEVICE_PATH=1`` runs the accelerator path (stats stay on device) on the CPU too."""
    return os.environ.get("NBDEBUG_DEVICE_PATH", "") not in ("", "0")


class Capture:
    """Context manager recording statistics of selected modules' outputs (and their gradients).

    Parameters: ``layers`` (see :func:`nbdebug.capture.select_modules`; default: every leaf
    module), ``grads`` (hook output gradients when a backward runs inside the block),
    ``histograms`` (exact 32-bin histograms of every output, computed on the device),
    ``sample_size`` (values kept per layer for on-demand histograms and the near-zero fraction;
    exact for smaller tensors), ``max_bytes`` (budget for everything kept beyond scalar stats),
    ``near_zero_eps``, ``device_path`` (keep stats on the device and sync once at exit even on
    the CPU; default from ``NBDEBUG_DEVICE_PATH``; always on for accelerators).
    """

    def __init__(
        self,
        model: nn.Module,
        layers: LayerFilter = None,
        *,
        grads: bool = True,
        histograms: bool = False,
        sample_size: int = 4096,
        max_bytes: int = DEFAULT_MAX_BYTES,
        near_zero_eps: float = 1e-6,
        bins: int = 32,
        device_path: bool | None = None,
    ) -> None:
        self._model = ModelRef(model)  # weak after __exit__: a result outliving the cell never keeps the model
        self._hold: nn.Module | None = model  # strong until __exit__
        self.modules = select_modules(model, layers)  # strong until __exit__ (hooks need them), then dropped
        self.grads = grads
        self.histograms = histograms
        self.sample_size = int(sample_size)
        self.max_bytes = int(max_bytes)
        self.near_zero_eps = near_zero_eps
        self.bins = bins
        self.device_path = device_path_default() if device_path is None else bool(device_path)
        self.result: CaptureResult | None = None
        self._hooks = HookSet()
        self._calls: list[_Call] = []
        self._by_tensor: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        # (data_ptr, numel, dtype) of recorded contiguous outputs → (tensor, call, version): an
        # output that aliases one of them unchanged (Identity, Dropout in eval, Flatten, views)
        # has the same stats, so they are copied instead of recomputed.
        self._by_storage: dict[tuple[int, int, torch.dtype], tuple[weakref.ref[torch.Tensor], int, int]] = {}
        # module name → index of the first leaf of each of its calls in the current step
        self._occurrence: dict[str, list[int]] = {}
        self._claimed: set[int] = set()  # calls whose recomputation (checkpointing) was hooked in this step
        self._passes = 0
        self._grad_counter = 0
        self._bytes = 0
        self._dropped_bytes = 0
        self._budget_exceeded = False
        self._truncated = False
        self._grad_snapshot: dict[int, tuple[int, int | None]] = {}
        self._t0 = 0.0
        self._error: ErrorSite | None = None
        self._raised: str | None = None

    # -- hooks -------------------------------------------------------------------------------
    def _on_root_pre(self, *_: Any) -> None:
        if _in_backward():  # the whole model recomputed by checkpointing: not a new step
            return
        self._passes += 1
        self._occurrence.clear()
        self._claimed.clear()

    def _link_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any], call: _Call, check: bool) -> None:
        """Link a call to the captured calls that produced its inputs (by tensor identity).

        Inputs not produced by a captured call are checked for NaN/Inf only when ``check`` (the
        output was non-finite, or the device cannot tell without a sync): that check is what
        separates "this layer made the NaN" from "the NaN came in with the input". The check
        stays on the device (float32 min/max; never float64 there).
        """
        for _, t in tensor_leaves((args, kwargs)):
            if not t.is_floating_point():
                continue
            hit = self._by_tensor.get(id(t))
            if hit is not None and hit[0]() is t:
                if hit[1] not in call.input_calls:
                    call.input_calls.append(hit[1])
            elif check and t.numel():
                mn, mx = torch.aminmax(t.detach())
                call.input_checks.append(torch.stack([mn, mx]).to(torch.float32))

    def _aliased_stats(self, t: torch.Tensor) -> Raw | None:
        """Stats of an already-recorded tensor with the same elements, or None.

        Same start, size and dtype over a contiguous range of a storage that is still alive (so
        the address cannot have been reused), and an unchanged version counter (shared by views,
        bumped by in-place ops): the same values. Inference tensors have no version counter and
        are always recomputed.
        """
        if not t.is_contiguous() or not t.numel():
            return None
        hit = self._by_storage.get((t.data_ptr(), t.numel(), t.dtype))
        if hit is None:
            return None
        ref, idx, version = hit
        src = ref()
        if t.is_inference() or src is None or src.data_ptr() != t.data_ptr() or _version(t) != version:
            return None  # inference tensors have no version counter: an in-place op cannot be seen
        raw = self._calls[idx].raw
        return raw.copy() if isinstance(raw, np.ndarray) else raw.clone()  # type: ignore[union-attr]

    def _keep(self, nbytes: int) -> bool:
        if self._bytes + nbytes > self.max_bytes:
            self._budget_exceeded = True
            self._dropped_bytes += nbytes
            return False
        self._bytes += nbytes
        return True

    def _sample(self, t: torch.Tensor) -> torch.Tensor | None:
        n = t.numel()
        if n == 0 or self.sample_size <= 0 or not self._keep(min(n, self.sample_size) * 4):
            return None
        x = t.detach().reshape(-1)
        if n <= self.sample_size:
            return x.float().clone()
        # An evenly strided sample: a cheap strided copy (a random gather costs ~10× more). The
        # step is made odd and not a multiple of 3, 5 or 7 so that it does not lock onto channel
        # or spatial periods.
        step = n // self.sample_size
        while step > 1 and any(step % p == 0 for p in (2, 3, 5, 7)):
            step -= 1
        return x[step // 2 :: step][: self.sample_size].float().clone()

    def _make_forward_hook(self, name: str, module: nn.Module) -> Any:
        type_name = type(module).__name__
        saturation = SATURATING.get(type_name)
        on_device = self.device_path

        def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if _in_backward():
                self._on_recompute(name, output)
                return
            if len(self._calls) >= MAX_CALLS:
                self._truncated = True
                return
            starts = self._occurrence.get(name)
            if starts is None:
                starts = self._occurrence[name] = []
            k = len(starts)
            step = self._passes
            new: list[tuple[_Call, torch.Tensor]] = []
            for leaf_name, t in tensor_leaves(output, name):
                if t.is_complex():
                    continue
                call = _Call(call_name(leaf_name, k), name, type_name, tuple(t.shape), str(t.dtype).replace("torch.", ""), step)
                call.raw = self._aliased_stats(t) if saturation is None else None
                if call.raw is None:
                    call.raw = tensor_stats(t, saturation=saturation, on_device=on_device)
                new.append((call, t))
            if not new:
                return
            starts.append(len(self._calls))
            # The module's inputs belong to its first leaf; later leaves share the links.
            check = any(not isinstance(c.raw, np.ndarray) or c.raw[_NAN] + c.raw[_INF] > 0 for c, _ in new)
            self._link_inputs(args, kwargs, new[0][0], check)
            grads = self.grads and torch.is_grad_enabled()
            for call, t in new:
                if call is not new[0][0]:
                    call.input_calls = new[0][0].input_calls
                if self._passes <= 1:  # samples/histograms describe the first forward pass
                    call.sample = self._sample(t)
                    if self.histograms and t.numel() and self._keep(self.bins * 4 + 8):
                        call.hist = device_histogram(t, self.bins)
                idx = len(self._calls)
                self._calls.append(call)
                ref = weakref.ref(t)
                self._by_tensor[id(t)] = (ref, idx)
                if t.is_contiguous() and t.numel():
                    self._by_storage[(t.data_ptr(), t.numel(), t.dtype)] = (ref, idx, _version(t))
                if grads and t.requires_grad:
                    call.hooked = True
                    self._hooks.tensor(t, self._make_grad_hook(call))

        return hook

    def _on_recompute(self, name: str, output: Any) -> None:
        """A forward run by autograd during backward (checkpointing): no new call or row.

        With ``use_reentrant=True`` the original forward ran without grad and the backward flows
        through the recomputed graph, so the output-gradient hook goes on the recomputed tensor,
        for the first call of ``name`` in this step that has no hook yet (and the same output
        shape). With the non-reentrant implementation every original output was hooked already.
        """
        starts = self._occurrence.get(name)
        if not starts or not (self.grads and torch.is_grad_enabled()):
            return
        leaves = [t for _, t in tensor_leaves(output, name) if not t.is_complex()]
        if not leaves or not leaves[0].requires_grad:
            return
        shape = tuple(leaves[0].shape)
        free = [i for i in starts if not self._calls[i].hooked and self._calls[i].shape == shape]
        if not free:
            return
        first = next((i for i in free if i not in self._claimed), None)
        if first is None:  # a second backward through the same graph (retain_graph)
            self._claimed.difference_update(free)
            first = free[0]
        self._claimed.add(first)
        for i, t in enumerate(leaves):
            j = first + i
            if j >= len(self._calls) or self._calls[j].module != name:
                break
            if t.requires_grad:
                self._hooks.tensor(t, self._make_grad_hook(self._calls[j]))

    def _make_grad_hook(self, call: _Call) -> Any:
        on_device = self.device_path

        def grad_hook(g: torch.Tensor) -> None:
            stats = tensor_stats(g, on_device=on_device)
            call.grad_stats = stats if call.grad_stats is None else merge_raw(call.grad_stats, stats)
            if call.grad_order < 0:
                call.grad_order = self._grad_counter
                self._grad_counter += 1
            return None

        return grad_hook

    def _producer(self, t: torch.Tensor) -> tuple[str, tuple[int, ...] | None] | None:
        """Row name of the captured call that produced ``t``, and that call's first input shape."""
        hit = self._by_tensor.get(id(t))
        if hit is None or hit[0]() is not t:
            return None
        call = self._calls[hit[1]]
        src = self._calls[call.input_calls[0]].shape if call.input_calls else None
        return call.key, src

    @property
    def model(self) -> nn.Module:
        """The captured model (raises :class:`~nbdebug.capture.ModelGoneError` once it is deleted)."""
        return self._model.get()

    # -- context manager --------------------------------------------------------------------
    def __enter__(self) -> Capture:
        self._t0 = time.perf_counter()
        self._grad_snapshot = {
            id(p): (id(p.grad), _version(p.grad)) for p in self.model.parameters() if p.grad is not None
        }
        try:
            self._hooks.forward_pre(self.model, self._on_root_pre)
            for name, module in self.modules:
                self._hooks.forward(module, self._make_forward_hook(name, module), with_kwargs=True)
        except BaseException:
            self._hooks.remove()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None, tb: Any = None) -> None:
        self._hooks.remove()
        try:
            if exc is not None:
                text = str(exc).strip().splitlines()
                self._raised = type(exc).__name__ + (f": {text[0]}" if text else "")
                try:
                    self._error = locate(exc, self.model, self._producer, tb)
                except Exception:  # never mask the user's exception with ours
                    self._error = None
        finally:
            self._by_tensor.clear()
            self._by_storage.clear()
        from .assemble import assemble

        try:
            self.result = assemble(self)
        except Exception as err:
            if exc is None:
                raise
            # The user's exception is what the cell must show: ours becomes a note.
            self._calls = []
            self.result = assemble(self)
            self.result.notes.append(f"nbdebug could not summarise what ran before the error: {type(err).__name__}: {err}")
        finally:
            self.modules = []  # the model's submodules (and their parameters) are not ours to keep
            self._hold = None
        self._calls = []

