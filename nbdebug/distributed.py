"""Many processes: each rank's capture written to a spool, read back in the launching kernel.

In the worker (DDP, FSDP2 ``fully_shard``, or a plain model), with ``NBDEBUG_SPOOL`` set::

    with nbdebug.distributed.debug(model):      # or nbdebug.debug(model) once it routes here
        for x, y in batches:
            loss = criterion(model(x), y); loss.backward(); opt.step(); opt.zero_grad()

In the launching kernel: ``run = run_distributed(lambda: mp.start_processes(...))`` (what
``%%nndebug --distributed -o run`` does) or ``run = nbdebug.load(spool_dir)`` after a ``torchrun`` /
script launch with ``NBDEBUG_SPOOL=spool_dir``. ``run.ranks[r]`` is rank ``r``'s
:class:`~nbdebug.capture.result.CaptureResult` (with its per-step history),
``run.first_nonfinite_rank``, ``run.diverged`` (parameters that differ across ranks),
``run.buffers_differ``, ``run.notes``.

Per step and rank, one device-to-host transfer: the parameters' float32 (sum, abs-sum, L2 norm), the
gradients' squared norms (taken at the optimizer step, before it changes anything; -1: no gradient) and the buffers'
fingerprints, stacked on the device; plus the history slots the capture appended (see
:mod:`nbdebug.capture.spool`). Nothing here calls a collective: a rank that fails never makes the
others wait for nbdebug.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .capture.spool import (
    LAUNCHER_ENV,
    SPOOL_ENV,
    RankSpool,
    SpoolWriter,
    incident_json,
    progress,
    read_rank,
    result_of,
    scan,
    summary_of,
    wants_spool,
)

__all__ = ["NonFinite", "Run", "SpoolDebug", "debug", "detect_rank", "load", "run_distributed", "unwrap"]

FORK_HINT = ("if the workers were forked (start_method='fork', accelerate's notebook_launcher) from a kernel that "
             "already ran multi-threaded torch ops, their thread pool deadlocks: call torch.set_num_threads(1) first "
             "thing in the worker, or use start_method='spawn' with the worker in a module file")
SAME_RANK = ("processes {pids} all claim rank {rank}: torch.distributed was not initialised in them and RANK was "
             "not set (accelerate's notebook_launcher on CPU needs ACCELERATE_USE_CPU=yes, otherwise every process "
             "believes it is rank 0); shown: pid {shown}")


# ============================================================================== worker side
def unwrap(model: Any) -> tuple[Any, str | None]:
    """``(module whose names the rows use, wrapper kind)``: DDP/DataParallel are unwrapped
    (``.module``); FSDP2 ``fully_shard`` keeps the module and its names (kind ``"FSDP2"``)."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    m, kind = model, None
    while isinstance(m, (DistributedDataParallel, DataParallel)):
        kind = kind or ("DDP" if isinstance(m, DistributedDataParallel) else "DataParallel")
        m = m.module
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        FSDPModule = ()
    if kind is None and any(isinstance(x, FSDPModule) for x in m.modules()):
        kind = "FSDP2"
    return m, kind


def detect_rank() -> tuple[int, int | None, str]:
    """``(rank, world size or None, source)`` from torch.distributed when initialised, else ``RANK`` /
    ``WORLD_SIZE``, else rank 0 (source ``"default"``). accelerate's state is never consulted."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), "torch.distributed"
    if os.environ.get("RANK", "").strip().isdigit():
        ws = os.environ.get("WORLD_SIZE", "").strip()
        return int(os.environ["RANK"]), int(ws) if ws.isdigit() else None, "RANK"
    return 0, None, "default"


def _local(t: Any) -> Any:
    """A DTensor's local shard (no communication); a plain tensor as is."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def hooks_on(model: Any) -> int:
    """Hooks of the kinds a capture registers: module forward/backward hooks of ``model`` and its
    submodules, parameters' post-accumulate-grad hooks, global module forward hooks and optimizer
    step hooks. (Not ``hook_count``'s state-dict hooks: FSDP2 adds those itself at its first forward.)"""
    from torch.nn.modules import module as torch_module

    from .capture.hooks import optimizer_hook_count

    n = optimizer_hook_count() + len(torch_module._global_forward_hooks)
    for m in model.modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            n += len(getattr(m, attr, None) or {})
    for p in model.parameters():
        n += len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
    return n


