"""Fit a lens on the user's model from local text, offline: ``fit_lens(model, tokenizer, texts, kind=...)``.

One forward pass over the text feeds every row's translator (:mod:`.collect`). Then

* ``kind="shortcut"`` (Din et al. 2023, "Jump to Conclusions"): per row, the closed-form least-squares
  affine map from the residual ``h_r`` to the final residual ``h_L / rms(h_L)`` (the final norm is scale
  invariant, so this target reads exactly like ``h_L`` through it, and no outlier-scaled position
  dominates the fit). Streamed: only ``(d+1)²`` sums per row are kept, whatever the token count.
* ``kind="tuned"`` (Belrose et al. 2023): per row, an affine translator trained with Adam on
  KL(final ‖ lens) through the model's own final norm and unembedding. The residuals are cached (float16,
  under ``max_bytes``) and minibatches of positions drawn from the cache. ``init="identity"`` starts from
  the identity as in the paper; ``init="shortcut"`` (default) starts from the least-squares solution
  computed in the same pass, and a row whose training ends worse than that start on held-apart positions
  (full vocabulary) keeps it (the paper's recipe takes ~65M tokens of SGD from the identity; a CPU
  budget of minutes does not, and the warm start is what makes the KL training pay off in it).
  The KL over the whole vocabulary is where the time goes: with ``vocab=K`` (default 4096) the training
  KL is the one of the distributions restricted to the ``K`` tokens carrying most of the final
  distribution's mass on the fitting text (12× fewer multiply-adds on a 49k vocabulary);
  ``vocab=None`` trains on the full vocabulary. The held-out quality is always measured on the full
  vocabulary.

Hygiene: the model is only run forward (nbdebug's own pass, eval mode for it, every mode put back),
its parameters never get ``.grad`` (gradients are taken with ``torch.autograd.grad`` on the
translators alone), the global RNG is not drawn from, and Ctrl-C at any point leaves it as it was.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from ..adapters.transformers import ModelParts, find_parts, require_lens
from ..capture import parse_bytes
from ..capture.state import loaded_weights
from ..runs.progress import Progress, ProgressSpec
from .collect import residual_batches, sample_rows, split_holdout, token_sequences
from .kl import head_kl, kl_rows, lens_logits
from .lens import FittedLens
from .quality import heldout_quality

__all__ = ["fit_lens"]

DEFAULT_TOKENS = {"shortcut": 8192, "tuned": 16384}


def _rms_normalise(h: torch.Tensor) -> torch.Tensor:
    return h / h.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()


class _Gram:
    """Running ``X'X`` and ``X'Y`` of every row (features ``[h, 1]``, target the normalised final row)."""

    def __init__(self, rows: int, d: int) -> None:
        self.G = torch.zeros(rows, d + 1, d + 1, dtype=torch.float64)
        self.C = torch.zeros(rows, d + 1, d, dtype=torch.float64)
        self.n = 0

    def add(self, batch: torch.Tensor) -> None:
        R, n, d = batch.shape
        y = _rms_normalise(batch[-1])
        X = torch.cat([batch[:-1], torch.ones(R - 1, n, 1)], -1)  # (R - 1, n, d + 1)
        self.G += torch.bmm(X.transpose(1, 2), X).double()
        self.C += torch.bmm(X.transpose(1, 2), y.expand(R - 1, n, d)).double()
        self.n += n

    def solve(self, ridge: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.C.shape[-1]
        diag = self.G.diagonal(dim1=1, dim2=2)
        lam = ridge * diag[:, :d].mean(-1).clamp_min(1e-12)
        G = self.G + torch.diag_embed(lam[:, None].expand(-1, d + 1))
        # one row at a time: the batched float64 solve once failed inside MKL here ("DLASWP parameter 6")
        W = torch.stack([torch.linalg.solve(G[r], self.C[r]) for r in range(G.shape[0])])  # (R - 1, d + 1, d)
        return W[:, :d].transpose(1, 2).float().contiguous(), W[:, d].float().contiguous()


    def whitener(self, ridge: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per row: the mean ``mu``, the ZCA whitening ``P = (Σ + λ)^-1/2`` and its inverse, from the same sums
        (``λ``: ``ridge`` × the mean eigenvalue)."""
        d = self.C.shape[-1]
        mu = self.G[:, :d, d] / self.n
        cov = self.G[:, :d, :d] / self.n - mu[:, :, None] * mu[:, None, :]
        ev, Q = torch.linalg.eigh(cov)
        ev = ev.clamp_min(0)
        ev = ev + ridge * ev.mean(-1, keepdim=True)
        P = (Q * ev.rsqrt()[:, None, :]) @ Q.transpose(1, 2)
        Pinv = (Q * ev.sqrt()[:, None, :]) @ Q.transpose(1, 2)
        return mu.float(), P.float(), Pinv.float()


