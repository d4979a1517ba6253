"""Headlines of the token-attribution and patching views (pure: plain numbers in, one sentence out).

**Attribution** (:func:`attribution_headline`), in this order, the first that holds:

1. integrated gradients that misses completeness by more than 5 % (``converged`` False): the scores do
   not add up to the metric's change, so the sentence says that and offers more steps / the first token
   kept, and names no token;
2. a deletion area no better than random orders' (``deletion ≥ random − MARGIN``, both on the metric
   normalised to 1 with nothing replaced and 0 with every token replaced): deleting the top-scored tokens
   first lowers the metric no faster than chance, so the scores are not read; the next method to try is
   offered (:func:`next_method`: gradient × input → integrated gradients with the first token kept →
   occlusion);
3. otherwise the finding: the tokens that push the metric up most, then the area against random.

**Patching** (:func:`patch_headline`): per block (grid row), the position (column) with the largest
effect, among rows where it is at least :data:`SHOWN` (0.05); consecutive rows with the same position
merge into one run of blocks ("restored by 'iffel' in blocks 0–23 and by ' of' from block 24"). A grid
with no effect ≥ 0.05 says nothing is restored; an attribution (estimated) grid says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .attention import display_token

__all__ = ["MARGIN", "SHOWN", "attribution_headline", "block_labels", "next_method", "patch_headline", "patch_runs"]

#: a deletion area within this of random orders' (normalised metric) is "no better than random"
MARGIN = 0.05
#: effects below this (in absolute value) are not printed in a cell, nor named in the headline
SHOWN = 0.05

_LABELS = {"grad_x_input": "gradient × input", "integrated_gradients": "integrated gradients", "occlusion": "occlusion"}


def next_method(method: str, fix_first: bool) -> dict[str, Any] | None:
    """The method to try when ``method`` is no better than random: ``{"method", "fix_first", "text"}``."""
    if method == "grad_x_input" or (method == "integrated_gradients" and not fix_first):
        return {"method": "integrated_gradients", "fix_first": True,
                "text": "integrated gradients with the first token kept in the baseline"}
    if method == "integrated_gradients":
        return {"method": "occlusion", "fix_first": fix_first, "text": "occlusion"}
    if method == "occlusion":
        return {"method": "integrated_gradients", "fix_first": True,
                "text": "integrated gradients with the first token kept in the baseline"}
    return None


def attribution_headline(d: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The headline of one attribution (``Attribution.to_dict()``) and the method it offers (or None)."""
    method = str(d.get("method", ""))
    name = _LABELS.get(method, method)
    label = str(d.get("label", "the metric"))
    fix_first = "first token fixed" in str(d.get("baseline", ""))
    if d.get("converged") is False:
        rel = d.get("relative_delta")
        miss = f"{rel:.0%}" if isinstance(rel, float) and np.isfinite(rel) else "more than 5%"
        offer = {"method": method, "fix_first": True, "text": "integrated gradients with the first token kept in the baseline"}
        return (f"{name}: the scores do not add up to the change of {label} (they miss it by {miss}): more steps or the "
                "first token kept in the baseline before reading them", None if fix_first else offer)
    faith = d.get("faithfulness") or {}
    dele, rnd = faith.get("deletion"), faith.get("random")
    if dele is not None and rnd is not None and dele >= rnd - MARGIN:
        offer = next_method(method, fix_first)
        tail = f"; try {offer['text']}" if offer else ""
        return (f"{name} is no better than random here: deleting its top tokens first lowers {label} no faster than "
                f"random orders (deletion area {dele:.3f} vs random {rnd:.3f}), so don't read these scores{tail}", offer)
    scores = np.asarray(d.get("scores") or [], np.float64)
    tokens = [display_token(str(t)) for t in d.get("tokens") or []]
    up = [i for i in np.argsort(-scores, kind="stable") if scores[i] > 0][:2]
    if not up:
        lead = f"{name}: no token pushes {label} up"
    else:
        lead = f"'{tokens[up[0]]}' pushes {label} up most ({scores[up[0]]:+.2f})"
        if len(up) > 1:
            lead += f", then '{tokens[up[1]]}' ({scores[up[1]]:+.2f})"
        lead += f" ({name})"
    if dele is not None and rnd is not None:
        lead += f"; deleting tokens in this order lowers it faster than random (area {dele:.3f} vs {rnd:.3f})"
    else:
        lead += "; faithfulness not measured"
    return lead, None