def _layout(name: str, p: Any) -> dict[str, Any]:
    """Where a parameter's values live: global shape, and for a DTensor its placements and the
    coordinates of this rank along its sharded mesh dimensions (ranks with equal ``shard`` hold the
    same values: those are compared)."""
    out: dict[str, Any] = {"name": name, "shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", "")}
    placements = getattr(p, "placements", None)
    if placements is not None:
        coord = p.device_mesh.get_coordinate() or []
        out["placements"] = [str(x) for x in placements]
        out["shard"] = [int(c) for c, pl in zip(coord, placements) if pl.is_shard()]
    return out


class SpoolDebug:
    """``nbdebug.debug`` in a worker process: a :class:`~nbdebug.capture.session.Capture` of the
    (unwrapped) model whose every step goes to ``spool/rank{R}-{pid}/`` (see
    :mod:`nbdebug.capture.spool`). Only the thermometer's capture is recorded across processes.
    Writing never raises into the user's loop (a failure is one line on stderr, then it stops)."""

    def __init__(self, model: Any, view: str | list[str] = "thermometer", *, spool: str | os.PathLike[str],
                 **options: Any) -> None:
        import inspect

        from .capture.budget import parse_bytes
        from .capture.session import Capture

        self.notes: list[str] = []
        views = [v.strip() for v in (view.split(",") if isinstance(view, str) else view) if v.strip()]
        if views != ["thermometer"]:
            self.notes.append(f"across processes only the thermometer is recorded (asked: {', '.join(views)})")
        self.spool = Path(spool)
        self._wrapper: Any = model
        self.model, self.wrapper_kind = unwrap(model)
        o = dict(options)
        kw: dict[str, Any] = {k: o[k] for k in ("histograms", "sample_size", "every", "loss", "break_on", "step_on",
                                                 "grads", "device_path", "near_zero_eps") if o.get(k) is not None}
        kw["max_bytes"] = parse_bytes(o.get("max_bytes"))
        accepted = inspect.signature(Capture.__init__).parameters
        self._native = "on_step" in accepted  # the per-step capture (issue 10); else steps are counted here
        if self._native:
            kw["on_step"] = self._on_step
        self.capture = Capture(self.model, o.get("layers"), **{k: v for k, v in kw.items() if k in accepted})
        self.writer: SpoolWriter | None = None
        self.rank, self.world_size, self.rank_source = 0, None, "default"
        self._hooks: Any = None
        self._grads: Any = None  # device tensor of gradient squared norms from the last optimizer step
        self._passes = 0
        self._incidents_sent = 0
        self._failed = False
        self._hooks_before = 0
        self._used: tuple[int, Any] = (0, None)  # (step, gradient norms) of the last chunk

    # -- fingerprints (on the device; one transfer) ----------------------------------------------
    def _grad_sq(self) -> Any:
        import torch

        out = []
        for _, p in self._params:
            g = p.grad
            out.append(torch.full((), -1.0, dtype=torch.float32, device=self._device) if g is None else
                       torch.linalg.vector_norm(_local(g).detach(), dtype=torch.float32).square().to(self._device))
        return torch.stack(out) if out else torch.zeros(0, device=self._device)

    def _fingerprints(self, step: int) -> dict[str, np.ndarray]:
        import torch

        def fp(t: Any) -> Any:
            x = _local(t).detach()
            if not x.is_floating_point():
                x = x.float()
            if x.numel() == 0:
                return torch.zeros(3, dtype=torch.float32, device=self._device)
            return torch.stack([x.sum(dtype=torch.float32), torch.linalg.vector_norm(x, 1, dtype=torch.float32),
                                torch.linalg.vector_norm(x, 2, dtype=torch.float32)]).to(self._device)

        with torch.no_grad():
            if self._grads is not None:
                grads = self._grads
            elif self._used[0] == step and self._used[1] is not None:  # the exit rewrites the last step
                grads = self._used[1]
            else:  # no optimizer step: the gradients as they are now
                grads = self._grad_sq()
            self._used = (step, grads)
            parts = [fp(p) for _, p in self._params] + [fp(b) for _, b in self._buffers] + [grads.reshape(-1)]
            flat = torch.cat([x.reshape(-1) for x in parts]).cpu().numpy() if parts else np.zeros(0, np.float32)
        self._grads = None
        n, b = 3 * len(self._params), 3 * len(self._buffers)
        return {"fp_params": flat[:n].reshape(-1, 3), "fp_buffers": flat[n:n + b].reshape(-1, 3), "fp_grads": flat[n + b:]}

    # -- per step ------------------------------------------------------------------------------
    def _write(self, step: int, history: Any, incidents: list[Any]) -> None:
        if self._failed or self.writer is None:
            return
        try:
            new = [incident_json(i) for i in incidents[self._incidents_sent:]]
            self._incidents_sent = len(incidents)
            self.writer.write_step(step, history, self._fingerprints(step), {"incidents": new})
        except Exception as exc:  # the user's loop goes on; the spool stops here
            self._failed = True
            sys.stderr.write(f"nbdebug: rank {self.rank} stopped writing its spool at step {step}: "
                             f"{type(exc).__name__}: {exc}\n")

    def _on_step(self, cap: Any = None) -> None:
        h = getattr(self.capture, "history", None)
        self._passes = h.steps if h is not None else self._passes + 1
        self._write(self._passes, h, list(getattr(self.capture, "incidents", None) or []))

    def _on_root_pre(self, *_: Any) -> None:  # steps without the per-step capture: a top-level forward each
        import torch

        if torch._C._current_graph_task_id() != -1:  # recomputation during backward
            return
        if self._passes:
            self._write(self._passes, None, [])
        self._passes += 1

    def _on_optimizer_step(self, opt: Any, *_: Any) -> None:
        import torch

        if self._failed:
            return
        ours = {id(p) for _, p in self._params}
        if any(id(p) in ours for g in opt.param_groups for p in g["params"]):
            with torch.no_grad():
                self._grads = self._grad_sq()  # stays on the device until the step's one transfer

    # -- context manager ---------------------------------------------------------------------------
    def __enter__(self) -> SpoolDebug:
        import torch

        from .capture.hooks import HookSet

        self.rank, self.world_size, self.rank_source = detect_rank()
        self._params = list(self.model.named_parameters())
        self._buffers = list(self.model.named_buffers())
        first = next((_local(p) for _, p in self._params), None)
        self._device = first.device if first is not None else torch.device("cpu")
        self._hooks_before = hooks_on(self._wrapper)
        try:
            self.writer = SpoolWriter(self.spool, self.rank)
            others = self.writer.others()
            if others:
                sys.stderr.write("nbdebug: " + SAME_RANK.format(pids=", ".join(map(str, [*others, os.getpid()])),
                                                                 rank=self.rank, shown="the first") + "\n")
            self.writer.write_json("meta.json", {
                "format": 1, "rank": self.rank, "world_size": self.world_size, "rank_source": self.rank_source,
                "pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                "model": type(self.model).__name__, "wrapper": self.wrapper_kind,
                "broadcast_buffers": getattr(self._wrapper, "broadcast_buffers", None),
                "params": [_layout(n, p) for n, p in self._params], "buffers": [n for n, _ in self._buffers],
                "threads": torch.get_num_threads(), "torch": torch.__version__, "notes": self.notes,
                "native_steps": self._native,
            })
        except Exception as exc:
            self._failed = True
            sys.stderr.write(f"nbdebug: rank {self.rank} cannot write its spool in {self.spool}: {type(exc).__name__}: {exc}\n")
        self._hooks = HookSet()
        try:
            self._hooks.optimizer_step_pre(self._on_optimizer_step)
            if not self._native:
                self._hooks.forward_pre(self.model, self._on_root_pre)
            self.capture.__enter__()
        except BaseException:
            self._hooks.remove()
            raise
        return self

    def __exit__(self, exc_type: Any = None, exc: BaseException | None = None, tb: Any = None) -> None:
        try:
            self.capture.__exit__(exc_type, exc, tb)
        finally:
            self._hooks.remove()
            res = self.capture.result
            h = getattr(res, "history", None) or getattr(self.capture, "history", None)
            if self._native:
                self._passes = h.steps if h is not None else getattr(res, "steps", self._passes)
            self._write(self._passes, h, list(getattr(res, "incidents", None) or []))
            hooks_left = hooks_on(self._wrapper) - self._hooks_before
            self._wrapper = None
            if self.writer is not None and not self._failed:
                try:
                    self.writer.write_final({
                        "result": None if res is None else summary_of(res),
                        "raised": None if exc is None else f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".rstrip(": "),
                        "traceback": None if exc is None else "".join(traceback.format_exception(exc_type, exc, tb))[-4000:],
                        "hooks_left": hooks_left,
                        "bytes": self.writer.bytes_written, "chunks": self.writer.chunks,
                    })
                except Exception as err:
                    sys.stderr.write(f"nbdebug: rank {self.rank} could not close its spool: {type(err).__name__}: {err}\n")

    # -- what api.Debug offers, for code that calls it in the worker --------------------------------
    @property
    def result(self) -> Any:
        """This rank's :class:`~nbdebug.capture.result.CaptureResult` (after the block)."""
        return self.capture.result

    def note(self) -> str:
        return "; ".join(self.notes)

    def show(self) -> None:
        """Nothing to show in a worker: the launching kernel shows every rank."""


