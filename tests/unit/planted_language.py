"""Tiny random language models with planted structure, for the findings of the language views.

Shared by the unit, widget and browser tests (the browser tests paste this file's source into their
notebook). Nothing is downloaded: ``tiny_lm`` builds GPT-2 from its config class, seeded.

- :func:`previous_token_gpt2`: one head (``layer``, ``head``) attends to the previous token, every
  other head is near-uniform: positions are one-hot (``wpe``), token embeddings tiny, and the planted
  head's query of position ``i`` is key ``i − 1``.
- :func:`answer_at_block_gpt2`: block ``block`` adds a large vector along the unembedding row of
  ``answer`` (tied to ``wte``): from that block on, the lens's top-1 at every position is ``answer``.
- :class:`WordTok`: a tokenizer stand-in, id ``i`` ↔ ``" w{i}"`` (``convert_ids_to_tokens``: ``Ġw{i}``).
"""

from __future__ import annotations

import torch
from torch import nn

from nbdebug.adapters.offline import tiny_lm


class WordTok:
    """Token ``i`` is the word ``" w{i}"``; ``convert_ids_to_tokens`` gives GPT-2's ``Ġw{i}``."""

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [f"Ġw{i}" for i in ids]

    def decode(self, ids: list[int]) -> str:
        return "".join(f" w{i}" for i in ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [int(w[1:]) for w in text.split()]


def previous_token_gpt2(layer: int = 2, head: int = 1, T: int = 12, layers: int = 4, heads: int = 4, d: int = 64) -> nn.Module:
    """GPT-2 (``layers × heads``, ``d``) whose head ``(layer, head)`` attends to the previous token for
    sequences up to ``T ≤ d / heads + 1`` tokens; the other heads are near-uniform."""
    m = tiny_lm("gpt2", vocab=64, layers=layers, heads=heads, d=d)
    hd = d // heads
    with torch.no_grad():
        m.transformer.wte.weight.mul_(0.01)
        m.transformer.wpe.weight.zero_()
        for i in range(T):
            m.transformer.wpe.weight[i, i] = 10.0
        w = m.transformer.h[layer].attn.c_attn.weight  # Conv1D: x @ w, columns q | k | v
        w[:, head * hd:(head + 1) * hd] = 0
        w[:, d + head * hd:d + (head + 1) * hd] = 0
        for i in range(1, min(T, hd + 1)):
            w[i, head * hd + i - 1] = 8.0  # the query of position i ...
        for j in range(min(T, hd)):
            w[j, d + head * hd + j] = 8.0  # ... meets the key of position i - 1
    return m


def answer_at_block_gpt2(block: int = 3, answer: int = 42, layers: int = 6, d: int = 64) -> nn.Module:
    """GPT-2 (``layers`` blocks) whose residual stream points at token ``answer`` from block ``block`` on."""
    m = tiny_lm("gpt2", vocab=64, layers=layers, heads=2, d=d)
    with torch.no_grad():
        u = m.transformer.wte.weight[answer]
        m.transformer.h[block].mlp.c_proj.bias.add_(u / u.norm() * 50)
    return m
