"""Logit lens: every layer's residual stream read through the model's own final norm and unembedding.

The probability tensor ``rows × positions × vocabulary`` is never held: the vocabulary is walked in
chunks with a running top-k and a running log-sum-exp (plus the sums needed for the entropy, the
target token's rank and the KL divergence to the final layer), and positions are processed in
blocks so the working set stays a few tens of MB whatever the sequence length.

>>> lens = LogitLens(residuals, normed_fn, weight, k=10)  # residuals: (rows, T, d)  # doctest: +SKIP
>>> col = lens.columns([T - 1])                          # what the view shows first
>>> table = lens.result()                                # every (row, position)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from .lens_finding import LensFinding, lens_finding

__all__ = ["LensResult", "LogitLens", "lens_stats"]

FIELDS = ("top_ids", "top_probs", "entropy", "kl", "target_prob", "target_rank")


def lens_stats(
    normed: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    k: int = 10,
    targets: torch.Tensor | None = None,
    softcap: float | None = None,
    chunk: int = 4096,
    budget: int = 4_000_000,
) -> dict[str, torch.Tensor]:
    """Softmax statistics of ``normed (R, P, d) @ weight.T (V, d)`` without materialising ``(R, P, V)``.

    Runs where ``weight`` is (``normed`` is moved there: the residuals travel, never the unembedding).
    Row ``R - 1`` is the reference for the KL divergence (``KL(p_final ‖ p_row)`` per position).
    ``targets (P,)`` (``-1`` = none) gives each position's target-token probability and rank
    (0 = top-1). Returns float32/int64 tensors shaped ``(R, P[, k])``.
    """
    R, P, d = normed.shape
    V = weight.shape[0]
    k = min(k, V)
    # Rows ordered position-major: (P, R) so each position's final row sits at r = R - 1.
    dev = weight.device
    x = normed.to(dev).transpose(0, 1).reshape(P * R, d).float().contiguous()
    N = P * R
    C = max(256, min(chunk, budget // max(N, 1)))
    m = torch.full((N,), -float("inf"), device=dev)
    s = torch.zeros(N, device=dev)
    t = torch.zeros(N, device=dev)  # Σ e·(z - m)
    u = torch.zeros(N, device=dev)  # Σ e_final·(z_row - m_row) (same position)
    top_v = torch.full((N, k), -float("inf"), device=dev)
    top_i = torch.zeros((N, k), dtype=torch.long, device=dev)
    rank = torch.zeros(N, dtype=torch.long, device=dev)
    has_t = targets is not None and bool((targets >= 0).any())
    if has_t:
        assert targets is not None
        tid = targets.to(dev).clamp_min(0).repeat_interleave(R)
        zt = (x * weight.index_select(0, tid).float()).sum(-1)
        if bias is not None:
            zt = zt + bias.float().index_select(0, tid)
        if softcap:
            zt = torch.tanh(zt / softcap) * softcap
    zbuf = torch.empty(N * C, device=dev)  # reused every chunk (contiguous views, also for the last)
    ebuf = torch.empty(N * C, device=dev)
    gbuf = torch.empty(N * C if has_t else 0, dtype=torch.bool, device=dev)
    for c0 in range(0, V, C):
        c1 = min(V, c0 + C)
        w = weight[c0:c1].float()
        z = zbuf[: N * (c1 - c0)].view(N, c1 - c0)
        e = ebuf[: N * (c1 - c0)].view(N, c1 - c0)
        torch.mm(x, w.T, out=z)
        if bias is not None:
            z.add_(bias[c0:c1].float())
        if softcap:
            z.div_(softcap).tanh_().mul_(softcap)
        kk = min(k, c1 - c0)
        cv, ci = z.topk(kk, dim=1)
        allv = torch.cat([top_v, cv], 1)
        alli = torch.cat([top_i, ci + c0], 1)
        top_v, pick = allv.topk(k, dim=1)
        top_i = alli.gather(1, pick)
        if has_t:
            gt = gbuf[: N * (c1 - c0)].view(N, c1 - c0)
            torch.gt(z, zt[:, None], out=gt)
            rank += gt.view(torch.uint8).sum(1, dtype=torch.int32)  # no int64 temporaries
            inside = (tid >= c0) & (tid < c1)
            if bool(inside.any()):
                rows = inside.nonzero().squeeze(1)
                zin = z[rows, tid[rows] - c0]
                rank[rows] -= (zin > zt[rows]).long()  # the target itself, if rounding put it above zt
        # Running sums relative to the running max m (d = z - m <= 0 keeps them precise):
        # s = Σ e, t = Σ e·d, u = Σ e_final·d_row (e = exp(d)); rescaled when m grows.
        m_new = torch.maximum(m, cv[:, 0])
        delta = torch.where(torch.isfinite(m), m - m_new, torch.zeros_like(m))
        dv, sv = delta.view(P, R), s.view(P, R)
        u.view(P, R).add_(dv * sv[:, R - 1 :]).mul_(torch.exp(dv[:, R - 1 :]))
        t.add_(delta * s).mul_(torch.exp(delta))
        s.mul_(torch.exp(delta))
        m = m_new
        z.sub_(m[:, None])
        torch.exp(z, out=e)
        s.add_(e.sum(1))
        t.add_(torch.bmm(e.unsqueeze(1), z.unsqueeze(2)).view(-1))  # Σ e·d without an (N, C) temporary
        ef = e.view(P, R, -1)[:, R - 1 :, :]  # (P, 1, C): final row's weights
        u.view(P, R).add_(torch.bmm(z.view(P, R, -1), ef.transpose(1, 2)).squeeze(-1))
    logs = torch.log(s)
    lse = m + logs
    entropy = logs - t / s
    logs_f = logs.view(P, R)[:, R - 1 :]
    s_f = s.view(P, R)[:, R - 1 :]
    t_f = t.view(P, R)[:, R - 1 :]
    kl = (t_f / s_f - logs_f) - u.view(P, R) / s_f + logs.view(P, R)
    out = {
        "top_ids": top_i.view(P, R, k).transpose(0, 1),
        "top_probs": torch.exp(top_v - lse[:, None]).view(P, R, k).transpose(0, 1),
        "entropy": entropy.view(P, R).T,
        "kl": kl.clamp_min(0).T,
    }
    if has_t:
        assert targets is not None
        valid = (targets.to(dev) >= 0).repeat_interleave(R)
        out["target_prob"] = torch.where(valid, torch.exp(zt - lse), torch.nan).view(P, R).T
        out["target_rank"] = torch.where(valid, rank, -1).view(P, R).T
    else:
        out["target_prob"] = torch.full((R, P), float("nan"), device=dev)
        out["target_rank"] = torch.full((R, P), -1, dtype=torch.long, device=dev)
    return {key: v.contiguous() for key, v in out.items()}


@dataclass(repr=False)
class LensResult:
    """The logit-lens table: ``rows`` = embeddings then each block's output, ``T`` positions.

    ``top_ids``/``top_probs`` ``(rows, T, k)``; ``entropy`` (nats), ``kl`` (``KL(final ‖ row)``,
    nats), ``target_prob`` and ``target_rank`` (0 = top-1, -1 = no target) ``(rows, T)``;
    ``targets (T,)`` the token id each position was scored against; ``vocab`` maps every id in
    ``top_ids`` and ``targets`` to its text. The arrays are views of the lens cache: columns not
    computed yet (the view shows the last position first) are filled on first access.
    """

    lens: LogitLens
    check: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether every (row, position) is computed already."""
        return bool(self.lens.done.all())

    def _table(self, key: str) -> np.ndarray:
        if not self.complete:
            self.lens.fill()
        return self.lens.table[key]

    row_names = property(lambda self: self.lens.row_names, doc="row labels: 'embed', then block names")
    tokens = property(lambda self: self.lens.tokens, doc="raw token strings of the positions")
    target_label = property(lambda self: self.lens.target_label, doc="what the target metrics refer to")
    targets = property(lambda self: self.lens.targets.cpu().numpy(), doc="(T,) target id per position (-1: none)")
    generated = property(lambda self: self.lens.generated, doc="per position: True if generate() produced the token ([]: no generation)")
    top_ids = property(lambda self: self._table("top_ids"), doc="(rows, T, k) token ids")
    top_probs = property(lambda self: self._table("top_probs"), doc="(rows, T, k) probabilities")
    entropy = property(lambda self: self._table("entropy"), doc="(rows, T) entropy in nats")
    kl = property(lambda self: self._table("kl"), doc="(rows, T) KL(final ‖ row) in nats")
    target_prob = property(lambda self: self._table("target_prob"), doc="(rows, T) target probability")
    target_rank = property(lambda self: self._table("target_rank"), doc="(rows, T) target rank, 0 = top-1")

    @property
    def finding(self) -> LensFinding:
        """Where the answer at the last position becomes top-1 and stays (the view's first line)."""
        return self.lens.finding()

    @property
    def vocab(self) -> dict[int, str]:
        if not self.complete:
            self.lens.fill()
        return self.lens.vocab

    def top_tokens(self, row: int, pos: int) -> list[tuple[str, float]]:
        """``[(token, prob), ...]`` of one cell."""
        self.lens.columns([pos])
        t = self.lens.table
        return [(self.lens.vocab.get(int(i), f"#{int(i)}"), float(p)) for i, p in zip(t["top_ids"][row, pos], t["top_probs"][row, pos], strict=True)]

    def top1(self, row: int = -1) -> list[str]:
        """Top-1 token string of every position in one row (default: the final row)."""
        return [self.vocab.get(int(i), f"#{int(i)}") for i in self.top_ids[row, :, 0]]

    def __repr__(self) -> str:
        lens = self.lens
        last = lens.vocab.get(int(lens.table["top_ids"][-1, -1, 0]), "?") if lens.done[-1] else "?"
        state = "complete" if self.complete else f"{int(lens.done.sum())} of {lens.T} positions computed so far"
        return f"LensResult({lens.R} rows × {lens.T} positions, top-{lens.k}, {state}; final row at the last position: {last!r})"