def debug(model: Any, view: str | list[str] = "thermometer", *, spool: str | os.PathLike[str] | None = None,
          **options: Any) -> Any:
    """In a worker: a :class:`SpoolDebug` writing to ``spool`` (default: ``$NBDEBUG_SPOOL``). Without a
    spool (or in the launching process itself) this is plain :func:`nbdebug.debug`, so the same worker
    code runs in one process."""
    if spool is None and wants_spool():
        spool = os.environ[SPOOL_ENV]
    if spool is None:
        from .api import Debug

        return Debug(model, view, **options)
    return SpoolDebug(model, view, spool=spool, **options)


# ============================================================================== launcher side
_PHASES = ("forward", "output_grad", "param_grad")


@dataclass(frozen=True)
class NonFinite:
    """Where one rank first saw a NaN/Inf: ``step`` (1-based), ``phase`` ("forward" < "output_grad" <
    "param_grad" within a step), the ``module`` (qualified name of the inner model) and ``row``."""

    rank: int
    step: int
    phase: str
    module: str | None
    row: str | None
    message: str = ""

    @property
    def order(self) -> tuple[int, int, int]:
        return self.step, _PHASES.index(self.phase), self.rank


def _owner(param: str) -> str:
    return param.rpartition(".")[0]


def _rank_nonfinite(s: RankSpool, res: Any) -> NonFinite | None:
    """The earliest non-finite event of one rank: the capture's own verdict (its incident names the
    module), the gradients seen at the optimizer step, and for a rank that never closed its capture
    the forward NaN/Inf counts in its history."""
    cands: list[NonFinite] = []
    step, phase = res.first_nonfinite_step, res.first_nonfinite_phase
    if step is not None and phase is not None:
        inc = next((i for i in res.incidents if getattr(i, "kind", None) == "nonfinite" and i.step == step), None)
        module, row = (inc.module, inc.row) if inc is not None else (None, None)
        if inc is None and phase == "forward" and res.forward_nonfinite_call is not None and res.layers:
            rec = res.layers[res.forward_nonfinite_call[0]]
            module, row = rec.module, rec.name
        cands.append(NonFinite(s.rank, step, phase, module, row, getattr(inc, "message", "") or ""))
    for d in s.incidents:  # written per step: still there when the rank was killed
        if d.get("kind") == "nonfinite" and d.get("phase") in _PHASES:
            cands.append(NonFinite(s.rank, int(d["step"]), d["phase"], d.get("module"), d.get("row"), d.get("message") or ""))
    names = [p["name"] for p in s.meta.get("params", [])]
    if s.first_bad_grad is not None and s.first_bad_grad[1] < len(names):  # seen at the optimizer step
        step_, name = s.first_bad_grad[0], names[s.first_bad_grad[1]]
        cands.append(NonFinite(s.rank, step_, "param_grad", _owner(name), None,
                               f"step {step_}: the gradient of `{name}` was NaN/Inf at the optimizer step"))
    h = res.history
    if s.final is None and h is not None and len(h):
        from .capture.history import FIELD_INDEX

        v = h.values("max")
        bad = (np.nan_to_num(v[:, :, FIELD_INDEX["nan"]]) + np.nan_to_num(v[:, :, FIELD_INDEX["inf"]])) > 0
        hit = np.argwhere(bad)
        if hit.size:
            j, r = hit[0]
            info = h.row_info[int(r)]
            cands.append(NonFinite(s.rank, int(h.step_index[j]), "forward", str(info.get("module")), h.rows[int(r)]))
    return min(cands, key=lambda c: c.order) if cands else None


