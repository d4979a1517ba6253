"""Healthy language-model recipes: a tiny random-init GPT-2 trained with HF ``labels=``, one with AdamW,
warmup and clipping, and (full runs only) 4 steps of transformers' ``Trainer`` fine-tuning SmolLM2-135M."""

from __future__ import annotations

import math

import torch

from .base import Setup, recipe


def _tokens(n: int, seed: int, vocab: int = 40, length: int = 8) -> torch.Tensor:
    """Sequences with structure to learn: each token is the previous one + 1 (mod vocab) from a random start."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    return (start + torch.arange(length)) % vocab


@recipe("tiny_lm_hf_labels")
def tiny_lm_hf_labels() -> Setup:
    """a tiny random-init GPT-2 (nbdebug.testing.tiny_gpt2), loss from model(input_ids, labels=), Adam lr=1e-3."""
    from nbdebug.testing import tiny_gpt2

    m = tiny_gpt2()
    ids = _tokens(512, 200)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(200)

    def loop(n: int) -> None:
        m.train()
        for _ in range(n):
            b = ids[torch.randint(0, len(ids), (32,), generator=g)]
            opt.zero_grad()
            m(input_ids=b, labels=b).loss.backward()
            opt.step()

    return Setup(m, loop, None, steps=40)


@recipe("tiny_gpt2_adamw_warmup_clip")
def tiny_gpt2_adamw_warmup_clip() -> Setup:
    """a tiny GPT-2 (offline.tiny_lm), AdamW lr=3e-3 wd 0.1, 8 warmup steps then cosine, clip_grad_norm_(1.0)."""
    from nbdebug.adapters.offline import tiny_lm

    m = tiny_lm("gpt2", vocab=40, layers=2, heads=2, d=32)
    ids = _tokens(512, 201)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / 8 if s < 8 else 0.5 * (1 + math.cos(math.pi * min(s - 8, 40) / 40)))
    g = torch.Generator().manual_seed(201)

    def loop(n: int) -> None:
        m.train()
        for _ in range(n):
            b = ids[torch.randint(0, len(ids), (32,), generator=g)]
            opt.zero_grad()
            m(input_ids=b, labels=b).loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            sched.step()

    return Setup(m, loop, None, steps=40)


@recipe("smollm2_trainer_finetune", full_only=True)
def smollm2_trainer_finetune() -> Setup:
    """4 steps of transformers' Trainer fine-tuning SmolLM2-135M (lr 5e-5, batch 2 × 32 tokens, no downloads)."""
    import tempfile

    import transformers as T

    from nbdebug.adapters.offline import load_smollm2

    model, tok = load_smollm2()
    text = ("The cat sat on the mat. The dog slept by the door. Birds sing in the morning. "
            "Rain fell on the quiet town. ") * 20
    ids = tok(text, return_tensors="pt")["input_ids"][0]
    chunks = [ids[i:i + 32] for i in range(0, len(ids) - 32, 32)][:64]

    class Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return len(chunks)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": chunks[i], "labels": chunks[i]}

    out = tempfile.mkdtemp(prefix="zoo-trainer-")

    def loop(n: int) -> None:
        model.train()
        args = T.TrainingArguments(out, max_steps=n, per_device_train_batch_size=2, learning_rate=5e-5,
                                   logging_steps=n, save_strategy="no", report_to=[], use_cpu=True,
                                   disable_tqdm=True, seed=0)
        T.Trainer(model=model, args=args, train_dataset=Data()).train()

    return Setup(model, loop, None, steps=4)
