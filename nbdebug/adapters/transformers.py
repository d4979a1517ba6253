"""Where a transformer keeps its blocks, attention modules, final norm and unembedding.

Works on Hugging Face models (GPT-2, Llama/Mistral/Qwen2, GPT-NeoX/Pythia, OPT, Gemma/Gemma2,
BERT/RoBERTa/DistilBERT encoders) and on TransformerLens ``HookedTransformer`` (duck-typed, never
imported). Nothing here changes the model: :func:`find_parts` only reads module attributes.

>>> parts = find_parts(model)                       # doctest: +SKIP
>>> parts.blocks[0][0], parts.final_norm_name, parts.family
('model.layers.0', 'model.norm', 'llama')
>>> logits = parts.logits(parts.final_norm(h))       # the model's own head, any residual h
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = [
    "AdapterError",
    "ModelParts",
    "attention_implementation",
    "eager_attention",
    "find_parts",
    "require_lens",
    "restore_attn_implementation",
]

# Names tried, in order, for each part (relative to any submodule of the model).
_BLOCK_LISTS = ("layers", "h", "layer", "blocks")
_ATTN_NAMES = ("self_attn", "attn", "attention", "self_attention")
_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "ln_final", "final_norm", "norm_f")
_ENCODER_TYPES = ("bert", "roberta", "distilbert", "xlm-roberta", "electra", "albert", "deberta")


class AdapterError(ValueError, LookupError):
    """A part of the model could not be found; the message says which and how to pass it."""


@dataclass
class ModelParts:
    """The pieces of a transformer the language views need.

    ``blocks``/``attentions`` are ``(qualified name, module)`` pairs, one per layer. ``unembed``
    maps a normed residual ``(..., d)`` to logits ``(..., V)``; ``unembed_weight``/``unembed_bias``
    expose it as a matrix when it is one (so the logit lens can chunk over the vocabulary).
    ``final_norm`` is the model's own module (LayerNorm, RMSNorm, Gemma's ``1 + w`` RMSNorm...).
    On an accelerate ``device_map`` model with offload, ``unembed_weight`` may sit on ``meta``: read
    it as ``unembed_module.weight`` inside ``capture.state.loaded_weights(unembed_module)``.
    """

    family: str
    blocks: list[tuple[str, nn.Module]]
    attentions: list[tuple[str, nn.Module]]
    final_norm: Callable[[torch.Tensor], torch.Tensor] | None = None
    final_norm_name: str = ""
    unembed_weight: torch.Tensor | None = None  # (V, d)
    unembed_bias: torch.Tensor | None = None  # (V,)
    unembed_module: nn.Module | None = None  # whose .weight/.bias they are (read by attribute: accelerate swaps them)
    pre_unembed: Callable[[torch.Tensor], torch.Tensor] | None = None  # e.g. OPT's project_out
    softcap: float | None = None  # Gemma 2 final logit softcapping
    encoder: bool = False
    hf_config: Any = None
    notes: list[str] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    @property
    def has_lens(self) -> bool:
        return self.unembed_weight is not None

    def normed(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm (if any) then pre-unembedding projection (if any) of a residual stream."""
        if self.final_norm is not None:
            h = self.final_norm(h)
        if self.pre_unembed is not None:
            h = self.pre_unembed(h)
        return h

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Unembed an already-normed residual (full vocabulary; use for small inputs only)."""
        if self.unembed_weight is None:
            raise AdapterError(f"{self.family}: no unembedding found; pass unembed=")
        from ..capture.state import loaded_weights

        mod = self.unembed_module
        with loaded_weights(mod) if mod is not None else nullcontext():
            w = mod.weight if mod is not None else self.unembed_weight
            b = getattr(mod, "bias", None) if mod is not None else self.unembed_bias
            z = normed.to(w.device) @ w.T.to(normed.dtype)
            if b is not None:
                z = z + b.to(z.dtype)
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z


def _model_type(model: nn.Module) -> str:
    cfg = getattr(model, "config", None)
    return str(getattr(cfg, "model_type", "") or "")


def _is_hooked_transformer(model: nn.Module) -> bool:
    return all(hasattr(model, a) for a in ("cfg", "blocks", "unembed", "embed")) and hasattr(
        getattr(model, "cfg", None), "n_layers"
    )


def _n_layers(model: nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    for key in ("num_hidden_layers", "n_layer", "n_layers", "num_layers"):
        n = getattr(cfg, key, None)
        if isinstance(n, int):
            return n
    text = getattr(cfg, "text_config", None)
    if text is not None:
        n = getattr(text, "num_hidden_layers", None)
        if isinstance(n, int):
            return n
    return None


def _find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    n = _n_layers(model)
    best: tuple[str, nn.ModuleList] | None = None
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) == 0:
            continue
        leaf = name.rsplit(".", 1)[-1]
        if n is not None and len(mod) != n:
            continue
        if leaf in _BLOCK_LISTS or n is not None:
            if best is None or (leaf in _BLOCK_LISTS and best[0].rsplit(".", 1)[-1] not in _BLOCK_LISTS):
                best = (name, mod)
    if best is None:
        raise AdapterError(
            f"could not find the list of transformer blocks in {type(model).__name__}: no "
            f"nn.ModuleList named {'/'.join(_BLOCK_LISTS)}"
            + (f" with {n} entries (config)" if n is not None else "")
            + "; pass blocks=[...] (a list of the block modules) explicitly"
        )
    return best


def _attention_classes(model: nn.Module) -> tuple[type, ...]:
    rec = getattr(model, "_can_record_outputs", None) or {}
    target = rec.get("attentions")
    cls = getattr(target, "target_class", target)
    return (cls,) if isinstance(cls, type) else ()


def _find_attention(block: nn.Module, classes: tuple[type, ...]) -> tuple[str, nn.Module] | None:
    if classes:
        for name, mod in block.named_modules():
            if isinstance(mod, classes) and "cross" not in name:
                return name, mod
    for name in _ATTN_NAMES:
        mod = getattr(block, name, None)
        if isinstance(mod, nn.Module):
            inner = getattr(mod, "self", None)  # BERT-style Attention(self=SelfAttention, output=...)
            if isinstance(inner, nn.Module) and not classes:
                return f"{name}.self", inner
            return name, mod
    return None


def _find_norm(model: nn.Module, blocks_name: str) -> tuple[str, nn.Module] | None:
    # The final norm is a sibling of the block list (model.norm, transformer.ln_f, decoder.final_layer_norm).
    parent_name = blocks_name.rsplit(".", 1)[0] if "." in blocks_name else ""
    scopes = [parent_name]
    while parent_name:
        parent_name = parent_name.rsplit(".", 1)[0] if "." in parent_name else ""
        scopes.append(parent_name)
    for scope in scopes:
        parent = model.get_submodule(scope) if scope else model
        for name in _NORM_NAMES:
            mod = getattr(parent, name, None)
            if isinstance(mod, nn.Module):
                return (f"{scope}.{name}" if scope else name), mod
    return None


def _linear_parts(mod: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if isinstance(mod, (nn.Linear, nn.Embedding)):
        return mod.weight, getattr(mod, "bias", None)
    return None, None


def _hooked_transformer_parts(model: Any) -> ModelParts:
    blocks = [(f"blocks.{i}", b) for i, b in enumerate(model.blocks)]
    # hook_pattern is an identity module whose output is the (B, H, T, T) pattern
    attns = [(f"blocks.{i}.attn.hook_pattern", b.attn.hook_pattern) for i, b in enumerate(model.blocks)]
    ln = getattr(model, "ln_final", None)
    w_u = model.unembed.W_U  # (d, V)
    b_u = getattr(model.unembed, "b_U", None)
    softcap = getattr(model.cfg, "output_logits_soft_cap", None)
    return ModelParts(
        family="hooked_transformer",
        blocks=blocks,
        attentions=attns,
        final_norm=ln if isinstance(ln, nn.Module) and type(ln).__name__ != "Identity" else None,
        final_norm_name="ln_final" if ln is not None else "",
        unembed_weight=w_u.T,
        unembed_bias=b_u,
        softcap=float(softcap) if softcap and softcap > 0 else None,
        hf_config=model.cfg,
    )


def find_parts(
    model: nn.Module,
    *,
    final_norm: nn.Module | Callable[[torch.Tensor], torch.Tensor] | None = None,
    unembed: nn.Module | torch.Tensor | None = None,
    blocks: list[nn.Module] | None = None,
) -> ModelParts:
    """Locate blocks, attention modules, final norm and unembedding of ``model``.

    Explicit ``final_norm=`` (a module or function), ``unembed=`` (a Linear/Embedding or a
    ``(V, d)`` weight) and ``blocks=`` override what is found. Raises :class:`AdapterError` naming
    what is missing and which argument supplies it. A ``torch.compile``d model is described by its
    original module (the same submodules, named without the ``_orig_mod.`` prefix).
    """
    orig = getattr(model, "_orig_mod", None)
    if isinstance(orig, nn.Module) and type(model).__name__ == "OptimizedModule":
        model = orig
    if _is_hooked_transformer(model):
        parts = _hooked_transformer_parts(model)
    else:
        parts = _hf_parts(model, blocks)
    if final_norm is not None:
        parts.final_norm, parts.final_norm_name = final_norm, "final_norm= (given)"
    if unembed is not None:
        if isinstance(unembed, torch.Tensor):
            parts.unembed_weight, parts.unembed_bias, parts.unembed_module = unembed, None, None
        else:
            w, b = _linear_parts(unembed)
            if w is None:
                raise AdapterError("unembed= must be an nn.Linear, nn.Embedding or a (vocab, d) weight tensor")
            parts.unembed_weight, parts.unembed_bias, parts.unembed_module = w, b, unembed
    return parts


def _hf_parts(model: nn.Module, blocks: list[nn.Module] | None) -> ModelParts:
    mtype = _model_type(model)
    if blocks is not None:
        names = {id(m): n for n, m in model.named_modules()}
        block_list = [(names.get(id(b), f"block{i}"), b) for i, b in enumerate(blocks)]
        blocks_name = block_list[0][0].rsplit(".", 1)[0] if block_list else ""
    else:
        blocks_name, mlist = _find_blocks(model)
        block_list = [(f"{blocks_name}.{i}", b) for i, b in enumerate(mlist)]
    classes = _attention_classes(model)
    attns: list[tuple[str, nn.Module]] = []
    for bname, b in block_list:
        found = _find_attention(b, classes)
        if found is None:
            raise AdapterError(
                f"no attention module in block {bname} ({type(b).__name__}); looked for "
                f"{', '.join(_ATTN_NAMES)}"
            )
        attns.append((f"{bname}.{found[0]}", found[1]))
    cfg = getattr(model, "config", None)
    encoder = mtype in _ENCODER_TYPES
    parts = ModelParts(family=mtype or type(model).__name__, blocks=block_list, attentions=attns, encoder=encoder, hf_config=cfg)
    if encoder:
        parts.notes.append("encoder model: attention view only (no causal LM head for a logit lens)")
        return parts
    norm = _find_norm(model, blocks_name)
    if norm is not None:
        parts.final_norm_name, parts.final_norm = norm[0], norm[1]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None and hasattr(model, "get_input_embeddings"):
        head = model.get_input_embeddings()  # a bare base model: tied unembedding
        if head is not None:
            parts.notes.append("no LM head: using the (tied) input embedding as unembedding")
    parts.unembed_weight, parts.unembed_bias = _linear_parts(head)
    parts.unembed_module = head if parts.unembed_weight is not None else None
    proj = getattr(getattr(model, "model", model), "decoder", None)
    proj = getattr(proj, "project_out", None)
    if isinstance(proj, nn.Module):  # OPT-350m: hidden -> word_embed_proj_dim before the head
        parts.pre_unembed = proj
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap:
        parts.softcap = float(cap)
    if parts.final_norm is None:
        parts.notes.append("no final norm found: residuals are unembedded directly (pass final_norm= if the model has one)")
    return parts


def require_lens(parts: ModelParts, model: nn.Module) -> None:
    """Raise a clear :class:`AdapterError` if the logit lens cannot run on ``parts``."""
    if parts.encoder:
        raise AdapterError(
            f"{type(model).__name__} is an encoder ({parts.family}); the logit lens needs a causal LM "
            "head. Pass unembed= (and final_norm=) explicitly to lens an encoder anyway."
        )
    if parts.unembed_weight is None:
        raise AdapterError(
            f"could not find the unembedding of {type(model).__name__} (no get_output_embeddings()); "
            "pass unembed=<nn.Linear or (vocab, d) tensor>"
        )


# -- attention implementation --------------------------------------------------------------------
def attention_implementation(model: nn.Module) -> str | None:
    """The HF attention implementation in use (``"sdpa"``, ``"eager"``...) or None if not HF."""
    cfg = getattr(model, "config", None)
    return getattr(cfg, "_attn_implementation", None) if cfg is not None else None


def _attn_configs(model: nn.Module) -> list[Any]:
    """Every config whose attention implementation a switch can change: the model's, its sub-configs
    (at any depth) and the configs of Hugging Face sub-models, each once."""
    seen: dict[int, Any] = {}
    todo = [getattr(model, "config", None)] + [getattr(m, "config", None) for m in model.modules()]
    while todo:
        cfg = todo.pop(0)
        if cfg is None or id(cfg) in seen or not hasattr(cfg, "_attn_implementation"):
            continue
        seen[id(cfg)] = cfg
        todo += [getattr(cfg, k, None) for k in getattr(cfg, "sub_configs", None) or {}]
    return list(seen.values())


@contextmanager
def restore_attn_implementation(model: nn.Module) -> Iterator[None]:
    """Put back every config's own attention implementation afterwards, exactly as it was.

    ``set_attn_implementation("sdpa")`` sets one implementation on every sub-config and sub-model; a
    model whose sub-configs differ (a vision tower on eager, the text model on SDPA) would come back
    changed. The top-level implementation is restored through the setter (when there is one), then
    each config's own value is written back as it was.
    """
    configs = _attn_configs(model)
    saved = [(cfg, vars(cfg).get("_attn_implementation_internal", cfg._attn_implementation)) for cfg in configs]
    top = attention_implementation(model)
    try:
        yield
    finally:
        setter = getattr(model, "set_attn_implementation", None)
        try:
            if callable(setter) and attention_implementation(model) != top:
                setter(top)
        finally:
            for cfg, value in saved:
                if "_attn_implementation_internal" in vars(cfg):
                    if cfg._attn_implementation_internal != value:
                        cfg._attn_implementation_internal = value
                elif cfg._attn_implementation != value:
                    cfg._attn_implementation = value


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[str]:
    """Switch an HF model to eager attention (which returns the probabilities), restore after
    (every sub-config's own implementation too: :func:`restore_attn_implementation`).

    Yields the path that runs: ``"eager"`` (already eager), ``"eager (switched from sdpa)"``, or
    ``"hooks"`` for non-HF models (TransformerLens patterns are always materialised).
    """
    before = attention_implementation(model)
    if before is None:
        yield "hooks"
        return
    if before == "eager":
        yield "eager"
        return
    with restore_attn_implementation(model):
        setter = getattr(model, "set_attn_implementation", None)
        if setter is None:  # transformers 4.x without the setter
            model.config._attn_implementation = "eager"  # type: ignore[union-attr]
        else:
            setter("eager")
        yield f"eager (switched from {before})"