def _groups(s: RankSpool) -> list[tuple]:
    """Per parameter: the key of the ranks holding the same values (replicas compare, shards don't)."""
    return [tuple(p.get("shard") or ()) if "placements" in p else () for p in s.meta.get("params", [])]


class Run:
    """Every rank's capture, read from a spool (see the module doc).

    ``ranks[r]``: rank ``r``'s :class:`~nbdebug.capture.result.CaptureResult` (None if rank ``r`` never
    entered ``nbdebug.debug``); ``first_nonfinite`` (every rank that saw a NaN/Inf, earliest first),
    ``first_nonfinite_rank``; ``diverged`` (parameters whose values differ across ranks at
    ``compared_step``, the last step every rank reached; ``diverged_steps``: name → first step seen
    differing); ``buffers_differ`` (buffers that differ: DDP re-broadcasts them from rank 0 at each
    forward, so they differ after a forward by design); ``errors`` (rank → the error it raised),
    ``tracebacks``; ``hooks_left`` (rank → hooks nbdebug left on its model: 0); ``notes``;
    ``error``: the launching cell's own exception (``run_distributed``); ``bytes``: the spool's size.
    """

    def __init__(self, spools: list[RankSpool], notes: list[str] | None = None) -> None:
        self.notes: list[str] = list(notes or [])
        self.error: BaseException | None = None
        self.value: Any = None  # run_cell()'s return value (run_distributed)
        self.processes = spools
        by_rank: dict[int, list[RankSpool]] = {}
        for s in spools:
            by_rank.setdefault(s.rank, []).append(s)
        for rank, same in by_rank.items():
            if len(same) > 1:
                self.notes.append(SAME_RANK.format(pids=", ".join(str(s.pid) for s in same), rank=rank, shown=same[0].pid))
        sizes = [int(s.meta["world_size"]) for s in spools if s.meta.get("world_size")]
        self.world_size = max([*sizes, *(r + 1 for r in by_rank)], default=0)
        self._spool: list[RankSpool | None] = [by_rank[r][0] if r in by_rank else None for r in range(self.world_size)]
        self.ranks: list[Any] = [None if s is None else result_of(s) for s in self._spool]
        if not spools:
            self.notes.append("no worker entered nbdebug.debug: wrap the steps to watch in `with nbdebug.debug(model):` "
                              "inside the worker function")
        missing = [r for r, s in enumerate(self._spool) if s is None]
        if missing:
            self.notes.append(f"rank(s) {', '.join(map(str, missing))} never entered nbdebug.debug")
        if any(s.meta.get("rank_source") == "default" for s in spools) and len(spools) > 1:
            self.notes.append("torch.distributed was not initialised and RANK unset in some workers: they were counted as rank 0")
        self.errors = {s.rank: s.final["raised"] for s in self._live() if s.final and s.final.get("raised")}
        self.tracebacks = {s.rank: s.final["traceback"] for s in self._live() if s.final and s.final.get("traceback")}
        self.hooks_left = {s.rank: int(s.final.get("hooks_left", 0)) for s in self._live() if s.final}
        for s in self._live():
            if s.final is None:
                self.notes.append(f"rank {s.rank} never closed its capture (killed, or still running): shown up to step {s.step}")
        self.bytes = sum(s.nbytes for s in spools)
        found = [_rank_nonfinite(s, res) for s, res in zip(self._spool, self.ranks) if s is not None]
        self.first_nonfinite: list[NonFinite] = sorted((f for f in found if f is not None), key=lambda f: f.order)
        self._compare()

    def _live(self) -> list[RankSpool]:
        return [s for s in self._spool if s is not None]

    @property
    def first_nonfinite_rank(self) -> int | None:
        """The rank whose NaN/Inf came first (earliest step; forward before gradients; ties: lowest rank)."""
        return self.first_nonfinite[0].rank if self.first_nonfinite else None

    def _compare(self) -> None:
        self.diverged: list[str] = []
        self.buffers_differ: list[str] = []
        self.diverged_steps: dict[str, int] = {}
        self.compared_step: int | None = None
        live = self._live()
        if len(live) < 2:
            return
        names = [p["name"] for p in live[0].meta.get("params", [])]
        bufs = list(live[0].meta.get("buffers", []))
        if any([p["name"] for p in s.meta.get("params", [])] != names or s.meta.get("buffers", []) != bufs for s in live):
            self.notes.append("ranks hold different parameter sets: not compared")
            return
        common = sorted(set.intersection(*(set(s.fingerprints) for s in live)))
        if not common:
            return
        self.compared_step = common[-1]
        keys = [_groups(s) for s in live]
        if any(k for ks in keys for k in ks):
            self.notes.append("FSDP: each shard lives on one rank, so sharded parameters have nothing to compare across "
                              "ranks (replicated parameters and HSDP replicas are compared); the full parameters are not "
                              "gathered at the end: that is a collective every rank must enter (it would hang after a "
                              "rank failed) and the gathered copies are identical on every rank by construction")
        for step in common:
            for what, arr, out in (("params", "fp_params", self.diverged), ("buffers", "fp_buffers", self.buffers_differ)):
                n = len(names) if what == "params" else len(bufs)
                for i in range(n):
                    seen: dict[tuple, np.ndarray] = {}
                    differs = False
                    for s, k in zip(live, keys):
                        v = s.fingerprints[step][arr][i]
                        key = k[i] if what == "params" else ()
                        if key in seen and not np.array_equal(seen[key], v, equal_nan=True):
                            differs = True
                        seen.setdefault(key, v)
                    name = names[i] if what == "params" else bufs[i]
                    if differs:
                        self.diverged_steps.setdefault(("" if what == "params" else "buffer:") + name, step)
                        if step == self.compared_step:
                            out.append(name)
        if self.buffers_differ:
            kinds = {s.meta.get("wrapper") for s in live}
            why = ("DDP re-broadcasts them from rank 0 at every forward (broadcast_buffers=True), so they differ after "
                   "a forward by design" if any(s.meta.get("broadcast_buffers") for s in live)
                   else "buffers are not synchronised across ranks" + (" (DDP broadcast_buffers=False)" if "DDP" in kinds else ""))
            self.notes.append(f"buffers that differ across ranks after step {self.compared_step}: "
                              f"{', '.join(self.buffers_differ[:8])}{' …' if len(self.buffers_differ) > 8 else ''} ({why})")

    def grad_norms(self, step: int | None = None) -> dict[str, float]:
        """Parameter → gradient L2 norm at ``step`` (default: the last step every rank wrote), as seen
        at the optimizer step: sharded parameters (FSDP) combined across their shards (√Σ shard²)."""
        live = self._live()
        steps = sorted(set.intersection(*(set(s.fingerprints) for s in live))) if live else []
        if not steps:
            return {}
        step = steps[-1] if step is None else step
        names = [p["name"] for p in live[0].meta.get("params", [])]
        out: dict[str, float] = {}
        for i, n in enumerate(names):
            per_shard: dict[tuple, float] = {}
            for s, k in zip(live, (_groups(s) for s in live)):
                g = s.fingerprints[step].get("fp_grads")
                if g is not None and i < len(g) and not g[i] < 0:  # -1: no gradient
                    per_shard.setdefault(k[i], float(g[i]))
            out[n] = math.sqrt(sum(per_shard.values())) if per_shard else math.nan
        return out

    def combined(self, row: str, field: str = "param_grad_norm") -> np.ndarray:
        """``field`` (``"param_grad_norm"`` or ``"param_norm"``) of ``row`` over rank 0's kept steps, for
        the whole module: under FSDP each rank's value covers its own shards, so the ranks' values are
        combined as √Σ value²; replicated parameters (DDP) have the same value on every rank (rank 0's)."""
        if field not in ("param_grad_norm", "param_norm"):
            raise KeyError(f"combined() takes 'param_grad_norm' or 'param_norm', got {field!r}")
        live = [(s, r) for s, r in zip(self._spool, self.ranks) if s is not None and r is not None and r.history is not None]
        if not live:
            return np.zeros(0)
        base = live[0][1]
        module = base.history.row_info[base.history.rows.index(base._row_of(row))]["module"]
        sharded = any("placements" in p and _owner(p["name"]) == module for p in live[0][0].meta.get("params", []))
        if not sharded:
            return base.series(row, field)
        steps = base.step_index
        acc = np.zeros(len(steps))
        for _, res in live:
            at = {int(s): i for i, s in enumerate(res.step_index)}
            v = res.series(row, field)
            acc += np.array([v[at[int(s)]] ** 2 if int(s) in at else np.nan for s in steps])
        return np.sqrt(acc)

    def spread(self, field: str = "mean") -> dict[str, tuple[float, float]]:
        """Row → (min, max) of ``field`` across ranks at each rank's last kept step."""
        out: dict[str, tuple[float, float]] = {}
        for res in self.ranks:
            h = None if res is None else res.history
            if h is None or not len(h):
                continue
            for row, v in h.at(int(h.step_index[-1])).items():
                x = v.get(field, math.nan)
                lo, hi = out.get(row, (math.inf, -math.inf))
                if not math.isnan(x):
                    out[row] = (min(lo, x), max(hi, x))
        return out

    def __repr__(self) -> str:
        steps = [None if r is None else r.steps for r in self.ranks]
        nf = self.first_nonfinite[0] if self.first_nonfinite else None
        return (f"Run({self.world_size} ranks, steps {steps}"
                + (f", first NaN/Inf: rank {nf.rank} step {nf.step} `{nf.module}`" if nf else "")
                + (f", diverged: {self.diverged}" if self.diverged else "")
                + (f", errors: {self.errors}" if self.errors else "") + ")")


