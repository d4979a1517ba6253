"""Language views on a GPT-2-small-shaped random model (12 layers × 12 heads, d=768, V=50,257).

Attention view, at 32/128/512/1024 tokens: the initial payload (everything synced before any
click) and the time from the end of the forward pass to a ready widget (result + widget +
serialised state); the capture forward vs the plain SDPA forward and vs the eager
``output_attentions=True`` forward BertViz needs; extra peak memory over the plain forward; vs
BertViz ``head_view`` / ``model_view`` HTML on the same attention.
Logit lens at 128 tokens: the full table, the first column (what the view shows first), one batched
GEMM holding every probability, and a naive per-layer/per-position loop, as ratios to one plain
forward, with extra peak memory.

Attention memory budget (issue 9), GPT-2-shaped 6 layers × 12 heads, ``--max-bytes 64MB``: at
512/2048 tokens (d=768) and 8192 tokens (``n_positions=8192``, d=192): extra peak over the plain
SDPA forward (capture forward + result + widget), capture-forward time / plain SDPA forward, time
to a ready widget after the forward, initial payload, one head fetched as the view asks for it (the
whole head up to 1024 tokens, else the first 128 tokens) and the whole head pooled to ≤ 1024².
Plus the capture-forward / plain-forward ratio at 1024 tokens (d=768).

Times are medians of interleaved rounds in one process (``common.interleaved``); peak memory is
the exact VmHWM delta (``common.peak_extra_bytes``, glibc returning freed blocks).

    python benchmarks/bench_language.py [--tokens 32,128,512,1024] [--bertviz-max 128] [--rounds 3]
    python benchmarks/bench_language.py --budget-only [--budget-tokens 512,2048,8192]
    python benchmarks/bench_language.py --quick      # tiny models and sizes: checks the script runs

The figures README.md / docs/comparison.md quote are printed last, labelled.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch
from common import Figures, exact_rss_env, interleaved, peak_extra_bytes, table

from nbdebug.adapters.offline import gpt2_shaped, gpt2_small
from nbdebug.inspectors.logitlens import LogitLens
from nbdebug.recorders.attention import AttentionRecorder
from nbdebug.recorders.logitlens import LogitLensRecorder
from nbdebug.widgets.attention import AttentionWidget

MB = 2**20
#: ``--quick``: GPT-2-shaped (layers, heads, d) and vocabulary of the stand-in for every model below
QUICK_SHAPE, QUICK_VOCAB = (2, 4, 32), 1000


def head_params(model: torch.nn.Module) -> dict[str, int]:
    """The head the benchmarks fetch: layer 5, head 3 (or the last ones of a smaller model)."""
    cfg = model.config
    return {"layer": min(5, cfg.n_layer - 1), "head": min(3, cfg.n_head - 1)}


def state_bytes(widget: Any) -> int:
    """Bytes of the widget's synced state as it goes over the wire (binary buffers + JSON)."""
    total = 0

    def walk(x: Any) -> Any:
        nonlocal total
        if isinstance(x, (memoryview, bytes, bytearray)):
            total += len(x)
            return None
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items() if k != "_esm"}
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        return x

    text = json.dumps(walk(widget.get_state()))  # walk() first: it adds the binary buffers to total
    return total + len(text.encode())


def capture_round(rec: Any, run: Any, fwd: list[float], ready: list[float], last: dict[str, Any]) -> Any:
    """One captured forward: its time into ``fwd``, the time to a built widget after it into ``ready``,
    the widget's state size into ``last["bytes"]``; returns the widget."""
    t0 = time.perf_counter()
    with rec:
        run()
    t1 = time.perf_counter()
    w = rec.widget()
    last["bytes"] = state_bytes(w)
    ready.append(time.perf_counter() - t1)
    fwd.append(t1 - t0)
    return w


