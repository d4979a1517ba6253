"""Many processes: each rank's capture written to a spool, read back in the launching kernel.

In the worker (DDP, FSDP2 ``fully_shard``, or a plain model), with ``NBDEBUG_SPOOL`` set::

    with nbdebug.debug(model):                  # nbdebug.distributed.debug is the same function
        for x, y in batches:
            loss = criterion(model(x), y); loss.backward(); opt.step(); opt.zero_grad()

In the launching kernel: ``run = run_distributed(lambda: mp.start_processes(...))`` (what
``%%nndebug --distributed -o run`` does) or ``run = nbdebug.load(spool_dir)`` after a ``torchrun`` /
script launch with ``NBDEBUG_SPOOL=spool_dir``. ``run.ranks[r]`` is rank ``r``'s
:class:`~nbdebug.capture.result.CaptureResult` (with its per-step history),
``run.first_nonfinite_rank``, ``run.diverged`` (parameters that differ across ranks),
``run.buffers_differ``, ``run.notes``.

Per step and rank, one device-to-host transfer: the parameters' float32 (L1 norm, L2 norm, max), the
gradients' squared norms (taken at the optimizer step, before it changes anything; -1: no gradient) and the buffers'
fingerprints, stacked on the device; plus the history slots the capture appended (see
:mod:`nbdebug.capture.spool`). Nothing here calls a collective: a rank that fails never makes the
others wait for nbdebug.
"""

from __future__ import annotations

# nbdebug.debug is the one entry: it spools in a worker (or with spool=), runs the views elsewhere
from ..api import debug
from .launch import run_distributed
from .run import FORK_HINT, SAME_RANK, NonFinite, Run, load
from .worker import SpoolDebug, detect_rank, hooks_on, unwrap

__all__ = ["FORK_HINT", "SAME_RANK", "NonFinite", "Run", "SpoolDebug", "debug", "detect_rank", "hooks_on", "load",
           "run_distributed", "unwrap"]
