"""Thermometer rows grouped by the module tree: the public face of the grouped view.

Repeated blocks (``model.layers.0`` … ``model.layers.31``) collapse into one group per container
with a per-block strip; the rest stays as plain rows in execution order. The tree and its
statistics are built in :mod:`nbdebug.inspectors.group_tree` (:func:`group_rows`,
:func:`group_report`, :func:`match`, the residual stream's strip); what the widgets sync of it in
:mod:`nbdebug.inspectors.groups_payload` (:func:`groups_payload`, :func:`groups_view`,
:func:`groups_live`, :func:`group_history`). Both are importable from here.

>>> tree = group_report(report)                       # doctest: +SKIP
>>> meta, arrays = groups_payload(tree)               # doctest: +SKIP
"""

from __future__ import annotations

from .group_tree import (
    GROUPED_MIN_ROWS,
    HISTORY_STATS,
    ROW_FIELDS,
    SEVERITY,
    STRIP_STATS,
    Block,
    Group,
    GroupTree,
    attach_residual,
    group_report,
    group_rows,
    match,
    residual_for,
    split_module,
)
from .groups_payload import group_history, groups_live, groups_payload, groups_view

__all__ = [
    "GROUPED_MIN_ROWS", "HISTORY_STATS", "ROW_FIELDS", "SEVERITY", "STRIP_STATS", "Block", "Group", "GroupTree",
    "attach_residual", "group_history", "group_report", "group_rows", "groups_live", "groups_payload", "groups_view",
    "match", "residual_for", "split_module",
]
