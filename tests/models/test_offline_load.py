"""``load_smollm2`` from its safetensors cache builds the model without a random init first (transformers'
``no_init_weights``: 2.3 of 3.2 CPU-s of a load, measured one thread on the shared machine). What it
gives is checked against the file itself: every tensor equal to the stored one, ``lm_head`` tied to the
embedding, the rotary buffers equal to RoPE's formula, eval mode; and the user's RNG is not drawn from.
Planted mistakes caught: the tie left out (``load_model`` is strict: the load raises), the init not
skipped (the RNG moves), a weight left at its init (not equal to the file's)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

pytestmark = [pytest.mark.models, pytest.mark.slow, pytest.mark.xdist_group("smollm2")]  # one SmolLM2 per worker (tests/shared_calls.py)

pytest.importorskip("transformers")


def test_load_reads_every_weight_from_the_file_and_leaves_the_rng(smollm2) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file

    from nbdebug.adapters.offline import cache_dir, load_smollm2

    model, _ = smollm2
    stored = load_file(str(cache_dir() / "smollm2-135m-instruct" / "model.safetensors"))
    state = model.state_dict()
    # one name of the tied pair is stored (safetensors keeps shared tensors once)
    assert set(stored) <= set(state) and len(set(state) - set(stored)) == 1
    assert set(state) - set(stored) <= {"lm_head.weight", "model.embed_tokens.weight"}
    for name, tensor in stored.items():
        assert torch.equal(state[name], tensor), name
    assert model.lm_head.weight is model.model.embed_tokens.weight
    cfg = model.config
    d = cfg.hidden_size // cfg.num_attention_heads
    theta = getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]
    expected = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    assert torch.equal(model.model.rotary_emb.inv_freq, expected)
    assert not model.training

    rng = torch.random.get_rng_state()
    again, _ = load_smollm2()
    assert torch.equal(torch.random.get_rng_state(), rng)  # no random init drawn from the user's RNG
    assert again is not model and again.lm_head.weight is again.model.embed_tokens.weight
