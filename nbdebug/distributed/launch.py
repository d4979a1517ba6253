"""Running a cell that launches workers: the spool in ``NBDEBUG_SPOOL``, a watcher for stalled
ranks, and the :class:`~nbdebug.distributed.run.Run` read back at the end."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..capture.spool import LAUNCHER_ENV, OPTIONS_FILE, SPOOL_ENV, progress
from .run import FORK_HINT, Run, load

__all__ = ["run_distributed"]


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
                    timeout_s: float = 60.0, on_progress: Callable[[dict[int, int]], Any] | None = None,
                    options: dict[str, Any] | None = None) -> Run:
    """Run a cell that launches workers, and collect what every rank recorded.

    Creates the spool (a temporary directory unless ``spool_dir`` is given), sets ``NBDEBUG_SPOOL``
    in ``os.environ`` for the workers (fork, spawn and subprocesses inherit it; restored afterwards),
    calls ``run_cell()``, reads the spool into a :class:`Run` and removes the temporary directory.
    A watcher thread calls ``on_progress({rank: step})`` when a rank writes, and when no rank wrote
    for ``timeout_s`` seconds while the cell still runs prints one line to the cell's stderr naming
    each rank's step and the likely cause (nothing is killed).

    ``options`` (JSON values: ``every``, ``max_bytes``, ``layers`` as a list of names/patterns,
    ``break_on``, ``sample_size``, ``histograms``) become the defaults of every worker's
    ``nbdebug.debug(...)`` (its own keyword arguments win): the magic's ``--every``/``--max-bytes``/…

    Never raises the cell's exception: it is ``run.error`` (re-raise it after showing the run; a
    worker's error also appears in ``run.errors``). ``run.value`` is ``run_cell()``'s return value.
    """
    __tracebackhide__ = True  # the cell's traceback starts at the user's code
    own = spool_dir is None
    root = Path(tempfile.mkdtemp(prefix="nbdebug-spool-")) if own else Path(spool_dir)  # type: ignore[arg-type]
    root.mkdir(parents=True, exist_ok=True)
    if options:
        (root / OPTIONS_FILE).write_text(json.dumps({k: v for k, v in options.items() if v is not None}))
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