class _Reader:
    """Every position read goes into the Gram sums; for a tuned fit (``batches``: how many batches will be
    read) a share of the positions, spread over the whole text, into a float16 cache under ``cap`` bytes
    (drawn with its own generator, ``seed + 1``: the text's end is as present in training as its start)."""

    def __init__(self, batches: int, cap: int, seed: int) -> None:
        self.batches, self.cap = batches, cap
        self.gram: _Gram | None = None
        self.buf: torch.Tensor | None = None  # preallocated: the cache never exists twice (max_bytes is the peak)
        self.read = self.cached = 0
        self.frac = 1.0
        self.gen = torch.Generator().manual_seed(seed + 1)

    def add(self, rows: torch.Tensor) -> None:
        R, n, d = rows.shape
        if self.gram is None:
            self.gram = _Gram(R - 1, d)
            if self.batches:
                room = self.cap // (R * d * 2)
                self.frac = min(1.0, room / max(1, n * self.batches))
                self.buf = torch.empty(R, min(room, n * self.batches), d, dtype=torch.float16)
        self.gram.add(rows)
        self.read += n
        if self.buf is None:
            return
        k = n if self.frac >= 1 else round(self.frac * self.read) - self.cached
        k = min(k, n, self.buf.shape[1] - self.cached)
        if k > 0:
            self.buf[:, self.cached:self.cached + k] = rows if k == n else rows[:, sample_rows(n, k, self.gen)]
            self.cached += k

    def stack(self) -> torch.Tensor:
        assert self.buf is not None
        return self.buf[:, :self.cached]