def bench_attention(model: torch.nn.Module, eager: torch.nn.Module, T: int, rounds: int, bertviz_max: int) -> dict[str, Any]:
    ids = torch.randint(0, model.config.vocab_size, (1, T))
    toks = [f"tok{i}" for i in range(T)]
    row: dict[str, Any] = {"T": T}
    fwd_times: list[float] = []
    ready_times: list[float] = []
    last: dict[str, Any] = {}

    def capture() -> Any:
        w = capture_round(AttentionRecorder(model, tokens=toks), lambda: model(ids), fwd_times, ready_times, last)
        last["result"] = w.result
        w.close()
        return w.result

    with torch.no_grad():
        t = interleaved(
            {"plain": lambda: model(ids), "eager": lambda: eager(ids, output_attentions=True), "capture": capture},
            rounds=rounds,
            warmup=1,
        )
        row["forward_s"], row["eager_attn_forward_s"] = t["plain"], t["eager"]
        row["capture_forward_s"] = statistics.median(fwd_times)
        row["ready_after_forward_s"] = statistics.median(ready_times)
        row["payload_MB"] = last["bytes"] / MB
        plain_peak = peak_extra_bytes(lambda: model(ids))
        row["extra_peak_over_forward_MB"] = (peak_extra_bytes(capture) - plain_peak) / MB
        att = last.pop("result")
        w = AttentionWidget(att)
        t0 = time.perf_counter()
        _content, buffers = w.handle_request("head", head_params(model))
        row["head_fetch_s"] = time.perf_counter() - t0
        row["head_fetch_KB"] = sum(len(b) for b in buffers) / 1024
        w.close()
        if T <= bertviz_max:
            from bertviz import head_view, model_view

            L, H, _ = att.shape
            attn = tuple(torch.from_numpy(np.stack([att.head(i, j) for j in range(H)]))[None] for i in range(L))
            for name, fn in (("head_view", head_view), ("model_view", model_view)):
                out: dict[str, Any] = {}

                def run(fn: Any = fn, out: dict[str, Any] = out) -> Any:
                    t0 = time.perf_counter()
                    html = fn(attn, toks, html_action="return")
                    out["s"] = time.perf_counter() - t0
                    out["MB"] = len((html.data if hasattr(html, "data") else str(html)).encode()) / MB
                    return html

                out["peak"] = peak_extra_bytes(run) / MB
                row[f"bertviz_{name}_s"], row[f"bertviz_{name}_MB"], row[f"bertviz_{name}_peak_MB"] = out["s"], out["MB"], out["peak"]
    return row


def bench_budget(T: int, rounds: int, max_bytes: str = "64MB", quick: bool = False) -> dict[str, Any]:
    """The attention view under ``--max-bytes``: memory over the plain SDPA forward, speed, payload, one head."""
    if quick:
        (layers, heads, d), vocab = QUICK_SHAPE, QUICK_VOCAB
    else:
        (layers, heads, d), vocab = (6, 12, 768 if T <= 2048 else 192), 50257
    model = gpt2_shaped(layers, heads, d, n_positions=max(2048, T), vocab=vocab)
    ids = torch.randint(0, vocab, (1, T))
    row: dict[str, Any] = {"T": T, "d": d}
    fwd: list[float] = []
    ready: list[float] = []
    last: dict[str, Any] = {}

    def capture() -> Any:
        last["w"] = capture_round(AttentionRecorder(model, max_bytes=max_bytes), lambda: model(ids), fwd, ready, last)
        return last["w"]

    with torch.no_grad():
        long = T > 2048  # minutes per capture on a CPU: one round, no warm-up
        t = interleaved({"plain": lambda: model(ids), "capture": capture}, rounds=1 if long else rounds, warmup=0 if long else 1)
        row["sdpa_forward_s"] = t["plain"]
        row["capture_forward_s"] = statistics.median(fwd)
        row["capture_x_sdpa"] = row["capture_forward_s"] / t["plain"]
        row["ready_after_forward_s"] = statistics.median(ready)
        row["payload_KB"] = last["bytes"] / 1024
        last.pop("w").close()
        plain_peak = peak_extra_bytes(lambda: model(ids))
        row["extra_peak_over_sdpa_MB"] = (peak_extra_bytes(capture) - plain_peak) / MB
        w = last.pop("w")
        head = head_params(model)
        for name, params in (("head_fetch", head if T <= 1024 else {**head, "start": 0, "end": 128}),
                             ("whole_head_pooled", head)):
            t0 = time.perf_counter()
            content, buffers = w.handle_request("head", params)
            row[f"{name}_s"] = time.perf_counter() - t0
            row[f"{name}_KB"] = sum(len(b) for b in buffers) / 1024
            row[f"{name}_stride"] = content["result"]["stride"]
        row["notes"] = w.notes
        w.close()
    return row


def naive_lens(model: torch.nn.Module, hidden: torch.Tensor, rows: int, positions: int) -> None:
    """The loop people write: for each layer and position, norm → unembed → softmax → top-k."""
    ln, head = model.transformer.ln_f, model.lm_head
    for r in range(rows):
        for p in range(positions):
            probs = torch.softmax(head(ln(hidden[r, p])), -1)
            probs.topk(10)
            (-(probs * probs.clamp_min(1e-30).log()).sum())


