"""Worker functions for tests/unit/test_distributed.py (a module file, so ``spawn`` can import them).

Each worker: one intra-op thread (the fork recipe), gloo on 127.0.0.1, a tiny model wrapped in DDP or
FSDP2 ``fully_shard``, a few SGD steps inside ``nbdebug.distributed.debug`` (the spool comes from
``NBDEBUG_SPOOL``), then it checks that nbdebug left no hook on its model and writes what the test
needs to compare with (hook counts, reference gradient norms) to ``out/rank{R}.json``.

Run as a script (``python tests/unit/_dist_workers.py SCENARIO OUT PORT``) it launches 2 ranks itself,
like a ``torchrun`` / script launch with ``NBDEBUG_SPOOL`` set by the caller.
"""

from __future__ import annotations

import datetime
import faulthandler
import gc
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(scenario: str, out: Path, start_method: str = "fork", **kw):  # type: ignore[no-untyped-def]
    """Run ``scenario`` on 2 gloo ranks through ``run_distributed``. A launch whose workers hang (killed
    after 120 s, see :func:`start`; their stacks are on stderr) is retried once on a fresh port and
    spool: a forked worker hung after its last step a few times in full-suite runs (stuck in C code as
    ``worker`` returned, likely the group destroyed before the DDP wrapper, which :func:`worker` now
    drops first), and that is not what these tests check."""
    from nbdebug.distributed import run_distributed

    for attempt in range(2):
        port = free_port()
        run = run_distributed(lambda p=port: start(worker, (2, p, scenario, str(out)), start_method), timeout_s=60, **kw)
        if not isinstance(getattr(run, "error", None), TimeoutError) or attempt:
            return run
        for f in out.glob("rank*.json"):
            f.unlink()
    raise AssertionError("unreachable")


#: one launch per scenario in this process, for the tests that only read it (:func:`launched`)
_LAUNCHED: dict[str, tuple] = {}


def launched(scenario: str, tmp_path_factory) -> tuple:  # type: ignore[no-untyped-def]
    """``(run, out)``: the fork launch of ``scenario`` made once in this process and shared by the tests that
    read it (tests/unit/test_distributed.py and tests/widget/test_run_widget.py, which put them in the
    ``xdist_group`` "ddp-launches" so that one worker launches each scenario once: ~3.5 CPU-s a launch)."""
    if scenario not in _LAUNCHED:
        out = tmp_path_factory.mktemp(f"ddp-{scenario}")
        _LAUNCHED[scenario] = (launch(scenario, out), out)
    return _LAUNCHED[scenario]


def start(fn, args: tuple, start_method: str = "fork", deadline_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    """``torch.multiprocessing.start_processes(..., join=True)`` that cannot hang the test run: workers still running
    after ``deadline_s`` are killed and the test fails saying so (a worker error propagates as usual)."""
    if start_method == "fork":
        import torch._dynamo as _dynamo  # noqa: F401  DDP's constructor imports it (~2.5 CPU-s): once here, not in each forked rank
    ctx = torch.multiprocessing.start_processes(fn, args=args, nprocs=2, start_method=start_method, join=False)
    stop = time.monotonic() + deadline_s
    while not ctx.join(timeout=0.5):
        if time.monotonic() > stop:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join(5)
            raise TimeoutError(f"{fn.__name__} workers still running after {deadline_s:.0f} s: killed")


STEPS = 5
NAN_RANK, NAN_STEP = 1, 3
DIVERGE_RANK, DIVERGE_AFTER = 1, 2
RAISE_RANK, RAISE_STEP = 1, 3


class Scale(nn.Module):
    """x * k, with ``k`` a plain float the test sets to NaN on one rank (DDP does not broadcast it)."""

    def __init__(self) -> None:
        super().__init__()
        self.k = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k


def make_model(scenario: str) -> nn.Module:
    torch.manual_seed(0)
    if scenario == "bn":
        return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    return nn.Sequential(nn.Linear(4, 8), Scale(), nn.ReLU(), nn.Linear(8, 2))


def _init(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)  # the fork recipe: the parent's thread pool does not survive fork
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))