def _head(parts: ModelParts) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float32 CPU copies of the unembedding (and bias), read inside ``loaded_weights`` (offload)."""
    mod = parts.unembed_module
    with loaded_weights(mod) if mod is not None else nullcontext():
        w = mod.weight if mod is not None else parts.unembed_weight
        b = getattr(mod, "bias", None) if mod is not None else parts.unembed_bias
        assert w is not None
        return w.detach().float().cpu().clone(), None if b is None else b.detach().float().cpu().clone()


def _top_vocab(parts: ModelParts, final: torch.Tensor, U: torch.Tensor, b: torch.Tensor | None, k: int) -> torch.Tensor:
    """The ``k`` token ids with the most final-distribution mass over the positions ``final (n, d)``."""
    mass = torch.zeros(U.shape[0])
    with torch.no_grad():
        for i in range(0, final.shape[0], 256):
            mass += torch.softmax(lens_logits(parts, final[i:i + 256], U, b), -1).sum(0)
    return mass.topk(k).indices.sort().values


def _train(parts: ModelParts, cache: torch.Tensor, A: torch.Tensor, c: torch.Tensor, *, U: torch.Tensor,
           bias: torch.Tensor | None, vocab: int | None, steps: int, deadline: float, lr: float, batch: int,
           optimizer: str = "adam", keep_better: bool = False, white: tuple[torch.Tensor, ...] | None = None,
           gen: torch.Generator, bar: Progress) -> dict[str, Any]:
    """Adam (or SGD) on KL(final ‖ lens) for every translator; ``A``/``c`` updated in place.
    ``keep_better``: the last positions of the cache (up to 256, an eighth) are held apart from training,
    and a row whose trained translator has a higher full-vocabulary KL there than its start keeps its
    start (a tuned row never ends worse than the least-squares row it started from)."""
    R1, N = cache.shape[0] - 1, cache.shape[1]
    val = min(256, N // 8) if keep_better else 0
    U_full, bias_full = U, bias
    N -= val
    if vocab is not None and vocab < U.shape[0]:
        keep = _top_vocab(parts, cache[-1, sample_rows(N, 1024, gen)].float(), U, bias, vocab)
        U, bias = U[keep].contiguous(), None if bias is None else bias[keep].contiguous()
    V = U.shape[0]
    if white is not None:  # trained as y = ((h − mu) P) M + c': the same map, its inputs decorrelated (Adam is not rotation invariant)
        mu, P, Pinv = white
        M0, c0 = torch.bmm(Pinv, A.transpose(1, 2)), torch.bmm(mu[:, None], A.transpose(1, 2))[:, 0] + c
    else:
        M0, c0 = A.transpose(1, 2), c
    params = [torch.nn.Parameter(M0[r].clone()) for r in range(R1)] + [torch.nn.Parameter(c0[r].clone()) for r in range(R1)]
    opt = (torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True) if optimizer == "sgd"
           else torch.optim.Adam(params, lr=lr))
    t0, done, losses = time.perf_counter(), 0, []
    span = max(deadline - t0, 1e-9)
    with torch.inference_mode(False), torch.enable_grad():
        for step in range(steps):
            now = time.perf_counter()
            if now >= deadline:
                break
            frac = max(step / max(steps, 1), (now - t0) / span)
            for g in opt.param_groups:
                g["lr"] = lr * max(0.0, 1.0 - frac)
            idx = sample_rows(N, batch, gen)
            with torch.no_grad():
                logp = torch.log_softmax(lens_logits(parts, cache[-1, idx].float(), U, bias), -1)
            x = cache[:-1, idx].float()
            if white is not None:
                x = torch.bmm(x - mu[:, None], P)
            y = torch.baddbmm(torch.stack(params[R1:])[:, None, :], x, torch.stack(params[:R1]))
            loss = head_kl(parts, y, logp, U, bias)
            grads = torch.autograd.grad(loss, params)
            for prm, gr in zip(params, grads, strict=True):
                prm.grad = gr
            total = float(loss.detach())
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(total / R1)
            done += 1
            bar.update(1)
    kept: list[int] = []
    with torch.no_grad():
        MT = torch.stack(params[:R1]) if white is None else torch.bmm(P, torch.stack(params[:R1]))  # A' = P M
        A1, c1 = MT.transpose(1, 2), torch.stack(params[R1:]) - (0 if white is None else torch.bmm(mu[:, None], MT)[:, 0])
        if not done:  # no step: the start itself, exactly (not its round trip through the whitening)
            A1, c1 = A.clone(), c.clone()
        if val:
            held = cache[:, N:].float()
            before, after = kl_rows(parts, held, [(A, c), (A1, c1)], U_full, bias_full)
            kept = [r for r in range(R1) if after[r] > before[r]]
        for r in range(R1):
            if r not in kept:
                A[r].copy_(A1[r])
                c[r].copy_(c1[r])
    return {"steps": done, "rows_kept_start": kept, "val_positions": val, "train_vocab": V, "train_kl_first": losses[0] if losses else math.nan,
            "train_kl_last": float(sum(losses[-10:]) / max(1, len(losses[-10:]))) if losses else math.nan}


def fit_lens(model: nn.Module, tokenizer: Any, texts: Any, kind: str = "tuned", *, max_tokens: int | None = None,
             max_seconds: float | None = None, max_bytes: int | str | None = None, seq_len: int = 256,
             holdout: int = 512, vocab: int | None = 4096, init: str = "shortcut", steps: int = 400,
             batch: int = 128, lr: float | None = None, optimizer: str = "adam", whiten: bool = False, seed: int = 0,
             progress: ProgressSpec = None) -> FittedLens:
    """Fit a ``"tuned"`` or ``"shortcut"`` lens on ``model`` from ``texts`` (a string, strings, or token
    ids), offline. ``max_tokens``: tokens read for fitting (default 8k shortcut, 16k tuned; the last
    ``holdout`` tokens of the text are kept apart to measure the lens, ``lens.quality``);
    ``max_seconds``: time budget for the fit (reading stops at half of it for a tuned lens, training
    at the end; the held-out check after it is extra); ``max_bytes``: the residual cache of a tuned fit
    (default 256 MiB as everywhere; positions beyond it are used by the least-squares start only);
    ``vocab``/``init``/``steps``/``batch``/``lr``/``optimizer`` (``"adam"`` or ``"sgd"``: Nesterov momentum
    0.9, as the paper; no default learning rate for it): the tuned training (module docstring); ``whiten``:
    train the translators on ZCA-whitened residuals from the same pass's sums (the same affine map; off by
    default: it did not train the early blocks faster, docs/lenses.md).
    ``progress``: ``None`` a bar once slow, ``True`` always, ``False`` none, or ``fn(done, total)``."""
    if kind not in ("tuned", "shortcut"):
        raise ValueError(f"fit_lens: kind={kind!r}; fit 'tuned' or 'shortcut' (the logit lens needs no fit)")
    if optimizer not in ("adam", "sgd") or (optimizer == "sgd" and lr is None):
        raise ValueError(f"fit_lens: optimizer={optimizer!r}; 'adam' (default) or 'sgd' with an explicit lr=")
    if init not in ("shortcut", "identity"):
        raise ValueError(f"fit_lens: init={init!r}; 'shortcut' (least-squares start) or 'identity'")
    with torch.inference_mode(False):  # a caller under inference_mode: our tensors stay ordinary ones
        return _fit(model, tokenizer, texts, kind, max_tokens=max_tokens, max_seconds=max_seconds, max_bytes=max_bytes,
                    seq_len=seq_len, holdout=holdout, vocab=vocab, init=init, steps=steps, batch=batch, lr=lr, seed=seed,
                    progress=progress, optimizer=optimizer, whiten=whiten)


def _fit(model: nn.Module, tokenizer: Any, texts: Any, kind: str, *, max_tokens: int | None, max_seconds: float | None,
         max_bytes: int | str | None, seq_len: int, holdout: int, vocab: int | None, init: str, steps: int, batch: int,
         lr: float | None, seed: int, progress: ProgressSpec, optimizer: str = "adam", whiten: bool = False) -> FittedLens:
    parts = find_parts(model)
    require_lens(parts, model)
    t0 = time.perf_counter()
    budget = float(max_seconds) if max_seconds else math.inf
    tokens = int(max_tokens or DEFAULT_TOKENS[kind])
    seqs = token_sequences(texts, tokenizer, seq_len=seq_len, max_tokens=tokens + max(0, holdout))
    fit_seqs, held = split_holdout(seqs, holdout)
    gen = torch.Generator().manual_seed(seed)
    read_until = t0 + (budget / 2 if kind == "tuned" else budget)
    reader = _Reader(fit_seqs.shape[0] if kind == "tuned" else 0, parse_bytes(max_bytes), seed)
    total = fit_seqs.shape[0] + (steps if kind == "tuned" else 0)
    with Progress(total, progress, what=f"fit_lens ({kind})") as bar:
        for rows in residual_batches(model, parts, fit_seqs):
            reader.add(rows)
            bar.update(1)
            if time.perf_counter() >= read_until:
                break
        gram, read = reader.gram, reader.read
        assert gram is not None
        read_s = time.perf_counter() - t0
        A, c = gram.solve()
        info: dict[str, Any] = {"model": getattr(getattr(model, "config", None), "name_or_path", ""), "tokens": read,
                                "seq_len": seq_len, "skipped": "the first position of each sequence",
                                "read_seconds": round(read_s, 2), "solve_seconds": round(time.perf_counter() - t0 - read_s, 2)}
        start = FittedLens("shortcut", A, c, model=model, parts=parts, info=dict(info, seconds=info["solve_seconds"] + read_s))
        if kind == "tuned":
            if init == "identity":
                A = torch.eye(A.shape[1]).repeat(A.shape[0], 1, 1)
                c = torch.zeros_like(c)
            if not reader.cached:
                raise ValueError("fit_lens: max_bytes keeps no residuals for the tuned training; raise it")
            stack = reader.stack()
            U, b = _head(parts)
            info.update(_train(parts, stack, A, c, U=U, bias=b, vocab=vocab, steps=steps, deadline=t0 + budget,
                               lr=lr if lr is not None else (1e-4 if init == "shortcut" else 1e-3), batch=batch,
                               gen=gen, bar=bar, optimizer=optimizer, keep_better=init == "shortcut",
                               white=gram.whitener() if whiten else None))
            info.update(cached_tokens=int(stack.shape[1]), init=init, optimizer=optimizer, whiten=whiten)
        info["seconds"] = round(time.perf_counter() - t0, 2)
    lens = FittedLens(kind, A, c, model=model, parts=parts, info=info) if kind == "tuned" else start
    lens.start = start if kind == "tuned" and init == "shortcut" else None
    if held.shape[0]:
        lens.quality = heldout_quality(lens, model, parts, held)
    return lens
