"""The worker side: ``nbdebug.debug`` in a rank writes its capture to the spool, step by step."""

from __future__ import annotations

import math
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from ..capture.spool import SpoolWriter, launcher_options
from .results import incident_json, summary_of
from .run import SAME_RANK

__all__ = ["SpoolDebug", "detect_rank", "hooks_on", "unwrap"]


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

    from ..capture.hooks import optimizer_hook_count

    n = optimizer_hook_count() + len(torch_module._global_forward_hooks)
    for m in model.modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            n += len(getattr(m, attr, None) or {})
    for p in model.parameters():
        n += len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
    return n


def _groups_of(tensors: list[Any]) -> dict[tuple[Any, Any], list[int]]:
    out: dict[tuple[Any, Any], list[int]] = {}
    for i, t in enumerate(tensors):
        out.setdefault((t.device, t.dtype), []).append(i)
    return out


def _norms(tensors: list[Any], order: int, device: Any) -> Any:
    """float32 ``[N]``: the L1 or L2 norm of each tensor, batched per device and dtype (``_foreach_norm``),
    accumulated in float32."""
    import torch

    out = torch.zeros(len(tensors), dtype=torch.float32, device=device)
    for idx in _groups_of(tensors).values():
        group = [tensors[i] if tensors[i].is_floating_point() else tensors[i].float() for i in idx]
        res = torch._foreach_norm(group, order, dtype=torch.float32)
        out[torch.tensor(idx, device=device)] = torch.stack(res).to(device)
    return out


def _fingerprint(tensors: list[Any], device: Any) -> Any:
    """float32 ``[N, 3]`` on ``device``: (L1 norm, L2 norm, max) of each tensor, computed where it lives.
    Replicas that hold the same values give bit-identical rows; an element changed on one rank changes them."""
    import torch

    if not tensors:
        return torch.zeros(0, 3, dtype=torch.float32, device=device)
    # empty tensors fingerprint as 0; parameters accelerate keeps on `meta` (offloaded) as NaN: not compared
    tensors = [torch.full((1,), math.nan, device=device) if t.device.type == "meta" else
               t if t.numel() else torch.zeros(1, dtype=t.dtype, device=t.device) for t in tensors]
    mx = torch.zeros(len(tensors), dtype=torch.float32, device=device)
    for idx in _groups_of(tensors).values():
        mx[torch.tensor(idx, device=device)] = torch.stack(torch._foreach_max([tensors[i] for i in idx])).to(device, torch.float32)
    return torch.stack([_norms(tensors, 1, device), _norms(tensors, 2, device), mx], dim=1)


def accelerate_disagrees(world_size: int | None) -> str | None:
    """A note when accelerate (already imported and set up in this process) believes it is one process
    of one while torch.distributed runs several: ``notebook_launcher`` on CPU without
    ``ACCELERATE_USE_CPU=yes``; the model is then not wrapped for data parallelism."""
    state = sys.modules.get("accelerate.state")
    if state is None or not world_size or world_size < 2:
        return None
    try:
        shared = dict(state.PartialState._shared_state)
    except Exception:
        return None
    if shared.get("num_processes") == 1:
        return (f"accelerate believes each of the {world_size} processes is process 0 of 1 (accelerate's "
                "notebook_launcher on CPU needs ACCELERATE_USE_CPU=yes): the ranks come from torch.distributed, "
                "but accelerate did not wrap the model for data parallelism, so each rank trains alone")
    return None


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


#: spool directory → this process's last result in it: a later ``nbdebug.debug`` block in the same worker
#: continues its steps and history (``Capture(resume=...)``), so one rank shows one run
_previous: dict[str, Any] = {}


