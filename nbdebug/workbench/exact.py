"""Exact patching on the batch dimension, from cached state.

Every patch is a run of the *base* prompt (corrupt when denoising) with one site taking the *source*
prompt's (clean) activation. A patch at layer ``l`` starts from the base run's recorded input of block
``l`` (blocks before it cannot change: not recomputed). In a causal model a patch whose earliest
patched position is ``p`` runs only positions ``p..T-1``: the earlier positions' keys/values are the
base run's (recorded), so they are not recomputed either.

Patches are grouped by that start position; within a group, runs are batched and advance block by
block, each joining the batch at its own layer (block ``j`` runs once for every run patched at or
before ``j``). A group is cut into chunks whose estimated working memory stays under ``max_bytes``.
Only the last position is unembedded unless the metric reads every position.

On a GPU the same plan is a few large batched calls per block (the per-patch loop is launch-bound
there): see the package docstring.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..adapters.blockparts import PatchParts
from ..adapters.blockrun import BlockRunner
from ..runs.interventions import Replacement, edit_activations, patch_points
from ..runs.own import own_pass
from ..runs.progress import Progress, ProgressSpec
from .metric import Metric
from .runs import RunState
from .sites import Cell, cell_masks

__all__ = ["Chunk", "ExactEngine", "Traced"]


@dataclass
class Chunk:
    """Cells run together: same start position, sorted by layer."""

    start: int
    cells: list[Cell]

    @property
    def first_layer(self) -> int:
        return self.cells[0].site.layer


@dataclass
class Traced:
    """Patched runs with their last position's logits ``(B, V)`` and residual stream entering each
    block and after the last one ``(B, L + 1, d)`` (for a logit-lens column), and the metric ``(B,)``."""

    metric: torch.Tensor
    logits: torch.Tensor
    residual: torch.Tensor


class ExactEngine:
    """Runs cells of one site kind exactly (see the module docstring); plain inputs, no state kept
    between calls besides the runs it was given."""

    def __init__(self, pp: PatchParts, runner: BlockRunner, metric: Metric, base: RunState, source: RunState,
                 max_bytes: int) -> None:
        self.pp, self.runner, self.metric = pp, runner, metric
        self.base, self.source = base, source
        self.max_bytes = int(max_bytes)
        self.blocks = [b for _, b in pp.parts.blocks]

    # -- planning ----------------------------------------------------------------------------------
    def start_of(self, cell: Cell) -> int:
        return cell.start if self.runner.kv_reuse else 0

    def row_bytes(self, start: int) -> int:
        """Estimated peak bytes one run needs while a block runs on positions ``start..T-1``."""
        T = self.base.length
        n = T - start
        x = self.base.block_inputs[0]
        d, elt = int(x.shape[-1]), x.element_size()
        cfg = self.pp.parts.hf_config
        inner = (getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None)
                 or getattr(cfg, "d_mlp", None) or 4 * d)
        heads = max(self.pp.n_heads, 1)
        kv = 2 * T * max(self.pp.n_kv_heads, 1) * max(self.pp.head_dim, 1)
        vocab = int(self.base.logits.shape[-1])
        logit_rows = T if self.metric.needs_all_positions else 1
        return elt * (n * (8 * d + 3 * int(inner) + 3 * heads * T) + 2 * kv) + 4 * vocab * logit_rows

    def plan(self, cells: Sequence[Cell]) -> list[Chunk]:
        """Chunks: cells grouped by start position, sorted by layer, cut to fit ``max_bytes``."""
        groups: dict[int, list[Cell]] = defaultdict(list)
        for cell in cells:
            groups[self.start_of(cell)].append(cell)
        chunks = []
        for start in sorted(groups):
            group = sorted(groups[start], key=lambda c: (c.site.layer, c.row, c.col))
            size = max(1, self.max_bytes // max(self.row_bytes(start), 1))
            chunks += [Chunk(start, group[i:i + size]) for i in range(0, len(group), size)]
        return chunks

    def steps(self, chunks: Sequence[Chunk]) -> int:
        """Block calls the chunks make (the progress total)."""
        return sum(self.pp.n_layers - c.first_layer for c in chunks)

    # -- running -----------------------------------------------------------------------------------
    def run(self, cells: Sequence[Cell], progress: ProgressSpec = False, what: str = "patching") -> torch.Tensor:
        """The metric ``(len(cells),)`` of each cell's patched run, in the order given (``progress``: see
        :class:`~nbdebug.runs.progress.Progress`; one step per block call)."""
        out = torch.empty(len(cells), dtype=torch.float32)
        index = {id(c): i for i, c in enumerate(cells)}
        chunks = self.plan(cells)
        with Progress(self.steps(chunks), progress, what) as bar:
            for chunk in chunks:
                values = self.run_chunk(chunk, bar).metric.detach().cpu()  # one transfer per chunk
                for cell, value in zip(chunk.cells, values):
                    out[index[id(cell)]] = value
        return out

    def run_chunk(self, chunk: Chunk, progress: Progress | None = None, trace: bool = False) -> Traced:
        """One batched pass over the chunk's cells; ``trace`` keeps each block's last-position residual."""
        kind = chunk.cells[0].site.kind
        base, start, T = self.base, chunk.start, self.base.length
        prefix = base.prefix(start)
        points = [] if kind == "resid" else [(m, self.pp.where(kind)) for _, m in self.pp.sites(kind)]
        by_layer: dict[int, list[Cell]] = defaultdict(list)
        for cell in chunk.cells:
            by_layer[cell.site.layer].append(cell)
        h: torch.Tensor | None = None
        lens: list[torch.Tensor] = []
        with own_pass(self.runner.model), patch_points(points) as plan:
            for j in range(chunk.first_layer, self.pp.n_layers):
                new = by_layer.get(j, [])
                if new:
                    h = self._join(h, new, kind, j, start, T, plan)
                assert h is not None
                if trace:
                    lens.append(h[:, -1])
                call = base.calls[j]
                kwargs = self.runner.block_kwargs(call, base.cache_ids, start, T, prefix, j, int(h.shape[0]))
                h = self.runner.hidden_of(self.blocks[j](h, **kwargs))
                if plan:
                    plan[j] = None
                if progress is not None:
                    progress.update(1)
            assert h is not None
            if self.metric.needs_all_positions:
                logits = self.runner.logits(h)
                if start:
                    head = base.logits[:, :start].to(logits.dtype)
                    logits = torch.cat([head.expand(logits.shape[0], -1, -1), logits], dim=1)
                last = logits[:, -1]
            else:
                logits = last = self.runner.logits(h[:, -1])
            metric = self.metric(logits)
            if trace:
                lens.append(h[:, -1])
        residual = self._residual(lens, chunk) if trace else torch.empty(0)
        return Traced(metric=metric.float(), logits=last.detach(), residual=residual)

    def run_edited(self, first: int, edits: Sequence[tuple[Any, str, Any]]) -> Traced:
        """The base run again from block ``first`` on (every position) with ``edits`` (``(module, where,
        fn)``, e.g. an ablation) active, traced; blocks before ``first`` are the recorded ones."""
        base, T = self.base, self.base.length
        h = base.block_inputs[first] if first < self.pp.n_layers else None
        lens: list[torch.Tensor] = []
        with own_pass(self.runner.model), edit_activations(edits):
            for j in range(first, self.pp.n_layers):
                assert h is not None
                lens.append(h[:, -1])
                kwargs = self.runner.block_kwargs(base.calls[j], base.cache_ids, 0, T, None, j, 1)
                h = self.runner.hidden_of(self.blocks[j](h, **kwargs))
            if h is None:
                raise ValueError("nothing to run after the last block")
            logits = self.runner.logits(h) if self.metric.needs_all_positions else self.runner.logits(h[:, -1])
            metric = self.metric(logits)
            lens.append(h[:, -1])
        rows = [base.block_inputs[j][:, -1] for j in range(first)]
        last = logits[:, -1] if logits.ndim == 3 else logits
        return Traced(metric=metric.float(), logits=last.detach(), residual=torch.stack(rows + lens, dim=1))

    def _join(self, h: torch.Tensor | None, new: list[Cell], kind: str, j: int, start: int, T: int,
              plan: list[Replacement | None]) -> torch.Tensor:
        """Add the runs patched at block ``j`` to the batch (their input: the base run's block input)."""
        x = self.base.block_inputs[j][:, start:]
        x = x.expand(len(new), *x.shape[1:])
        width = int(self.source.activation(kind, j).shape[-1])
        mask = cell_masks(self.pp, new, start, T, width).to(x.device)
        src = self.source.activation(kind, j)[:, start:]
        rows = 0 if h is None else int(h.shape[0])
        if kind == "resid":
            x = Replacement(0, mask, src.to(x.device)).apply(x)
        else:
            plan[j] = Replacement(rows, mask, src)
        return x if h is None else torch.cat([h, x.to(h.device, h.dtype)])

    def _residual(self, lens: list[torch.Tensor], chunk: Chunk) -> torch.Tensor:
        """``(B, L + 1, d)``: the base run's residual before each run's first patched block, then the run's."""
        first = chunk.first_layer
        B = int(lens[-1].shape[0])
        rows = [self.base.block_inputs[j][:, -1].expand(B, -1) for j in range(first)]
        out = []
        for j, r in enumerate(lens):  # r has the batch as it was at that block: earlier joiners only
            pad = B - int(r.shape[0])
            if pad:
                layer = first + j
                r = torch.cat([r, self.base.block_inputs[layer][:, -1].expand(pad, -1).to(r.dtype)])
            out.append(r)
        return torch.stack(rows + out, dim=1)
