"""Thermometer rows grouped by the module tree: repeated blocks collapse into one group per container.

A 32-block Llama gives ~1,600 rows named ``model.layers.0.self_attn.q_proj`` … ``model.layers.31.mlp.down_proj``.
Here every container whose numeric children hold sub-modules (``model.layers``, ``encoder.layer``,
``transformer.h``, ``blocks``, a MoE's ``experts``) becomes one :class:`Group` with one
:class:`Block` per index; the rest stays as plain rows in execution order (a model without repeats is
unchanged: one top-level item per row). A group's strip is one statistic per block
(:data:`STRIP_STATS`: the worst flag's severity, the mean std, the blocks' gradient norm, the residual
stream norm after the block…); flags are ORed upward (row → block → group); full names are kept for
hover and search (:func:`match`).

>>> tree = group_rows(report.names, modules=report.modules, types=report.types,     # doctest: +SKIP
...                   table=report.table, columns=COLUMNS, flags=report.flags)
>>> [g.name for g in tree.groups]                                                     # doctest: +SKIP
['model.layers']
>>> meta, arrays = groups_payload(tree)    # (groups_payload.py) compact: names as a tree, numbers as float32  # doctest: +SKIP

The tree is built here; what the widgets sync of it is in :mod:`nbdebug.inspectors.groups_payload`;
:mod:`nbdebug.inspectors.groups` is the public face of both. Pure computation (numpy only): no
torch, no Jupyter.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..capture.names import split_call_name
from .report import COLUMNS

__all__ = [
    "GROUPED_MIN_ROWS", "HISTORY_STATS", "ROW_FIELDS", "SEVERITY", "STRIP_STATS", "Block", "Group", "GroupTree",
    "attach_residual", "group_report", "group_rows", "match", "residual_for", "split_module",
]

#: per-row statistics sent to the grouped view (in this order), from the thermometer's table columns
ROW_FIELDS: tuple[str, ...] = ("mean", "std", "min", "max", "zero_frac", "nan", "inf", "grad_norm", "update_ratio")
#: per-block statistics of a group's strip (in this order)
STRIP_STATS: tuple[str, ...] = ("severity", "std", "absmax", "grad_norm", "zero_frac", "nonfinite", "residual")
#: how bad a flag is (0: no flag); a block's "severity" is its worst row's; unknown flags count 1
SEVERITY: dict[str, int] = {
    "raised": 3, "nan_origin_fwd": 3, "nan_origin_bwd": 3, "nonfinite": 3,
    "exploding": 2, "dead": 2,
    "vanishing": 1, "saturated": 1, "dead_units": 1, "update_ratio": 1,
}
#: strip statistics kept per kept step for the blocks' sparklines (``group_history``)
HISTORY_STATS: tuple[str, ...] = ("std", "grad_norm", "residual")
#: the thermometer offers the grouped view from this many rows on (and only when something repeats)
GROUPED_MIN_ROWS = 100
_LEAF = re.compile(r"[\[#]")


@dataclass
class Group:
    """A container of repeated blocks (``model.layers``): ``blocks`` indexes :attr:`GroupTree.blocks`
    in numeric order; ``parent`` is the enclosing block (-1: top level); ``first`` its first row."""

    name: str
    parent: int
    blocks: list[int] = field(default_factory=list)
    flags: int = 0
    first: int = 0


@dataclass
class Block:
    """One index of a group (``model.layers.3``): ``rows`` every row inside it (nested groups
    included, execution order); ``items`` what it shows when expanded: ``("row", r)`` and
    ``("group", g)`` in execution order."""

    name: str
    index: int
    group: int
    rows: list[int] = field(default_factory=list)
    items: list[tuple[str, int]] = field(default_factory=list)
    flags: int = 0


@dataclass
class GroupTree:
    """The grouped rows. ``owner[r]`` is the innermost block holding row ``r`` (-1: top level);
    ``top`` the top-level items; ``values`` float32 [R, :data:`ROW_FIELDS`]; ``row_flags`` bitmask
    over ``flag_codes``; ``strip`` float32 [blocks, :data:`STRIP_STATS`]; ``residual`` the residual
    stream attached to its group (``{"group", "d", "largest_jump", "first_nonfinite", "notes"}``)."""

    names: list[str]
    modules: list[str]
    types: list[str]
    values: np.ndarray
    flag_codes: list[str]
    row_flags: np.ndarray
    owner: np.ndarray
    groups: list[Group]
    blocks: list[Block]
    top: list[tuple[str, int]]
    strip: np.ndarray
    residual: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def group_of(self, name: str) -> Group:
        """The group whose container is ``name`` (KeyError listing the groups)."""
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no group {name!r}; groups: {[g.name for g in self.groups]}")

    def row_flags_of(self, r: int) -> list[str]:
        bits = int(self.row_flags[r])
        return [c for i, c in enumerate(self.flag_codes) if bits >> i & 1]


def split_module(name: str) -> tuple[str, str]:
    """A row name without its module's name: ``"block.0[1]#2"`` → ``("block.0", "[1]#2")``,
    ``"relu#2"`` → ``("relu", "#2")`` (used when rows do not say their module)."""
    base = split_call_name(name)[0]
    m = _LEAF.search(base)
    module = base[: m.start()] if m and m.start() > 0 else base
    return module, name[len(module):]


class _Node:
    __slots__ = ("children", "deep", "rows")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.rows: list[int] = []  # rows whose module is exactly this node
        self.deep = False  # some row's module is strictly below this node


def group_rows(names: Sequence[str], *, modules: Sequence[str] | None = None, types: Sequence[str] | None = None,
               table: np.ndarray | None = None, columns: Sequence[str] = (), flags: Sequence[Sequence[str]] | None = None,
               residual: Any = None) -> GroupTree:
    """Group thermometer rows by their module tree.

    ``modules[r]`` is row ``r``'s module (else parsed from the name: :func:`split_module`);
    ``table`` [R, len(columns)] the thermometer's stats (NaN where missing); ``flags`` per row;
    ``residual`` an :class:`~nbdebug.inspectors.residual.ResidualStream` shown as the strip
    statistic ``"residual"`` of the group holding its blocks.
    """
    n = len(names)
    mods = [str(m) if m else split_module(str(x))[0] for m, x in zip(modules, names)] if modules is not None else [
        split_module(str(x))[0] for x in names]
    root = _Node()
    for r, m in enumerate(mods):
        node = root
        for seg in m.split("."):
            node.deep = True
            node = node.children.setdefault(seg, _Node())
        node.rows.append(r)

    groups: list[Group] = []
    blocks: list[Block] = []
    owner = np.full(n, -1, dtype=np.int32)

    def walk(node: _Node, path: str, own: int) -> None:
        for r in node.rows:
            owner[r] = own
        numeric = [(int(k), k, c) for k, c in node.children.items() if k.isascii() and k.isdigit() and c.deep]
        members = {k for _, k, _ in numeric} if len(numeric) >= 2 else set()
        if members:
            g = len(groups)
            groups.append(Group(name=path, parent=own))
            for i, k, child in sorted(numeric):
                groups[g].blocks.append(len(blocks))
                blocks.append(Block(name=f"{path}.{k}" if path else k, index=i, group=g))
                walk(child, blocks[-1].name, len(blocks) - 1)
        for k, child in node.children.items():
            if k not in members:
                walk(child, f"{path}.{k}" if path else k, own)

    walk(root, "", -1)

    # rows of each block (nested ones included), first rows, items in execution order
    parent_block = [groups[b.group].parent for b in blocks]
    for r in range(n):
        b = int(owner[r])
        while b >= 0:
            blocks[b].rows.append(r)
            b = parent_block[b]
    for g in groups:
        g.first = min((blocks[b].rows[0] for b in g.blocks if blocks[b].rows), default=n)
    top: list[tuple[str, int]] = []
    for r in range(n):
        (blocks[owner[r]].items if owner[r] >= 0 else top).append(("row", r))
    for gi, g in enumerate(groups):
        (blocks[g.parent].items if g.parent >= 0 else top).append(("group", gi))
    key = lambda it: it[1] if it[0] == "row" else groups[it[1]].first  # noqa: E731
    top.sort(key=key)
    for b in blocks:
        b.items.sort(key=key)

    values = _row_values(n, table, columns)
    codes, row_flags = _flag_bits(flags, n)
    for b in blocks:
        for r in b.rows:
            b.flags |= int(row_flags[r])
    for g in groups:
        for b in g.blocks:
            g.flags |= blocks[b].flags
    sev = np.array([max((SEVERITY.get(c, 1) for i, c in enumerate(codes) if int(f) >> i & 1), default=0)
                    for f in row_flags], dtype=np.float32)
    strip = _strip(blocks, values, sev)
    tree = GroupTree(names=[str(x) for x in names], modules=mods, types=[str(t) for t in types] if types is not None else [""] * n,
                     values=values, flag_codes=codes, row_flags=row_flags, owner=owner, groups=groups, blocks=blocks,
                     top=top, strip=strip)
    if residual is not None:
        attach_residual(tree, residual)
    return tree


def group_report(report: Any, residual: Any = None) -> GroupTree:
    """:func:`group_rows` of a :class:`~nbdebug.inspectors.thermometer.ThermometerReport` (its rows,
    table and flags at the report's step)."""
    return group_rows(report.names, modules=report.modules, types=report.types, table=report.table, columns=COLUMNS,
                      flags=report.flags, residual=residual)


def _row_values(n: int, table: np.ndarray | None, columns: Sequence[str]) -> np.ndarray:
    out = np.full((n, len(ROW_FIELDS)), np.nan, dtype=np.float32)
    if table is None or n == 0:
        return out
    t = np.asarray(table, dtype=np.float64).reshape(n, len(columns))
    for j, f in enumerate(ROW_FIELDS):
        if f in columns:
            out[:, j] = t[:, list(columns).index(f)]
    return out


def _flag_bits(flags: Sequence[Sequence[str]] | None, n: int) -> tuple[list[str], np.ndarray]:
    """Flag codes in order of first appearance (severity order is not needed: bits are per code)."""
    codes: list[str] = []
    bits = np.zeros(n, dtype=np.uint32)
    for r, fl in enumerate(flags or ()):
        for c in fl:
            if c not in codes:
                if len(codes) == 32:
                    raise ValueError("more than 32 distinct flag codes")
                codes.append(str(c))
            bits[r] |= np.uint32(1 << codes.index(c))
    return codes, bits


def _strip(blocks: list[Block], values: np.ndarray, sev: np.ndarray) -> np.ndarray:
    """One value per block and :data:`STRIP_STATS` entry (NaN where no row has the statistic)."""
    F = {f: i for i, f in enumerate(ROW_FIELDS)}
    out = np.full((len(blocks), len(STRIP_STATS)), np.nan, dtype=np.float32)

    def finite(a: np.ndarray) -> np.ndarray:
        return a[np.isfinite(a)]

    for i, b in enumerate(blocks):
        if not b.rows:
            continue
        v = values[b.rows].astype(np.float64)
        out[i, 0] = sev[b.rows].max()
        std = finite(v[:, F["std"]])
        if std.size:
            out[i, 1] = std.mean()
        ext = finite(np.abs(v[:, [F["min"], F["max"]]]).ravel())
        if ext.size:
            out[i, 2] = ext.max()
        g = finite(v[:, F["grad_norm"]])
        if g.size:
            out[i, 3] = np.sqrt((g**2).sum())
        z = finite(v[:, F["zero_frac"]])
        if z.size:
            out[i, 4] = z.mean()
        out[i, 5] = np.nan_to_num(v[:, [F["nan"], F["inf"]]], nan=0.0).sum()
    return out


def residual_for(tree: GroupTree, layers: Sequence[Any]) -> Any:
    """The residual stream of the top-level group with the most blocks (a language model's block
    list), read from its blocks' own output rows among ``layers`` (``CaptureResult.layers``);
    None when no block output was captured (the capture took leaf modules only)."""
    from .residual import block_rows, residual_stream

    top = [g for g in tree.groups if g.parent == -1]
    if not top:
        return None
    g = max(top, key=lambda g: len(g.blocks))
    blocks = [tree.blocks[b].name for b in g.blocks]
    if not any(block_rows([r.name for r in layers], blocks)):
        return None
    return residual_stream(layers, blocks)


def attach_residual(tree: GroupTree, res: Any) -> None:
    """Put ``res.norm`` (per block name; a :class:`~nbdebug.inspectors.residual.ResidualStream`)
    into the ``"residual"`` strip of the group holding those blocks, with its largest jump."""
    by_name = {b.name: i for i, b in enumerate(tree.blocks)}
    hits = [(by_name[name], float(v)) for name, v in zip(res.blocks, res.norm) if name in by_name]
    if not hits:
        tree.notes.append("residual stream: its blocks are not among the grouped rows' blocks")
        return
    col = STRIP_STATS.index("residual")
    for b, v in hits:
        tree.strip[b, col] = v
    g = tree.blocks[hits[0][0]].group
    pos = {name: j for j, name in enumerate(res.blocks)}
    jump, first = res.largest_jump, res.first_nonfinite
    tree.residual = {
        "group": g, "d": int(res.d),
        "largest_jump": None if jump is None else res.blocks[jump],
        "first_nonfinite": None if first is None else res.blocks[first],
        "growth": [float(res.growth[pos[tree.blocks[b].name]]) if tree.blocks[b].name in pos else float("nan")
                   for b in tree.groups[g].blocks],
        "notes": list(res.notes),
    }


def match(tree: GroupTree, query: str) -> list[int]:
    """Rows matching every word of ``query`` (case-insensitive) in the full name, the type or a flag
    code; ``type:Linear`` / ``flag:dead`` / ``name:q_proj`` look in one place only."""
    words = query.lower().split()
    out = []
    for r, name in enumerate(tree.names):
        hay = {"name": name.lower(), "type": tree.types[r].lower(), "flag": " ".join(tree.row_flags_of(r)).lower()}
        ok = True
        for w in words:
            where, sep, what = w.partition(":")
            if sep and where in hay:
                ok = what in hay[where]
            else:
                ok = any(w in h for h in hay.values())
            if not ok:
                break
        if ok:
            out.append(r)
    return out