class SpoolDebug:
    """``nbdebug.debug`` in a worker process: a :class:`~nbdebug.capture.session.Capture` of the
    (unwrapped) model whose every step goes to ``spool/rank{R}-{pid}/`` (see
    :mod:`nbdebug.capture.spool`). Only the thermometer's capture is recorded across processes.
    Writing never raises into the user's loop (a failure is one line on stderr, then it stops)."""

    def __init__(self, model: Any, view: str | list[str] = "thermometer", *, spool: str | os.PathLike[str],
                 **options: Any) -> None:
        import inspect

        from ..capture.budget import parse_bytes
        from ..capture.session import Capture

        self.notes: list[str] = []
        views = [v.strip() for v in (view.split(",") if isinstance(view, str) else view) if v.strip()]
        if views != ["thermometer"]:
            self.notes.append(f"across processes only the thermometer is recorded (asked: {', '.join(views)})")
        self.spool = Path(spool)
        self._wrapper: Any = model
        self.model, self.wrapper_kind = unwrap(model)
        o = {**launcher_options(self.spool), **options}  # the magic's --every/--max-bytes/…; the call's own win
        kw: dict[str, Any] = {k: o[k] for k in ("histograms", "sample_size", "every", "loss", "break_on", "step_on",
                                                 "grads", "device_path", "near_zero_eps") if o.get(k) is not None}
        kw["max_bytes"] = parse_bytes(o.get("max_bytes"))
        accepted = inspect.signature(Capture.__init__).parameters
        self._native = "on_step" in accepted  # the per-step capture (issue 10); else steps are counted here
        if self._native:
            kw["on_step"] = self._on_step
        prev = _previous.get(str(self.spool.resolve()))
        if prev is not None and "resume" in accepted and "resume" not in o:  # a second block in this worker
            kw["resume"] = prev
        self.capture = Capture(self.model, o.get("layers"), **{k: v for k, v in kw.items() if k in accepted})
        self.writer: SpoolWriter | None = None
        self.rank, self.world_size, self.rank_source = 0, None, "default"
        self._hooks: Any = None
        self._grads: Any = None  # device tensor of gradient squared norms from the last optimizer step
        self._steps_done = 0
        self._incidents_sent = 0
        self._failed = False
        self._hooks_before = 0
        self._used: tuple[int, Any] = (0, None)  # (step, gradient norms) of the last chunk

    # -- fingerprints (on the device; one transfer) ----------------------------------------------
    def _grad_sq(self) -> Any:
        import torch

        grads = [None if p.grad is None else _local(p.grad).detach() for _, p in self._params]
        have = [g for g in grads if g is not None]
        norms = iter(_norms(have, 2, self._device).square()) if have else iter(())
        minus = torch.full((), -1.0, dtype=torch.float32, device=self._device)  # no gradient
        out = [minus if g is None else next(norms) for g in grads]
        return torch.stack(out) if out else torch.zeros(0, device=self._device)

    def _fingerprints(self, step: int) -> dict[str, np.ndarray]:
        import torch

        with torch.no_grad():
            if self._grads is not None:
                grads = self._grads
            elif self._used[0] == step and self._used[1] is not None:  # the exit rewrites the last step
                grads = self._used[1]
            else:  # no optimizer step: the gradients as they are now
                grads = self._grad_sq()
            self._used = (step, grads)
            tensors = [_local(t).detach() for _, t in self._params + self._named_buffers]
            parts = [_fingerprint(tensors, self._device).reshape(-1), grads.reshape(-1)]
            flat = torch.cat(parts).cpu().numpy()  # the step's one device-to-host transfer
        self._grads = None
        n, b = 3 * len(self._params), 3 * len(self._named_buffers)
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
        self._steps_done = h.steps if h is not None else self._steps_done + 1
        self._write(self._steps_done, h, list(getattr(self.capture, "incidents", None) or []))

    def _on_root_pre(self, *_: Any) -> None:  # steps without the per-step capture: a top-level forward each
        import torch

        if torch._C._current_graph_task_id() != -1:  # recomputation during backward
            return
        if self._steps_done:
            self._write(self._steps_done, None, [])
        self._steps_done += 1

    def _on_optimizer_step(self, opt: Any, *_: Any) -> None:
        import torch

        if self._failed:
            return
        if any(id(p) in self._ours for g in opt.param_groups for p in g["params"]):
            with torch.no_grad():
                self._grads = self._grad_sq()  # stays on the device until the step's one transfer

    # -- context manager ---------------------------------------------------------------------------
    def __enter__(self) -> SpoolDebug:
        import torch

        from ..capture.hooks import HookSet

        self.rank, self.world_size, self.rank_source = detect_rank()
        odd = accelerate_disagrees(self.world_size)
        if odd and odd not in self.notes:
            self.notes.append(odd)
        self._params = list(self.model.named_parameters())
        self._named_buffers = list(self.model.named_buffers())
        self._ours = {id(p) for _, p in self._params}
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
                "params": [_layout(n, p) for n, p in self._params], "buffers": [n for n, _ in self._named_buffers],
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
                self._steps_done = h.steps if h is not None else getattr(res, "steps", self._steps_done)
            self._write(self._steps_done, h, list(getattr(res, "incidents", None) or []))
            hooks_left = hooks_on(self._wrapper) - self._hooks_before
            # nothing of ours keeps the model (or its parameters) alive after the block
            self._wrapper, self.model, self._params, self._named_buffers, self._ours = None, None, [], [], set()
            if res is not None:
                _previous[str(self.spool.resolve())] = res
            self._grads, self._used = None, (0, None)
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
