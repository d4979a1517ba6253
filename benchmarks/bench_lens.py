"""Lenses you can trust (issue 29): how far each block's lens is from the model's output on held-out text.

    python benchmarks/bench_lens.py            # SmolLM2-135M: shortcut and tuned fits, per-block KL table
    python benchmarks/bench_lens.py --quick    # tiny random model: every code path, numbers mean nothing

The defaults are the acceptance run of issue 29 (quiet machine, nothing else running: 9 min in all on
2026-11-28, table in docs/lenses.md):

    PYTHONPATH=. python benchmarks/bench_lens.py --fit-rest --shortcut-tokens 8192 --shortcut-seconds 180 \
        --tuned-tokens 32768 --tuned-seconds 900 --steps 400 --vocab 4096 --heldout-tokens 1024 \
        --json /tmp/bench_lens.json

It times a shortcut fit on its own (``fit_lens(kind="shortcut")``: reading the text + least squares,
the ≤ 3 min criterion) and a tuned fit (≤ 15 min); ``--vocab 0`` trains the tuned lens on the full
vocabulary (the cost and effect of the restriction, docs/lenses.md).

Fitting text: the Python documentation's English (``pydoc_data.topics``), topics sorted by name; the
first of the last ``--heldout-topics`` topics that hold ``--heldout-tokens`` are never read while fitting
(``--no-fit-rest``: none of the last ``--heldout-topics`` is read) and give the held-out KL(final ‖ lens) in
nats, per block, over the whole vocabulary (the first position of each sequence left out, as in the fit).
Prints the fit times, the per-block table, the means and the acceptance checks; ``--json PATH`` writes them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from nbdebug.lens import fit_lens, load_lens
from nbdebug.lens.collect import residual_batches, token_sequences
from nbdebug.lens.quality import row_kl
from nbdebug.lens.resolve import local_text


def heldout(model, tok, texts, parts, lenses, *, tokens, seq_len):  # type: ignore[no-untyped-def]
    seqs = token_sequences(texts, tok, seq_len=seq_len, max_tokens=tokens)
    out = {name: [] for name in lenses}
    for rows in residual_batches(model, parts, seqs):
        for name, lens in lenses.items():
            out[name].append(row_kl(lens, parts, rows))
    return {name: torch.cat(v, 1).mean(1)[:-1] for name, v in out.items()}  # blocks: rows 0 … L-1 (the last is 0)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shortcut-tokens", type=int, default=8192, help="the shortcut fit on its own (timed)")
    ap.add_argument("--shortcut-seconds", type=float, default=180)
    ap.add_argument("--tuned-tokens", type=int, default=32768)
    ap.add_argument("--tuned-seconds", type=float, default=900)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--vocab", type=int, default=4096, help="training vocabulary of the tuned lens (0: all)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--heldout-tokens", type=int, default=1024)
    ap.add_argument("--heldout-topics", type=int, default=60)
    ap.add_argument("--fit-rest", action=argparse.BooleanOptionalAction, default=True,
                    help="fit on every topic but those holding the held-out tokens (the default: the acceptance run); "
                         "--no-fit-rest: the topics before the last --heldout-topics only (~12k tokens)")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    from nbdebug.adapters.transformers import find_parts

    if a.quick:
        from nbdebug.adapters.offline import tiny_lm

        model, tok, seq_len = tiny_lm("llama", vocab=300, layers=3, d=32), None, 64
        gen = torch.Generator().manual_seed(0)
        fit_text, held_text = torch.randint(0, 300, (3000,), generator=gen), torch.randint(0, 300, (600,), generator=gen)
        a.shortcut_tokens, a.tuned_tokens, a.steps, a.heldout_tokens, a.vocab = 1024, 1024, 5, 512, 128
    else:
        from nbdebug.adapters.offline import load_smollm2

        model, tok = load_smollm2()
        seq_len = 256
        topics = local_text()
        fit_text, held_text = topics[: -a.heldout_topics], topics[-a.heldout_topics:]
        if a.fit_rest:  # the same held-out tokens (the first of the last topics); every other topic may be read
            k, n = 0, 0
            while n < a.heldout_tokens:
                n += len(tok.encode(held_text[k], add_special_tokens=False)) + 1
                k += 1
            fit_text, held_text = fit_text + held_text[k:], held_text[:k]
    parts = find_parts(model)
    times, lenses = {}, {}
    if a.shortcut_tokens:  # the shortcut fit on its own (the timing criterion); the table's shortcut is the tuned fit's start
        t = time.perf_counter()
        fit_lens(model, tok, fit_text, kind="shortcut", max_tokens=a.shortcut_tokens, max_seconds=a.shortcut_seconds,
                 holdout=0, seq_len=seq_len)
        times["shortcut alone"] = time.perf_counter() - t
    t = time.perf_counter()
    tuned = fit_lens(model, tok, fit_text, kind="tuned", max_tokens=a.tuned_tokens, max_seconds=a.tuned_seconds,
                     holdout=0, seq_len=seq_len, steps=a.steps, vocab=a.vocab or None, init="shortcut", batch=a.batch)
    times["tuned"] = time.perf_counter() - t
    assert tuned.start is not None
    lenses["shortcut"], lenses["tuned"] = tuned.start, tuned
    times["shortcut"] = tuned.info["read_seconds"] + tuned.info["solve_seconds"]  # reading the text + least squares
    if a.quick:  # the other training paths: identity start, the full vocabulary, and a save/load round trip
        import tempfile

        lenses["tuned-identity-fullvocab"] = fit_lens(model, tok, fit_text, kind="tuned", max_tokens=a.tuned_tokens,
                                                      holdout=256, seq_len=seq_len, steps=a.steps, vocab=None, init="identity")
        with tempfile.TemporaryDirectory() as d:
            lenses["tuned (saved, loaded)"] = load_lens(lenses["tuned"].save(d), model)
    kl = heldout(model, tok, held_text, parts, {"logit": None, **lenses}, tokens=a.heldout_tokens, seq_len=seq_len)
    names = list(kl)
    print(f"held-out KL(final ‖ lens), nats, per block ({kl['logit'].shape[0]} rows: embeddings, blocks 0 … L-2; "
          f"the last block is the output itself)")
    print("row       " + "".join(f"{n:>14s}" for n in names))
    for r in range(kl["logit"].shape[0]):
        label = "embed" if r == 0 else f"block {r - 1}"
        print(f"{label:10s}" + "".join(f"{float(kl[n][r]):14.3f}" for n in names))
    # the "mean over blocks": blocks 0 … L-2, the embeddings row apart (the logit lens reads it at ~100
    # nats, which alone would make any lens look 10× better); the mean with it is printed too
    mean = {n: float(kl[n][1:].mean()) for n in names}
    print("mean      " + "".join(f"{mean[n]:14.3f}" for n in names) + "   (blocks)")
    print("with embed" + "".join(f"{float(kl[n].mean()):14.3f}" for n in names))
    s, tu, lo = kl["shortcut"][1:], kl["tuned"][1:], kl["logit"][1:]
    checks = {
        "shortcut fit ≤ 180 s": times.get("shortcut alone", times["shortcut"]) <= 180,
        "tuned fit ≤ 900 s": times["tuned"] <= 900,
        "shortcut ≥ 5× lower than logit": mean["logit"] >= 5 * mean["shortcut"],
        "tuned ≥ 10× lower than logit": mean["logit"] >= 10 * mean["tuned"],
        "tuned ≥ 15% lower than shortcut": mean["tuned"] <= 0.85 * mean["shortcut"],
        "tuned < shortcut at ≥ 90% of blocks": float((tu < s).float().mean()) >= 0.9,
    }
    print(f"\nfit times: shortcut alone {times.get('shortcut alone', math.nan):.0f} s ({a.shortcut_tokens} tokens); shortcut {times['shortcut']:.0f} s (reading {lenses['shortcut'].info['tokens']} tokens + least squares; "
          f"the tuned fit's start), "
          f"tuned {times['tuned']:.0f} s ({lenses['tuned'].info['tokens']} tokens, {lenses['tuned'].info.get('steps')} steps, "
          f"training vocabulary {lenses['tuned'].info.get('train_vocab')})")
    print(f"ratios: logit/shortcut {mean['logit'] / mean['shortcut']:.1f}×, logit/tuned {mean['logit'] / mean['tuned']:.1f}×, "
          f"tuned vs shortcut {100 * (1 - mean['tuned'] / mean['shortcut']):.0f}% lower, tuned lower at "
          f"{int((tu < s).sum())} of {len(s)} blocks; logit lower than shortcut at {int((lo < s).sum())}")
    for k, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {k}")
    print("\n## figures quoted in docs/lenses.md")
    print("mean held-out KL: " + ", ".join(f"{n} {mean[n]:.3f}" for n in names))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"kl": {n: [float(x) for x in kl[n]] for n in names}, "mean": mean, "times": times,
                       "info": {n: lenses[n].info for n in lenses}, "checks": checks}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
