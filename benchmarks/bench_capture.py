"""Thermometer capture overhead vs the plain forward(+backward) and vs the hooks people write today.

    python benchmarks/bench_capture.py [--rounds 7] [--quick] [--no-kernel]
    python benchmarks/bench_capture.py --kernel [--threads 1 2]
    python benchmarks/bench_capture.py --instructions   # + instructions per forward (callgrind), minutes

``--quick``: tiny models (ResNet-18 layout at width 8, b1 32²; a 2-layer GPT-2 with d=32, 8 tokens),
one round, checks the script runs to the end (the ``--instructions`` child processes included, run
without valgrind). ``--instructions``: nbdebug's forward over the plain one in instructions counted by
valgrind's callgrind (one thread; a process per variant and call count, the difference of 1 and 2
forwards), printed beside the wall-time ratio: wall time swings ±15% on a shared machine, instruction
counts do not. The figures README.md / docs/comparison.md quote are
printed last, labelled.

The kernel table (after the models; alone with ``--kernel``, left out with ``--no-kernel``): the per-tensor cost of ``stats_and_units`` (the forward hook's stats + dead-unit
mask) and ``tensor_stats`` with the fused native kernel vs the torch/numpy path
(``NBDEBUG_NATIVE=0``), on tensors just written by a ReLU (1k, 16k, 1M float32 elements), in µs
per call including the Python work, per torch thread count.

Models: a ResNet-18-shaped CNN (batch 8, 224²) and a GPT-2-small-config transformer (random init,
128 tokens). Variants, all hooking every leaf module:
  plain          the model alone
  nbdebug        nbdebug.capture.Capture (forward stats, one host sync at exit)
  nbdebug-dev    the same on the accelerator path run on the CPU (stats stay on the device, a fixed
                 number of transfers at exit; what CUDA/MPS run), for reference
  item-hooks     tutorial hooks: mean/std/min/max/zero-fraction/NaN each via .item()
  clone-hooks    hooks that keep a clone of every output (what "cache everything" tools do)
and, with a backward pass, plain fwd+bwd vs nbdebug with gradient stats.
Targets (issues #2, #9): nbdebug ≤ 1.15× plain forward on both models, < 16 MB extra peak memory;
per-step tracking, checkpoint detection and error location (issue #9) add no per-hook cost to speak of.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from common import (
    Figures,
    ResNet18,
    exact_rss_env,
    gpt2_small,
    instructions_per_call,
    interleaved,
    peak_extra_bytes,
    table,
)

from nbdebug.capture import HookSet, select_modules
from nbdebug.capture.session import Capture
from nbdebug.testing import ResNetShaped


def item_hooks(model: nn.Module) -> HookSet:
    hooks = HookSet()
    store: list[dict] = []

    def hook(_m, _i, out):  # type: ignore[no-untyped-def]
        if isinstance(out, tuple):
            out = out[0]
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return
        t = out.detach()
        store.append({
            "mean": t.mean().item(), "std": t.std().item(), "min": t.min().item(), "max": t.max().item(),
            "zeros": (t == 0).float().mean().item(), "nan": torch.isnan(t).sum().item(),
        })

    for _, m in select_modules(model, None):
        hooks.forward(m, hook)
    return hooks


def clone_hooks(model: nn.Module) -> tuple[HookSet, list]:
    hooks = HookSet()
    store: list[torch.Tensor] = []

    def hook(_m, _i, out):  # type: ignore[no-untyped-def]
        if isinstance(out, tuple):
            out = out[0]
        if isinstance(out, torch.Tensor):
            store.append(out.detach().clone())

    for _, m in select_modules(model, None):
        hooks.forward(m, hook)
    return hooks, store


def bench(name: str, model: nn.Module, make_input, rounds: int,  # type: ignore[no-untyped-def]
          out: dict[str, float] | None = None) -> list[tuple[str, ...]]:
    """The table's rows for one model; ``out`` (a dict) also gets the ratios and extra peak MB by variant."""
    x = make_input()

    def fwd() -> object:
        with torch.no_grad():
            return model(x)

    def nb() -> object:
        with Capture(model) as cap, torch.no_grad():
            model(x)
        return cap.result

    def nb_dev() -> object:
        with Capture(model, device_path=True) as cap, torch.no_grad():
            model(x)
        return cap.result

    def items() -> object:
        with item_hooks(model), torch.no_grad():
            return model(x)

    def clones() -> object:
        hooks, store = clone_hooks(model)
        with hooks, torch.no_grad():
            model(x)
        return store

    def loss_of(out: object) -> torch.Tensor:
        t = out.logits if hasattr(out, "logits") else out
        return t.float().pow(2).mean()

    def fwd_bwd() -> object:
        loss_of(model(x)).backward()
        model.zero_grad(set_to_none=True)
        return None

    def nb_bwd() -> object:
        with Capture(model) as cap:
            loss_of(model(x)).backward()
        model.zero_grad(set_to_none=True)
        return cap.result

    t = interleaved({"plain": fwd, "nbdebug": nb, "nbdebug-dev": nb_dev, "item-hooks": items, "clone-hooks": clones}, rounds=rounds)
    tb = interleaved({"plain": fwd_bwd, "nbdebug": nb_bwd}, rounds=max(3, rounds // 2))
    mem = {k: peak_extra_bytes(f) for k, f in [("plain", fwd), ("nbdebug", nb), ("nbdebug-dev", nb_dev), ("item-hooks", items), ("clone-hooks", clones)]}
    rows = []
    for k in ("plain", "nbdebug", "nbdebug-dev", "item-hooks", "clone-hooks"):
        rows.append((name, f"forward {k}", f"{t[k] * 1e3:.1f}", f"{t[k] / t['plain']:.3f}", f"{(mem[k] - mem['plain']) / 2**20:+.1f}"))
    for k in ("plain", "nbdebug"):
        rows.append((name, f"fwd+bwd {k}", f"{tb[k] * 1e3:.1f}", f"{tb[k] / tb['plain']:.3f}", ""))
    if out is not None:
        out.update({f"{k} x": t[k] / t["plain"] for k in t})
        out.update({f"{k} MB": (mem[k] - mem["plain"]) / 2**20 for k in mem})
    return rows


def _per_call_us(fn, reps: int, rounds: int = 9) -> float:  # type: ignore[no-untyped-def]
    """Median over rounds of the mean µs per call of ``reps`` calls."""
    import statistics
    import time

    fn()
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t) / reps * 1e6)
    return statistics.median(out)


