"""Language views on a GPT-2-small-shaped random model (12 layers × 12 heads, d=768, V=50,257).

Attention view: initial payload bytes and time from the end of the forward pass to a ready widget
(result + widget + serialised state) at 32/128/512/1024 tokens, vs BertViz ``head_view`` /
``model_view`` HTML on the same attention; extra peak memory. Logit lens at 128 tokens: the full
table, the first column (what the view shows first), a one-shot batched GEMM and a naive
per-layer/per-position loop, each as a ratio to one plain forward, with extra peak memory.
Everything is measured in one process, interleaved, best of ``--repeat``.

    python benchmarks/bench_language.py [--tokens 32,128,512,1024] [--bertviz-max 128] [--repeat 3]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import torch

from nbdebug.adapters.offline import gpt2_small
from nbdebug.inspectors.logitlens import LogitLens
from nbdebug.recorders.attention import AttentionRecorder
from nbdebug.recorders.logitlens import LogitLensRecorder

MB = 2**20


def _trim() -> None:
    """Give freed heap memory back to the OS, so RSS deltas measure what an operation holds."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: deltas are then upper bounds... or zero after reuse
        pass


class PeakRSS:
    """Extra peak resident memory while entered (sampled every millisecond), in bytes."""

    def __enter__(self) -> PeakRSS:
        gc.collect()
        _trim()
        self.proc = psutil.Process()
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def extra(self) -> int:
        return self.peak - self.base


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def state_bytes(widget: Any) -> int:
    """Bytes of the widget's synced state as it goes over the wire (binary buffers + JSON)."""
    state = widget.get_state()
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

    text = json.dumps(walk(state))  # walk() first: it adds the binary buffers to total
    return total + len(text.encode())


def bench_attention(model: torch.nn.Module, T: int, repeat: int, bertviz_max: int) -> dict[str, Any]:
    ids = torch.randint(0, 50257, (1, T))
    toks = [f"tok{i}" for i in range(T)]
    row: dict[str, Any] = {"T": T}
    with torch.no_grad():
        with PeakRSS() as mem:
            row["forward_s"], _ = best(lambda: model(ids), repeat)
        row["forward_peak_MB"] = mem.extra / MB
        model.set_attn_implementation("eager")  # what output_attentions=True (BertViz) needs
        try:
            row["eager_output_attentions_s"], _ = best(lambda: model(ids, output_attentions=True), repeat)
        finally:
            model.set_attn_implementation("sdpa")

        def capture() -> tuple[float, float, Any]:
            rec = AttentionRecorder(model, tokens=toks)
            t0 = time.perf_counter()
            with rec:
                model(ids)
            t1 = time.perf_counter()
            w = rec.widget()
            nbytes = state_bytes(w)
            t2 = time.perf_counter()
            return t1 - t0, t2 - t1, (w, nbytes)

        runs = []
        for _ in range(repeat):
            with PeakRSS() as mem:
                fwd, after, (w, nbytes) = capture()
            runs.append((fwd, after, nbytes, mem.extra))
            att = w.result
            w.close()
            del w
        row["capture_forward_s"] = min(r[0] for r in runs)
        row["ready_after_forward_s"] = min(r[1] for r in runs)
        row["payload_MB"] = runs[0][2] / MB
        row["extra_peak_MB"] = min(r[3] for r in runs) / MB
        t = time.perf_counter()
        from nbdebug.widgets.attention import AttentionWidget

        _content, buffers = AttentionWidget(att).handle_request("head", {"layer": 5, "head": 3})
        row["head_fetch_s"] = time.perf_counter() - t
        row["head_fetch_KB"] = sum(len(b) for b in buffers) / 1024
        if T <= bertviz_max:
            from bertviz import head_view, model_view

            attn = tuple(torch.from_numpy(att.attention[i].astype("float32"))[None] for i in range(att.attention.shape[0]))
            for name, fn in (("head_view", head_view), ("model_view", model_view)):
                with PeakRSS() as mem:
                    t = time.perf_counter()
                    html = fn(attn, toks, html_action="return")
                    row[f"bertviz_{name}_s"] = time.perf_counter() - t
                data = html.data if hasattr(html, "data") else str(html)
                row[f"bertviz_{name}_MB"] = len(data.encode()) / MB
                row[f"bertviz_{name}_extra_peak_MB"] = mem.extra / MB
                del html, data
            del attn
        del att
        gc.collect()
    return row