def load(spool_dir: str | os.PathLike[str]) -> Run:
    """Read a spool (written by workers launched with ``NBDEBUG_SPOOL=spool_dir``) into a :class:`Run`."""
    path = Path(spool_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"no spool directory {str(path)!r} (set NBDEBUG_SPOOL={path} for the workers)")
    return Run([read_rank(p) for _, _, p in scan(path)])


class _Watcher(threading.Thread):
    """Polls the spool's directory listings while the cell runs: reports progress, and prints one
    line to the cell's stderr when no rank wrote anything for ``timeout_s`` seconds."""

    def __init__(self, root: Path, timeout_s: float, on_progress: Callable[[dict[int, int]], Any] | None,
                 poll_s: float = 0.25) -> None:
        super().__init__(name="nbdebug-spool-watcher", daemon=True)
        self.root, self.timeout_s, self.on_progress, self.poll_s = root, timeout_s, on_progress, poll_s
        self.stream = sys.stderr  # the cell's stderr (IPython's stream), taken when the cell starts
        self.stalls: list[str] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def message(self, state: dict[tuple[int, int], tuple[int, float, bool]], idle: float) -> str:
        import torch

        threads = torch.get_num_threads()
        kernel = f" (this kernel uses {threads} intra-op threads)" if threads > 1 else ""
        if not state:
            return (f"nbdebug: no worker has entered nbdebug.debug after {idle:.0f} s while the cell runs. "
                    f"If the workers hang{kernel}: {FORK_HINT}.")
        where = ", ".join(f"rank {r} {'closed' if closed else f'at step {step}'}" for (r, _), (step, _, closed) in sorted(state.items()))
        return (f"nbdebug: no rank wrote progress for {idle:.0f} s while the cell runs ({where}). Likely cause{kernel}: "
                f"{FORK_HINT}; otherwise a collective that one rank did not reach.")

    def run(self) -> None:
        last_change, last_key, warned = time.monotonic(), None, False
        while not self._halt.wait(self.poll_s):
            try:
                state = progress(self.root)
            except OSError:
                continue
            key = sorted((k, v[0], v[2]) for k, v in state.items())
            if key != last_key:
                last_key, last_change, warned = key, time.monotonic(), False
                if self.on_progress is not None:
                    try:
                        self.on_progress({r: v[0] for (r, _), v in state.items()})
                    except Exception:
                        pass
                continue
            idle = time.monotonic() - last_change
            if not warned and idle >= self.timeout_s and not (state and all(v[2] for v in state.values())):
                warned = True
                line = self.message(state, idle)
                self.stalls.append(line)
                try:
                    self.stream.write(line + "\n")
                    self.stream.flush()
                except Exception:
                    pass


