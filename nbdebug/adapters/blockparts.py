"""What activation patching needs of a transformer, per family: every block's attention output, MLP
output, attention output projection (whose input holds the heads side by side), the MLP's output
projection (whose input holds the neurons), head counts and whether attention is causal.

Built on :func:`~nbdebug.adapters.transformers.find_parts` (blocks, attention modules, final norm,
unembedding). Hugging Face models (GPT-2, Llama/Mistral/Qwen2/Gemma, GPT-NeoX, OPT) and
TransformerLens ``HookedTransformer`` (its hook points) are known. Nothing here changes the model.

>>> pp = patch_parts(model)                            # doctest: +SKIP
>>> pp.attn_out[3][0], pp.heads[3][0], pp.heads_at, pp.n_heads, pp.n_kv_heads
('model.layers.3.self_attn', 'model.layers.3.self_attn.o_proj', 'input', 9, 3)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .transformers import AdapterError, ModelParts, find_parts

__all__ = ["PatchParts", "patch_parts"]

# Names tried, in order (relative to a block / an attention module / an MLP module).
_MLP_NAMES = ("mlp", "feed_forward", "ffn")
_OUT_PROJ_NAMES = ("o_proj", "c_proj", "dense", "out_proj", "wo")
_MLP_OUT_NAMES = ("down_proj", "c_proj", "dense_4h_to_h", "fc2", "w2", "wo")

Named = tuple[str, nn.Module]


@dataclass
class PatchParts:
    """Per block (lists of ``(qualified name, module)``, one per layer; None when a family has no such
    part, with ``missing[kind]`` saying what was looked for).

    ``resid``: the module whose *input* is the residual stream entering the block (the block itself;
    TransformerLens: ``hook_resid_pre``, whose output it is). ``attn_out``/``mlp_out``: modules whose
    output (first element of a tuple) is the attention / MLP contribution. ``heads``: where the
    heads' outputs sit side by side: the input of the attention output projection (``heads_at ==
    "input"``, last axis ``n_heads * head_dim``) or TransformerLens' ``hook_z`` output
    (``heads_at == "output"``, axes ``(..., n_heads, head_dim)``). ``neurons``: the MLP output
    projection, whose input's last axis is the MLP's hidden neurons (TransformerLens: ``hook_post``,
    its output).
    """

    parts: ModelParts
    resid: list[Named]
    resid_at: str  # "input" (HF blocks) or "output" (HookedTransformer hook_resid_pre)
    attn_out: list[Named] | None
    mlp_out: list[Named] | None
    heads: list[Named] | None
    heads_at: str  # "input" | "output"
    neurons: list[Named] | None
    neurons_at: str
    n_heads: int
    head_dim: int
    n_kv_heads: int
    causal: bool
    hooked: bool = False
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return len(self.parts.blocks)

    def sites(self, kind: str) -> list[Named]:
        """The per-layer modules of a site kind (``resid``/``attn``/``mlp``/``heads``/``neurons``), or
        :class:`AdapterError` naming the missing part."""
        found = {"resid": self.resid, "attn": self.attn_out, "mlp": self.mlp_out, "heads": self.heads,
                 "neurons": self.neurons}
        if kind not in found:
            raise ValueError(f"unknown site kind {kind!r}; one of resid, attn, mlp, heads, neurons")
        value = found[kind]
        if value is None:
            raise AdapterError(self.missing.get(kind, f"{self.parts.family}: no {kind} sites"))
        return value

    def where(self, kind: str) -> str:
        """Whether a kind's activation is its module's ``"input"`` or ``"output"``."""
        return {"resid": self.resid_at, "heads": self.heads_at, "neurons": self.neurons_at}.get(kind, "output")


def _cfg_int(cfg: Any, *keys: str) -> int | None:
    for key in keys:
        v = getattr(cfg, key, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _child(module: nn.Module, names: tuple[str, ...]) -> tuple[str, nn.Module] | None:
    for name in names:
        mod = getattr(module, name, None)
        if isinstance(mod, nn.Module):
            return name, mod
    return None


def _per_block(blocks: list[Named], find: Any, what: str, looked: tuple[str, ...]) -> tuple[list[Named] | None, str]:
    out: list[Named] = []
    for bname, block in blocks:
        got = find(bname, block)
        if got is None:
            return None, f"no {what} in block {bname} ({type(block).__name__}); looked for {', '.join(looked)}"
        out.append(got)
    return out, ""


def _hooked_parts(model: Any, parts: ModelParts) -> PatchParts:
    cfg = model.cfg
    blocks = list(model.blocks)
    attn_only = bool(getattr(cfg, "attn_only", False))

    def named(suffix: str) -> list[Named]:
        return [(f"blocks.{i}.{suffix}", b.get_submodule(suffix)) for i, b in enumerate(blocks)]

    missing = {}
    if attn_only:
        missing["mlp"] = missing["neurons"] = "attention-only HookedTransformer: it has no MLP (hook_mlp_out)"
    kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    return PatchParts(
        parts=parts, resid=named("hook_resid_pre"), resid_at="output", attn_out=named("hook_attn_out"),
        mlp_out=None if attn_only else named("hook_mlp_out"), heads=named("attn.hook_z"), heads_at="output",
        neurons=None if attn_only else named("mlp.hook_post"), neurons_at="output", n_heads=int(cfg.n_heads),
        head_dim=int(cfg.d_head), n_kv_heads=int(kv), causal=getattr(cfg, "attention_dir", "causal") == "causal",
        hooked=True, missing=missing,
    )


def patch_parts(model: nn.Module, parts: ModelParts | None = None) -> PatchParts:
    """Locate what patching needs in ``model`` (see :class:`PatchParts`). Raises
    :class:`~nbdebug.adapters.transformers.AdapterError` when the model is an encoder or has no
    unembedding (the metric needs the model's logits); a missing MLP or output projection only fails
    when those sites are asked for (:meth:`PatchParts.sites`)."""
    parts = parts or find_parts(model)
    if parts.encoder:
        raise AdapterError(f"{type(model).__name__} is an encoder ({parts.family}): patching needs a causal "
                           "language model (a next-token head to measure the answer on)")
    if parts.family == "hooked_transformer":
        return _hooked_parts(model, parts)
    if parts.unembed_weight is None:
        raise AdapterError(f"could not find the unembedding of {type(model).__name__} (no get_output_embeddings()): "
                           "patching measures the answer on the model's logits")
    blocks = parts.blocks
    attn_by_block = dict(zip([b for b, _ in blocks], parts.attentions))
    cfg = parts.hf_config

    def attn_out(bname: str, block: nn.Module) -> Named:
        return attn_by_block[bname]

    def mlp(bname: str, block: nn.Module) -> Named | None:
        got = _child(block, _MLP_NAMES)
        return None if got is None else (f"{bname}.{got[0]}", got[1])

    def out_proj(bname: str, block: nn.Module) -> Named | None:
        aname, amod = attn_by_block[bname]
        got = _child(amod, _OUT_PROJ_NAMES)
        return None if got is None else (f"{aname}.{got[0]}", got[1])

    def mlp_proj(bname: str, block: nn.Module) -> Named | None:
        m = mlp(bname, block)
        if m is None:
            return None
        got = _child(m[1], _MLP_OUT_NAMES)
        return None if got is None else (f"{m[0]}.{got[0]}", got[1])

    attn, _ = _per_block(blocks, attn_out, "attention module", ())
    mlps, mlp_missing = _per_block(blocks, mlp, "MLP module", _MLP_NAMES)
    heads, heads_missing = _per_block(blocks, out_proj, "attention output projection", _OUT_PROJ_NAMES)
    neurons, neurons_missing = _per_block(blocks, mlp_proj, "MLP output projection", _MLP_OUT_NAMES)
    n_heads = _cfg_int(cfg, "num_attention_heads", "n_head", "num_heads") or 0
    amod = parts.attentions[0][1]
    n_heads = n_heads or int(getattr(amod, "num_heads", 0) or 0)
    d = _cfg_int(cfg, "hidden_size", "n_embd", "d_model") or 0
    head_dim = _cfg_int(cfg, "head_dim") or int(getattr(amod, "head_dim", 0) or (d // n_heads if n_heads else 0))
    n_kv = _cfg_int(cfg, "num_key_value_heads", "n_kv_heads") or n_heads
    missing = {"mlp": mlp_missing, "heads": heads_missing, "neurons": neurons_missing}
    if not n_heads or not head_dim:
        heads, missing["heads"] = None, f"{parts.family}: the number of attention heads is not in the config"
    return PatchParts(
        parts=parts, resid=list(blocks), resid_at="input", attn_out=attn, mlp_out=mlps, heads=heads, heads_at="input",
        neurons=neurons, neurons_at="input", n_heads=n_heads, head_dim=head_dim, n_kv_heads=n_kv,
        causal=not bool(getattr(cfg, "is_encoder_decoder", False)), missing={k: v for k, v in missing.items() if v},
    )
