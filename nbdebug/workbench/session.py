"""A clean/corrupt pair on one model, with the recorded runs cached: grids, and single patches fast
enough for a click (only the blocks from the patched one on run again, on the positions the patch
can change).

>>> wb = Workbench(model, clean=ids, corrupt=ids2, answer=" Paris", wrong=" Rome", tokenizer=tok)  # doctest: +SKIP
>>> g = wb.grid("resid")                      # what nbdebug.patch returns
>>> run = wb.cell(g, row=8, col=3)            # one patched run: metric, effect, top next tokens, residual per block
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ..adapters.blockparts import patch_parts
from ..adapters.blockrun import block_runner
from ..capture.budget import DEFAULT_MAX_BYTES, parse_bytes
from ..capture.state import execution_device
from ..runs.progress import ProgressSpec
from .attribution_patching import estimate_patches
from .exact import ExactEngine
from .grid import PatchGrid
from .interventions import ablation_edits
from .metric import Metric, MetricError, token_labels, tokens_of, top_k
from .runs import RunState, record_state
from .sites import Cell, identical, layout
from .targets import resolve

__all__ = ["PatchedRun", "Workbench"]

DIRECTIONS = ("denoise", "noise")
METHODS = ("exact", "attribution")


@dataclass
class PatchedRun:
    """One patched run (a clicked cell): its metric and effect, the last position's logits ``(V,)``,
    the residual stream at the last position entering each block and after the last ``(L + 1, d)``
    (float32 numpy), and the site and positions patched."""

    metric: float
    effect: float
    logits: np.ndarray
    residual: np.ndarray
    site: str
    positions: tuple[int, ...]

    def top(self, k: int = 5) -> list[tuple[int, float]]:
        """The ``k`` most likely next tokens ``(id, probability)``."""
        ids, ps = top_k(self.logits, k)
        return list(zip(ids, ps))


class Workbench:
    """A clean and a corrupt prompt on ``model`` and the metric (see :func:`nbdebug.patch` for the
    arguments). Records each prompt's run once (nbdebug's own pass: no hooks left, the model unchanged)
    and reuses them for every grid and cell.

    For ablation clicks on one prompt (a view without a corrupt prompt), ``corrupt`` may be None; with
    no ``answer`` either, the metric is the probability of the clean run's top next token
    (``effect`` is then NaN: there is no corrupt run to normalise by)."""

    def __init__(self, model: nn.Module, clean: Any, corrupt: Any = None, *, answer: Any = None, wrong: Any = None,
                 tokenizer: Any = None, metric: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.pp = patch_parts(model)
        self.runner = block_runner(model, self.pp)
        top1 = corrupt is None and answer is None and metric is None
        self.metric = Metric(label="p(top-1)") if top1 else Metric.build(answer, wrong, tokenizer, metric)
        device = execution_device(model) or torch.device("cpu")
        ids = {"clean": tokens_of(clean, tokenizer, "clean")}
        if corrupt is not None:
            ids["corrupt"] = tokens_of(corrupt, tokenizer, "corrupt")
        self.tokens = {k: token_labels(tokenizer, v[0].tolist()) for k, v in ids.items()}
        self.tokens.setdefault("corrupt", [])
        if corrupt is not None and ids["clean"].shape != ids["corrupt"].shape:
            raise MetricError(
                f"clean and corrupt must have the same number of tokens (patching matches positions one to one): "
                f"clean has {ids['clean'].shape[1]} {self.tokens['clean']}, corrupt has {ids['corrupt'].shape[1]} "
                f"{self.tokens['corrupt']}")
        self.ids = {k: v.to(device) for k, v in ids.items()}
        self.runs: dict[str, RunState] = {}
        self.kinds: dict[str, set[str]] = {"clean": set(), "corrupt": set()}
        if top1:  # the clean run's most likely next token, as a probability
            a = int(self.state("clean").logits[0, -1].argmax())
            self.metric = Metric(answer=a, prob=True, label=f"p({token_labels(tokenizer, [a])[0]!r})")

    @property
    def length(self) -> int:
        return int(self.ids["clean"].shape[1])

    def state(self, which: str, kinds: Sequence[str] = ()) -> RunState:
        """The recorded run of ``"clean"`` or ``"corrupt"`` with (at least) ``kinds`` recorded."""
        if which not in self.ids:
            raise MetricError("patching needs a corrupt prompt: Workbench(model, clean, corrupt, ...)")
        want = set(kinds) - {"resid"}
        if which not in self.runs or not want <= self.kinds[which]:
            self.kinds[which] |= want
            self.runs[which] = record_state(self.model, self.pp, self.runner, self.ids[which], sorted(self.kinds[which]),
                                            last_only=not self.metric.needs_all_positions)
        return self.runs[which]

    def metric_of(self, which: str) -> float:
        return float(self.metric(self.state(which).logits)[0])

    def scale(self) -> tuple[float, float]:
        """``(m_clean, m_corrupt)``; a clear error when they are equal (nothing to restore)."""
        return self._check(self.metric_of("clean"), self.metric_of("corrupt"))

    def _check(self, mc: float, mk: float) -> tuple[float, float]:
        if not abs(mc - mk) > 1e-7 * max(1.0, abs(mc), abs(mk)):
            raise MetricError(
                f"the metric ({self.metric.label}) is the same on clean and corrupt ({mc:.6g}): a patch has nothing "
                "to restore. Choose prompts, or an answer/wrong pair, that the model tells apart")
        return mc, mk

    def _pair(self, direction: str, kind: str) -> tuple[RunState, RunState]:
        base, source = _roles(direction)
        return self.state(base, [kind]), self.state(source, [kind])

    def engine(self, direction: str, kind: str, max_bytes: Any = None) -> ExactEngine:
        base, source = self._pair(direction, kind)
        return ExactEngine(self.pp, self.runner, self.metric, base, source, parse_bytes(max_bytes, DEFAULT_MAX_BYTES))

    # -- grids -----------------------------------------------------------------------------------------
    def grid(self, sites: str = "resid", *, method: str = "exact", direction: str = "denoise", positions: Any = None,
             verify: int = 0, max_bytes: Any = None, progress: ProgressSpec = None) -> PatchGrid:
        """The patching grid (see :func:`nbdebug.patch`)."""
        t0 = time.perf_counter()
        if method not in METHODS:
            raise ValueError(f"method={method!r}: 'exact' or 'attribution'")
        base_name, source_name = _roles(direction)
        lay = layout(self.pp, sites, positions, self.length, self.tokens["clean"])
        notes = [self.runner.note] if self.runner.note else []
        source = self.state(source_name, [sites])
        if method == "exact":
            base = self.state(base_name, [sites])
            mc, mk = self.scale()
            same = self._identical(lay.cells, [base.activation(sites, j) for j in range(self.pp.n_layers)], source, sites)
            todo = [c for c, s in zip(lay.cells, same) if not s]
            values = self.engine(direction, sites, max_bytes).run(todo, progress, f"patching {sites}")
        else:  # one forward of the base run that keeps its graph, one backward: no other forward
            est = estimate_patches(self.model, self.pp, self.runner, self.metric, self.ids[base_name], source, lay.cells, sites)
            m_source = float(self.metric(source.logits)[0])
            mc, mk = self._check(*((m_source, est.metric_base) if direction == "denoise" else (est.metric_base, m_source)))
            same = self._identical(lay.cells, est.base, source, sites)
            todo = [c for c, s in zip(lay.cells, same) if not s]
            keep = {id(c) for c in todo}
            values = est.estimate[[i for i, c in enumerate(lay.cells) if id(c) in keep]]
            notes.append("attribution: a first-order estimate from one forward and one backward of the base run")
        raw = np.full(lay_shape(lay), np.nan)
        m_base = mk if direction == "denoise" else mc  # a patch of an identical activation leaves the base run
        for cell, s in zip(lay.cells, same):
            if s:
                raw[cell.row, cell.col] = m_base
        for cell, v in zip(todo, values.tolist()):
            raw[cell.row, cell.col] = v
        effect = (raw - mk) / (mc - mk)
        grid = PatchGrid(
            effect=effect, raw=raw, metric_clean=mc, metric_corrupt=mk, rows=lay.rows, columns=lay.columns,
            sites=sites, method=method, direction=direction, identical=_mask(lay, same), row_sites=lay.row_sites,
            positions=lay.positions, tokens_clean=self.tokens["clean"], tokens_corrupt=self.tokens["corrupt"],
            metric=self.metric.label, patches=len(todo), notes=notes)
        if verify:
            grid.verified = self.verify(grid, int(verify), max_bytes=max_bytes)
        grid.seconds = time.perf_counter() - t0
        return grid

    def verify(self, grid: PatchGrid, k: int, max_bytes: Any = None) -> dict[tuple[int, int], float]:
        """The exact effect of ``grid``'s top ``k`` cells, in one batched pass."""
        lay = layout(self.pp, grid.sites, _positions_spec(grid), self.length, self.tokens["clean"])
        by_rc = {(c.row, c.col): c for c in lay.cells}
        cells = [by_rc[rc] for rc in grid.top_cells(k)]
        if not cells:
            return {}
        raw = self.engine(grid.direction, grid.sites, max_bytes).run(cells, False)
        mc, mk = grid.metric_clean, grid.metric_corrupt
        return {(c.row, c.col): (float(v) - mk) / (mc - mk) for c, v in zip(cells, raw.tolist())}

    def _identical(self, cells: Sequence[Cell], base: Sequence[torch.Tensor], source: RunState, kind: str) -> list[bool]:
        out = [False] * len(cells)
        by_layer: dict[int, list[int]] = {}
        for i, c in enumerate(cells):
            by_layer.setdefault(c.site.layer, []).append(i)
        for layer, idx in by_layer.items():
            flags = identical(self.pp, [cells[i] for i in idx], base[layer], source.activation(kind, layer))
            for i, f in zip(idx, flags):
                out[i] = f
        return out

    # -- one cell ----------------------------------------------------------------------------------------
    def cell(self, grid: PatchGrid, row: int, col: int) -> PatchedRun:
        """One cell of ``grid`` run exactly, with what a view shows beside it (see :class:`PatchedRun`)."""
        lay = layout(self.pp, grid.sites, _positions_spec(grid), self.length, self.tokens["clean"])
        cell = next(c for c in lay.cells if c.row == row and c.col == col)
        return self.run_cell(cell, grid.direction)

    def run_cell(self, cell: Cell, direction: str = "denoise") -> PatchedRun:
        """One patch, traced (last-position logits and residual per block)."""
        mc, mk = self.scale()
        eng = self.engine(direction, cell.site.kind)
        chunk = eng.plan([cell])[0]
        traced = eng.run_chunk(chunk, trace=True)
        m = float(traced.metric[0])
        return PatchedRun(metric=m, effect=(m - mk) / (mc - mk), logits=traced.logits[0].float().cpu().numpy(),
                          residual=traced.residual[0].float().cpu().numpy(), site=cell.site.name,
                          positions=cell.positions)

    # -- one ablated run ---------------------------------------------------------------------------------
    def ablated(self, which: str = "clean", *, heads: Any = None, layers: Any = None, channels: Any = None,
                neurons: Any = None, mode: str = "zero") -> PatchedRun:
        """``which`` run again with an ablation (the arguments of :func:`nbdebug.ablate`; ``mode="mean"``
        averages over this run's own activation), from the first ablated block on: a view's click."""
        mc, mk = self.scale() if "corrupt" in self.ids else (float("nan"), float("nan"))
        targets = resolve(self.model, heads=heads, layers=layers, channels=channels, neurons=neurons, pp=self.pp)
        if not targets:
            raise ValueError("nothing to ablate: give heads=, layers=, channels= or neurons=")
        first = _first_block(self.pp, targets)
        if first is None:
            raise ValueError(f"{', '.join(t.name for t in targets)}: not inside the model's blocks; "
                             "use nbdebug.ablate around a forward instead")
        edits, _ = ablation_edits(targets, mode)
        state = self.state(which)
        eng = ExactEngine(self.pp, self.runner, self.metric, state, state, DEFAULT_MAX_BYTES)
        traced = eng.run_edited(first, edits)
        m = float(traced.metric[0])
        return PatchedRun(metric=m, effect=(m - mk) / (mc - mk), logits=traced.logits[0].float().cpu().numpy(),
                          residual=traced.residual[0].float().cpu().numpy(), site=", ".join(t.name for t in targets),
                          positions=tuple(range(self.length)))