def run_distributed(run_cell: Callable[[], Any], *, spool_dir: str | os.PathLike[str] | None = None,
                    timeout_s: float = 60.0, on_progress: Callable[[dict[int, int]], Any] | None = None) -> Run:
    """Run a cell that launches workers, and collect what every rank recorded.

    Creates the spool (a temporary directory unless ``spool_dir`` is given), sets ``NBDEBUG_SPOOL``
    in ``os.environ`` for the workers (fork, spawn and subprocesses inherit it; restored afterwards),
    calls ``run_cell()``, reads the spool into a :class:`Run` and removes the temporary directory.
    A watcher thread calls ``on_progress({rank: step})`` when a rank writes, and when no rank wrote
    for ``timeout_s`` seconds while the cell still runs prints one line to the cell's stderr naming
    each rank's step and the likely cause (nothing is killed).

    Never raises the cell's exception: it is ``run.error`` (re-raise it after showing the run; a
    worker's error also appears in ``run.errors``). ``run.value`` is ``run_cell()``'s return value.
    """
    own = spool_dir is None
    root = Path(tempfile.mkdtemp(prefix="nbdebug-spool-")) if own else Path(spool_dir)  # type: ignore[arg-type]
    root.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in (SPOOL_ENV, LAUNCHER_ENV)}
    os.environ[SPOOL_ENV], os.environ[LAUNCHER_ENV] = str(root), str(os.getpid())
    watcher = _Watcher(root, timeout_s, on_progress)
    watcher.start()
    value: Any = None
    error: BaseException | None = None
    try:
        value = run_cell()
    except BaseException as exc:  # KeyboardInterrupt too: what the ranks wrote is still shown
        error = exc
    finally:
        watcher.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        run = load(root)
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    run.notes.extend(s.split(" while the cell runs")[0].removeprefix("nbdebug: ") for s in watcher.stalls)
    run.error, run.value = error, value
    return run
