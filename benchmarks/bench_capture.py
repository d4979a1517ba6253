"""Thermometer capture overhead vs the plain forward(+backward) and vs the hooks people write today.

    python benchmarks/bench_capture.py [--rounds 7] [--quick]

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
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from common import ResNet18, exact_rss_env, gpt2_small, interleaved, peak_extra_bytes, table

from nbdebug.capture import HookSet, select_modules
from nbdebug.capture.session import Capture


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


def bench(name: str, model: nn.Module, make_input, rounds: int) -> list[tuple[str, ...]]:  # type: ignore[no-untyped-def]
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
    return rows


def main() -> None:
    exact_rss_env()
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="small inputs, to check the script runs")
    a = ap.parse_args()
    torch.manual_seed(0)
    b, hw, tokens = (1, 64, 16) if a.quick else (8, 224, 128)
    rows = []
    resnet = ResNet18().eval()
    rows += bench(f"resnet18 b{b} {hw}²", resnet, lambda: torch.randn(b, 3, hw, hw), a.rounds)
    gpt = gpt2_small()
    rows += bench(f"gpt2-small {tokens} tok", gpt, lambda: torch.randint(0, 50257, (1, tokens)), a.rounds)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(table(rows, ("model", "variant", "ms (median)", "× plain", "extra peak MB vs plain")))


if __name__ == "__main__":
    main()