def bench_lens(model: torch.nn.Module, T: int, rounds: int, naive_positions: int) -> dict[str, Any]:
    ids = torch.randint(0, model.config.vocab_size, (1, T))
    row: dict[str, Any] = {"T": T}
    with torch.no_grad():
        rec = LogitLensRecorder(model, lens_topk=10)
        with rec:
            model(ids)
        lens = rec.lens()
        # What the view keeps: one (T, d) residual per row, each where its block ran (the product's
        # path below takes them as they are). The two baselines take the (rows, T, d) stack.
        resid, parts = lens.residuals, rec.parts
        stacked = torch.stack([r.to(lens.device) for r in resid])

        def fresh() -> LogitLens:
            return LogitLens(resid, parts.normed, parts.unembed_weight, None, k=10, targets=lens.targets)

        def first_col() -> Any:
            lz = fresh()
            lz.columns([T - 1])
            return lz

        def full() -> Any:
            lz = fresh()
            lz.fill()
            return lz

        def batched() -> Any:  # one GEMM over every (row, position), every probability held
            z = parts.normed(stacked) @ parts.unembed_weight.T
            p = torch.softmax(z, -1)
            p.topk(10, -1)
            return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)

        variants = {"forward": lambda: model(ids), "first_column": first_col, "full_table": full, "batched_gemm": batched}
        t = interleaved(variants, rounds=rounds, warmup=1)
        row["forward_s"] = t["forward"]
        for name in ("first_column", "full_table", "batched_gemm"):
            row[f"{name}_x_forward"] = t[name] / t["forward"]
        for name, fn in variants.items():
            row[f"{name}_peak_MB"] = peak_extra_bytes(fn) / MB
        R = stacked.shape[0]
        t0 = time.perf_counter()
        naive_lens(model, stacked, R, naive_positions)
        per_cell = (time.perf_counter() - t0) / (R * naive_positions)
        t0 = time.perf_counter()
        model(ids)
        row["naive_loop_x_forward"] = per_cell * R * T / (time.perf_counter() - t0)
        row["naive_cells_timed"] = R * naive_positions
    return row


