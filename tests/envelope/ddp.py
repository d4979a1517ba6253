"""A DDP model trained on two gloo CPU processes under ``%%nndebug --distributed`` (the matrix's
``ddp`` row). The cell calls :func:`launch`, which forks two ranks (one intra-op thread each, gloo on
127.0.0.1) and kills them after ``deadline_s`` so a hang cannot stall the run.

Each rank first trains an identical copy of the model, wrapped in its own DDP, without nbdebug (the
reference: plain hooks measure each row's mean per step, and ``‖Δθ‖/‖θ‖`` per optimizer step), then
the model itself under ``nbdebug.debug`` (which spools to the launcher in a worker), and writes to
``out/rank{R}.json``: those measurements, the hooks and optimizer hooks nbdebug left, and the
differences between the two models' fingerprints (parameters, buffers, ``.grad``, modes, attributes).
"""

from __future__ import annotations

import copy
import datetime
import faulthandler
import gc
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

STEPS = 4
ROWS = ["0", "1", "2"]  # the inner Sequential's names (DDP unwrapped), one row per leaf
PARAM_MODULES = ["0", "2"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def batches(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    return [torch.randn(6, 4, generator=g) for _ in range(STEPS)]


def train(wrapped: nn.Module, opt: torch.optim.Optimizer, xs: list[torch.Tensor]) -> None:
    """The user's loop in each worker."""
    for x in xs:
        opt.zero_grad()
        wrapped(x).pow(2).mean().backward()
        opt.step()


def measured(inner: nn.Module, wrapped: nn.Module, opt: torch.optim.Optimizer, xs: list[torch.Tensor]) -> dict[str, Any]:
    """:func:`train` with plain hooks: each row's output mean per step, each module's ‖Δθ‖/‖θ‖ per step."""
    means: dict[str, list[float]] = {r: [] for r in ROWS}
    ratio: dict[str, list[float]] = {m: [] for m in PARAM_MODULES}
    handles = [inner.get_submodule(r).register_forward_hook(
        lambda _m, _a, out, r=r: means[r].append(float(out.detach().mean()))) for r in ROWS]
    before: dict[str, list[torch.Tensor]] = {}

    def pre(*_: Any) -> None:
        before.update({m: [p.detach().clone() for p in inner.get_submodule(m).parameters()] for m in PARAM_MODULES})

    def post(*_: Any) -> None:
        for m in PARAM_MODULES:
            ps = list(inner.get_submodule(m).parameters())
            d = sum(float((p.detach() - q).pow(2).sum()) for p, q in zip(ps, before[m])) ** 0.5
            ratio[m].append(d / sum(float(q.pow(2).sum()) for q in before[m]) ** 0.5)

    handles += [opt.register_step_pre_hook(pre), opt.register_step_post_hook(post)]
    try:
        train(wrapped, opt, xs)
    finally:
        for h in handles:
            h.remove()
    return {"means": means, "ratio": ratio}


def worker(rank: int, world: int, port: int, out: str) -> None:
    """One rank: the reference loop, then the same loop under ``nbdebug.debug`` (see the module doc)."""
    import torch.distributed as dist

    import nbdebug
    from nbdebug.capture import fingerprint, hook_count, same_fingerprint
    from nbdebug.capture.hooks import optimizer_hook_count

    faulthandler.dump_traceback_later(90, exit=False)  # a hung rank prints its stacks (pytest shows stderr)
    torch.set_num_threads(1)  # the fork recipe: the parent's thread pool does not survive fork
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    model = make_model()
    ref = copy.deepcopy(model)
    ref_ddp = nn.parallel.DistributedDataParallel(ref)
    meas = measured(ref, ref_ddp, torch.optim.SGD(ref_ddp.parameters(), lr=0.1, momentum=0.9), batches(rank))
    wrapped = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    hooks, opt_hooks = hook_count(wrapped), optimizer_hook_count()
    with nbdebug.debug(wrapped):
        train(wrapped, opt, batches(rank))
    result = {**meas, "hooks_left": hook_count(wrapped) - hooks, "optimizer_hooks_left": optimizer_hook_count() - opt_hooks,
              "diffs": same_fingerprint(fingerprint(ref), fingerprint(model)), "training": model.training}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    del wrapped, ref_ddp, opt  # the DDP wrappers before their process group (see tests/unit/_dist_workers.py)
    gc.collect()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


def launch(port: int, out: str, deadline_s: float = 60.0) -> str:
    """The cell body: 2 forked ranks of :func:`worker`; ranks still running after ``deadline_s`` are
    killed and the cell raises ``TimeoutError`` (a worker's error propagates as usual)."""
    ctx = torch.multiprocessing.start_processes(worker, args=(2, port, out), nprocs=2, start_method="fork", join=False)
    stop = time.monotonic() + deadline_s
    while not ctx.join(timeout=0.25):
        if time.monotonic() > stop:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join(5)
            raise TimeoutError(f"DDP workers still running after {deadline_s:.0f} s: killed")
    return "trained"
