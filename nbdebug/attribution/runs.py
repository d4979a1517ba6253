"""Runs of one prompt with its token embeddings replaced: ``B`` runs at once, in chunks under a byte
budget, as nbdebug's own passes (buffers cloned, RNG forked, the user's hooks set aside; every hook
removed, also on errors; gradients asked for the substituted embeddings only, never for parameters).

>>> runs = EmbeddingRuns(model, ids, metric)           # doctest: +SKIP
>>> runs.clean                                          # (T, d) float32: the prompt's own embeddings
>>> runs.metric(embs)                                   # (B,) float32, embs (B, T, d)
>>> m, g = runs.gradients(embs)                         # (B,), (B, T, d) ∂m/∂embedding

The substitution is ``nbdebug.runs.interventions.edit_activations`` on the embedding module's
output (one place registers and removes hooks). Gradient passes run with ``torch.inference_mode(False)``
and ``torch.enable_grad()`` inside, so a caller under ``torch.no_grad()`` or ``torch.inference_mode()``
gets the same numbers; only gradients of the substituted embeddings are taken
(``torch.autograd.grad``): no ``.grad`` is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..adapters.embedding import input_embedding, lm_call
from ..adapters.outputs import logits_of
from ..capture.budget import DEFAULT_MAX_BYTES
from ..capture.state import execution_device
from ..runs.interventions import edit_activations
from ..runs.own import own_pass

__all__ = ["EmbeddingRuns", "run_bytes"]

MAX_CHUNK = 256


def _layers(model: nn.Module) -> int:
    cfg = getattr(model, "config", None) or getattr(model, "cfg", None)
    for key in ("num_hidden_layers", "n_layer", "n_layers", "num_layers"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 12


def run_bytes(model: nn.Module, T: int, d: int, itemsize: int, grad: bool) -> int:
    """An estimate of one run's activation memory: ``T · d · (2 + 20 L)`` values with a graph kept
    (measured: SmolLM2-135M, 9 tokens, float32, 64 runs in one batch took 757 MB above the model,
    11.8 MB per run; this gives 12.5 MB), a tenth of that without."""
    per = T * d * (2 + 20 * _layers(model)) * itemsize
    return max(1, per if grad else per // 10)


class EmbeddingRuns:
    """One prompt ``ids`` ``(1, T)`` and the metric; runs of it with replaced embeddings (see module doc)."""

    def __init__(self, model: nn.Module, ids: torch.Tensor, metric: Callable[[torch.Tensor], torch.Tensor],
                 *, last_only: bool = True, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.model = model
        self.embed = input_embedding(model)
        self.device = execution_device(self.embed) or torch.device("cpu")
        with torch.inference_mode(False):
            self.ids = ids.to(self.device).clone()  # a normal tensor even when the caller's is an inference tensor
        self.T = int(self.ids.shape[1])
        self.fn = metric
        self.last_only = last_only
        self.max_bytes = max_bytes
        self.passes = 0  # forwards run, counted per batched call
        with torch.inference_mode(False), own_pass(model):
            e = self.embed(self.ids)
        e = e[0] if isinstance(e, (tuple, list)) else e
        self.dtype = e.dtype
        self.clean = e[0].detach().float()  # (T, d)
        self.d = int(self.clean.shape[-1])

    def chunk(self, grad: bool, total: int) -> int:
        """Runs per batched call under ``max_bytes``, the ``total`` runs split into equal chunks (64 runs
        under a cap of 21 go as 16 × 4, not 21 × 3 + 1)."""
        per = run_bytes(self.model, self.T, self.d, torch.finfo(self.dtype).bits // 8, grad)
        cap = int(max(1, min(MAX_CHUNK, self.max_bytes // per)))
        parts = max(1, -(-total // cap))
        return max(1, -(-total // parts))

    @contextmanager
    def _substituted(self, holder: list[torch.Tensor]) -> Iterator[None]:
        def swap(x: torch.Tensor) -> torch.Tensor:
            return holder[0]

        with edit_activations([(self.embed, "output", swap)]):
            yield

    def _forward(self, embs: torch.Tensor) -> torch.Tensor:
        holder = [embs]
        ids = self.ids.expand(embs.shape[0], self.T)
        args, kwargs = lm_call(self.model, ids)
        if not self.last_only:
            kwargs.pop("logits_to_keep", None)
        with self._substituted(holder):
            out = self.model(*args, **kwargs)
        self.passes += 1
        logits = logits_of(out)
        if logits is None:
            raise RuntimeError(f"no logits in the output of {type(self.model).__name__}")
        return self.fn(logits)

    def metric(self, embs: torch.Tensor) -> torch.Tensor:
        """``(B,)`` float32 on the CPU: the metric of each run, ``embs`` ``(B, T, d)``."""
        outs: list[torch.Tensor] = []
        n = self.chunk(grad=False, total=int(embs.shape[0]))
        with torch.inference_mode(False), own_pass(self.model):
            for i in range(0, embs.shape[0], n):
                part = embs[i:i + n].to(self.device, self.dtype)
                outs.append(self._forward(part).float().cpu())
        return torch.cat(outs) if outs else torch.zeros(0)

    def gradients(self, embs: torch.Tensor, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(m, g)``: each run's metric ``(B,)`` and ``∂m/∂embedding`` ``(B, T, d)`` float32 on the
        CPU. With ``weights`` ``(B,)`` the gradients are summed with those weights instead: ``g`` is
        ``(T, d)`` (integrated gradients: only the sum is kept, chunk by chunk)."""
        ms: list[torch.Tensor] = []
        gs: list[torch.Tensor] = []
        total = torch.zeros(self.T, self.d, dtype=torch.float32)
        n = self.chunk(grad=True, total=int(embs.shape[0]))
        # parameters keep their requires_grad: only the embeddings' gradient is asked for, so nothing is
        # computed for them and no .grad is written. (Freezing them, own_pass's default, made SmolLM2's
        # IG 64 steps ~30 % slower on CPU: torch's matmul then takes a slower batched path.)
        with own_pass(self.model, grad=True, params="as_is"):
            for i in range(0, embs.shape[0], n):
                leaf = embs[i:i + n].to(self.device, self.dtype, copy=True).requires_grad_(True)  # never an inference tensor
                m = self._forward(leaf)
                (g,) = torch.autograd.grad(m.sum(), leaf)
                ms.append(m.detach().float().cpu())
                g = g.detach().float().cpu()
                if weights is None:
                    gs.append(g)
                else:
                    total += (g * weights[i:i + n, None, None]).sum(0)
        m_all = torch.cat(ms) if ms else torch.zeros(0)
        return m_all, (torch.cat(gs) if weights is None else total)
