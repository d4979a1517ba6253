"""The launcher side: a spool read back as a :class:`Run` (every rank's result, the first NaN/Inf
across ranks, parameters that differ across ranks)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..capture.spool import RankSpool, read_rank, scan
from .results import result_of

__all__ = ["FORK_HINT", "SAME_RANK", "NonFinite", "Run", "load"]

FORK_HINT = ("if the workers were forked (start_method='fork', accelerate's notebook_launcher) from a kernel that "
             "already ran multi-threaded torch ops, their thread pool deadlocks: call torch.set_num_threads(1) first "
             "thing in the worker, or use start_method='spawn' with the worker in a module file")
SAME_RANK = ("processes {pids} all claim rank {rank}: torch.distributed was not initialised in them and RANK was "
             "not set (accelerate's notebook_launcher on CPU needs ACCELERATE_USE_CPU=yes, otherwise every process "
             "believes it is rank 0); shown: pid {shown}")


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
        from ..capture.history import FIELD_INDEX

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
    forward, so they differ after a forward by design); ``errors`` (rank → the error it raised, in the
    order they were raised: the first is the cause, later ones are often collectives that failed with it),
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
        for s in spools:  # what the workers noticed (accelerate's state, views not recorded)
            for n in s.meta.get("notes") or []:
                if n not in self.notes:
                    self.notes.append(n)
        # in the order they were raised: after one rank fails, the others' collectives fail too (gloo: the peer
        # closed the connection), and the launcher may report any of them; the first is the cause
        raised = sorted((s.final.get("time", 0.0), s.rank, s.final["raised"]) for s in self._live() if s.final and s.final.get("raised"))
        self.errors: dict[int, str] = {r: e for _, r, e in raised}
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
        module = base.history.row_info[base.history.rows.index(base.row_name(row))]["module"]
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

    @property
    def focus(self) -> int | None:
        """The rank to look at first: the first NaN/Inf's, else the lowest rank that raised, else 0."""
        if self.first_nonfinite:
            return self.first_nonfinite[0].rank
        if self.errors:
            return next(iter(self.errors))  # the first raised
        return next((r for r, res in enumerate(self.ranks) if res is not None), None)

    def summary(self) -> str:
        """What happened across ranks, in one paragraph (the magic shows it above the view)."""
        return _summary(self)

    def widget(self, rank: int | None = None) -> Any:
        """Without ``rank``: the whole run's view (:class:`~nbdebug.widgets.run.RunWidget`: a rank
        selector on :attr:`focus`, the spread across ranks, the first NaN/Inf, diverged parameters);
        with ``rank``: that rank's :class:`~nbdebug.widgets.thermometer.ThermometerWidget`."""
        if rank is None:
            from ..widgets.run import RunWidget

            if all(res is None for res in self.ranks):
                raise LookupError(self.summary())
            return RunWidget(self)
        from ..inspectors.thermometer import diagnose
        from ..widgets.thermometer import ThermometerWidget

        res = self.ranks[rank] if 0 <= rank < len(self.ranks) else None
        if res is None:
            raise LookupError(f"rank {rank} recorded nothing: " + self.summary())
        return ThermometerWidget(diagnose(res), res)

    def show(self) -> None:
        """Display the run's view (:meth:`widget`), or the summary alone when no rank recorded anything."""
        from IPython.display import display

        from ..widgets.dashboard import ViewNote

        if all(res is None for res in self.ranks):
            display(ViewNote(self.summary()))
        else:
            display(self.widget())

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


def _summary(run: Run) -> str:
    """One paragraph: ranks and steps, the first NaN/Inf, divergence, errors, notes."""
    steps = ", ".join(f"rank {r}: {'—' if res is None else res.steps}" for r, res in enumerate(run.ranks))
    parts = [f"{run.world_size} rank(s) (steps {steps})" if run.ranks else "no rank recorded"]
    if run.first_nonfinite:
        f = run.first_nonfinite[0]
        also = "; ".join(f"rank {x.rank} step {x.step} ({x.phase})" for x in run.first_nonfinite[1:])
        parts.append(f"first NaN/Inf: rank {f.rank}, step {f.step}, `{f.module}` ({f.phase})" + (f"; also {also}" if also else ""))
    if run.diverged:
        parts.append(f"parameters that differ across ranks after step {run.compared_step}: {', '.join(run.diverged)}")
    for i, (r, e) in enumerate(run.errors.items()):
        parts.append(f"rank {r} raised {e}" + (" first" if i == 0 and len(run.errors) > 1 else ""))
    left = {r: n for r, n in run.hooks_left.items() if n}
    if left:
        parts.append(f"hooks left: {left}")
    return "; ".join(parts + run.notes)
