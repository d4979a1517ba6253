"""Which attention heads are unusual for *this* model, and the sentence the attention view leads with.

Attention sinks (most of a head's attention on the first token, ``[CLS]`` or ``[SEP]``) are normal in
trained transformers: SmolLM2-135M has 228 of its 270 heads sinking on "The capital of France is".
So a head is never judged against a fixed threshold; it is compared with the model's own heads.

The rule (:data:`RULE`, shown in the view's details): for each statistic of :data:`KINDS` over all
``L × H`` heads, take the median ``m`` and the median absolute deviation ``MAD``; a head's robust
z-score is ``z = (x − m) / max(1.4826·MAD, 0.05)`` in the statistic's unusual direction. A head is an
outlier on that statistic when ``z ≥ 3.5`` (Iglewicz and Hoaglin's cut-off for the modified z-score)
and it differs from ``m`` by at least 0.25 (a quarter of its attention: narrow spreads never flag).
A head outlying on several statistics is described by its largest ``z`` among the pattern statistics
(sink, previous token, own token, one token); the entropy statistics speak only when none of those
does. Fewer than :data:`MIN_HEADS` heads are too few to compare.

>>> f = head_findings(metrics, col_mass, labels, sink_positions=[0], sink_label="[CLS]")   # doctest: +SKIP
>>> f.sentence
'4 of 72 heads stand out: L0H2 attends to the previous token (100%; typical head here: 5%); ...'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .events import fmt_p

__all__ = ["KINDS", "MIN_HEADS", "RULE", "HeadFindings", "HeadOutlier", "head_findings"]

#: robust z-score from which a head is unusual for its model
Z_MIN = 3.5
#: the smallest difference from the model's typical head that counts (fraction of attention / of max entropy)
DIFF_MIN = 0.25
#: floor of the robust spread (1.4826·MAD): when nearly every head has the same value, a head must
#: still be DIFF_MIN away, not a hair
SCALE_FLOOR = 0.05
#: below this many heads, there is no "typical head" to compare with
MIN_HEADS = 4
#: heads described with their reason in the sentence; the others are named by label (each prints its
#: reason under its thumbnail, :attr:`HeadOutlier.short`), never hidden behind "and N more"
NAMED = 4
#: heads past :data:`NAMED` listed by label in the sentence (the others are counted; all are outlined)
LISTED = 12


@dataclass(frozen=True)
class Kind:
    """A per-head statistic the rule compares: its name, the unusual direction, and whether it is a pattern."""

    name: str
    direction: int  # +1: unusually high, -1: unusually low
    pattern: bool


#: the statistics compared, in the order ties are described
KINDS = (
    Kind("prev_token", +1, True),
    Kind("self", +1, True),
    Kind("focus", +1, True),
    Kind("sink", +1, True),
    Kind("spread", +1, False),
    Kind("sharp", -1, False),
)

RULE = (
    "A head is coloured when it is unusual for this model, not by a fixed threshold: for each statistic "
    "(mass on the sink tokens, on the previous token, on its own token, on its most-attended other token, "
    "and entropy / its maximum) a robust z-score against all of the model's heads, "
    "z = (x − median) / max(1.4826·MAD, 0.05), must reach 3.5 and the head must differ from the median "
    "by at least 25 points. Sinks on the first token, [CLS] or [SEP] are normal in trained models: "
    "they are marked in grey, and only coloured when few heads of this model sink."
)


@dataclass
class HeadOutlier:
    """One unusual head: the statistic that makes it so, its value, the model's typical value and ``z``."""

    layer: int
    head: int
    kind: str
    value: float
    typical: float
    z: float
    text: str
    token: int = -1  # the attended position for kind "focus"
    token_label: str = ""  # its readable label (kind "focus")

    @property
    def label(self) -> str:
        """``"L4H2"``."""
        return f"L{self.layer}H{self.head}"

    @property
    def short(self) -> str:
        """The reason in a few characters, printed under the head's thumbnail: the same statistic and
        value the sentence gives (``"prev 100%"``, ``"self 97%"``, ``"sink 95%"``, ``"flat 98%"``,
        ``"sharp 4%"``; for one token its label, cut to 8 characters: ``"␣Paris 58%"``)."""
        if self.kind == "focus":
            return f"{_cut(self.token_label, 8)} {_pct(self.value)}"
        return f"{_SHORT[self.kind]} {_pct(self.value)}"

    def to_json(self) -> dict[str, object]:
        """Plain values for a widget trait."""
        return {"layer": self.layer, "head": self.head, "kind": self.kind, "value": round(self.value, 4),
                "typical": round(self.typical, 4), "z": round(self.z, 2), "text": self.text, "token": self.token,
                "short": self.short}


@dataclass
class HeadFindings:
    """The outliers (largest ``z`` first), an ``(L, H)`` mask of them, each statistic's typical value
    (the model's median), and the header sentence."""

    outliers: list[HeadOutlier]
    mask: np.ndarray
    typical: dict[str, float]
    sentence: str
    n_heads: int
    rule: str = RULE
    compared: bool = True  # False: too few heads (or tokens) to compare
    by_head: dict[tuple[int, int], HeadOutlier] = field(default_factory=dict, repr=False)

    def of(self, layer: int, head: int) -> HeadOutlier | None:
        """The outlier record of one head, or None when it is typical."""
        return self.by_head.get((layer, head))


def _pct(x: float) -> str:
    """A share of attention written as every probability is (:func:`~nbdebug.inspectors.events.fmt_p`)."""
    return fmt_p(x)