def _first_block(pp: Any, targets: Sequence[Any]) -> int | None:
    """The first block any target sits in (None when one is outside every block)."""
    names = [n for n, _ in pp.parts.blocks]
    first = None
    for t in targets:
        layer = next((j for j, n in enumerate(names) if t.name == n or t.name.startswith(n + ".")), None)
        if layer is None:
            return None
        first = layer if first is None else min(first, layer)
    return first


def _roles(direction: str) -> tuple[str, str]:
    """``(base, source)`` prompt names: denoise runs the corrupt prompt with clean activations."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r}: 'denoise' (clean into corrupt) or 'noise' (corrupt into clean)")
    return ("corrupt", "clean") if direction == "denoise" else ("clean", "corrupt")


def lay_shape(lay: Any) -> tuple[int, int]:
    return (len(lay.rows), len(lay.columns))


def _mask(lay: Any, same: list[bool]) -> np.ndarray:
    out = np.zeros(lay_shape(lay), dtype=bool)
    for c, s in zip(lay.cells, same):
        out[c.row, c.col] = s
    return out


def _positions_spec(grid: PatchGrid) -> Any:
    """The ``positions=`` argument that lays ``grid`` out again."""
    if grid.sites == "heads" and grid.row_sites and grid.row_sites[0].head is None:
        return "all"
    if grid.columns == ["all"]:
        return "all"
    return [p[0] for p in grid.positions]