def main() -> None:
    exact_rss_env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="32,128,512,1024")
    ap.add_argument("--bertviz-max", type=int, default=128, help="largest T for BertViz (512 takes ~30 s and ~5 GB)")
    ap.add_argument("--lens-tokens", type=int, default=128)
    ap.add_argument("--naive-positions", type=int, default=16, help="positions timed in the naive loop (extrapolated to all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-attention", action="store_true")
    ap.add_argument("--skip-lens", action="store_true")
    ap.add_argument("--budget-tokens", default="512,2048,8192", help="sequence lengths of the --max-bytes 64MB attention figures")
    ap.add_argument("--budget-only", action="store_true", help="only the attention budget figures and the 1024-token speed ratio")
    ap.add_argument("--speed-tokens", type=int, default=1024, help="sequence length of the capture/SDPA speed ratio")
    ap.add_argument("--quick", action="store_true", help="tiny models and sizes, one round: checks the script runs to the end")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.bertviz_max, args.lens_tokens, args.naive_positions = "16", 16, 8, 2
        args.rounds, args.budget_tokens, args.speed_tokens = 1, "32", 64
    torch.manual_seed(0)
    fig = Figures("docs/comparison.md (attention and logit-lens rows)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("\n## attention under --max-bytes 64MB (GPT-2-shaped, 6 layers × 12 heads)")
    brows = []
    for T in [int(t) for t in args.budget_tokens.split(",") if t]:
        r = bench_budget(T, args.rounds, quick=args.quick)
        brows.append(r)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))
        sys.stdout.flush()
    bcols = ["T", "d", "sdpa_forward_s", "capture_forward_s", "capture_x_sdpa", "ready_after_forward_s", "extra_peak_over_sdpa_MB",
             "payload_KB", "head_fetch_s", "head_fetch_KB", "whole_head_pooled_s", "whole_head_pooled_KB", "whole_head_pooled_stride"]
    if brows:
        print(table([tuple(f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "–")) for c in bcols) for r in brows], tuple(bcols)))
    for r in brows:
        if r["T"] == max(b["T"] for b in brows if b["T"] <= 2048):
            fig.add(f"attention at {r['T']} tokens, --max-bytes 64MB: capture forward × the SDPA forward", f"{r['capture_x_sdpa']:.2f}×")
            fig.add(f"attention at {r['T']} tokens, --max-bytes 64MB: extra peak memory", f"+{r['extra_peak_over_sdpa_MB']:.0f} MB")
            fig.add(f"attention at {r['T']} tokens, --max-bytes 64MB: payload up front", f"{r['payload_KB']:.0f} KB")
            fig.add(f"attention at {r['T']} tokens, --max-bytes 64MB: a head's token range on demand", f"{r['head_fetch_s'] * 1e3:.0f} ms")
    speed = bench_budget(args.speed_tokens, args.rounds, quick=args.quick)
    print(f"\n{args.speed_tokens} tokens: capture forward / plain SDPA forward = {speed['capture_x_sdpa']:.2f}× "
          f"(ready {speed['ready_after_forward_s']:.2f} s after the forward; extra peak {speed['extra_peak_over_sdpa_MB']:.0f} MB)")
    if args.budget_only:
        fig.print()
        return
    model = gpt2_shaped(*QUICK_SHAPE, n_positions=256, vocab=QUICK_VOCAB) if args.quick else gpt2_small()
    cfg = model.config
    print(f"\n{'a tiny GPT-2 (--quick)' if args.quick else 'GPT-2-small'} random init "
          f"({cfg.n_layer} layers × {cfg.n_head} heads, d={cfg.n_embd}, V={cfg.vocab_size:,}), fp32 CPU")
    if not args.skip_attention:
        eager = copy.deepcopy(model)
        eager.set_attn_implementation("eager")
        rows = []
        for T in [int(t) for t in args.tokens.split(",")]:
            r = bench_attention(model, eager, T, args.rounds, args.bertviz_max)
            rows.append(r)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))
            sys.stdout.flush()
        del eager
        print("\n## attention view")
        cols = ["T", "forward_s", "eager_attn_forward_s", "capture_forward_s", "ready_after_forward_s", "payload_MB",
                "extra_peak_over_forward_MB", "head_fetch_s", "head_fetch_KB", "bertviz_head_view_s", "bertviz_head_view_MB",
                "bertviz_head_view_peak_MB", "bertviz_model_view_s", "bertviz_model_view_MB"]
        print(table([tuple(f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "–")) for c in cols) for r in rows], tuple(cols)))
        for r in rows:
            if "bertviz_head_view_MB" in r:
                print(f"T={r['T']}: BertViz head_view HTML / nbdebug payload = {r['bertviz_head_view_MB'] / r['payload_MB']:.0f}×; "
                      f"time to HTML / nbdebug ready-after-forward = {r['bertviz_head_view_s'] / r['ready_after_forward_s']:.0f}×")
        r = next((r for r in rows if r["T"] == 512), rows[-1])
        at = f"attention at {r['T']} tokens ({'tiny GPT-2' if args.quick else 'GPT-2 small'})"
        fig.add(f"{at}: capture forward × its plain forward", f"{r['capture_forward_s'] / r['forward_s']:.2f}×")
        fig.add(f"{at}: sent up front", f"{r['payload_MB']:.2f} MB")
        fig.add(f"{at}: ready after the forward", f"{r['ready_after_forward_s']:.2f} s")
        fig.add(f"{at}: extra peak memory", f"+{r['extra_peak_over_forward_MB']:.0f} MB")
        fig.add(f"{at}: one head on demand", f"{r['head_fetch_KB']:.0f} KB, {r['head_fetch_s'] * 1e3:.0f} ms")
        if "bertviz_head_view_MB" in r:
            fig.add(f"{at}: BertViz head_view", f"{r['bertviz_head_view_MB']:.0f} MB of HTML, {r['bertviz_head_view_s']:.0f} s, "
                                                 f"+{r['bertviz_head_view_peak_MB'] / 1024:.1f} GB")
        else:
            fig.add(f"{at}: BertViz head_view", f"not run (--bertviz-max {args.bertviz_max}; --bertviz-max {r['T']} runs it: ~5 GB at 512)")
    if args.skip_lens:
        fig.print()
        return
    R = cfg.n_layer + 1
    print(f"\n## logit lens at {args.lens_tokens} tokens ({R} rows × {args.lens_tokens} positions × {cfg.vocab_size:,})")
    r = bench_lens(model, args.lens_tokens, args.rounds, args.naive_positions)
    for k, v in r.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    lens = f"logit lens, {R} layers × {args.lens_tokens} positions × {cfg.vocab_size:,}"
    fig.add(f"{lens}: whole table × a forward", f"{r['full_table_x_forward']:.2f}×, +{r['full_table_peak_MB']:.0f} MB")
    fig.add(f"{lens}: last column first × a forward", f"{r['first_column_x_forward']:.2f}×")
    fig.add(f"{lens}: one batched GEMM × a forward", f"{r['batched_gemm_x_forward']:.2f}×, +{r['batched_gemm_peak_MB'] / 1024:.2f} GB")
    fig.add(f"{lens}: per-layer/per-position loop × a forward", f"{r['naive_loop_x_forward']:.0f}×")
    fig.print()


if __name__ == "__main__":
    main()