def block_labels(rows: Sequence[str], kinds: Sequence[str], layers: Sequence[int], heads: Sequence[int | None]) -> list[str]:
    """What each grid row is: ``resid`` rows are block inputs ("block 3 input"), ``attn``/``mlp`` rows a
    block's attention / MLP output, ``heads`` rows one head ("block 3 head 5"); other kinds keep the name."""
    out = []
    for name, kind, layer, head in zip(rows, kinds, layers, heads):
        if kind == "resid":
            out.append(f"block {layer} input")
        elif kind in ("attn", "mlp"):
            out.append(f"block {layer} {kind} out")
        elif kind == "heads" and head is not None:
            out.append(f"block {layer} head {head}")
        else:
            out.append(str(name))
    return out


def patch_runs(effect: np.ndarray, columns: Sequence[str]) -> list[tuple[int, int, int, float]]:
    """``(first row, last row, column, peak effect)`` runs: per row the column with the largest effect
    (rows whose largest is below :data:`SHOWN` left out), consecutive rows with the same column merged."""
    e = np.where(np.isfinite(effect), effect, -np.inf)
    runs: list[tuple[int, int, int, float]] = []
    for r in range(e.shape[0]):
        c = int(np.argmax(e[r])) if e.shape[1] else 0
        v = float(e[r, c]) if e.shape[1] else -np.inf
        if v < SHOWN:
            continue
        if runs and runs[-1][2] == c and runs[-1][1] == r - 1:
            a, _, _, p = runs[-1]
            runs[-1] = (a, r, c, max(p, v))
        else:
            runs.append((r, r, c, v))
    return runs


def patch_headline(effect: np.ndarray, columns: Sequence[str], answer: str, row_blocks: Sequence[int], sites: str,
                   *, estimate: bool = False, n_blocks: int | None = None, labels: Sequence[str] = ()) -> str:
    """"'␣Paris' is restored by 'iffel' in blocks 0–23 and by '␣of' from block 24" (see the module doc).
    ``row_blocks``: each row's block index; ``n_blocks`` the model's (the last run says "from block k");
    ``labels`` the rows' names (heads: the three strongest heads are named instead of runs of blocks)."""
    e = np.asarray(effect, np.float64)
    runs = patch_runs(e, columns)
    what = {"resid": "", "attn": " through attention outputs", "mlp": " through MLP outputs", "heads": " through heads"}.get(sites, "")
    est = " (attribution estimate)" if estimate else ""
    if not runs:
        return f"no single site restores {answer}{what}: every effect is below {SHOWN:g}{est}"
    if sites == "heads" and labels:
        flat = np.where(np.isfinite(e), e, -np.inf)
        order = [int(i) for i in np.argsort(-flat, axis=None, kind="stable")[:3] if flat.flat[int(i)] >= SHOWN]
        named = [f"{labels[i // e.shape[1]]} at '{columns[i % e.shape[1]]}' ({flat.flat[i]:.2f})" for i in order]
        return f"{answer} is restored most by " + ", then ".join(named) + est
    last_block = (n_blocks - 1) if n_blocks else max(row_blocks)
    parts = []
    for i, (a, b, c, _p) in enumerate(runs):
        ba, bb = row_blocks[a], row_blocks[b]
        tok = f"'{columns[c]}'"
        if bb == last_block and ba != bb and i == len(runs) - 1:
            where = f"from block {ba}"
        else:
            where = f"block {ba}" if ba == bb else f"blocks {ba}–{bb}"
        parts.append(f"by {tok} in {where}" if not where.startswith("from") else f"by {tok} {where}")
    body = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    if len(parts) > 4:
        body = ", ".join(parts[:3]) + f" and {len(parts) - 3} more runs of blocks"
    return f"{answer} is restored{what} {body}{est}"
