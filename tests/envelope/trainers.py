"""Training frameworks in a ``%%nndebug`` cell: ``transformers.Trainer.train()`` on a tiny random GPT-2
(no dropout, so runs repeat bit for bit), 3 optimizer steps × 2 micro-batches, one evaluation batch
after step 3.

The reference is the same Trainer run on an identical model with plain hooks measuring, per
grad-enabled forward (a step of the thermometer's history): the model's own ``loss`` and the output
mean of :data:`ROW`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

STEPS = 3  # optimizer steps
ACCUM = 2  # micro-batches per optimizer step
ROW = "transformer.h.0.mlp.c_fc"


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 40, (n, 8), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def gpt2() -> nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def trainer(model: nn.Module, out: Path) -> Any:
    import transformers

    args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=4, per_device_eval_batch_size=8, gradient_accumulation_steps=ACCUM,
        max_steps=STEPS, eval_strategy="steps", eval_steps=STEPS, logging_steps=1, learning_rate=1e-3, report_to=[],
        use_cpu=True, save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0, log_level="error",
    )
    return transformers.Trainer(model=model, args=args, train_dataset=Tokens(64, 1), eval_dataset=Tokens(8, 2))


def reference(out: Path) -> tuple[nn.Module, dict[str, list[float]]]:
    """The run without nbdebug: the trained model and, per grad-enabled forward, ``loss`` and ``ROW``'s mean."""
    model = gpt2()
    got: dict[str, list[float]] = {"loss": [], "mean": []}

    def on_model(_m: nn.Module, _a: Any, output: Any) -> None:
        if torch.is_grad_enabled():
            got["loss"].append(float(output.loss.detach()))

    def on_row(_m: nn.Module, _a: Any, output: torch.Tensor) -> None:
        if torch.is_grad_enabled():
            got["mean"].append(float(output.detach().mean()))

    handles = [model.register_forward_hook(on_model), model.get_submodule(ROW).register_forward_hook(on_row)]
    try:
        trainer(model, out).train()
    finally:
        for h in handles:
            h.remove()
    return model, got