#: the few characters under a thumbnail, per statistic (kind "focus" prints the token instead)
_SHORT = {"prev_token": "prev", "self": "self", "sink": "sink", "spread": "flat", "sharp": "sharp"}


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _describe(kind: str, value: float, typical: float, token_label: str, sink_label: str) -> str:
    v, t = _pct(value), _pct(typical)
    if kind == "prev_token":
        return f"attends to the previous token ({v}; typical head here: {t})"
    if kind == "self":
        return f"attends to its own token ({v}; typical head here: {t})"
    if kind == "focus":
        return f"attends to {token_label} ({v}; typical head's strongest other token: {t})"
    if kind == "sink":
        return f"puts {v} on {sink_label} (typical head here: {t})"
    if kind == "spread":
        return f"spreads its attention evenly (entropy {v} of its maximum; typical head here: {t})"
    return f"attends sharply (entropy {v} of its maximum; typical head here: {t})"


def _statistics(metrics: dict[str, np.ndarray], col_mass: np.ndarray, sinks: list[int]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``{kind: (L, H)}`` values and the ``(L, H)`` position each head attends to most outside the sinks."""
    other = col_mass.copy()
    if sinks:
        other[:, :, sinks] = 0
    stats = {
        "prev_token": metrics["prev_token"],
        "self": metrics["diagonal"],
        "focus": other.max(-1),
        "sink": metrics["first_mass"] + metrics["sep_mass"],
        "spread": metrics["norm_entropy"],
        "sharp": metrics["norm_entropy"],
    }
    return {k: np.asarray(v, np.float64) for k, v in stats.items()}, other.argmax(-1)


def head_findings(
    metrics: dict[str, np.ndarray],
    col_mass: np.ndarray,
    labels: Sequence[str],
    *,
    sink_positions: Sequence[int] = (0,),
    sink_label: str = "the first token",
) -> HeadFindings:
    """Outlier heads of one model by the rule of this module (:data:`RULE`).

    ``metrics``: the ``(L, H)`` arrays of :data:`~nbdebug.inspectors.attention.METRICS`; ``col_mass``
    ``(L, H, T)``: mean attention each key receives; ``labels``: readable tokens (for "attends to
    '␣France'"); ``sink_positions``: the first token and any [SEP]/EOS (left out of "one token").
    """
    L, H, T = col_mass.shape
    n = L * H
    sinks = sorted({int(p) for p in sink_positions if 0 <= int(p) < T})
    if n < MIN_HEADS or T < 3:
        why = f"{n} head{'s' if n != 1 else ''}" if n < MIN_HEADS else f"{T} token{'s' if T != 1 else ''}"
        return HeadFindings([], np.zeros((L, H), bool), {}, f"Too few to compare ({why}): no head is marked as unusual.",
                            n, compared=False)
    stats, focus_pos = _statistics(metrics, col_mass, sinks)
    best: dict[tuple[int, int], tuple[bool, float, str]] = {}  # (pattern, z, kind) of the head's strongest outlier
    typical: dict[str, float] = {}
    zs: dict[str, np.ndarray] = {}
    for kind in KINDS:
        x = stats[kind.name]
        med = float(np.median(x))
        scale = max(1.4826 * float(np.median(np.abs(x - med))), SCALE_FLOOR)
        typical[kind.name] = med
        z = kind.direction * (x - med) / scale
        zs[kind.name] = z
        hit = (z >= Z_MIN) & (kind.direction * (x - med) >= DIFF_MIN)
        for layer, head in np.argwhere(hit):
            key = (int(layer), int(head))
            cand = (kind.pattern, float(z[layer, head]), kind.name)
            if key not in best or cand[:2] > best[key][:2]:
                best[key] = cand
    outliers = []
    for (layer, head), (_pattern, z, kind) in best.items():
        value = float(stats[kind][layer, head])
        tok = int(focus_pos[layer, head]) if kind == "focus" else -1
        label = f"{labels[tok]!r} [{tok}]" if 0 <= tok < len(labels) else f"token {tok}"
        text = _describe(kind, value, typical[kind], label, sink_label)
        tok_label = str(labels[tok]) if 0 <= tok < len(labels) else (f"#{tok}" if tok >= 0 else "")
        outliers.append(HeadOutlier(layer, head, kind, value, typical[kind], z, text, tok, tok_label))
    outliers.sort(key=lambda o: (-o.z, o.layer, o.head))
    mask = np.zeros((L, H), bool)
    for o in outliers:
        mask[o.layer, o.head] = True
    return HeadFindings(outliers, mask, typical, _sentence(outliers, n), n,
                        by_head={(o.layer, o.head): o for o in outliers})


def _sentence(outliers: list[HeadOutlier], n: int) -> str:
    if not outliers:
        return f"No head stands out: each of the {n} heads is close to this model's typical head."
    k = len(outliers)
    named = "; ".join(f"{o.label} {o.text}" for o in outliers[:NAMED])
    rest = [o.label for o in outliers[NAMED:]]
    more = ""
    if rest:
        shown = rest if len(rest) <= LISTED + 1 else [*rest[:LISTED], f"{len(rest) - LISTED} others"]
        listed = ", ".join(shown[:-1]) + f" and {shown[-1]}" if len(shown) > 1 else shown[0]
        more = f"; also {listed}, each with its reason under it in the grid"
    verb = "stands" if k == 1 else "stand"
    return f"{k} of {n} heads {verb} out: {named}{more}."