def naive_lens(model: torch.nn.Module, hidden: torch.Tensor, rows: int, positions: int) -> None:
    """The loop people write: for each layer and position, norm → unembed → softmax → top-k."""
    ln, head = model.transformer.ln_f, model.lm_head
    for r in range(rows):
        for p in range(positions):
            probs = torch.softmax(head(ln(hidden[r, p])), -1)
            probs.topk(10)
            (-(probs * probs.clamp_min(1e-30).log()).sum())


def bench_lens(model: torch.nn.Module, T: int, repeat: int, naive_positions: int) -> dict[str, Any]:
    ids = torch.randint(0, 50257, (1, T))
    row: dict[str, Any] = {"T": T}
    with torch.no_grad():
        fwd, _ = best(lambda: model(ids), repeat)
        row["forward_s"] = fwd
        rec = LogitLensRecorder(model, lens_topk=10)
        with rec:
            model(ids)
        lens = rec.lens()  # the recorder computed the last column here already
        resid, parts = lens.residuals, rec.parts

        def fresh() -> LogitLens:
            return LogitLens(resid, parts.normed, parts.unembed_weight, None, k=10, targets=lens.targets)

        def first_col() -> None:
            fresh().columns([T - 1])

        def full() -> None:
            fresh().fill()

        def batched() -> None:  # one GEMM over every (row, position), full probabilities held
            z = parts.normed(resid) @ parts.unembed_weight.T
            p = torch.softmax(z, -1)
            p.topk(10, -1)
            (-(p * torch.log(p.clamp_min(1e-30))).sum(-1))

        for name, fn in (("first_column", first_col), ("full_table", full), ("batched_gemm", batched)):
            times, extras = [], []
            for _ in range(repeat):
                fwd_i, _ = best(lambda: model(ids), 1)  # interleave a forward: ratios under the same load
                with PeakRSS() as mem:
                    t = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - t) / fwd_i)
                extras.append(mem.extra)
            row[f"{name}_x_forward"] = min(times)
            row[f"{name}_extra_peak_MB"] = min(extras) / MB
        R = resid.shape[0]
        t = time.perf_counter()
        naive_lens(model, resid, R, naive_positions)
        per_cell = (time.perf_counter() - t) / (R * naive_positions)
        row["naive_loop_x_forward"] = per_cell * R * T / fwd
        row["naive_measured_cells"] = R * naive_positions
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="32,128,512,1024")
    ap.add_argument("--bertviz-max", type=int, default=128, help="largest T for BertViz (512 takes ~30 s and ~5 GB)")
    ap.add_argument("--lens-tokens", type=int, default=128)
    ap.add_argument("--naive-positions", type=int, default=16, help="positions timed in the naive loop (extrapolated to all)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = gpt2_small()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, GPT-2-small random init ({sum(p.numel() for p in model.parameters()) / 1e6:.0f} M params)")
    print("\n## attention view (initial payload = everything synced before any click)")
    cols = ["T", "forward_s", "eager_output_attentions_s", "capture_forward_s", "forward_peak_MB", "ready_after_forward_s", "payload_MB", "extra_peak_MB", "head_fetch_s", "head_fetch_KB",
            "bertviz_head_view_s", "bertviz_head_view_MB", "bertviz_head_view_extra_peak_MB", "bertviz_model_view_s", "bertviz_model_view_MB"]
    print(" | ".join(cols))
    for T in [int(t) for t in args.tokens.split(",")]:
        r = bench_attention(model, T, args.repeat, args.bertviz_max)
        print(" | ".join(f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "–")) for c in cols))
        if "bertviz_head_view_MB" in r:
            print(f"   payload ratio BertViz head_view / nbdebug: {r['bertviz_head_view_MB'] / r['payload_MB']:.0f}×; "
                  f"time ratio: {r['bertviz_head_view_s'] / r['ready_after_forward_s']:.0f}×")
        sys.stdout.flush()
    print(f"\n## logit lens at {args.lens_tokens} tokens (13 rows × {args.lens_tokens} positions × 50,257), ratios to one plain forward")
    r = bench_lens(model, args.lens_tokens, args.repeat, args.naive_positions)
    for k, v in r.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")


if __name__ == "__main__":
    main()
