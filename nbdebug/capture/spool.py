"""The spool: how each rank's capture reaches the launching process, as files (no server port).

One directory per run; in it one subdirectory per process that entered ``nbdebug.debug`` in a
worker, named ``rank{R}-{pid}`` (two processes that both believe they are rank 0 get two
directories, which is how the reader tells them apart)::

    spool/
      rank0-4711/
        meta.json                   rank, world size, where the rank came from, parameter layout
        c00000001_00000001.npz      one chunk per step: the history slots changed since the last chunk,
        c00000002_00000002.npz      the parameter/gradient/buffer fingerprints, new incidents (JSON)
        final.json                  at exit: the merged rows, the error if the cell raised, hooks left

Every file is written to a temporary name and renamed (atomic on POSIX), so a reader never sees
half a file and a rank that raises or is killed leaves every step it finished. A chunk is
``numpy.savez`` of plain arrays plus one JSON string: nothing is pickled. The chunk name carries
the sequence number and the step, so progress is read from a directory listing alone.

This module is pure numpy + JSON (no torch): the launching kernel reads spools without
``torch.distributed``.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .history import SCALARS, History

__all__ = ["LAUNCHER_ENV", "OPTIONS_FILE", "SPOOL_ENV", "RankSpool", "SpoolWriter", "jsonable", "launcher_options", "progress",
           "read_rank", "scan", "wants_spool"]

SPOOL_ENV = "NBDEBUG_SPOOL"  # the spool directory, set for the workers by the launcher
LAUNCHER_ENV = "NBDEBUG_SPOOL_LAUNCHER"  # pid of the launching process (it never spools itself)
FORMAT = 1
OPTIONS_FILE = "options.json"  # the launcher's defaults for every worker's nbdebug.debug(...)
FP_KEEP = 64  # steps whose fingerprint chunks stay on disk after a rewrite of the whole history
MIN_CHUNKS = 64  # chunks on disk before the writer considers rewriting the whole history into one
_DIR = re.compile(r"^rank(\d+)-(\d+)$")
_CHUNK = re.compile(r"^c(\d{8})_(\d+)\.npz$")


def wants_spool() -> bool:
    """Whether ``nbdebug.debug`` in this process should write to a spool: ``NBDEBUG_SPOOL`` is set
    and this is not the launching process itself."""
    return bool(os.environ.get(SPOOL_ENV)) and os.environ.get(LAUNCHER_ENV) != str(os.getpid())


def launcher_options(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The launcher's option defaults for the workers (``options.json`` in the spool; {} when none)."""
    try:
        data = json.loads((Path(root) / OPTIONS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def jsonable(x: Any) -> Any:
    """Plain JSON data from stats dicts, tuples, numpy scalars; anything else (tensors) → None."""
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return None


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _dumps(obj: Any) -> str:
    return json.dumps(jsonable(obj), allow_nan=True)


class SpoolWriter:
    """Writes one process's directory in a spool (see the module doc).

    :meth:`write_step` after every step (only the history slots that changed since the previous
    chunk), :meth:`write_final` once at exit. ``bytes_written`` / ``chunks`` count what went to disk.
    """

    def __init__(self, root: str | os.PathLike[str], rank: int, pid: int | None = None) -> None:
        self.root = Path(root)
        self.rank = int(rank)
        self.pid = os.getpid() if pid is None else int(pid)
        self.dir = self.root / f"rank{self.rank}-{self.pid}"
        self.dir.mkdir(parents=True, exist_ok=True)
        # a later block in the same process continues the numbering (its first chunk rewrites the history)
        self.seq = max((int(m.group(1)) for e in os.scandir(self.dir) if (m := _CHUNK.match(e.name))), default=0)
        self.chunks = 0
        self.bytes_written = 0
        self._token = 0
        self._rows_sent = 0
        self._on_disk: list[tuple[int, Path]] = []  # (step, path) of this writer's chunks
        self._whole_bytes = 0  # bytes of the last chunk that holds the whole history
        self._since = 0  # bytes of the chunks written after it
        self._incidents: list[Any] = []  # every incident written (carried into whole-history chunks)
        self._bad_grad: list[int] | None = None  # [step, parameter index] of the first NaN/Inf gradient norm

    def others(self) -> list[int]:
        """Pids of other processes that wrote a directory for the same rank in this spool."""
        out = []
        for r, pid, _ in scan(self.root):
            if r == self.rank and pid != self.pid:
                out.append(pid)
        return out

    def write_json(self, name: str, obj: Any) -> None:
        data = _dumps(obj).encode()
        _write(self.dir / name, data)
        self.bytes_written += len(data)

    def write_step(self, step: int, history: History | None, arrays: Mapping[str, np.ndarray] | None = None,
                   info: Mapping[str, Any] | None = None) -> int:
        """One chunk for ``step``: the history slots changed since the last chunk (all of them after
        a decimation), ``arrays`` (fingerprints) and ``info`` (JSON: ``incidents``, notes). Returns its bytes.

        Disk stays bounded: once the chunks since the last whole-history chunk outweigh it (and there
        are at least :data:`MIN_CHUNKS`), this chunk holds the whole history, and every earlier chunk
        older than :data:`FP_KEEP` steps is deleted (their incidents and the first NaN/Inf gradient
        are carried in this chunk's JSON)."""
        self.seq += 1
        meta: dict[str, Any] = {"seq": self.seq, "step": int(step), "time": time.time(), **(info or {})}
        out: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in (arrays or {}).items()}
        self._incidents += list(meta.get("incidents") or [])
        g = out.get("fp_grads")
        if self._bad_grad is None and g is not None and g.size and not np.isfinite(g).all():
            self._bad_grad = [int(step), int(np.flatnonzero(~np.isfinite(g))[0])]
        if self._bad_grad is not None:
            meta["first_bad_grad"] = self._bad_grad
        whole = False
        if history is not None:
            if len(self._on_disk) >= MIN_CHUNKS and self._since > self._whole_bytes:
                self._token = 0  # this chunk rewrites the whole history
            token, start = history.changes_since(self._token)
            k, r = len(history), len(history.rows)
            meta["history"] = {"steps": history.steps, "appended": history.appended, "max_bytes": history.max_bytes}
            if start < k or r > self._rows_sent:
                whole = start == 0
                rows_from = 0 if whole else self._rows_sent
                meta["history"].update(start=int(start), rows=r, rows_from=rows_from,
                                       new_rows=[jsonable(i) for i in history.row_info[rows_from:]])
                count = history.bucket_steps[start:]
                out["h_idx"] = np.stack([history.step_index[start:], history.bucket_first[start:], count], axis=1)
                aggs = ("last", "min", "max") if bool((count > 1).any()) else ("last",)
                for agg in aggs:  # a bucket of one step has min = max = last: not written twice
                    out[f"h_{agg}"] = history.values(agg, start)
                    out[f"s_{agg}"] = np.stack([history.scalar(s, agg, start) for s in SCALARS], axis=1) if k - start else \
                        np.zeros((0, len(SCALARS)), np.float32)
            self._token, self._rows_sent = token, r
        if whole:
            meta["carried_incidents"] = self._incidents
        out["meta"] = np.array(_dumps(meta))
        buf = io.BytesIO()
        np.savez(buf, **out)
        data = buf.getvalue()
        path = self.dir / f"c{self.seq:08d}_{int(step)}.npz"
        _write(path, data)
        self.chunks += 1
        self.bytes_written += len(data)
        if whole:  # every earlier chunk's history is in this one: keep only recent fingerprints
            self._whole_bytes, self._since = len(data), 0
            keep = []
            for s, p in self._on_disk:
                if s > step - FP_KEEP:
                    keep.append((s, p))
                else:
                    p.unlink(missing_ok=True)
            self._on_disk = keep
        else:
            self._since += len(data)
        self._on_disk.append((int(step), path))
        return len(data)

    def write_final(self, info: Mapping[str, Any]) -> None:
        """``final.json``: written once when the process's capture closed (normally or by an error)."""
        self.write_json("final.json", {"time": time.time(), "chunks": self.seq, **info})


# ---------------------------------------------------------------------- reading
def scan(root: str | os.PathLike[str]) -> list[tuple[int, int, Path]]:
    """``(rank, pid, dir)`` of every process directory in a spool, by rank then start time."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for entry in os.scandir(root):
        m = _DIR.match(entry.name)
        if m and entry.is_dir():
            try:
                t = (Path(entry.path) / "meta.json").stat().st_mtime
            except OSError:
                t = math.inf
            found.append((int(m.group(1)), int(m.group(2)), Path(entry.path), t))
    found.sort(key=lambda x: (x[0], x[3], x[1]))
    return [(r, pid, p) for r, pid, p, _ in found]


def progress(root: str | os.PathLike[str]) -> dict[tuple[int, int], tuple[int, float, bool]]:
    """``(rank, pid) → (last step written, time of the last write, closed)`` from directory listings only."""
    out: dict[tuple[int, int], tuple[int, float, bool]] = {}
    for rank, pid, path in scan(root):
        step, last, closed = 0, 0.0, False
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for e in entries:
            m = _CHUNK.match(e.name)
            if m or e.name in ("meta.json", "final.json"):
                try:
                    last = max(last, e.stat().st_mtime)
                except OSError:
                    continue
            if m:
                step = max(step, int(m.group(2)))
            closed = closed or e.name == "final.json"
        out[(rank, pid)] = (step, last, closed)
    return out


@dataclass
class RankSpool:
    """What one process wrote: its meta, history, per-step fingerprints, incidents and final summary."""

    rank: int
    pid: int
    dir: Path
    meta: dict[str, Any]
    final: dict[str, Any] | None  # None: the process never closed its capture (killed, or still running)
    history: History | None
    step: int  # the last step a chunk was written for
    fingerprints: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)  # step → arrays
    incidents: list[dict[str, Any]] = field(default_factory=list)
    first_bad_grad: tuple[int, int] | None = None  # (step, parameter index) of the first NaN/Inf gradient
    chunks: int = 0
    nbytes: int = 0  # bytes on disk
    last_write: float = 0.0


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class _Slots:
    """A history rebuilt from chunks: each chunk replaces the slots from its ``start`` on."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.step = np.zeros(0, np.int64)
        self.first = np.zeros(0, np.int64)
        self.count = np.zeros(0, np.int64)
        self.v: list[list[np.ndarray]] = [[], [], []]  # per agg: one [R_at_write, F] matrix per slot
        self.s: list[list[np.ndarray]] = [[], [], []]
        self.info: dict[str, Any] = {}

    def add(self, h: dict[str, Any], z: Any) -> None:
        self.info = h
        if "start" not in h:
            return
        start = int(h["start"])
        del self.rows[int(h.get("rows_from", len(self.rows))):]
        for info in h.get("new_rows", []):
            if "shape" in info and isinstance(info["shape"], list):
                info["shape"] = tuple(info["shape"])
            self.rows.append(info)
        idx = z["h_idx"].reshape(-1, 3)
        self.step = np.concatenate([self.step[:start], idx[:, 0]])
        self.first = np.concatenate([self.first[:start], idx[:, 1]])
        self.count = np.concatenate([self.count[:start], idx[:, 2]])
        for i, agg in enumerate(("last", "min", "max")):
            key = f"h_{agg}" if f"h_{agg}" in z.files else "h_last"
            skey = f"s_{agg}" if f"s_{agg}" in z.files else "s_last"
            self.v[i] = self.v[i][:start] + list(z[key])
            self.s[i] = self.s[i][:start] + list(z[skey])

    def history(self) -> History | None:
        if not self.info:
            return None
        buckets = ((int(self.first[j]), int(self.step[j]), int(self.count[j]), [per[j] for per in self.v], [s[j] for s in self.s])
                   for j in range(len(self.step)))
        return History.from_buckets(self.rows, buckets, steps=int(self.info.get("steps", 0)),
                                    appended=int(self.info.get("appended", int(self.count.sum()))),
                                    max_bytes=int(self.info.get("max_bytes", 2**40)))


def read_rank(path: str | os.PathLike[str], attempts: int = 5) -> RankSpool:
    """Read one process directory (chunks in order). A chunk deleted while reading (the writer
    compacted its directory) starts the read over."""
    for _ in range(attempts - 1):
        try:
            return _read_rank(Path(path))
        except FileNotFoundError:
            continue
    return _read_rank(Path(path), strict=False)


def _read_rank(path: Path, strict: bool = True) -> RankSpool:
    m = _DIR.match(path.name)
    rank, pid = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    meta = _load_json(path / "meta.json") or {}
    final = _load_json(path / "final.json")
    chunks = sorted((int(mm.group(1)), int(mm.group(2)), e.name) for e in os.scandir(path) if (mm := _CHUNK.match(e.name)))
    out = RankSpool(rank, pid, path, meta, final, None, 0)
    slots = _Slots()
    seen: set[str] = set()
    for _, step, name in chunks:
        fp = path / name
        try:
            out.nbytes += fp.stat().st_size
            with np.load(fp, allow_pickle=False) as z:
                cm = json.loads(str(z["meta"]))
                if "history" in cm:
                    slots.add(cm["history"], z)
                arrays = {k: z[k] for k in z.files if k.startswith("fp_")}
        except FileNotFoundError:
            if strict:
                raise
            continue
        except (OSError, ValueError, KeyError):
            continue
        if arrays:
            out.fingerprints[step] = arrays
        for d in (cm.get("carried_incidents") or []) + (cm.get("incidents") or []):
            key = json.dumps(d, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.incidents.append(d)
        if cm.get("first_bad_grad") and out.first_bad_grad is None:
            out.first_bad_grad = (int(cm["first_bad_grad"][0]), int(cm["first_bad_grad"][1]))
        out.step = max(out.step, step)
        out.last_write = max(out.last_write, float(cm.get("time", 0.0)))
        out.chunks += 1
    out.incidents.sort(key=lambda d: d.get("step") or 0)
    out.history = slots.history()
    return out
