"""`Capture`: per-layer statistics of outputs and output gradients while user code runs.

>>> with Capture(model) as cap:                      # doctest: +SKIP
...     loss = criterion(model(x), y); loss.backward()
>>> cap.result.layers[0].name, cap.result.layers[0].stats["mean"]   # doctest: +SKIP

Everything is computed on the tensors' device; the host sees the numbers once, at ``__exit__``.
Hooks are removed on every exit path (exception, KeyboardInterrupt included) and the model is left
exactly as it was: no attributes, no ``.grad`` of our own, no mode changes.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from .hooks import HookSet
from .leaves import tensor_leaves
from .select import LayerFilter, select_modules
from .stats import FIELDS, IDX, SATURATING, merge, summarize, tensor_stats

__all__ = ["Capture", "CaptureResult", "LayerRecord"]

DEFAULT_MAX_BYTES = 256 * 2**20
MAX_CALLS = 200_000  # per-call records kept (a long training loop in one cell is summarised)


@dataclass
class LayerRecord:
    """One row: a tensor leaf of one module's output (per occurrence within a forward pass)."""

    name: str  # row name: 'features.0', 'block.0[1]', 'layer1.0.relu#2' for a second call
    module: str  # qualified module name
    type: str  # module class name
    shape: tuple[int, ...]
    dtype: str
    calls: int
    stats: dict[str, float]  # mean, std, min, max, zero_frac, near_zero_frac, nan, inf, numel, ...
    grad: dict[str, float] | None  # same keys for d(loss)/d(output), None when no backward reached it
    param_grad_norm: float | None  # L2 norm of this module's own parameters' fresh .grad
    sample: np.ndarray | None = None  # float32 sample of the first call's values (for histograms)
    histogram: tuple[np.ndarray, np.ndarray] | None = None  # exact (counts, edges) when requested
    inputs: tuple[int, ...] = ()  # row indices whose outputs fed this row's module (first call)
    external_input_nonfinite: bool = False  # an input not produced by a captured row was NaN/Inf


@dataclass
class CaptureResult:
    """What a :class:`Capture` saw, as plain data (numpy and floats only)."""

    layers: list[LayerRecord]
    forward_passes: int
    backward_ran: bool
    calls_recorded: int
    truncated: bool
    sample_size: int
    near_zero_eps: float
    bytes_kept: int
    budget_exceeded: bool
    forward_nonfinite_call: tuple[int, bool] | None  # (row index, inputs were finite) of the first non-finite forward output
    backward_nonfinite_row: int | None  # row whose output gradient was the first non-finite one in backward order
    elapsed_s: float
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> LayerRecord:
        for rec in self.layers:
            if rec.name == name:
                return rec
        matches = [r for r in self.layers if r.module == name]
        if matches:
            return matches[0]
        raise KeyError(f"no captured layer {name!r}; captured: {[r.name for r in self.layers][:20]}")

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        return (
            f"CaptureResult({len(self.layers)} layers, {self.forward_passes} forward pass(es), "
            f"backward={'yes' if self.backward_ran else 'no'})"
        )


class _Call:
    """One recorded tensor leaf of one module call (device tensors until the final sync)."""

    __slots__ = ("dtype", "grad_order", "grad_stats", "hist", "input_calls", "input_checks", "key", "module", "raw", "sample", "shape", "type")

    def __init__(self, key: str, module: str, type_: str, shape: tuple[int, ...], dtype: str) -> None:
        self.key, self.module, self.type, self.shape, self.dtype = key, module, type_, shape, dtype
        self.raw: torch.Tensor | None = None
        self.grad_stats: torch.Tensor | None = None
        self.grad_order = -1
        self.sample: torch.Tensor | None = None
        self.hist: torch.Tensor | None = None
        self.input_calls: list[int] = []
        self.input_checks: list[torch.Tensor] = []


