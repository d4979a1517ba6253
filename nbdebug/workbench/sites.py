"""Where a patch goes: the sites of a kind (one per layer, or per layer and head), named by the module
whose activation is patched (one name per module call, as everywhere in nbdebug), and the grid's
cells (site × positions patched together).

Kinds: ``"resid"`` (the input of each block: TransformerLens' ``resid_pre``), ``"attn"`` / ``"mlp"``
(each block's attention / MLP output), ``"heads"`` (each head's output: its slice of the attention
output projection's input, or TransformerLens' ``hook_z``). Positions: ``"each"`` (a column per
position), ``"all"`` (every position patched together: one column; for heads, rows are layers and
columns heads), or a list of positions (a column each). ``None`` is the kind's default: ``"all"``
for heads, ``"each"`` otherwise.

>>> lay = layout(pp, "heads", "all", T=9, tokens=labels)          # doctest: +SKIP
>>> lay.rows[3], lay.columns[:2], lay.cells[0]
('model.layers.3.self_attn.o_proj', ['h0', 'h1'], Cell(row=0, col=0, site=Site('heads', 0, ...), positions=(0, ..., 8)))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..adapters.blockparts import PatchParts

__all__ = ["KINDS", "Cell", "Layout", "Site", "cell_masks", "feature_shape", "identical", "layout"]

KINDS = ("resid", "attn", "mlp", "heads")


@dataclass(frozen=True)
class Site:
    """One patchable activation: its kind, layer, the module whose input/output it is, and a head."""

    kind: str
    layer: int
    module: str
    head: int | None = None

    @property
    def name(self) -> str:
        """The module's name, with ``:h<k>`` for a head."""
        return self.module if self.head is None else f"{self.module}:h{self.head}"


@dataclass(frozen=True)
class Cell:
    """One patch of the grid: row and column indices, the site, the positions patched together."""

    row: int
    col: int
    site: Site
    positions: tuple[int, ...]

    @property
    def start(self) -> int:
        return self.positions[0]


@dataclass
class Layout:
    """The grid's rows, columns (labels) and cells; ``positions[c]`` are column ``c``'s positions."""

    kind: str
    rows: list[str]
    columns: list[str]
    cells: list[Cell]
    positions: list[tuple[int, ...]]
    row_sites: list[Site]


def _positions(spec: Any, kind: str, T: int) -> str | list[int]:
    if spec is None:
        return "all" if kind == "heads" else "each"
    if isinstance(spec, str):
        if spec not in ("each", "all"):
            raise ValueError(f"positions={spec!r}: None, 'each', 'all' or a list of positions")
        return spec
    out = []
    for p in spec:
        p = int(p)
        q = p + T if p < 0 else p
        if not 0 <= q < T:
            raise ValueError(f"position {p} is outside the prompt's {T} tokens")
        out.append(q)
    if not out:
        raise ValueError("positions=[]: give at least one position")
    return out


def layout(pp: PatchParts, kind: str, positions: Any, T: int, tokens: Sequence[str]) -> Layout:
    """The grid of ``kind`` over ``positions`` (see the module docstring) for a ``T``-token prompt
    whose token labels are ``tokens``."""
    if kind not in KINDS:
        raise ValueError(f"sites={kind!r}: one of {', '.join(KINDS)}")
    mods = pp.sites(kind)
    spec = _positions(positions, kind, T)
    every = tuple(range(T))
    if kind == "heads" and spec == "all":
        row_sites = [Site(kind, layer, name) for layer, (name, _) in enumerate(mods)]
        cells = [Cell(r, h, Site(kind, r, mods[r][0], h), every) for r in range(len(mods)) for h in range(pp.n_heads)]
        return Layout(kind, [s.name for s in row_sites], [f"h{h}" for h in range(pp.n_heads)], cells,
                      [every] * pp.n_heads, row_sites)
    if kind == "heads":
        row_sites = [Site(kind, layer, name, h) for layer, (name, _) in enumerate(mods) for h in range(pp.n_heads)]
    else:
        row_sites = [Site(kind, layer, name) for layer, (name, _) in enumerate(mods)]
    cols: list[tuple[int, ...]] = [every] if spec == "all" else [(p,) for p in (range(T) if spec == "each" else spec)]
    labels = ["all" if c == every and spec == "all" else str(tokens[c[0]]) for c in cols]
    cells = [Cell(r, c, site, cols[c]) for r, site in enumerate(row_sites) for c in range(len(cols))]
    return Layout(kind, [s.name for s in row_sites], labels, cells, cols, row_sites)


def feature_shape(pp: PatchParts, kind: str, width: int) -> tuple[int, ...]:
    """The trailing shape of a kind's activation mask: heads as ``(H*d,)`` or TransformerLens' ``(H, 1)``."""
    if kind != "heads":
        return (1,)
    return (pp.n_heads, 1) if pp.heads_at == "output" else (width,)


def cell_masks(pp: PatchParts, cells: Sequence[Cell], start: int, T: int, width: int) -> torch.Tensor:
    """``(n, T - start, *feature)`` bool: where each cell's patch replaces its run's activation."""
    feat = feature_shape(pp, cells[0].site.kind if cells else "resid", width)
    mask = torch.zeros((len(cells), T - start, *feat), dtype=torch.bool)
    for i, cell in enumerate(cells):
        pos = [p - start for p in cell.positions]
        h = cell.site.head
        if h is None:
            mask[i, pos] = True
        elif pp.heads_at == "output":
            mask[i, pos, h] = True
        else:
            mask[i, pos, h * pp.head_dim:(h + 1) * pp.head_dim] = True
    return mask


def identical(pp: PatchParts, cells: Sequence[Cell], base: torch.Tensor, source: torch.Tensor) -> list[bool]:
    """Per cell: whether clean and corrupt hold exactly the same values where it would patch.
    ``base``/``source``: the layer's activations ``(1, T, ...)`` of the two runs."""
    differs = base[0] != source[0]
    out = []
    for cell in cells:
        d = differs[list(cell.positions)]
        h = cell.site.head
        if h is not None:
            d = d[:, h] if pp.heads_at == "output" else d[:, h * pp.head_dim:(h + 1) * pp.head_dim]
        out.append(not bool(d.any()))
    return out

