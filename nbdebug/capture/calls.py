"""The records of the open step of a :class:`~nbdebug.capture.session.Capture`: :class:`Call` (one
recorded tensor leaf of one module call, which is also that tensor's output-gradient hook),
:class:`StepMark` (what a step's calls share) and :class:`OpenStep` (the open step's calls and what
the hooks fill while it runs: tensors by identity and storage, the losses, the "something may be
non-finite" flag, the forward incident snapshot, calls whose gradient came after their step closed).

Data flows one way: the forward hooks (:mod:`.forward`) and the gradient hooks (:meth:`Call.__call__`)
fill an :class:`OpenStep`; the step's close (:mod:`.closing`) reads it; :meth:`OpenStep.reset` starts
the next one. The only call going back up is the one the first gradient of a backward makes to the
parameter-gradient watch it was built with (``paramgrads``: look at the parameters' gradients when
this backward ends).
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import numpy as np
import torch

from .classes import batch_classes
from .eager import eager_method
from .losses import as_float_later
from .stats import IDX, Raw, merge_raw, tensor_stats

__all__ = ["Call", "OpenStep", "StepMark", "in_backward"]

_ndarray = np.ndarray
_NAN, _INF = IDX["nan"], IDX["inf"]
_EMPTY: list = []  # shared, never appended to (replaced by a new list on first use)


class BackwardWatch(Protocol):
    """What a gradient hook needs of the parameter-gradient watch (:class:`~.paramgrads.ParamGrads`)."""

    queued: int
    params: list[torch.Tensor]

    def backward_started(self) -> None: ...


class StepMark:
    """What the calls of one step share: whether the step closed (a gradient arriving later belongs to
    a delayed backward) and its number once committed (0 before). Set once for all of them."""

    __slots__ = ("closed", "step")

    def __init__(self) -> None:
        self.closed = False
        self.step = 0


class Call:
    """One recorded tensor leaf of one module call in the open step; it is also the output-gradient
    hook of that tensor (no closure per call: fewer objects for the garbage collector)."""

    __slots__ = ("alive", "grad_order", "grad_stats", "held", "hooked", "input_calls", "input_checks", "late", "mark",
                 "module", "raw", "rec", "ref", "row", "shape", "version")

    def __init__(self, rec: OpenStep, row: Any, module: str, shape: tuple[int, ...], mark: StepMark) -> None:
        self.rec, self.row, self.module, self.shape, self.mark = rec, row, module, shape, mark
        self.raw: Raw | None = None
        self.grad_stats: Raw | None = None
        self.late: Raw | None = None  # gradient stats that arrived after the step closed
        self.grad_order = -1
        self.hooked = False
        self.alive: Any = None  # bool [units] (None: every unit non-zero, or n/a)
        self.input_calls: list[Call] = _EMPTY  # a list once linked
        self.input_checks: list[torch.Tensor] = _EMPTY
        self.held: tuple[Any, Any] | None = None  # (inputs, output) until the step's check (device path)
        self.ref: Any = None  # weakref to the output tensor (input linking, aliasing)
        self.version: int | None = None

    def link_input(self, producer: Call) -> None:
        """``producer``'s output is one of this call's inputs."""
        if self.input_calls is _EMPTY:
            self.input_calls = [producer]
        elif producer not in self.input_calls:
            self.input_calls.append(producer)

    def check_input(self, minmax: torch.Tensor) -> None:
        """Keep the [min, max] of an input no recorded call produced (the step's non-finite check reads it)."""
        if self.input_checks is _EMPTY:
            self.input_checks = []
        self.input_checks.append(minmax)

    # run eagerly, never traced: under compiled autograd (and a compiled backward) TorchDynamo traced this
    # hook inside the user's backward graph and recompiled it per layer shape and per ``rec.grad_counter``
    # value (a Python int it guards on): ~100 CPU-s of compiles on the envelope's compiled_autograd row
    # (test_compiled.py counts them). Captured values are the same: the hook runs as in eager mode.
    @eager_method  # torch.compiler.disable, once TorchDynamo is imported (eager.py)
    def __call__(self, g: torch.Tensor) -> None:
        """The output-gradient hook."""
        rec = self.rec
        # The gradient of a view (Flatten, reshape) is a view of the next gradient: same elements, same
        # stats (same start, size and dtype, both contiguous, that tensor alive and unchanged).
        last = rec.last_grad
        ptr, n, contiguous = g.data_ptr(), g.numel(), g.is_contiguous()
        if (last is not None and ptr == last[1] and n == last[2] and contiguous and g.dtype == last[3]
                and (src := last[0]()) is not None and src._version == last[4]):
            stats = last[5].copy() if isinstance(last[5], np.ndarray) else last[5].clone()
        else:
            if not ptr and n and g._is_zerotensor():  # a ZeroTensor (torch.sgn's): no memory to read, all zeros
                g = torch.zeros(g.shape, dtype=g.dtype, device=g.device)
            stats = tensor_stats(g, on_device=rec.device_path)
            if type(stats) is not _ndarray or stats[_NAN] + stats[_INF] > 0:
                rec.maybe_bad = True  # the step's close looks for the first non-finite gradient
            if contiguous and n and not g.is_inference():
                rec.last_grad = (weakref.ref(g), ptr, n, g.dtype, g._version, stats)
        if self.mark.closed:  # a delayed backward: folded with the next step (History.update)
            if self.late is None:
                rec.late.append(self)
            self.late = stats if self.late is None else merge_raw(self.late, stats)
        else:
            self.grad_stats = stats if self.grad_stats is None else merge_raw(self.grad_stats, stats)
            if rec.head is self:  # the model's classifier output: the batch's class make-up (classes.py)
                rec.classes = batch_classes(g, rec.device_path)
        if self.grad_order < 0:
            self.grad_order = rec.grad_counter
            rec.grad_counter += 1
        pg = rec.paramgrads
        if not pg.queued and pg.params:  # look at the parameter gradients when this backward ends
            pg.backward_started()
        return None


class OpenStep:
    """The open step's records (see the module doc). ``device_path``: stats stay on the device;
    ``paramgrads``: told when a backward reaches a recorded output (:class:`BackwardWatch`).

    ``calls`` (in call order), ``by_tensor`` (id of a recorded output → its call; ``call.ref`` checks
    identity), ``by_storage`` (``data_ptr`` of a recorded output → its call: an aliasing output copies
    its stats), ``occurrence`` (module → the leaves of each of its calls in this pass), ``claimed``
    (first leaves whose checkpoint recomputation was hooked), ``losses``, ``maybe_bad`` (a hook saw a
    NaN/Inf count, or stats it cannot read on the host), ``hot``/``hot_call`` (the forward incident
    snapshotted in the hook, CPU path), ``late`` (calls of closed steps whose gradient came late),
    ``handles`` (output-gradient hook handles, pruned once their graph is gone), ``backward_losses``
    (what each ``backward()`` of the step ran on, a non-scalar one summed: ``nonscalar``), ``head``
    (the call whose output is the model's classifier output, set by the root forward hook) and
    ``classes`` (its gradient's class make-up, :func:`~.classes.batch_classes`; None without one)."""

    __slots__ = ("backward_losses", "by_storage", "by_tensor", "calls", "claimed", "classes", "device_path",
                 "grad_counter", "handles", "head", "hot", "hot_call", "last_grad", "late", "losses", "mark", "maybe_bad",
                 "nonscalar", "occurrence", "paramgrads", "prune_at")

    def __init__(self, device_path: bool, paramgrads: BackwardWatch) -> None:
        self.device_path, self.paramgrads = device_path, paramgrads
        self.calls: list[Call] = []
        self.by_tensor: dict[int, Call] = {}
        self.by_storage: dict[int, Call] = {}
        self.occurrence: dict[str, list[list[Call]]] = {}
        self.claimed: set[int] = set()
        self.mark = StepMark()
        self.losses: list[Any] = []
        self.backward_losses: list[Any] = []
        self.nonscalar = False
        self.last_grad: tuple[Any, ...] | None = None  # the last output gradient's (ref, ptr, numel, dtype, version, stats)
        self.maybe_bad = False
        self.hot: Any = None
        self.hot_call: Call | None = None
        self.grad_counter = 0
        self.late: list[Call] = []
        self.handles: list[Any] = []
        self.prune_at = 256  # prune the handles when there are this many
        self.head: Call | None = None
        self.classes: Any = None

    def new_pass(self) -> None:
        """A top-level pass begins: module occurrences count from 1 again."""
        self.occurrence.clear()
        self.claimed.clear()

    def on_backward(self, tensors: Any) -> None:
        """A ``backward()`` is about to run on ``tensors`` (a tensor or a sequence of them): their values
        are the step's loss when nothing else gives one (a non-scalar tensor counts its sum)."""
        ts = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(t for t in tensors if isinstance(t, torch.Tensor))
        for t in ts:
            if not t.is_floating_point():
                continue
            t = t.detach()
            if t.numel() != 1:
                self.nonscalar = True
                t = t.float().sum()
            self.backward_losses.append(as_float_later(t, self.device_path))

    def snapshot(self, incident: Any, call: Call) -> None:
        """The forward incident of ``call``, copied in its hook (CPU path: the first non-finite output)."""
        self.hot, self.hot_call = incident, call

    def take_late(self) -> list[Call]:
        """The calls whose gradient arrived after their step closed, since the last look."""
        late, self.late = self.late, []
        return late

    def reset(self) -> None:
        """The open step closed: its calls' gradients are late from now on; the next step starts empty."""
        self.mark.closed = True
        self.mark = StepMark()
        self.calls = []
        self._prune()
        self.by_tensor.clear()
        self.by_storage.clear()
        self.losses = []
        if self.backward_losses:
            self.backward_losses = []
        self.nonscalar = False
        self.last_grad = None
        self.hot, self.hot_call = None, None
        self.maybe_bad = False
        self.head = self.classes = None

    def _prune(self) -> None:
        """Drop the handles of gradient hooks whose tensor is gone, once the list has doubled since the
        last pruning (a long loop keeps only the hooks of graphs still alive, at no cost per step)."""
        if len(self.handles) < self.prune_at:
            return
        self.handles = [h for h in self.handles if h.hooks_dict_ref() is not None]
        self.prune_at = max(256, 2 * len(self.handles))

    def remove_hooks(self) -> None:
        """Remove every output-gradient hook (at exit: a graph the user keeps never calls back)."""
        handles, self.handles = self.handles, []
        for h in handles:
            h.remove()

    def release(self) -> None:
        """At exit: hold no call, tensor or graph of the run."""
        self.calls, self.late = [], []
        self.by_tensor.clear()
        self.by_storage.clear()
        self.losses, self.backward_losses = [], []
        self.hot, self.hot_call, self.last_grad = None, None, None
        self.head = self.classes = None

    def producer(self, t: torch.Tensor) -> tuple[str, tuple[int, ...] | None] | None:
        """Row name of the recorded call that produced ``t``, and that call's first input shape."""
        call = self.by_tensor.get(id(t))
        if call is None or call.ref is None or call.ref() is not t:
            return None
        src = call.input_calls[0].shape if call.input_calls else None
        return call.row.key, src


def in_backward() -> bool:
    """True while autograd runs a backward on this thread (checkpoint recomputation happens there)."""
    return torch._C._current_graph_task_id() != -1