class Capture:
    """Context manager recording statistics of selected modules' outputs (and their gradients).

    Parameters: ``layers`` (see :func:`nbdebug.capture.select_modules`; default: every leaf
    module), ``grads`` (hook output gradients when a backward runs inside the block),
    ``histograms`` (exact 32-bin histograms of every output, computed on the device),
    ``sample_size`` (values kept per layer for on-demand histograms and the near-zero fraction;
    exact for smaller tensors), ``max_bytes`` (budget for everything kept beyond scalar stats),
    ``near_zero_eps``.
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
    ) -> None:
        self.model = model
        self.modules = select_modules(model, layers)
        self.grads = grads
        self.histograms = histograms
        self.sample_size = int(sample_size)
        self.max_bytes = int(max_bytes)
        self.near_zero_eps = near_zero_eps
        self.bins = bins
        self.result: CaptureResult | None = None
        self._hooks = HookSet()
        self._calls: list[_Call] = []
        self._by_tensor: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        # (data_ptr, numel, dtype) of recorded contiguous outputs → (tensor, call, version): an
        # output that aliases one of them unchanged (Identity, Dropout in eval, Flatten, views)
        # has the same stats, so they are copied instead of recomputed.
        self._by_storage: dict[tuple[int, int, torch.dtype], tuple[weakref.ref[torch.Tensor], int, int]] = {}
        self._occurrence: dict[str, int] = {}
        self._passes = 0
        self._grad_counter = 0
        self._bytes = 0
        self._budget_exceeded = False
        self._truncated = False
        self._grad_snapshot: dict[int, tuple[int, int]] = {}
        self._t0 = 0.0

    # -- hooks -------------------------------------------------------------------------------
    def _on_root_pre(self, *_: Any) -> None:
        self._passes += 1
        self._occurrence.clear()

    def _link_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any], call: _Call, check: bool) -> None:
        """Link a call to the captured calls that produced its inputs (by tensor identity).

        Inputs not produced by a captured call are checked for NaN/Inf only when ``check`` (the
        output was non-finite, or the device cannot tell without a sync): that check is what
        separates "this layer made the NaN" from "the NaN came in with the input".
        """
        for _, t in tensor_leaves((args, kwargs)):
            if not t.is_floating_point():
                continue
            hit = self._by_tensor.get(id(t))
            if hit is not None and hit[0]() is t:
                if hit[1] not in call.input_calls:
                    call.input_calls.append(hit[1])
            elif check and t.numel():
                mn, mx = torch.aminmax(t.detach().float() if t.dtype not in (torch.float32, torch.float64) else t.detach())
                call.input_checks.append(torch.stack([mn.double(), mx.double()]))

    def _aliased_stats(self, t: torch.Tensor) -> Any:
        """Stats of an already-recorded tensor with the same elements, or None.

        Same start, size and dtype over a contiguous range of a storage that is still alive (so
        the address cannot have been reused), and an unchanged version counter (shared by views,
        bumped by in-place ops): the same values.
        """
        if not t.is_contiguous() or not t.numel():
            return None
        hit = self._by_storage.get((t.data_ptr(), t.numel(), t.dtype))
        if hit is None:
            return None
        ref, idx, version = hit
        src = ref()
        if src is None or src.data_ptr() != t.data_ptr() or t._version != version:
            return None
        raw = self._calls[idx].raw
        return raw.copy() if isinstance(raw, np.ndarray) else raw.clone()

    def _keep(self, nbytes: int) -> bool:
        if self._bytes + nbytes > self.max_bytes:
            self._budget_exceeded = True
            return False
        self._bytes += nbytes
        return True

    def _sample(self, t: torch.Tensor) -> torch.Tensor | None:
        n = t.numel()
        if n == 0 or not self._keep(min(n, self.sample_size) * 4):
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

        def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if len(self._calls) >= MAX_CALLS:
                self._truncated = True
                return
            k = self._occurrence.get(name, 0)
            self._occurrence[name] = k + 1
            suffix = f"#{k + 1}" if k else ""
            new: list[tuple[_Call, torch.Tensor]] = []
            for leaf_name, t in tensor_leaves(output, name):
                if t.is_complex():
                    continue
                call = _Call(leaf_name + suffix, name, type_name, tuple(t.shape), str(t.dtype).replace("torch.", ""))
                call.raw = self._aliased_stats(t) if saturation is None else None
                if call.raw is None:
                    call.raw = tensor_stats(t, saturation=saturation)
                new.append((call, t))
            if not new:
                return
            # The module's inputs belong to its first leaf; later leaves share the links.
            check = any(not isinstance(c.raw, np.ndarray) or c.raw[IDX["nan"]] + c.raw[IDX["inf"]] > 0 for c, _ in new)
            self._link_inputs(args, kwargs, new[0][0], check)
            for call, t in new:
                if call is not new[0][0]:
                    call.input_calls = new[0][0].input_calls
                if self._passes <= 1:  # samples/histograms describe the first forward pass
                    call.sample = self._sample(t)
                    if self.histograms and t.numel() and self._keep(self.bins * 8):
                        call.hist = self._histogram(t)
                idx = len(self._calls)
                self._calls.append(call)
                ref = weakref.ref(t)
                self._by_tensor[id(t)] = (ref, idx)
                if t.is_contiguous() and t.numel():
                    self._by_storage[(t.data_ptr(), t.numel(), t.dtype)] = (ref, idx, t._version)
                if self.grads and t.requires_grad and torch.is_grad_enabled():
                    self._hooks.tensor(t, self._make_grad_hook(call))

        return hook

    def _histogram(self, t: torch.Tensor) -> torch.Tensor:
        x = t.detach().reshape(-1).float()
        finite = x[torch.isfinite(x)] if x.device.type != "cpu" or not torch.isfinite(x.sum()) else x
        if finite.numel() == 0:
            return torch.zeros(self.bins, device=x.device)
        return torch.histc(finite, bins=self.bins)

    def _make_grad_hook(self, call: _Call) -> Any:
        def grad_hook(g: torch.Tensor) -> None:
            stats = tensor_stats(g)
            call.grad_stats = stats if call.grad_stats is None else _merge_dev(call.grad_stats, stats)
            if call.grad_order < 0:
                call.grad_order = self._grad_counter
                self._grad_counter += 1
            return None

        return grad_hook

    # -- context manager --------------------------------------------------------------------
    def __enter__(self) -> Capture:
        self._t0 = time.perf_counter()
        self._grad_snapshot = {
            id(p): (id(p.grad), p.grad._version) for p in self.model.parameters() if p.grad is not None
        }
        try:
            self._hooks.forward_pre(self.model, self._on_root_pre)
            for name, module in self.modules:
                self._hooks.forward(module, self._make_forward_hook(name, module), with_kwargs=True)
        except BaseException:
            self._hooks.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.remove()
        self._by_tensor.clear()
        self._by_storage.clear()
        self.result = self._finish()
        self._calls = []

    # -- the one host sync ------------------------------------------------------------------
    def _fresh_param_grad_norms(self) -> dict[str, float]:
        out: dict[str, float] = {}
        mods = dict(self.modules)
        for name, module in mods.items():
            grads = []
            for p in module.parameters(recurse=False):
                g = p.grad
                if g is None:
                    continue
                before = self._grad_snapshot.get(id(p))
                if before is not None and before == (id(g), g._version):
                    continue  # stale: the cell did not touch it
                grads.append(g.detach())
            if grads:
                out[name] = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
        return out

    def _finish(self) -> CaptureResult:
        calls = self._calls
        n_f = len(FIELDS)
        raws = _to_host([c.raw for c in calls], n_f)
        g_idx = [i for i, c in enumerate(calls) if c.grad_stats is not None]
        grads = dict(zip(g_idx, _to_host([calls[i].grad_stats for i in g_idx], n_f)))
        # Rows: one per key, in order of first appearance.
        row_of: dict[str, int] = {}
        members: list[list[int]] = []
        for i, c in enumerate(calls):
            r = row_of.setdefault(c.key, len(members))
            if r == len(members):
                members.append([])
            members[r].append(i)
        call_row = {i: row_of[c.key] for i, c in enumerate(calls)}
        param_norms = self._fresh_param_grad_norms()

        layers: list[LayerRecord] = []
        for idxs in members:
            c0 = calls[idxs[0]]
            raw = merge(raws[idxs])
            s = {k: float(v[0]) for k, v in summarize(raw[None]).items()}
            g_rows = [grads[i] for i in idxs if i in grads]
            g = {k: float(v[0]) for k, v in summarize(merge(np.stack(g_rows))[None]).items()} if g_rows else None
            sample = c0.sample.cpu().numpy() if c0.sample is not None else None
            if sample is not None and sample.size:
                s["near_zero_frac"] = float(np.mean(np.abs(sample) < self.near_zero_eps))
                s["near_zero_exact"] = float(sample.size >= s["numel"])
            else:
                s["near_zero_frac"] = math.nan
                s["near_zero_exact"] = 0.0
            if c0.type in SATURATING:
                s["saturated_frac"] = s["extra_frac"]
            s.pop("extra_frac", None)
            hist = None
            if c0.hist is not None:
                lo, hi = s["min"], s["max"]
                if not (math.isfinite(lo) and math.isfinite(hi)):
                    fin = sample[np.isfinite(sample)] if sample is not None else np.zeros(0)
                    lo, hi = (float(fin.min()), float(fin.max())) if fin.size else (0.0, 0.0)
                edges = np.linspace(lo, hi if hi > lo else lo + 1.0, self.bins + 1)
                hist = (c0.hist.cpu().numpy().astype(np.float64), edges)
            ext_nonfinite = any(
                not (math.isfinite(float(v[0])) and math.isfinite(float(v[1]))) for v in (x.cpu() for x in c0.input_checks)
            )
            layers.append(
                LayerRecord(
                    name=c0.key,
                    module=c0.module,
                    type=c0.type,
                    shape=c0.shape,
                    dtype=c0.dtype,
                    calls=len(idxs),
                    stats=s,
                    grad=g,
                    param_grad_norm=param_norms.pop(c0.module, None),  # on the module's first row
                    sample=sample,
                    histogram=hist,
                    inputs=tuple(sorted({call_row[j] for j in c0.input_calls})),
                    external_input_nonfinite=ext_nonfinite,
                )
            )

        # First non-finite forward output in execution order.
        fwd = None
        for i, c in enumerate(calls):
            v = raws[i]
            if v[IDX["nan"]] > 0 or v[IDX["inf"]] > 0:
                ext_bad = any(not np.all(np.isfinite(x.cpu().numpy())) for x in c.input_checks)
                fwd = (call_row[i], not ext_bad)
                break
        # First non-finite output gradient in backward order.
        bwd = None
        order = sorted((c.grad_order, i) for i, c in enumerate(calls) if c.grad_order >= 0)
        for _, i in order:
            gv = grads.get(i)
            if gv is not None and (gv[IDX["nan"]] > 0 or gv[IDX["inf"]] > 0):
                bwd = call_row[i]
                break

        notes: list[str] = []
        if self._budget_exceeded:
            notes.append(
                f"byte budget of {self.max_bytes / 2**20:.0f} MB reached: stats kept for every layer, "
                "samples/histograms dropped for later ones (raise max_bytes to keep them)"
            )
        if self._truncated:
            notes.append(f"more than {MAX_CALLS} layer calls: later calls were not recorded")
        return CaptureResult(
            layers=layers,
            forward_passes=self._passes,
            backward_ran=bool(grads),
            calls_recorded=len(calls),
            truncated=self._truncated,
            sample_size=self.sample_size,
            near_zero_eps=self.near_zero_eps,
            bytes_kept=self._bytes,
            budget_exceeded=self._budget_exceeded,
            forward_nonfinite_call=fwd,
            backward_nonfinite_row=bwd,
            elapsed_s=time.perf_counter() - self._t0,
            notes=notes,
        )


def _merge_dev(a: Any, b: Any) -> Any:
    """Combine two raw stat vectors (numpy or device tensors) of one tensor's gradient."""
    out = a + b
    lib = np if isinstance(a, np.ndarray) else torch
    out[IDX["min"]] = lib.minimum(a[IDX["min"]], b[IDX["min"]])
    out[IDX["max"]] = lib.maximum(a[IDX["max"]], b[IDX["max"]])
    return out


def _to_host(raws: list[Any], width: int) -> np.ndarray:
    """Stack raw stat vectors: CPU ones are numpy already, device ones cross in one transfer each device."""
    if not raws:
        return np.zeros((0, width))
    out = np.full((len(raws), width), np.nan)
    dev = [i for i, r in enumerate(raws) if isinstance(r, torch.Tensor)]
    for i, r in enumerate(raws):
        if isinstance(r, np.ndarray):
            out[i] = r
    by_device: dict[torch.device, list[int]] = {}
    for i in dev:
        by_device.setdefault(raws[i].device, []).append(i)
    for idxs in by_device.values():
        out[idxs] = torch.stack([raws[i] for i in idxs]).cpu().numpy()  # the one sync per device
    return out