def worker(rank: int, world: int, port: int, scenario: str, out: str) -> None:
    """One rank of ``scenario``: "ddp", "nan", "diverge", "bn", "raise", "fsdp"; "api": "ddp" through
    ``nbdebug.debug`` (which routes to the spool in a worker)."""
    import nbdebug
    import nbdebug.distributed as nd
    from nbdebug.capture.hooks import hook_count, optimizer_hook_count

    # A worker still alive after 90 s prints every thread's stack to stderr (pytest shows it).
    faulthandler.dump_traceback_later(90, exit=False)
    _init(rank, world, port)
    try:
        model = make_model(scenario)
        if scenario == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for layer in (model[0], model[3]):
                fully_shard(layer)
            wrapped = fully_shard(model)
        else:
            wrapped = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
        if scenario == "fsdp":  # FSDP2 adds its own state-dict hooks at its first forward: count after it
            with torch.no_grad():
                wrapped(torch.zeros(1, 4))
        before, opt_before = hook_count(wrapped), optimizer_hook_count()
        g = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
        ref: dict[str, float] = {}
        with (nbdebug.debug if scenario == "api" else nd.debug)(wrapped):
            for step in range(1, STEPS + 1):
                if scenario == "nan" and rank == NAN_RANK and step == NAN_STEP:
                    model[1].k = float("nan")
                x = torch.randn(6, 4, generator=g)
                loss = wrapped(x).pow(2).mean()
                if scenario == "raise" and rank == RAISE_RANK and step == RAISE_STEP:
                    raise RuntimeError(f"boom on rank {rank} at step {step}")
                loss.backward()
                if scenario == "fsdp" and step == STEPS:  # the full gradients' norms, gathered (a collective)
                    ref = {n: float(p.grad.full_tensor().norm()) for n, p in model.named_parameters()}
                elif scenario == "ddp" and step == STEPS:  # the gradients DDP averaged over the ranks
                    ref = {n: float(p.grad.norm()) for n, p in model.named_parameters()}
                opt.step()
                opt.zero_grad()
                if scenario == "diverge" and rank == DIVERGE_RANK and step == DIVERGE_AFTER:
                    with torch.no_grad():  # outside DDP's sync: this rank's copy only
                        model[0].weight[0, 0] += 1.0
        left = hook_count(wrapped) - before
        opt_left = optimizer_hook_count() - opt_before
        assert left == 0 and opt_left == 0, f"rank {rank}: nbdebug left {left} module hooks, {opt_left} optimizer hooks"
        Path(out, f"rank{rank}.json").write_text(json.dumps({"hooks_left": left, "ref_grad_norms": ref, "pid": os.getpid()}))
    except BaseException:
        raise  # no teardown: the other ranks wait in their collective until the launcher stops them
    else:
        # Drop the DDP/FSDP wrapper before the process group: destroying the group while DDP still holds
        # it made 13 of 40 spawn workers abort at interpreter exit here ("terminate called without an
        # active exception", torch 2.13, gloo, without nbdebug too); with the wrapper gone first, 0 of 60.
        del wrapped, model, opt, loss
        gc.collect()
        dist.destroy_process_group()


def script_main(scenario: str, out: str, port: int) -> None:
    """A script launch: 2 ranks forked from this fresh process (NBDEBUG_SPOOL comes from the caller)."""
    import torch._dynamo  # noqa: F401  DDP's constructor imports it (~2.5 CPU-s): once here, not in each forked rank
    import torch.multiprocessing as mp

    mp.start_processes(worker, args=(2, port, scenario, out), nprocs=2, start_method="fork")


if __name__ == "__main__":
    script_main(sys.argv[1], sys.argv[2], int(sys.argv[3]))


def no_rank_worker(index: int, out: str) -> None:
    """No torch.distributed, no RANK: both processes believe they are rank 0 (notebook_launcher on CPU
    without ACCELERATE_USE_CPU=yes)."""
    import nbdebug.distributed as nd

    torch.set_num_threads(1)
    os.environ.pop("RANK", None)
    model = make_model("ddp")
    with nd.debug(model):
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()



def stall_worker(index: int, out: str) -> None:
    """Two steps, then no progress (as a rank waiting forever in a collective or a deadlocked thread pool)."""
    import time

    import nbdebug.distributed as nd

    torch.set_num_threads(1)
    os.environ["RANK"] = str(index)
    model = make_model("ddp")
    with nd.debug(model):
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
        time.sleep(60)


def accelerate_worker() -> None:
    """An accelerate training function (``notebook_launcher`` calls it in each process)."""
    from accelerate import Accelerator

    import nbdebug.distributed as nd

    torch.set_num_threads(1)
    acc = Accelerator()
    model = make_model("ddp")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped, opt = acc.prepare(model, opt)
    g = torch.Generator().manual_seed(100 + int(os.environ.get("RANK", "0")))  # each process its own batches
    with nd.debug(wrapped):
        for _ in range(3):
            acc.backward(wrapped(torch.randn(6, 4, generator=g)).pow(2).mean())
            opt.step()
            opt.zero_grad()
