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
>>> meta, arrays = groups_payload(tree)    # compact: names as a tree, numbers as float32  # doctest: +SKIP

Pure computation (numpy only): no torch, no Jupyter.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..capture.names import split_call_name

__all__ = [
    "GROUPED_MIN_ROWS", "ROW_FIELDS", "SEVERITY", "STRIP_STATS", "Block", "Group", "GroupTree", "attach_residual",
    "group_history", "group_report", "group_rows", "groups_live", "groups_payload", "groups_view", "match", "residual_for",
    "split_module",
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
    from .thermometer import COLUMNS

    return group_rows(report.names, modules=report.modules, types=report.types, table=report.table, columns=COLUMNS,
                      flags=report.flags, residual=residual)


def group_history(history: Any, tree: GroupTree, max_slots: int = 256,
                  max_bytes: int = 256 * 1024) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top-level groups' blocks over the kept steps: ``steps`` int32 [K], ``blocks`` int32 [B]
    (indices into ``tree.blocks``) and float32 [K, B, :data:`HISTORY_STATS`] (the strip statistics
    of :func:`group_rows` from ``history``'s ``last`` values; the residual stream from
    :func:`~nbdebug.inspectors.residual.residual_history` on the residual's group). At most
    ``max_slots`` evenly spaced kept steps (the last always) and ``max_bytes`` of values."""
    from ..capture.history import FIELD_INDEX
    from .residual import residual_history

    blocks = [b for g in tree.groups if g.parent == -1 for b in g.blocks]
    K = len(history.step_index)
    n = min(K, max_slots, max(2, max_bytes // max(1, 4 * len(blocks) * len(HISTORY_STATS))))
    pick = np.unique(np.linspace(0, K - 1, n).round().astype(int)) if K else np.zeros(0, int)
    vals = history.values("last")[pick].astype(np.float64)
    pos = {name: i for i, name in enumerate(history.rows)}
    out = np.full((len(pick), len(blocks), len(HISTORY_STATS)), np.nan, dtype=np.float32)
    std_i, g_i = FIELD_INDEX["std"], FIELD_INDEX["grad_norm"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a block without values at a step gives NaN
        for j, b in enumerate(blocks):
            idx = [pos[tree.names[r]] for r in tree.blocks[b].rows if tree.names[r] in pos]
            if not idx:
                continue
            out[:, j, 0] = np.nanmean(vals[:, idx, std_i], axis=1)
            g = vals[:, idx, g_i]
            out[:, j, 1] = np.where(np.isfinite(g).any(axis=1), np.sqrt(np.nansum(g**2, axis=1)), np.nan)
    if tree.residual is not None and K:
        col = {b: j for j, b in enumerate(blocks)}
        bl = [b for b in tree.groups[tree.residual["group"]].blocks if b in col]
        out[:, [col[b] for b in bl], 2] = residual_history(history, [tree.blocks[b].name for b in bl])[pick]
    return history.step_index[pick].astype(np.int32), np.asarray(blocks, dtype=np.int32), out


def groups_view(report: Any, layers: Sequence[Any] | None = None, min_rows: int = GROUPED_MIN_ROWS,
                history: Any = None) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """What the thermometer widget syncs for its grouped view: :func:`groups_payload` of the
    report's rows with the residual stream (from ``layers``, ``CaptureResult.layers``, when the
    blocks' outputs were captured) and, with a ``history`` of 2+ kept steps, the blocks' strip
    statistics over the kept steps (``hist_steps``, ``hist_blocks``, ``hist_strip``: :func:`group_history`;
    meta ``hist_stats``); None
    below ``min_rows`` rows or when no block repeats."""
    if len(report.names) < min_rows:
        return None
    tree = group_report(report)
    if not tree.groups:
        return None
    res = residual_for(tree, layers) if layers is not None else None
    if res is not None:
        attach_residual(tree, res)
    meta, arrays = groups_payload(tree)
    meta["step"] = getattr(report, "step", None)  # the step the rows' values and flags are at (None: whole run)
    if history is not None and len(history.step_index) >= 2:
        arrays["hist_steps"], arrays["hist_blocks"], arrays["hist_strip"] = group_history(history, tree)
        meta["hist_stats"] = list(HISTORY_STATS)
    return meta, arrays


def groups_live(rows: Sequence[Any], min_rows: int = GROUPED_MIN_ROWS) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The grouped view of a running cell: :func:`groups_payload` of the tree of ``rows`` (a
    history's ``row_info``: name, module, type, shape) without values, flags or strips (NaN): the
    browser fills them from the history it holds, at the step slider's step. The residual stream
    is attached to the top-level group with the most blocks when their output rows are among
    ``rows`` (norms per step from the history); meta ``live`` is True. None below ``min_rows`` rows
    or when no block repeats."""
    from .residual import block_rows

    if len(rows) < min_rows:
        return None
    names = [str(r.get("name")) for r in rows]
    tree = group_rows(names, modules=[str(r.get("module") or "") for r in rows], types=[str(r.get("type") or "") for r in rows])
    if not tree.groups:
        return None
    top = [g for g in range(len(tree.groups)) if tree.groups[g].parent == -1]
    if top:
        g = max(top, key=lambda g: len(tree.groups[g].blocks))
        outs = block_rows(names, [tree.blocks[b].name for b in tree.groups[g].blocks])
        shapes = [tuple(rows[names.index(o)].get("shape") or ()) for o in outs if o is not None]
        if shapes:
            tree.residual = {"group": g, "d": int(shapes[0][-1]) if shapes[0] else 1, "largest_jump": None,
                             "first_nonfinite": None, "growth": [math.nan] * len(tree.groups[g].blocks), "notes": []}
    meta, arrays = groups_payload(tree)
    meta["step"], meta["live"] = None, True
    return meta, arrays


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


def groups_payload(tree: GroupTree) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The grouped view for the widget: small JSON plus binary arrays (``js/src/thermometer/groups.ts``;
    ``groups_step.ts`` re-aggregates the strips at the step slider's step from the history in the
    browser, with these formulas and ``severity``, which holds every flag of :data:`SEVERITY`).

    Names travel as a tree: node ``i`` is ``full(parent[i]) + strings[suffix[i]]`` (suffixes like
    ``".q_proj"``, ``"[0]"``, ``"#2"`` are stored once), so 1,600 rows cost a few kB of names.
    Arrays: ``name_parent``/``name_suffix`` int32 [N]; per row ``row_name``, ``row_module``
    (name nodes), ``row_type`` (string index), ``row_owner`` (block, -1 top) int32, ``row_flags``
    uint32, ``values`` float32 [R, ROW_FIELDS]; per group ``group_name``, ``group_parent``,
    ``group_first`` int32, ``group_flags`` uint32; per block ``block_name``, ``block_group``,
    ``block_index``, ``block_rows`` int32, ``block_flags`` uint32, ``strip`` float32 [B, STRIP_STATS];
    ``residual_growth`` float32 [blocks of the residual group] when there is a residual stream.
    """
    strings: dict[str, int] = {}
    parent: list[int] = []
    suffix: list[int] = []
    nodes: dict[str, int] = {}

    def sid(s: str) -> int:
        return strings.setdefault(s, len(strings))

    def node(path: str, rest: str = "") -> int:
        key = path + "\0" + rest
        if key in nodes:
            return nodes[key]
        if rest:
            p, s = node(path), rest
        elif "." in path:
            head, _, tail = path.rpartition(".")
            p, s = node(head), "." + tail
        else:
            p, s = -1, path
        nodes[key] = len(parent)
        parent.append(p)
        suffix.append(sid(s))
        return nodes[key]

    row_module = [node(m) for m in tree.modules]
    row_name = [node(m, name[len(m):]) if name.startswith(m) else node(name) for m, name in zip(tree.modules, tree.names)]
    i32 = lambda xs: np.asarray(xs, dtype=np.int32)  # noqa: E731
    arrays = {
        "row_name": i32(row_name),
        "row_module": i32(row_module),
        "row_type": i32([sid(t) for t in tree.types]),
        "row_owner": tree.owner.astype(np.int32),
        "row_flags": tree.row_flags.astype(np.uint32),
        "values": tree.values.astype(np.float32),
        "group_name": i32([node(g.name) for g in tree.groups]),
        "group_parent": i32([g.parent for g in tree.groups]),
        "group_first": i32([g.first for g in tree.groups]),
        "group_flags": np.asarray([g.flags for g in tree.groups], dtype=np.uint32),
        "block_name": i32([node(b.name) for b in tree.blocks]),
        "block_group": i32([b.group for b in tree.blocks]),
        "block_index": i32([b.index for b in tree.blocks]),
        "block_rows": i32([len(b.rows) for b in tree.blocks]),
        "block_flags": np.asarray([b.flags for b in tree.blocks], dtype=np.uint32),
        "strip": tree.strip.astype(np.float32),
    }
    arrays["name_parent"] = i32(parent)
    arrays["name_suffix"] = i32(suffix)
    meta: dict[str, Any] = {
        "version": 1,
        "strings": list(strings),
        "row_fields": list(ROW_FIELDS),
        "strip_stats": list(STRIP_STATS),
        "flag_codes": list(tree.flag_codes),
        # every known flag (the browser re-aggregates the strips at other steps, whose flags differ)
        "severity": {**SEVERITY, **{c: SEVERITY.get(c, 1) for c in tree.flag_codes}},
        "residual": None,
        "notes": list(tree.notes),
    }
    if tree.residual is not None:
        res = dict(tree.residual)
        arrays["residual_growth"] = np.asarray(res.pop("growth"), dtype=np.float32)
        meta["residual"] = res
    return meta, arrays
