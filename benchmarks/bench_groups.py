"""Grouped thermometer at 1,600 rows: payload bytes and Python build time (and the browser figures).

The model is a 32-block language-model-shaped stack (random init, d=32, 8 tokens) with 50 captured
rows per block: layer norms, q/k/v/o projections and a mixture of 11 experts (fc1, act, fc2,
dropout), plus the embedding, final norm and head: 1,603 leaf rows, and the 32 blocks' own outputs
for the residual stream row. Measured: the real capture → ``diagnose`` → ``group_report`` →
``groups_payload`` path; bytes = JSON of the meta + the binary arrays (what the ``groups`` trait
syncs), next to the flat ``layers`` trait's JSON (names, modules, shapes, flags per row) for scale.
First draw and expanding a group are timed in JupyterLab by ``tests/browser/test_groups_browser.py``
(``performance.now()`` in the page), which writes ``test-artifacts/groups_browser_timing.json``;
this script prints those figures when the file exists.

    python benchmarks/bench_groups.py [--quick]

The figures README.md / docs/big-models.md quote are printed last, labelled.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import torch
from common import Figures
from torch import nn

BLOCKS, EXPERTS, D = 32, 11, 32
ROOT = pathlib.Path(__file__).resolve().parent.parent
TIMING = ROOT / "test-artifacts" / "groups_browser_timing.json"


class Expert(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2, self.drop = nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d), nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))


class Attention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.softmax(self.q_proj(x) @ self.k_proj(x).transpose(-1, -2) / x.shape[-1] ** 0.5, -1)
        return self.o_proj(a @ self.v_proj(x))


class MoE(nn.Module):
    def __init__(self, d: int, n: int) -> None:
        super().__init__()
        self.experts = nn.ModuleList(Expert(d) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([e(x) for e in self.experts]).mean(0)


class Block(nn.Module):
    def __init__(self, d: int, experts: int) -> None:
        super().__init__()
        self.input_layernorm, self.self_attn = nn.LayerNorm(d), Attention(d)
        self.post_attention_layernorm, self.mlp = nn.LayerNorm(d), MoE(d, experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, blocks: int, experts: int, d: int, vocab: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d, experts) for _ in range(blocks))
        self.norm = nn.LayerNorm(d)


class BigLM(nn.Module):
    """``model.layers.N.{input_layernorm, self_attn.*_proj, post_attention_layernorm, mlp.experts.E.*}``."""

    def __init__(self, blocks: int = BLOCKS, experts: int = EXPERTS, d: int = D, vocab: int = 64) -> None:
        super().__init__()
        self.model = Inner(blocks, experts, d, vocab)
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(ids)
        for b in self.model.layers:
            x = b(x)
        return self.lm_head(self.model.norm(x))


def big_model(blocks: int = BLOCKS, experts: int = EXPERTS) -> tuple[nn.Module, torch.Tensor, list[str]]:
    """The model, its input, and the capture's layer list: every leaf plus the blocks themselves."""
    torch.manual_seed(0)
    model = BigLM(blocks, experts)
    leaves = [n for n, m in model.named_modules() if n and not list(m.children())]
    return model, torch.randint(0, 64, (1, 8)), leaves + [f"model.layers.{i}" for i in range(blocks)]


def capture_report(blocks: int = BLOCKS, experts: int = EXPERTS, steps: int = 1):
    """``steps`` SGD steps of ``big_model`` under ``Capture``; the thermometer report (at the last step)."""
    from nbdebug.capture.session import Capture
    from nbdebug.inspectors.thermometer import diagnose

    model, ids, layers = big_model(blocks, experts)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with Capture(model, layers=layers) as cap:  # exact names reach non-leaf modules (the blocks)
        for _ in range(steps):
            model(ids).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return cap.result, diagnose(cap.result)


