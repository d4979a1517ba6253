"""References for the workbench tests, written independently of nbdebug.workbench: one full forward
of the model per patch, with plain PyTorch hooks (what TransformerLens' generic_activation_patch does)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn


def logit_diff(answer: int, wrong: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def metric(logits: torch.Tensor) -> torch.Tensor:
        last = logits[:, -1].float()
        return last[:, answer] - last[:, wrong]

    return metric


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return out if isinstance(out, torch.Tensor) else out.logits


def _act(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def record(model: nn.Module, ids: torch.Tensor, module: nn.Module, where: str) -> torch.Tensor:
    """The activation at ``module``'s input (first positional) or output (first element) for ``ids``."""
    seen: list[torch.Tensor] = []
    if where == "input":
        h = module.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    else:
        h = module.register_forward_hook(lambda m, a, o: seen.append(_act(o).detach().clone()))
    try:
        with torch.no_grad():
            logits(model, ids)
    finally:
        h.remove()
    return seen[0]


def patched_metric(model: nn.Module, ids: torch.Tensor, module: nn.Module, where: str, positions: list[int],
                   value: torch.Tensor, metric: Callable[[torch.Tensor], torch.Tensor],
                   features: slice | tuple[Any, ...] = (), ) -> float:
    """One full forward of ``ids`` with ``module``'s activation at ``positions`` (and ``features`` of the
    trailing axes) replaced by ``value``'s."""
    idx = (slice(None), positions, *((features,) if isinstance(features, slice) else features))

    def put(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[idx] = value[idx].to(x.dtype)
        return x

    if where == "input":
        h = module.register_forward_pre_hook(lambda m, a: (put(a[0]), *a[1:]))
    else:
        h = module.register_forward_hook(
            lambda m, a, o: put(o) if isinstance(o, torch.Tensor) else (put(o[0]), *o[1:]))
    try:
        with torch.no_grad():
            return float(metric(logits(model, ids))[0])
    finally:
        h.remove()


def hand_grid(model: nn.Module, base: torch.Tensor, source: torch.Tensor, sites: list[tuple[nn.Module, str]],
              metric: Callable[[torch.Tensor], torch.Tensor], heads: int = 0, head_dim: int = 0,
              z_layout: bool = False, all_positions: bool = False) -> np.ndarray:
    """Raw metric grid, one forward per patch: rows = sites (× heads when ``heads``), columns = positions
    (or heads when ``all_positions``)."""
    T = base.shape[1]
    rows: list[list[float]] = []
    for module, where in sites:
        src = record(model, source, module, where)
        if not heads:
            cols = [list(range(T))] if all_positions else [[p] for p in range(T)]
            rows.append([patched_metric(model, base, module, where, c, src, metric) for c in cols])
            continue

        def feat(h: int) -> Any:
            return (h,) if z_layout else slice(h * head_dim, (h + 1) * head_dim)

        if all_positions:
            rows.append([patched_metric(model, base, module, where, list(range(T)), src, metric, feat(h))
                         for h in range(heads)])
        else:
            for h in range(heads):
                rows.append([patched_metric(model, base, module, where, [p], src, metric, feat(h)) for p in range(T)])
    return np.array(rows)


def hooked(kv_heads: int | None = 2, positional: str = "rotary", layers: int = 3) -> nn.Module:
    """A random-init TransformerLens HookedTransformer (GQA with ``kv_heads``), eval mode, seeded."""
    import warnings

    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=layers, d_model=32, n_ctx=32, d_head=8, n_heads=4, d_vocab=64,
                                  act_fn="gelu", normalization_type="LN", n_key_value_heads=kv_heads,
                                  positional_embedding_type=positional, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return HookedTransformer(cfg).eval()


#: the tiny models' shape (:func:`tiny`)
LAYERS, HEADS, HEAD_DIM = 3, 4, 8
#: which module each site kind patches, and at its input or output, per family, written by hand (the
#: references never ask nbdebug's ``patch_parts`` which module to patch): the residual stream is each
#: block's input (TransformerLens: ``hook_resid_pre``), attn/mlp the sublayer's output, heads the output
#: projection's input (per-head slices of ``HEAD_DIM``; TransformerLens: ``hook_z``, a heads axis)
SITES: dict[str, dict[str, tuple[str, str]]] = {
    "gpt2": {"resid": ("transformer.h.{}", "input"), "attn": ("transformer.h.{}.attn", "output"),
             "mlp": ("transformer.h.{}.mlp", "output"), "heads": ("transformer.h.{}.attn.c_proj", "input")},
    "llama": {"resid": ("model.layers.{}", "input"), "attn": ("model.layers.{}.self_attn", "output"),
              "mlp": ("model.layers.{}.mlp", "output"), "heads": ("model.layers.{}.self_attn.o_proj", "input")},
    "mistral": {"resid": ("model.layers.{}", "input"), "attn": ("model.layers.{}.self_attn", "output"),
                "mlp": ("model.layers.{}.mlp", "output"), "heads": ("model.layers.{}.self_attn.o_proj", "input")},
    "gemma2": {"resid": ("model.layers.{}", "input"), "attn": ("model.layers.{}.self_attn", "output"),
               "mlp": ("model.layers.{}.mlp", "output"), "heads": ("model.layers.{}.self_attn.o_proj", "input")},
    "neox": {"resid": ("gpt_neox.layers.{}", "input"), "attn": ("gpt_neox.layers.{}.attention", "output"),
             "mlp": ("gpt_neox.layers.{}.mlp", "output"), "heads": ("gpt_neox.layers.{}.attention.dense", "input")},
    "hooked": {"resid": ("blocks.{}.hook_resid_pre", "output"), "attn": ("blocks.{}.hook_attn_out", "output"),
               "mlp": ("blocks.{}.hook_mlp_out", "output"), "heads": ("blocks.{}.attn.hook_z", "output")},
}


def sites(model: nn.Module, family: str, kind: str) -> list[tuple[nn.Module, str]]:
    """``[(module, "input" | "output")]`` of ``kind`` for each layer, from :data:`SITES`."""
    name, where = SITES[family][kind]
    return [(model.get_submodule(name.format(i)), where) for i in range(LAYERS)]


def tiny(family: str) -> nn.Module:
    """3 layers, 4 heads (Llama: 2 key/value heads, GQA), d=32, vocabulary 64; ``hooked`` for TransformerLens."""
    if family == "hooked":
        return hooked()
    from nbdebug.adapters.offline import tiny_lm

    return tiny_lm(family, layers=3, heads=4, d=32)


def prompts(T: int = 7, changed: tuple[int, ...] = (2,), seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A clean prompt and a corrupt one differing at ``changed`` positions."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, 64, (1, T), generator=g)
    corrupt = clean.clone()
    for p in changed:
        corrupt[0, p] = (clean[0, p] + 5) % 64
    return clean, corrupt


def answer_pair(model: nn.Module, clean: torch.Tensor, corrupt: torch.Tensor) -> tuple[int, int]:
    """The clean run's top next token and the corrupt run's (or its second when they agree)."""
    with torch.no_grad():
        a = logits(model, clean)[0, -1]
        b = logits(model, corrupt)[0, -1]
    top = int(a.argmax())
    other = b.topk(2).indices.tolist()
    return top, other[0] if other[0] != top else other[1]
