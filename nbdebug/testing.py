"""Random-init reference models shared by tests, benchmarks and tutorials (no torchvision needed).

>>> model = ResNetShaped()              # torchvision's resnet18 layout and module names
>>> small = ResNetShaped(width=8, classes=10)
>>> model, reference = offloaded_llama(tmp_path)   # doctest: +SKIP  (accelerate: CPU + disk device_map)
"""

from __future__ import annotations

import logging
import os
import pathlib
from typing import Any

import torch
from torch import nn

__all__ = ["BasicBlock", "ResNetShaped", "TokenDataset", "lit_autoencoder", "offload_map", "offloaded_llama", "tiny_gpt2"]


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: two 3×3 convs with BatchNorm, in-place residual add and ReLU."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity  # in place, as in torchvision
        return self.relu(out)


class ResNetShaped(nn.Module):
    """ResNet-18's layout (stem, 4 stages of 2 basic blocks, avgpool, fc); width configurable."""

    def __init__(self, width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(w, w), BasicBlock(w, w))
        self.layer2 = nn.Sequential(BasicBlock(w, 2 * w, 2), BasicBlock(2 * w, 2 * w))
        self.layer3 = nn.Sequential(BasicBlock(2 * w, 4 * w, 2), BasicBlock(4 * w, 4 * w))
        self.layer4 = nn.Sequential(BasicBlock(4 * w, 8 * w, 2), BasicBlock(8 * w, 8 * w))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8 * w, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class TokenDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``n`` seeded random sequences of 8 token ids below 40, each its own labels (causal LM training)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 40, (n, 8), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_gpt2() -> nn.Module:
    """A seeded random-init GPT-2 (vocabulary 40, 2 layers of width 16, no dropout: runs repeat bit
    for bit), for :class:`TokenDataset`. Needs ``transformers``."""
    import transformers as T

    torch.manual_seed(0)
    cfg = T.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
                       embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return T.GPT2LMHeadModel(cfg)


def lit_autoencoder() -> Any:
    """A seeded LitAutoEncoder-shaped ``LightningModule`` on 4 features: its ``training_step`` calls
    ``self.decoder(self.encoder(x))`` (its own ``forward`` never runs) and appends the encoder's
    output mean to ``enc_means`` and the detached loss to ``losses``; SGD at lr 0.1. Needs
    ``lightning``."""
    import lightning.pytorch as L
    import torch.nn.functional as F

    class LitAE(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
            self.decoder = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 4))
            self.losses: list[torch.Tensor] = []
            self.enc_means: list[float] = []

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            x, _ = batch
            z = self.encoder(x)
            self.enc_means.append(float(z.detach().mean()))
            loss = F.mse_loss(self.decoder(z), x)
            self.losses.append(loss.detach())
            return loss

        def validation_step(self, batch: Any, i: int) -> None:
            x, _ = batch
            self.log("val_loss", F.mse_loss(self.decoder(self.encoder(x)), x))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    return LitAE()


def _llama_config(tied: bool, layers: int, hidden: int, vocab: int, heads: int = 4) -> Any:
    import transformers as T

    return T.LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=heads,
                         num_key_value_heads=min(2, heads), vocab_size=vocab, tie_word_embeddings=tied)


def offload_map(layers: int, tied: bool = False) -> dict[str, str]:
    """The CPU + disk ``device_map`` of :func:`offloaded_llama`: embeddings and the first half of the
    blocks on the CPU, the other blocks, the final norm and ``lm_head`` on disk. With tied
    embeddings the embedding goes to disk too (it IS the unembedding; accelerate cannot run a tied
    weight split between a CPU module and a disk one)."""
    dm = {"model.embed_tokens": "disk" if tied else "cpu", "model.rotary_emb": "cpu"}
    dm.update({f"model.layers.{i}": "cpu" if i < layers // 2 else "disk" for i in range(layers)})
    dm.update({"model.norm": "disk", "lm_head": "disk"})
    return dm


def offloaded_llama(tmp_path: str | os.PathLike[str], *, tied: bool = False, split: str = "map", layers: int = 4,
                    hidden: int = 64, vocab: int = 512, heads: int = 4,
                    dtype: torch.dtype = torch.float32) -> tuple[nn.Module, nn.Module]:
    """A random-init Llama-shaped model saved to ``tmp_path`` and reloaded with accelerate spreading it
    over the CPU and disk (``offload_folder`` inside ``tmp_path``), and the same checkpoint loaded
    without offload (the reference). ``heads`` attention heads (2 key/value heads, or 1 when
    ``heads`` is 1). Both in eval mode, in ``dtype`` (the weights are drawn in float32,
    seeded, and saved in ``dtype``).

    ``split="map"``: the explicit map of :func:`offload_map`; ``split="max_memory"``:
    ``device_map="auto"`` with a CPU ``max_memory`` of ~70 % of the weights (the rest goes to disk).

    >>> model, reference = offloaded_llama(tmp_path)     # doctest: +SKIP
    >>> model.lm_head.weight.device, model.hf_device_map["lm_head"]
    (device(type='meta'), 'disk')
    """
    import transformers as T
    from transformers.utils import logging as hf_logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        torch.manual_seed(0)
        name = f"llama-{layers}x{hidden}h{heads}-v{vocab}{'-tied' if tied else ''}-{str(dtype).replace('torch.', '')}"
        path = pathlib.Path(tmp_path) / name
        model = T.LlamaForCausalLM(_llama_config(tied, layers, hidden, vocab, heads)).to(dtype)
        model.save_pretrained(path)
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        del model
        reference = T.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        if split == "map":
            kw: dict[str, Any] = {"device_map": offload_map(layers, tied)}
        elif split == "max_memory":
            kw = {"device_map": "auto", "max_memory": {"cpu": int(0.7 * size)}}
        else:
            raise ValueError(f"split={split!r}: 'map' or 'max_memory'")
        offload = path / f"offload-{split}"
        model = T.AutoModelForCausalLM.from_pretrained(path, offload_folder=offload, dtype=dtype, **kw).eval()
        return model, reference
    finally:
        if bars:
            hf_logging.enable_progress_bar()
