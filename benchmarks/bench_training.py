"""Training-loop overhead of the per-step history (issue 10), next to wandb.watch and detect_anomaly.

    python benchmarks/bench_training.py [--rounds 5] [--threads 1] [--steps 10000] [--quick] [--processes 5]

(a) small CNN (3 conv layers, 32 channels, 32×32 inputs, batch 32, ReLU, a linear head, SGD), a
    40-step loop: plain, ``nbdebug.Capture`` (full history, every step), ``nbdebug.debug(model,
    "thermometer")`` (what ``%%nndebug`` runs; building the widget afterwards is timed apart), the
    same with ``live=True`` in an IPython shell (the magic's default: live updates ≤ 4/s), and,
    when they work offline, ``wandb.watch(model, log="all", log_freq=1)`` (``WANDB_MODE=offline``)
    and ``torch.autograd.detect_anomaly()``. Target: Capture and debug ≤ 1.15× plain.
(b) digits-sized model (2 conv + 2 linear on 8×8, batch 16), a 100-step loop, where the fixed cost
    per hook call dominates. Target ≤ 1.5× plain.
(c) a 300-row model (150 Linear+ReLU pairs, width 32, batch 8) for 10,000 steps under
    ``max_bytes=64MB``: history bytes, process RSS growth, time per step vs plain.
(d) inference loops on the digits model: 100 forwards under ``torch.no_grad()``, and in grad mode
    without a backward (predictions collected): plain vs Capture vs debug. No target; each forward is a
    step (held back until 16 of them say it is an inference cell, then folded in batches).
One process, interleaved rounds (A, B, C, A, B, C…), medians. ``torch.set_num_threads`` (default
1) keeps two runs of the same loop comparable on a shared 2-core machine. The digits ratios also move
by ±0.03 from one process to the next on a quiet machine (the small CNN's by more): ``--processes N``
measures both loops again in N fresh processes each and reports each variant's median, min and max.
The figures README.md / docs/training.md quote are printed last, labelled. ``--quick``: 2-8 steps of
each loop (the small CNN on 8×8 inputs), one round, a 20-step memory run, and the ``--breakdown``
timers, and one fresh process that measures both loops and runs the ``--instructions`` children's loops
(without valgrind): every part of the full run, tiny. ``--instructions``: instructions per step under ``Capture`` over plain (callgrind), next
to the wall-time ratio (the wall-time ratios swing ±15% from run to run on a shared machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(__file__))
from common import Figures, instructions_per_call, interleaved, table

import nbdebug
from nbdebug.capture.budget import format_bytes, parse_bytes
from nbdebug.capture.session import Capture


def small_cnn(hw: int = 32) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * hw * hw, 10),
    )


def digits_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(16 * 8 * 8, 32), nn.ReLU(), nn.Linear(32, 10),
    )


def deep_mlp(pairs: int = 150, width: int = 32) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(pairs):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


class Loop:
    """``steps`` SGD steps on one fixed batch (data loading is not what is measured)."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float = 0.01) -> None:
        self.model, self.x, self.y, self.steps = model, x, y, steps
        self.opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        self.loss: torch.Tensor | None = None

    def __call__(self, after_step: Callable[[torch.Tensor], None] | None = None) -> None:
        for _ in range(self.steps):
            self.opt.zero_grad(set_to_none=True)
            out = self.model(self.x)
            loss = F.cross_entropy(out, self.y) if self.y.dtype == torch.long else F.mse_loss(out, self.y)
            loss.backward()
            self.opt.step()
            self.loss = loss
            if after_step is not None:
                after_step(loss)


def history_steps(result: object) -> str:
    hist = getattr(result, "history", None)
    if hist is None:
        return "no history (Capture without issue 10's history)"
    return f"{len(hist.step_index)} kept steps, {format_bytes(hist.nbytes)}"