def _kernel_one(src: torch.Tensor, quick: bool = False) -> dict[tuple[str, str], float]:
    from nbdebug.capture import native
    from nbdebug.capture.stats import stats_and_units, tensor_stats

    x = torch.empty_like(src)
    reps = 5 if quick else 50 if src.numel() > 100_000 else 2000

    def write() -> None:  # a fresh output, as in a forward hook
        torch.clamp_min(src, 0, out=x)

    base = _per_call_us(write, reps)
    res = {}
    for mode in ("native", "fallback"):
        os.environ["NBDEBUG_NATIVE"] = "1" if mode == "native" else "0"
        native._reset()
        assert native.available() == (mode == "native"), native.status()
        rounds = 1 if quick else 9
        res[mode, "stats"] = _per_call_us(lambda: (write(), tensor_stats(x)), reps, rounds) - base
        res[mode, "units"] = _per_call_us(lambda: (write(), stats_and_units(x, units=True)), reps, rounds) - base
    return res


def kernel(threads: list[int], quick: bool = False) -> Figures:
    """Per-tensor stats cost, native kernel vs the torch/numpy path; returns the figure README quotes."""
    from nbdebug.capture import native

    shapes = {"1k (8x125)": (8, 125), "16k (64x250)": (64, 250), "16k (8x8x16x16)": (8, 8, 16, 16),
              "1M (64x16x32x32)": (64, 16, 32, 32), "1M (1024x1024)": (1024, 1024)}
    if quick:
        shapes = {"1k (8x125)": (8, 125)}
    saved = os.environ.get("NBDEBUG_NATIVE")
    rows, slower = [], []
    for nt in threads:
        torch.set_num_threads(nt)
        for label, shape in shapes.items():
            res = _kernel_one(torch.randn(shape), quick)
            rows.append((str(nt), label, *(f"{res[m, k]:.1f}" for k in ("stats", "units") for m in ("fallback", "native"))))
            slower += [res["fallback", k] / res["native", k] for k in ("stats", "units") if res["native", k] > 0]
    if saved is None:
        os.environ.pop("NBDEBUG_NATIVE")
    else:
        os.environ["NBDEBUG_NATIVE"] = saved
    native._reset()
    print(f"\ntorch {torch.__version__}; native: {native.status()}; load {os.getloadavg()[0]:.2f}")
    print(table(rows, ("threads", "tensor", "tensor_stats µs before", "after", "stats_and_units µs before", "after")))
    fig = Figures("docs/training.md (the statistics kernel)")
    if slower:
        fig.add("the torch/numpy path (NBDEBUG_NATIVE=0) vs the native kernel, per tensor (tensor_stats and "
                f"stats_and_units, {len(shapes)} shapes × threads {threads})", f"{min(slower):.1f}–{max(slower):.1f}× slower")
    return fig


def models(quick: bool) -> list[tuple[str, nn.Module, Callable[[], torch.Tensor]]]:
    """(name, model, make_input) of the two models, seeded: the same in the timing run and in each
    ``--instructions`` child process."""
    torch.manual_seed(0)
    b, hw, tokens = (1, 32, 8) if quick else (8, 224, 128)
    resnet = (ResNetShaped(8, 10) if quick else ResNet18()).eval()
    rname = f"resnet18{'-shaped w8' if quick else ''} b{b} {hw}²"
    if quick:
        from nbdebug.adapters.offline import gpt2_shaped

        gpt, gname = gpt2_shaped(2, 2, 32, n_positions=64, vocab=1000), f"tiny gpt2 {tokens} tok"
    else:
        gpt, gname = gpt2_small(), f"gpt2-small {tokens} tok"
    vocab = gpt.config.vocab_size
    return [(rname, resnet, lambda: torch.randn(b, 3, hw, hw)), (gname, gpt, lambda: torch.randint(0, vocab, (1, tokens)))]


