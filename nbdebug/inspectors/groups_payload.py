"""What the widgets sync of the grouped view (of a :mod:`nbdebug.inspectors.group_tree` tree;
:mod:`nbdebug.inspectors.groups` re-exports these names): :func:`groups_payload` (names as a tree, numbers as float32),
:func:`groups_view` (the thermometer's grouped view of a report, with the blocks' strips over the
kept steps from :func:`group_history`) and :func:`groups_live` (the tree of a running cell's rows).

Pure computation (numpy only): no torch, no Jupyter.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from .group_tree import (
    GROUPED_MIN_ROWS,
    HISTORY_STATS,
    ROW_FIELDS,
    SEVERITY,
    STRIP_STATS,
    GroupTree,
    attach_residual,
    group_report,
    group_rows,
    residual_for,
)

__all__ = ["group_history", "groups_live", "groups_payload", "groups_view"]


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
