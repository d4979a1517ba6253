"""Model adapters on tiny random-init configs of each family (built from config classes, no downloads)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from nbdebug.adapters.offline import tiny_lm  # noqa: E402
from nbdebug.adapters.transformers import (  # noqa: E402
    AdapterError,
    attention_implementation,
    eager_attention,
    find_parts,
    require_lens,
)
from nbdebug.capture import fingerprint, hook_count, same_fingerprint  # noqa: E402

V = 64


def tiny(family: str) -> nn.Module:
    return tiny_lm(family, vocab=V)


EXPECTED = {
    # family: (first block, first attention, final norm, norm type)
    "gpt2": ("transformer.h.0", "transformer.h.0.attn", "transformer.ln_f", nn.LayerNorm),
    "llama": ("model.layers.0", "model.layers.0.self_attn", "model.norm", None),
    "mistral": ("model.layers.0", "model.layers.0.self_attn", "model.norm", None),
    "qwen2": ("model.layers.0", "model.layers.0.self_attn", "model.norm", None),
    "neox": ("gpt_neox.layers.0", "gpt_neox.layers.0.attention", "gpt_neox.final_layer_norm", nn.LayerNorm),
    "opt": ("model.decoder.layers.0", "model.decoder.layers.0.self_attn", "model.decoder.final_layer_norm", nn.LayerNorm),
    "gemma": ("model.layers.0", "model.layers.0.self_attn", "model.norm", None),
    "gemma2": ("model.layers.0", "model.layers.0.self_attn", "model.norm", None),
}
ENCODERS = {
    "bert": ("encoder.layer.0", "encoder.layer.0.attention.self"),
    "roberta": ("encoder.layer.0", "encoder.layer.0.attention.self"),
    "distilbert": ("transformer.layer.0", "transformer.layer.0.attention"),
}


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_decoder_parts(family: str) -> None:
    m = tiny(family)
    p = find_parts(m)
    block, attn, norm, norm_type = EXPECTED[family]
    assert p.n_layers == 2 and len(p.attentions) == 2
    assert p.blocks[0][0] == block and p.blocks[0][1] is m.get_submodule(block)
    assert p.attentions[0][0] == attn and p.attentions[0][1] is m.get_submodule(attn)
    assert p.final_norm_name == norm and p.final_norm is m.get_submodule(norm)
    if norm_type is not None:
        assert isinstance(p.final_norm, norm_type)
    assert p.unembed_weight is m.get_output_embeddings().weight
    assert not p.encoder
    require_lens(p, m)


def test_family_specifics() -> None:
    assert find_parts(tiny("gemma2")).softcap == 3.0
    assert find_parts(tiny("llama")).softcap is None
    opt = tiny("opt")
    assert find_parts(opt).pre_unembed is opt.model.decoder.project_out  # 16 -> 8 before the head


@pytest.mark.parametrize("family", sorted(ENCODERS))
def test_encoder_parts(family: str) -> None:
    m = tiny(family)
    p = find_parts(m)
    block, attn = ENCODERS[family]
    assert p.encoder and p.blocks[0][0] == block and p.attentions[0][0] == attn
    with pytest.raises(AdapterError, match="encoder"):
        require_lens(p, m)


def test_unknown_architecture_names_what_is_missing() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(AdapterError, match=r"blocks=\[") as err:
        find_parts(m)
    assert "transformer blocks" in str(err.value)


def test_custom_model_with_explicit_parts() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.attn(x)

    class Toy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 8)
            self.stack = nn.ModuleList([Block(), Block()])
            self.out_norm = nn.LayerNorm(8)
            self.head = nn.Linear(8, 10)

    toy = Toy()
    p = find_parts(toy, blocks=list(toy.stack), final_norm=toy.out_norm, unembed=toy.head)
    assert [n for n, _ in p.blocks] == ["stack.0", "stack.1"]
    assert p.attentions[1][1] is toy.stack[1].attn
    assert p.final_norm is toy.out_norm and p.unembed_weight is toy.head.weight and p.unembed_bias is toy.head.bias
    with pytest.raises(AdapterError, match="unembed="):
        find_parts(toy, blocks=list(toy.stack), unembed=nn.ReLU())


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "distilbert"])
def test_eager_switch_is_restored(family: str) -> None:
    m = tiny(family)
    assert attention_implementation(m) == "sdpa"
    fp = fingerprint(m)
    with eager_attention(m) as path:
        assert attention_implementation(m) == "eager"
        assert path == "eager (switched from sdpa)"
    assert attention_implementation(m) == "sdpa"
    assert m.config._attn_implementation_internal == "sdpa"
    assert same_fingerprint(fp, fingerprint(m)) == []
    with pytest.raises(RuntimeError):  # restored on errors too
        with eager_attention(m):
            raise RuntimeError("boom")
    assert attention_implementation(m) == "sdpa"


def test_eager_model_stays_eager_and_plain_modules_use_hooks() -> None:
    m = tiny("gemma2")  # Gemma 2 defaults to eager
    with eager_attention(m) as path:
        assert path == "eager"
    assert attention_implementation(m) == "eager"
    with eager_attention(nn.Linear(2, 2)) as path:
        assert path == "hooks"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_transformer_lens_hooked_transformer() -> None:
    tl = pytest.importorskip("transformer_lens")
    from nbdebug.recorders.attention import AttentionRecorder
    from nbdebug.recorders.logitlens import LogitLensRecorder

    torch.manual_seed(0)
    cfg = tl.HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=32, d_head=8, n_heads=2, d_vocab=50, d_mlp=32, act_fn="gelu", normalization_type="LN")
    m = tl.HookedTransformer(cfg).eval()
    p = find_parts(m)
    assert p.family == "hooked_transformer" and p.final_norm is m.ln_final
    assert [n for n, _ in p.attentions] == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    ids = torch.randint(0, 50, (1, 6))
    fp = fingerprint(m)
    with LogitLensRecorder(m, lens_topk=3) as lens, AttentionRecorder(m) as att:
        with torch.no_grad():
            m(ids)
    assert same_fingerprint(fp, fingerprint(m)) == []
    with torch.no_grad():
        _, cache = m.run_with_cache(ids)
        resid = cache.accumulated_resid(apply_ln=False)[:, 0]  # (rows, T, d), before ln_final
        ref = torch.softmax(m.ln_final(resid) @ m.W_U + m.b_U, -1)  # ln_final recomputed per row
    res = lens.result()
    v, i = ref.topk(3, -1)
    assert (res.top_ids == i.numpy()).all()
    assert torch.allclose(torch.as_tensor(res.top_probs), v, atol=1e-6)
    a = att.result()
    assert a.path == "hooks"
    for layer in range(2):
        assert torch.allclose(torch.as_tensor(a.attention[layer]).float(), cache["pattern", layer][0], atol=1e-3)


def test_model_call_generate_watch_nests_and_restores_in_any_order() -> None:
    from transformers.generation.utils import GenerationMixin

    from nbdebug.capture import ModelCall

    original = GenerationMixin.generate
    m = tiny_lm("gpt2")
    a, b = ModelCall(m, watch_generate=True), ModelCall(m, watch_generate=True)
    a.__enter__()
    b.__enter__()
    assert GenerationMixin.generate is not original  # one wrapper for both watchers
    out = m.generate(torch.randint(1, 60, (1, 3)), max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert torch.equal(a.sequences, out) and torch.equal(b.sequences, out) and a.calls == b.calls == 2
    a.__exit__(None, None, None)  # not in LIFO order
    assert GenerationMixin.generate is not original
    b.__exit__(None, None, None)
    assert GenerationMixin.generate is original and hook_count(m) == 0
    other = tiny_lm("gpt2")  # a watcher of one model ignores another model's generate
    with ModelCall(m, watch_generate=True) as c:
        other.generate(torch.randint(1, 60, (1, 3)), max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert c.sequences is None and c.calls == 0 and not c.generated


def test_compiled_model_parts_keep_their_names() -> None:
    m = tiny_lm("llama")
    parts = find_parts(torch.compile(m))  # compiling is lazy: nothing runs here
    assert parts.blocks[0][0] == "model.layers.0" and parts.blocks[0][1] is m.model.layers[0]
    assert parts.final_norm_name == "model.norm" and parts.final_norm is m.model.norm