@contextmanager
def quiet_ipython() -> Iterator[None]:
    """An IPython shell whose displays go nowhere, so ``live=True`` shows and updates its widget as in
    a notebook (the updates' cost is measured, not a front end's)."""
    from IPython.core.interactiveshell import InteractiveShell

    sh = InteractiveShell.instance()
    publish = sh.display_pub.publish
    sh.display_pub.publish = lambda *a, **k: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        sh.display_pub.publish = publish  # type: ignore[method-assign]


def wandb_variant(model: nn.Module, loop: Loop, tmp: str) -> tuple[Callable[[], object] | None, str]:
    """``wandb.watch(model, log="all", log_freq=1)`` around the loop, offline; (None, why) if it cannot run."""
    os.environ["WANDB_MODE"] = "offline"
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        import wandb

        run = wandb.init(project="nbdebug-bench", dir=tmp, mode="offline", reinit=True)
    except Exception as exc:  # not installed, or cannot start offline here
        return None, f"wandb unavailable: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    def fn() -> object:
        run.watch(model, log="all", log_freq=1)
        try:
            loop(lambda loss: run.log({"loss": loss.item()}))
        finally:
            run.unwatch(model)
        return None

    return fn, f"wandb {wandb.__version__} offline"


def anomaly_variant(loop: Loop) -> Callable[[], object]:
    def fn() -> object:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Anomaly Detection has been enabled…" every round
            with torch.autograd.detect_anomaly():
                loop()
        return None

    return fn