def payload_bytes(meta: dict, arrays: dict) -> int:
    return len(json.dumps(meta).encode()) + sum(a.nbytes for a in arrays.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 blocks, 2 steps, 3 repeats: checks the script runs")
    args = ap.parse_args()
    from nbdebug.inspectors.groups import (
        attach_residual,
        group_report,
        groups_payload,
        residual_for,
    )

    blocks = 2 if args.quick else BLOCKS
    result, report = capture_report(blocks)
    rows = len(report.names)
    leaf_rows = sum(1 for n in report.names if not n.startswith("model.layers.") or n.count(".") > 2)

    def build() -> tuple[dict, dict]:
        tree = group_report(report)
        res = residual_for(tree, result.layers)
        if res is not None:
            attach_residual(tree, res)
        return groups_payload(tree)

    times = []
    for _ in range(3 if args.quick else 15):
        t0 = time.perf_counter()
        meta, arrays = build()
        times.append(time.perf_counter() - t0)
    flat = [{"name": n, "module": m, "type": t, "shape": list(s), "dtype": d, "flags": f, "calls": c}
            for n, m, t, s, d, f, c in zip(report.names, report.modules, report.types, report.shapes, report.dtypes,
                                          report.flags, report.calls)]
    names = len(json.dumps(report.names).encode())
    print(f"rows: {rows} ({leaf_rows} leaf rows + {rows - leaf_rows} block outputs), groups: "
          f"{len(arrays['group_name'])} ({len(arrays['block_name'])} blocks), residual: {'yes' if meta['residual'] else 'no'}")
    print(f"groups payload: {payload_bytes(meta, arrays) / 1024:.1f} KiB (target <= 1 MB); names as a tree: "
          f"{len(json.dumps(meta['strings']).encode()) + arrays['name_parent'].nbytes + arrays['name_suffix'].nbytes} B "
          f"vs {names} B as full strings; flat `layers` JSON + float32 stats table: "
          f"{(len(json.dumps(flat).encode()) + report.table.size * 4) / 1024:.1f} KiB")
    fig = Figures("docs/big-models.md (1000+ layers)")
    fig.add(f"grouped thermometer at {rows:,} rows: groups payload", f"{payload_bytes(meta, arrays) / 1024:.0f} KiB")
    print(f"python build (group_report + residual + groups_payload): median {statistics.median(times) * 1e3:.1f} ms "
          f"(min {min(times) * 1e3:.1f} ms) over {len(times)} runs")
    # the whole thermometer widget state for this one step (what a notebook syncs and saves)
    import traitlets
    from ipywidgets.widgets.widget import _remove_buffers

    from nbdebug.widgets.thermometer import ThermometerWidget

    w = ThermometerWidget(report, result)
    state, _, bufs = _remove_buffers(w.get_state())
    wired = isinstance(getattr(type(w), "groups", None), traitlets.TraitType)
    whole = (len(json.dumps(state).encode()) + sum(b.nbytes for b in bufs)) / 1024
    print(f"thermometer widget state, one step: {whole:.1f} KiB "
          f"({'with' if wired else 'without'} the grouped view; target <= 1 MB)")
    fig.add(f"grouped thermometer at {rows:,} rows: the widget's whole state", f"{whole:.0f} KiB")
    w.close()

    # over time: the blocks' strip statistics at every kept step (what groups_view adds to the payload)
    from nbdebug.inspectors.groups import groups_view

    n_steps = 2 if args.quick else 60
    t0 = time.perf_counter()
    result, report = capture_report(blocks, steps=n_steps)
    run = time.perf_counter() - t0
    t0 = time.perf_counter()
    meta, arrays = groups_view(report, result.layers, history=result.history)
    hist = sum(arrays[k].nbytes for k in ("hist_steps", "hist_blocks", "hist_strip"))
    print(f"{n_steps} training steps ({run:.1f} s captured): groups_view with history in "
          f"{(time.perf_counter() - t0) * 1e3:.1f} ms, whole payload {payload_bytes(meta, arrays) / 1024:.1f} KiB of which "
          f"{hist / 1024:.1f} KiB are the blocks' series ({arrays['hist_strip'].shape[0]} steps x "
          f"{arrays['hist_strip'].shape[1]} top-level blocks x {len(meta['hist_stats'])} stats)")
    if TIMING.exists():
        t = json.loads(TIMING.read_text())
        print("browser (JupyterLab, chromium; from tests/browser/test_groups_browser.py): " +
              ", ".join(f"{k[:-3]} {float(v):.1f} ms" if k.endswith("_ms") else f"{k} {v}" for k, v in t.items()))
        for k, v in t.items():
            if k.endswith("_ms"):
                fig.add(f"browser, {k[:-3].replace('_', ' ')} (tests/browser/test_groups_browser.py, {BLOCKS} blocks)", f"{float(v):.0f} ms")
    else:
        print(f"browser figures: run tests/browser/test_groups_browser.py (writes {TIMING.relative_to(ROOT)})")
        fig.add("browser first draw / expanding a group", f"not measured here: run tests/browser/test_groups_browser.py (writes {TIMING.relative_to(ROOT)})")
    fig.print()


if __name__ == "__main__":
    main()
