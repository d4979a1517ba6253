"""Training frameworks in a ``%%nndebug`` cell.

``transformers.Trainer.train()`` on a tiny random GPT-2 (no dropout, so runs repeat bit for bit), 3
optimizer steps × 2 micro-batches, one evaluation batch after step 3. The reference is the same
Trainer run on an identical model with plain hooks measuring, per grad-enabled forward (a step of the
thermometer's history): the model's own ``loss`` and the output mean of :data:`ROW`.

Lightning's ``trainer.fit`` on a LitAutoEncoder-shaped module whose ``training_step`` calls
``self.decoder(self.encoder(x))`` (its own ``forward`` never runs), with a sanity-check validation
batch before training and one after every :data:`LIT_VAL_EVERY` steps (``inference_mode``). The
module records its encoder's output mean per ``training_step``; the reference is the same fit of an
identical module without nbdebug.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from nbdebug.testing import TokenDataset as Tokens
from nbdebug.testing import lit_autoencoder
from nbdebug.testing import tiny_gpt2 as gpt2

STEPS = 3  # optimizer steps
ACCUM = 2  # micro-batches per optimizer step
ROW = "transformer.h.0.mlp.c_fc"


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


LIT_STEPS = 6
LIT_VAL_EVERY = 3

#: A fresh LitAutoEncoder-shaped ``LightningModule`` (seeded): records its encoder's output mean per
#: ``training_step`` in ``enc_means``.
lit_module = lit_autoencoder


def lit_loader() -> Any:
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=4)


def lit_fit(module: Any) -> Any:
    """The cell body: ``trainer.fit(module, ...)`` with a sanity check and validation, on the CPU."""
    import lightning.pytorch as L

    trainer = L.Trainer(max_steps=LIT_STEPS, val_check_interval=LIT_VAL_EVERY, limit_val_batches=1, num_sanity_val_steps=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", devices=1)
    trainer.fit(module, lit_loader(), lit_loader())
    return trainer