def bench_loop(name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, rounds: int,
               references: bool, tmp: str) -> tuple[list[tuple[str, ...]], list[str]]:
    loop = Loop(model, x, y, steps)
    kept: dict[str, object] = {}
    widget_times: list[float] = []

    def plain() -> object:
        loop()
        return None

    def capture() -> object:
        with Capture(model) as cap:
            loop()
        kept["capture"] = cap.result
        return None

    def capture_no_watch() -> object:
        """Diagnostic: the capture with an OptimizerWatch whose step hooks do nothing (update ratios and
        learning rates not read; the hooks' dispatch by torch remains), to attribute the overhead."""
        from nbdebug.capture import optim

        saved = optim.OptimizerWatch._pre, optim.OptimizerWatch._post
        optim.OptimizerWatch._pre = optim.OptimizerWatch._post = lambda *_: None  # type: ignore[method-assign]
        try:
            with Capture(model):
                loop()
        finally:
            optim.OptimizerWatch._pre, optim.OptimizerWatch._post = saved  # type: ignore[method-assign]
        return None

    debugs: list[object] = []

    def debug() -> object:
        with nbdebug.debug(model, "thermometer") as dbg:
            loop()
        debugs.append(dbg)  # its widget (what the magic displays afterwards) is built and timed after the rounds
        return None

    def debug_live() -> object:
        with quiet_ipython(), nbdebug.debug(model, "thermometer", live=True) as dbg:
            loop()
        for w in dbg.widgets():
            w.close()
        return None

    variants: dict[str, Callable[[], object]] = {
        "plain": plain, "nbdebug Capture": capture, "nbdebug.debug (%%nndebug)": debug, "nbdebug.debug live=True": debug_live,
        "(Capture, optimizer hooks empty)": capture_no_watch,
    }
    notes: list[str] = []
    if references:
        fn, why = wandb_variant(model, loop, tmp)
        if fn is not None:
            variants['wandb.watch log="all" freq 1'] = fn
        notes.append(why)
        variants["detect_anomaly"] = anomaly_variant(loop)
    cpu: dict[str, float] = {}
    t = interleaved(variants, rounds=rounds, warmup=1, cpu=cpu)
    rows = [(name, k, f"{v * 1e3:.1f}", f"{v / steps * 1e3:.2f}", f"{v / t['plain']:.3f}", f"{cpu[k] / cpu['plain']:.3f}")
            for k, v in t.items()]
    for dbg in debugs:
        c = time.perf_counter()
        w = dbg.widget()  # type: ignore[attr-defined]
        widget_times.append(time.perf_counter() - c)
        try:
            w.close()
        except Exception:
            pass
    debugs.clear()
    debug_total = t["nbdebug.debug (%%nndebug)"]
    widget_times.sort()
    wt = widget_times[len(widget_times) // 2]
    notes.append(f"{name}: widget construction after the loop {wt * 1e3:.1f} ms (median), excluded from the debug row; "
                 f"with it: {(debug_total + wt) / t['plain']:.3f}× plain")
    notes.append(f"{name}: Capture result {history_steps(kept.get('capture'))}")
    return rows, notes


def under_nbdebug(model: nn.Module, body: Callable[[], object]) -> tuple[Callable[[], None], Callable[[], None]]:
    """``body`` under ``Capture(model)`` and under ``nbdebug.debug(model, "thermometer")`` (what ``%%nndebug`` runs)."""
    def capture() -> None:
        with Capture(model):
            body()

    def debug() -> None:
        with nbdebug.debug(model, "thermometer"):
            body()

    return capture, debug


def per_step(name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, rounds: int,
             out: dict[str, float] | None = None) -> list[str]:
    """Each variant's cost split into a per-step part and a once-per-cell part (hook registration, the
    result, a live widget's creation and last update): the loop timed at ``steps`` steps and at 1 step,
    interleaved (process CPU time); per step = (T(steps) − T(1)) / (steps − 1), once = T(1) − per step."""
    loops = {n: Loop(model, x, y, n) for n in (1, steps)}

    def variants(loop: Loop) -> dict[str, Callable[[], object]]:
        capture, debug = under_nbdebug(model, loop)

        def live() -> None:
            with quiet_ipython(), nbdebug.debug(model, "thermometer", live=True) as dbg:
                loop()
            for w in dbg.widgets():
                w.close()

        return {"plain": loop, "Capture": capture, "debug": debug, "debug live=True": live}

    both = {f"{k}@{n}": fn for n, lp in loops.items() for k, fn in variants(lp).items()}
    cpu: dict[str, float] = {}
    interleaved(both, rounds=rounds, warmup=1, cpu=cpu)
    per = {k: (cpu[f"{k}@{steps}"] - cpu[f"{k}@1"]) / (steps - 1) for k in variants(loops[1])}
    lines = [f"{name}: per step and once per cell (CPU time, {steps} vs 1 step, median of {rounds} interleaved rounds)"]
    for k, v in per.items():
        once = cpu[f"{k}@1"] - v
        more = max(once - (cpu['plain@1'] - per['plain']), 0.0)
        lines.append(f"  {k:16s} {v * 1e6:7.1f} µs/step  {v / per['plain']:.3f}× plain per step;  "
                     f"once per cell {more * 1e3:5.2f} ms more than plain")
        if out is not None:
            out[f"{k} per step x"], out[f"{k} once ms"] = v / per["plain"], more * 1e3
    return lines


def breakdown(name: str, loop: Loop, rounds: int) -> list[str]:
    """Where a step's time goes: plain forward/backward/optimizer step, hooks that do nothing (the floor
    of any hook-based capture), and wall time inside each of Capture's entry points (timers wrapped
    around them; medians over ``rounds``)."""
    import statistics

    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    import nbdebug.capture.session as S
    from nbdebug.capture import calls as CL
    from nbdebug.capture import forward as FW
    from nbdebug.capture import optim as O
    from nbdebug.capture import paramgrads as PG

    pc = time.perf_counter
    acc: dict[str, float] = {}

    def timed(key: str, fn: Callable) -> Callable:
        def w(*a: object, **k: object) -> object:
            t = pc()
            try:
                return fn(*a, **k)
            finally:
                acc[key] = acc.get(key, 0.0) + pc() - t
        return w

    saved = {(FW.ForwardHooks, "_make_hook"): FW.ForwardHooks._make_hook, (CL.Call, "__call__"): CL.Call.__call__,
             (S, "close_step"): S.close_step, (FW, "stats_and_units"): FW.stats_and_units, (CL, "tensor_stats"): CL.tensor_stats,
             (O.OptimizerWatch, "_pre"): O.OptimizerWatch._pre, (O.OptimizerWatch, "_post"): O.OptimizerWatch._post,
             (PG.ParamGrads, "backward_ended"): PG.ParamGrads.backward_ended,
             (S.Capture, "__enter__"): S.Capture.__enter__, (S.Capture, "__exit__"): S.Capture.__exit__}
    mk = FW.ForwardHooks._make_hook
    FW.ForwardHooks._make_hook = lambda self, n, m: timed("forward hooks", mk(self, n, m))  # type: ignore[method-assign]
    CL.Call.__call__ = timed("output-gradient hooks", CL.Call.__call__)  # type: ignore[method-assign]
    S.close_step = timed("step close (closing.close_step + commit)", S.close_step)
    FW.stats_and_units = timed("  (in the forward hooks: stats_and_units)", FW.stats_and_units)
    CL.tensor_stats = timed("  (in the gradient hooks: tensor_stats)", CL.tensor_stats)
    O.OptimizerWatch._pre = timed("optimizer watch (pre + post hooks)", O.OptimizerWatch._pre)  # type: ignore[method-assign]
    O.OptimizerWatch._post = timed("optimizer watch (pre + post hooks)", O.OptimizerWatch._post)  # type: ignore[method-assign]
    PG.ParamGrads.backward_ended = timed("parameter-gradient norms", PG.ParamGrads.backward_ended)  # type: ignore[method-assign]
    S.Capture.__enter__ = timed("enter + exit (the result), per step", S.Capture.__enter__)  # type: ignore[method-assign]
    S.Capture.__exit__ = timed("enter + exit (the result), per step", S.Capture.__exit__)  # type: ignore[method-assign]

    def noop(*_: object) -> None:
        return None

    def bare() -> None:
        def fh(_m: nn.Module, _i: object, _k: object, o: object) -> None:
            if isinstance(o, torch.Tensor) and o.requires_grad:
                o.register_hook(noop)
        hs = [m.register_forward_hook(fh, with_kwargs=True) for m in loop.model.modules() if not list(m.children())]
        hs += [register_optimizer_step_pre_hook(noop), register_optimizer_step_post_hook(noop)]
        try:
            loop()
        finally:
            for h in hs:
                h.remove()

    def phases() -> tuple[float, float, float]:
        tf = tb = ts = 0.0
        for _ in range(loop.steps):
            loop.opt.zero_grad(set_to_none=True)
            t0 = pc()
            out = loop.model(loop.x)
            loss = F.cross_entropy(out, loop.y)
            t1 = pc()
            loss.backward()
            t2 = pc()
            loop.opt.step()
            t3 = pc()
            tf, tb, ts = tf + t1 - t0, tb + t2 - t1, ts + t3 - t2
        return tf, tb, ts

    plain, floor, cap, ph, parts = [], [], [], [], []
    try:
        for r in range(rounds + 1):
            t = pc()
            loop()
            p = pc() - t
            t = pc()
            bare()
            b = pc() - t
            acc.clear()
            t = pc()
            with S.Capture(loop.model):
                loop()
            c = pc() - t
            f = phases()
            if r:
                plain.append(p)
                floor.append(b)
                cap.append(c)
                ph.append(f)
                parts.append(dict(acc))
    finally:
        for (obj, attr), v in saved.items():
            setattr(obj, attr, v)
    med, n = statistics.median, loop.steps

    def ms(v: float) -> str:
        return f"{v / n * 1e3:8.3f} ms/step"

    p = med(plain)
    lines = [f"{name}: breakdown per step (median of {rounds} interleaved rounds)",
             f"  plain loop                              {ms(p)}",
             f"    forward / backward / optimizer step   {' / '.join(f'{med([x[i] for x in ph]) / n * 1e3:.3f}' for i in range(3))} ms",
             f"  no-op hooks (fwd, tensor, optim)        {ms(med(floor))}  {med(floor) / p:.2f}× plain (the floor of any hook-based capture)",
             f"  Capture                                 {ms(med(cap))}  {med(cap) / p:.2f}× plain; overhead {ms(med(cap) - p)}"]
    keys = sorted({k for d in parts for k in d}, key=lambda k: (k.startswith("  "), -med([d.get(k, 0.0) for d in parts])))
    for k in keys:
        lines.append(f"    {k:38s}{ms(med([d.get(k, 0.0) for d in parts]))}")
    return lines


def memory_run(steps: int, out: dict[str, Any] | None = None) -> list[str]:
    """10,000 steps of a 300-row model under max_bytes=64MB: history bytes, RSS growth, time per step."""
    import psutil

    torch.manual_seed(0)
    model = deep_mlp()
    x, y = torch.randn(8, 32), torch.randn(8, 32)
    proc = psutil.Process()
    plain_loop = Loop(model, x, y, min(steps, 500), lr=1e-3)
    plain_loop()  # warm up
    t = time.perf_counter()
    plain_loop()
    plain_step = (time.perf_counter() - t) / plain_loop.steps
    loop = Loop(model, x, y, steps, lr=1e-3)
    rss0 = proc.memory_info().rss
    peak = rss0
    done = [0]
    every = max(steps // 40, 1)  # 250 of the 10,000 steps; every step of --quick's 20

    def watch_rss(_loss: torch.Tensor) -> None:
        nonlocal peak
        done[0] += 1
        if done[0] % every == 0:
            peak = max(peak, proc.memory_info().rss)

    t = time.perf_counter()
    with Capture(model, max_bytes=parse_bytes("64MB")) as cap:
        loop(watch_rss)
    total = time.perf_counter() - t
    peak = max(peak, proc.memory_info().rss)
    res = cap.result
    hist = getattr(res, "history", None)
    rows = len(hist.rows) if hist is not None else len(res.layers)
    lines = [
        f"300-row model (150 Linear+ReLU, width 32, batch 8), {steps} steps, max_bytes=64MB: {rows} rows",
        f"  history: {history_steps(res)}; steps seen {getattr(res, 'steps', '?')}",
        f"  process RSS growth: peak {format_bytes(peak - rss0)}, after the capture {format_bytes(max(proc.memory_info().rss - rss0, 0))}",
        f"  time per step: {total / steps * 1e3:.2f} ms under Capture vs {plain_step * 1e3:.2f} ms plain ({total / steps / plain_step:.2f}×)",
    ]
    if out is not None:
        out.update(rows=rows, history=history_steps(res), rss=format_bytes(max(proc.memory_info().rss - rss0, 0)),
                   ratio=total / steps / plain_step, ms=total / steps * 1e3)
    return lines


def across_processes(n: int, rounds: int, threads: int, quick: bool, out: dict[str, str] | None = None,
                     also: list[str] | None = None) -> list[str]:
    """Each target loop's ratios (CPU time, × plain) measured in ``n`` fresh processes, one after the other;
    ``out`` (a dict) also gets "loop: variant" → "median [min – max]". ``quick``: each process measures both
    loops, one after the other (a fresh process costs ~6 CPU-s of imports; --quick's figures mean nothing),
    and ``also`` (more arguments) gives it more to do: what other fresh processes of the full run do."""
    loops = (("digits", 4 if quick else 100), ("cnn", 2 if quick else 40))
    runs: dict[str, list[dict[str, float]]] = {loop: [] for loop, _ in loops}
    batches = [[loop for loop, _ in loops]] * n if quick else [[loop] for loop, _ in loops for _ in range(n)]
    for batch in batches:
        cmd = [sys.executable, __file__, "--only", ",".join(batch), "--rounds", str(rounds), "--threads", str(threads),
               *(["--quick"] if quick else []), *(also or [])]
        stdout = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        for loop, line in zip(batch, stdout.strip().splitlines()[-len(batch):]):  # a JSON line per loop, in order
            runs[loop].append(json.loads(line))
    lines: list[str] = []
    for loop, steps in loops:
        name = "digits" if loop == "digits" else "small CNN"
        lines.append(f"{name} ({steps} steps) in {n} fresh processes, × plain (CPU time): median [min – max]; each process's value")
        for k in runs[loop][0]:
            vals = [r[k] for r in runs[loop]]
            lines.append(f"  {k:34s} {statistics.median(vals):.3f} [{min(vals):.3f} – {max(vals):.3f}]   "
                         + " ".join(f"{v:.3f}" for v in vals))
            if out is not None:
                out[f"{name}: {k}"] = f"{statistics.median(vals):.3f} [{min(vals):.3f} – {max(vals):.3f}]"
    return lines


def _instr_child(spec: str, threads: int, hw: int) -> None:
    """One ``--instr-child loop:variant:steps`` process: the loop once, plain or under ``Capture``."""
    loop_name, variant, steps = spec.split(":")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if loop_name == "digits":
        model, x, y = digits_model(), torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    else:
        model, x, y = small_cnn(hw), torch.randn(32, 3, hw, hw), torch.randint(0, 10, (32,))
    loop = Loop(model, x, y, int(steps))
    if variant == "plain":
        loop()
    else:
        with Capture(model):
            loop()


UNCOUNTED = ",".join(f"{loop}:{variant}:1" for loop in ("digits", "cnn") for variant in ("plain", "Capture"))


def instruction_ratios(threads: int, quick: bool, hw: int, out: dict[str, str] | None = None, ran: bool = False) -> list[str]:
    """Instructions per step under ``Capture`` over plain, counted by valgrind's callgrind (wall-time
    ratios swing ±15% on a shared machine; instruction counts do not): ``common.instructions_per_call``,
    each variant in its own process for ``lo`` and ``hi`` steps, the difference divided by ``hi - lo``, so
    the import, model set-up and warm-up cancel out (tests/unit/test_bench_instructions.py checks that
    counting on small programs). ``quick`` runs the children's loops without valgrind (under it, importing
    torch alone takes about a minute): the code path is checked, nothing is counted; ``ran``: those
    children's loops already ran in another fresh process (``--quick``: the cross-process spread's)."""
    import shutil

    counting = shutil.which("valgrind") is not None and not quick
    lines = [f"instructions per step (callgrind{'' if counting else ': not counted, --quick or no valgrind'}), × plain"]
    if not counting:  # nothing counted: the four children's loops in one process (one torch import, not four)
        if not ran:
            subprocess.run([sys.executable, __file__, "--instr-child", UNCOUNTED, "--threads", str(threads),
                            *(["--quick"] if quick else [])], capture_output=True, text=True, check=True)
        where = "the cross-process spread's fresh process" if ran else "one fresh process"
        return [*lines, f"  digits, small CNN: their plain and Capture loops ran ({where}); not counted"]
    for loop, (lo, hi) in (("digits", (10, 30)), ("cnn", (5, 15))):
        per = instructions_per_call(
            lambda variant, steps, loop=loop: [sys.executable, __file__, "--instr-child", f"{loop}:{variant}:{steps}",
                                               "--threads", str(threads)],
            ("plain", "Capture"), lo, hi, count=True)
        name = "digits" if loop == "digits" else "small CNN"
        if per:
            ratio = per["Capture"] / per["plain"]
            lines.append(f"  {name}: plain {per['plain'] / 1e6:.2f}M, Capture {per['Capture'] / 1e6:.2f}M per step: {ratio:.3f}×")
            if out is not None:
                out[name] = f"{ratio:.3f}"
        else:
            lines.append(f"  {name}: its plain and Capture processes ran; not counted")
    return lines


def inference_loops(rounds: int, quick: bool) -> list[tuple[str, ...]]:
    """(d): forward-only loops (no optimizer, no backward) on the digits model."""
    model, x = digits_model(), torch.randn(16, 1, 8, 8)
    n = 4 if quick else 100
    rows: list[tuple[str, ...]] = []
    for mode, ctx in (("no_grad", torch.no_grad), ("grad mode, no backward", contextlib.nullcontext)):
        def run(ctx: Callable[[], Any] = ctx) -> None:
            with ctx():
                outs = [model(x) for _ in range(n)]
            del outs

        capture, debug = under_nbdebug(model, run)
        cpu: dict[str, float] = {}
        t = interleaved({"plain": run, "nbdebug Capture": capture, "nbdebug.debug (%%nndebug)": debug},
                        rounds=rounds, warmup=1, cpu=cpu)
        rows += [(f"digits {n} forwards, {mode}", k, f"{v * 1e3:.1f}", f"{v / n * 1e3:.3f}", f"{v / t['plain']:.3f}",
                  f"{cpu[k] / cpu['plain']:.3f}") for k, v in t.items()]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--steps", type=int, default=10_000, help="steps of the memory run (c)")
    ap.add_argument("--no-references", action="store_true", help="skip wandb.watch and detect_anomaly")
    ap.add_argument("--no-memory", action="store_true", help="skip the 10,000-step memory run (c)")
    ap.add_argument("--quick", action="store_true", help="few steps, one round, and --breakdown: checks the script runs to the end")
    ap.add_argument("--breakdown", action="store_true", help="also: where each loop's step time goes (timers in Capture)")
    ap.add_argument("--processes", type=int, default=1, help="also: the loops (a) and (b) in N fresh processes each (median, min, max)")
    ap.add_argument("--instructions", action="store_true",
                    help="also: instructions per step under Capture over plain, counted by valgrind --tool=callgrind (minutes)")
    ap.add_argument("--only", help=argparse.SUPPRESS)  # one of those processes: "digits", "cnn" or both; a JSON line of ratios per loop
    ap.add_argument("--instr-child", help=argparse.SUPPRESS)  # one process of --instructions
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rounds, mem_steps = (1, 20) if a.quick else (a.rounds, a.steps)
    cnn_steps, digits_steps, hw = (2, 4, 8) if a.quick else (40, 100, 32)
    only = a.only.split(",") if a.only else []
    if set(only) - {"digits", "cnn"}:
        ap.error(f"--only takes digits, cnn or digits,cnn, not {a.only}")
    if a.instr_child:
        for spec in a.instr_child.split(","):  # several when nothing is counted (instruction_ratios)
            _instr_child(spec, a.threads, hw)
        if not only:
            return
    # --quick runs every part of the full run (`make bench` passes --processes 5 --instructions), tiny: the
    # cross-process spread in one fresh process for both loops, which also runs the --instructions children's
    # loops (the same code as the full run's processes; each process costs ~6 CPU-s of imports, the quick
    # run's largest cost)
    processes = max(a.processes, 1) if a.quick else a.processes
    breakdowns = a.breakdown or a.quick
    torch.manual_seed(0)
    for loop in only:
        torch.manual_seed(0)  # each loop as its own process would run it
        with tempfile.TemporaryDirectory() as tmp:
            if loop == "digits":
                r, _ = bench_loop("digits", digits_model(), torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,)),
                                  digits_steps, rounds, False, tmp)
            else:
                r, _ = bench_loop("small CNN", small_cnn(hw), torch.randn(32, 3, hw, hw), torch.randint(0, 10, (32,)),
                                  cnn_steps, rounds, False, tmp)
        print(json.dumps({row[1]: float(row[5]) for row in r}), flush=True)  # CPU-time ratios to plain
    if only:
        return
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    cnn_name, digits_name = f"small CNN b32 {hw}² ({cnn_steps} steps)", f"digits 2conv+2lin b16 8² ({digits_steps} steps)"
    with tempfile.TemporaryDirectory() as tmp:
        cnn = small_cnn(hw)
        cnn_rows, n = bench_loop(cnn_name, cnn, torch.randn(32, 3, hw, hw), torch.randint(0, 10, (32,)),
                                 cnn_steps, rounds, not a.no_references, tmp)
        rows += cnn_rows
        notes += n
        if breakdowns:
            notes += breakdown("small CNN", Loop(cnn, torch.randn(32, 3, hw, hw), torch.randint(0, 10, (32,)), cnn_steps),
                               rounds)
        digits = digits_model()
        if breakdowns:
            notes += breakdown("digits", Loop(digits, torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,)), digits_steps),
                               rounds)
        digits_rows, n = bench_loop(digits_name, digits, torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,)),
                                    digits_steps, rounds, False, tmp)
        rows += digits_rows
        notes += n
        once: dict[str, float] = {}
        notes += per_step("digits", digits, torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,)), digits_steps, rounds, once)
        inference_rows = inference_loops(rounds, a.quick)
        rows += inference_rows
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {rounds} interleaved rounds, "
          f"load average {os.getloadavg()[0]:.2f} at the end")
    print(table(rows, ("loop", "variant", "ms (median)", "ms/step", "× plain", "× plain (CPU time)")))
    print("targets: small CNN Capture/debug ≤ 1.15×, digits ≤ 1.5×")
    for line in notes:
        print(line)
    spread: dict[str, str] = {}
    also = ["--instr-child", UNCOUNTED] if a.quick else []  # nothing counted in --quick: see instruction_ratios
    if processes > 1 or a.quick:
        for line in across_processes(processes, rounds, a.threads, a.quick, spread, also):
            print(line)
    instr: dict[str, str] = {}
    if a.instructions or a.quick:
        for line in instruction_ratios(a.threads, a.quick, hw, instr, ran=bool(also)):
            print(line)
    mem: dict[str, Any] = {}
    if not a.no_memory:
        for line in memory_run(mem_steps, mem):
            print(line)
    print(f"load average {os.getloadavg()[0]:.2f} at the end (2 cores: above ~1 another process shared them)")
    fig = Figures("docs/training.md (overhead) and benchmarks/README.md; × plain in CPU time, this process")
    for name, loop_rows in ((cnn_name, cnn_rows), (digits_name, digits_rows)):
        for row in loop_rows[1:]:
            fig.add(f"{name}: {row[1]}", f"{row[5]}×")
    for k, v in spread.items():
        fig.add(f"{k} over {processes} fresh processes, median [min – max]", f"{v}×")
    for name, loop_rows in ((cnn_name, cnn_rows), (digits_name, digits_rows)):
        key = "digits" if loop_rows is digits_rows else "small CNN"
        if key in instr:
            wall = next(r[4] for r in loop_rows if r[1] == "nbdebug Capture")
            fig.add(f"{name}: Capture, instructions per step (callgrind) / wall time, × plain", f"{instr[key]}× / {wall}×")
    if "debug live=True once ms" in once:
        fig.add("digits: the live view's widget, per cell (once-per-cell cost of debug live=True over debug)",
                f"~{once['debug live=True once ms'] - once['debug once ms']:.1f} ms")
    for row in inference_rows:
        if row[1] != "plain":
            fig.add(f"{row[0]}: {row[1]}", f"{row[5]}×")
    if mem:
        fig.add(f"{mem_steps:,} steps × {mem['rows']} rows within --max-bytes 64MB", f"{mem['history']}, RSS +{mem['rss']}, "
                f"{mem['ms']:.2f} ms/step ({mem['ratio']:.2f}× plain)")
    fig.print()


if __name__ == "__main__":
    main()