def _instr_child(spec: str, quick: bool) -> None:
    """One ``--instr-child MODEL:VARIANT:CALLS`` process: CALLS forwards of model MODEL (0 or 1), plain
    or under ``Capture`` (the table's ``nbdebug`` variant), on one thread."""
    which, variant, calls = spec.split(":")
    torch.set_num_threads(1)  # callgrind counts every thread's instructions: a waiting thread's spins too
    _, model, make_input = models(quick)[int(which)]
    x = make_input()
    for _ in range(int(calls)):
        if variant == "plain":
            with torch.no_grad():
                model(x)
        else:
            with Capture(model) as cap, torch.no_grad():
                model(x)
            assert cap.result is not None


def instruction_ratios(quick: bool, count: bool, names: list[str]) -> dict[str, float]:
    """Model name (``names``: the models' in ``models`` order) → instructions per forward under ``Capture``
    over plain ({} when not counted)."""
    out: dict[str, float] = {}
    if not count:  # nothing counted: every child's forwards in one process (one torch import, not four)
        specs = ",".join(f"{i}:{variant}:1" for i in range(len(names)) for variant in ("plain", "nbdebug"))
        subprocess.run([sys.executable, __file__, "--instr-child", specs, *(["--quick"] if quick else [])], capture_output=True, text=True, check=True)
        return out
    for i, name in enumerate(names):
        per = instructions_per_call(
            lambda variant, calls, i=i: [sys.executable, __file__, "--instr-child", f"{i}:{variant}:{calls}", *(["--quick"] if quick else [])],
            ("plain", "nbdebug"), 1, 2, count)
        if per:
            out[name] = per["nbdebug"] / per["plain"]
    return out


def main() -> None:
    if "--instr-child" not in sys.argv:
        exact_rss_env()
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="small inputs, to check the script runs")
    ap.add_argument("--kernel", action="store_true", help="per-tensor stats cost: native kernel vs torch/numpy")
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2], help="torch thread counts for the kernel table")
    ap.add_argument("--no-kernel", action="store_true", help="leave out the kernel table")
    ap.add_argument("--instructions", action="store_true",
                    help="also: instructions per forward under Capture over plain, counted by valgrind --tool=callgrind (minutes)")
    ap.add_argument("--instr-child", help=argparse.SUPPRESS)  # one process of --instructions (specs, comma-separated)
    a = ap.parse_args()
    if a.instr_child:
        for spec in a.instr_child.split(","):  # several when nothing is counted (instruction_ratios)
            _instr_child(spec, a.quick)
        return
    threads = [1] if a.quick else a.threads
    if a.kernel:
        kernel(threads, a.quick).print()
        return
    rounds = 1 if a.quick else a.rounds
    rows = []
    res, lm = {}, {}
    (rname, resnet, rin), (gname, gpt, gin) = models(a.quick)
    rows += bench(rname, resnet, rin, rounds, res)
    rows += bench(gname, gpt, gin, rounds, lm)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(table(rows, ("model", "variant", "ms (median)", "× plain", "extra peak MB vs plain")))
    # --quick runs the --instructions processes too (without valgrind): every part of the full run
    instr = instruction_ratios(a.quick, a.instructions and not a.quick, [rname, gname]) if a.instructions or a.quick else None
    if instr is not None:
        print(f"instructions per forward (callgrind, 1 thread{'' if instr else ': not counted, --quick or no valgrind'}), nbdebug × plain, beside wall time:")
        for name, r in ((rname, res), (gname, lm)):
            print(f"  {name}: {f'{instr[name]:.3f}×' if name in instr else 'not counted'} instructions, {r['nbdebug x']:.2f}× wall")
    fig = Figures("docs/comparison.md (per-layer stats rows)")
    for name, r in ((rname, res), (gname, lm)):
        fig.add(f"per-layer stats of every leaf layer, {name}: nbdebug", f"{r['nbdebug x']:.2f}× forward, {r['nbdebug MB']:+.1f} MB")
        if instr:
            fig.add(f"per-layer stats of every leaf layer, {name}: nbdebug, instructions (callgrind) / wall time, × plain",
                    f"{instr[name]:.3f}× / {r['nbdebug x']:.2f}×")
        fig.add(f"per-layer stats of every leaf layer, {name}: .item() hooks", f"{r['item-hooks x']:.2f}× ({r['item-hooks MB']:+.0f} MB)")
        fig.add(f"per-layer stats of every leaf layer, {name}: clone hooks", f"{r['clone-hooks x']:.2f}× ({r['clone-hooks MB']:+.0f} MB)")
    kfig = None if a.no_kernel else kernel(threads, a.quick)
    fig.print()
    if kfig is not None:
        kfig.print()


if __name__ == "__main__":
    main()