class LogitLens:
    """Holds the residual streams of one sequence and computes lens columns on demand (cached).

    ``residuals``: ``(rows, T, d)`` — embeddings, then each block's output — or a list of ``rows``
    ``(T, d)`` tensors, each on the device of its block (a ``device_map`` model): the positions a
    request needs are moved, one position block at a time, to ``device`` (default: the last row's,
    i.e. next to the final norm) and the normed rows on to the unembedding's device. ``normed_fn`` applies
    the model's final norm (and any projection before the head); ``weight``/``bias`` are the
    unembedding, or functions returning it (so a view can hold the model's parameters weakly: such a
    function raises ``ModelGoneError`` once the model is deleted); ``loaded`` (optional) returns a
    context manager inside which they can be read (accelerate offload: the weights are loaded once
    per request, not per position block, and put back on ``meta`` afterwards). The weight is never converted
    to float32 as a whole: vocabulary chunks of ``chunk`` rows are, one at a time. ``translators`` (tuned lens): one callable per row but the last (or per row,
    ``None`` = identity) mapping a residual to the translated residual before the final norm. Columns are computed in position blocks and remembered, so the first column the
    view shows costs one small GEMM and the rest are filled when asked (or by :meth:`result`).
    """

    def __init__(
        self,
        residuals: torch.Tensor | Sequence[torch.Tensor],
        normed_fn: Callable[[torch.Tensor], torch.Tensor],
        weight: torch.Tensor | Callable[[], torch.Tensor],
        bias: torch.Tensor | Callable[[], torch.Tensor | None] | None = None,
        *,
        k: int = 10,
        targets: torch.Tensor | None = None,
        softcap: float | None = None,
        row_names: Sequence[str] | None = None,
        tokens: Sequence[str] | None = None,
        decode: Callable[[list[int]], list[str]] | None = None,
        target_label: str = "",
        position_block: int | None = None,
        translators: Sequence[Callable[[torch.Tensor], torch.Tensor] | None] | None = None,
        chunk: int = 4096,
        generated: Sequence[bool] | None = None,
        device: torch.device | None = None,
        loaded: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self.residuals = residuals
        self.device = device if device is not None else residuals[-1].device
        self._loaded = loaded or nullcontext
        self._loaded_depth = 0
        self.normed_fn = normed_fn
        self._weight = weight
        self._bias = bias
        self.chunk = chunk
        self.generated = list(generated) if generated is not None else []
        self.k = k
        self.softcap = softcap
        R, T = len(residuals), int(residuals[0].shape[0])
        self.R, self.T = R, T
        self.targets = targets if targets is not None else torch.full((T,), -1, dtype=torch.long)
        self.row_names = list(row_names) if row_names is not None else ["embed"] + [f"block {i}" for i in range(R - 1)]
        self.tokens = list(tokens) if tokens is not None else [f"#{i}" for i in range(T)]
        self.decode = decode or (lambda ids: [f"#{i}" for i in ids])
        self.target_label = target_label
        self.position_block = position_block or max(1, 2048 // max(R, 1))
        tr = list(translators) if translators is not None else []
        if tr and len(tr) == R - 1:
            tr.append(None)  # tuned lens: no translator for the final layer
        if tr and len(tr) != R:
            raise ValueError(f"translators: need {R - 1} or {R} entries (one per row), got {len(tr)}")
        self.translators = tr
        self.done = np.zeros(T, dtype=bool)
        self.table: dict[str, np.ndarray] = {
            "top_ids": np.zeros((R, T, k), np.int64),
            "top_probs": np.zeros((R, T, k), np.float32),
            "entropy": np.full((R, T), np.nan, np.float32),
            "kl": np.full((R, T), np.nan, np.float32),
            "target_prob": np.full((R, T), np.nan, np.float32),
            "target_rank": np.full((R, T), -1, np.int64),
        }
        self.vocab: dict[int, str] = {}

    @property
    def weight(self) -> torch.Tensor:
        """The ``(V, d)`` unembedding (``ModelGoneError`` if it was given weakly and the model is gone;
        on ``meta`` for an offloaded model outside ``loaded()``)."""
        return self._weight() if callable(self._weight) else self._weight

    @contextmanager
    def loaded(self) -> Iterator[None]:
        """The unembedding readable for the whole block (re-entrant: nested requests load it once)."""
        if self._loaded_depth:
            yield
            return
        with self._loaded():
            self._loaded_depth += 1
            try:
                yield
            finally:
                self._loaded_depth -= 1

    def _head(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight, bias)`` readable now (call inside ``self._loaded()``)."""
        w = self.weight
        if w.device.type == "meta":
            raise RuntimeError("the unembedding is on the meta device (offloaded by accelerate) and was not loaded: pass loaded=")
        return w, self.bias

    def _rows(self, rows: Sequence[int], idx: torch.Tensor) -> torch.Tensor:
        """``(len(rows), P, d)`` residuals at positions ``idx``, gathered on ``self.device``."""
        out = [self.residuals[r].index_select(0, idx.to(self.residuals[r].device)).to(self.device) for r in rows]
        return torch.stack(out)

    @property
    def bias(self) -> torch.Tensor | None:
        return self._bias() if callable(self._bias) else self._bias

    @property
    def vocab_size(self) -> int:
        return int(self.weight.shape[0])

    def _translate(self, h: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        """Apply the per-row translators (tuned lens), if any, to ``h (len(rows), P, d)``."""
        if not self.translators:
            return h
        out = [h[i] if self.translators[r] is None else self.translators[r](h[i]) for i, r in enumerate(rows)]
        return torch.stack(out)

    @torch.no_grad()
    def _compute(self, pos: list[int]) -> None:
        idx = torch.tensor(pos, dtype=torch.long)
        h = self._rows(range(self.R), idx)
        normed = self.normed_fn(self._translate(h, range(self.R)))
        weight, bias = self._head()
        st = lens_stats(normed, weight, bias, k=self.k, targets=self.targets[idx], softcap=self.softcap, chunk=self.chunk)
        for key, v in st.items():
            self.table[key][:, pos] = v.cpu().numpy()
        self.done[pos] = True

    def columns(self, positions: Sequence[int]) -> dict[str, np.ndarray]:
        """Lens statistics of ``positions`` (every row), computed now unless already cached."""
        pos = sorted({int(p) % self.T for p in positions})
        todo = [p for p in pos if not self.done[p]]
        if todo:
            with self.loaded():  # offloaded weights: loaded once for the whole request
                for i in range(0, len(todo), self.position_block):
                    self._compute(todo[i : i + self.position_block])
        self.learn([int(i) for i in np.unique(self.table["top_ids"][:, pos])])
        return {key: v[:, pos] for key, v in self.table.items()}

    def learn(self, ids: Sequence[int]) -> dict[int, str]:
        """Decode the ids not known yet into ``vocab``; returns the newly learnt ``{id: text}``."""
        new = [int(i) for i in dict.fromkeys(ids) if int(i) not in self.vocab and int(i) >= 0]
        added = dict(zip(new, self.decode(new), strict=True)) if new else {}
        self.vocab.update(added)
        return added

    def vocab_for(self, positions: Sequence[int]) -> dict[int, str]:
        ids = np.unique(self.table["top_ids"][:, list(positions)])
        return {int(i): self.vocab[int(i)] for i in ids if int(i) in self.vocab}

    @torch.no_grad()
    def cell(self, row: int, pos: int, k: int = 20) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ids and probabilities of one cell (one matrix-vector product)."""
        h = self._rows([row], torch.tensor([pos], dtype=torch.long))  # (1, 1, d)
        with self.loaded():
            weight, bias = self._head()
            x = self.normed_fn(self._translate(h, [row]))[0, 0].to(weight.device).float()
            V = weight.shape[0]
            z = torch.empty(V, device=x.device)
            for c0 in range(0, V, self.chunk):  # float32 copies of one vocabulary chunk at a time, never (V, d)
                c1 = min(V, c0 + self.chunk)
                torch.mv(weight[c0:c1].float(), x, out=z[c0:c1])
            if bias is not None:
                z = z + bias.float()
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        p = torch.softmax(z, -1)
        v, i = p.topk(min(k, p.numel()))
        self.learn([int(x) for x in i])
        return i.cpu().numpy(), v.cpu().numpy()

    def fill(self) -> None:
        """Compute every missing column (and learn the targets' text)."""
        self.columns(range(self.T))
        self.learn([int(t) for t in self.targets.tolist() if t >= 0])

    def finding(self, position: int = -1) -> LensFinding:
        """Where the token scored at ``position`` (the target, else the output's top-1) becomes top-1 and stays."""
        pos = position % self.T
        c = self.columns([pos])
        tid = int(self.targets[pos])
        self.learn([int(c["top_ids"][-1, 0, 0]), tid])
        return lens_finding(c["top_ids"][:, 0, 0], c["top_probs"][:, 0, 0], c["target_rank"][:, 0], c["target_prob"][:, 0],
                            tid, self.vocab, self.row_names, pos)

    def result(self) -> LensResult:
        """The table as a :class:`LensResult` (missing columns are filled when first read)."""
        return LensResult(self)
