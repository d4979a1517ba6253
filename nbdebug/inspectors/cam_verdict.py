"""The CAM methods panel's verdict (pure): sanity before rank, ties shown as ties, one sentence.

Inputs are the panel's own numbers: per method its four faithfulness areas (``auc[method][metric]``,
:mod:`nbdebug.inspectors.faithfulness`) and, with ``--sanity``, its Spearman ρ against the map of the
re-initialised model (:mod:`nbdebug.inspectors.sanity`; flagged at ρ ≥ 0.9: the map "does not depend on
the class decision").

- **Sanity before rank**: a method that fails the sanity check is ranked after every method that passes
  it, however good its faithfulness areas (a map that ignores the decision can still delete the object
  first: eigencam, the first principal component of the activations, often does).
- **Score**: ``insertion − deletion + road_lerf − road_morf`` (higher is better), as
  :func:`~nbdebug.inspectors.faithfulness.rank_methods`.
- **Ties**: methods whose deletion and insertion areas agree to :data:`TIE` rank their pixels the same
  way (e.g. gradcam, hirescam and xgradcam give the same map on a layer followed by global pooling):
  they share one rank, ROAD's imputation noise does not break the tie, and the score of the group is
  its mean.
- **Verdict**: the most faithful group that passes the sanity check, named; the methods that fail it,
  named; "every method fails" when none passes; "not checked" when ``--sanity`` was not asked.

>>> auc = {"a": {"deletion": 0.2, "insertion": 0.8, "road_morf": 0.3, "road_lerf": 0.5},
...        "b": {"deletion": 0.1, "insertion": 0.9, "road_morf": 0.2, "road_lerf": 0.6}}
>>> [(r.method, r.rank) for r in rank_cams(auc, {"b": 0.99})]
[('a', 1), ('b', 2)]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .events import fmt_p
from .sanity import THRESHOLD

__all__ = ["TIE", "CamRank", "cam_headline", "gradcam_headline", "rank_cams"]

#: deletion and insertion areas this close: the same pixel order (a tie)
TIE = 1e-6


@dataclass(frozen=True)
class CamRank:
    """One method's place: ``rank`` (1 = best; tied methods share it), ``tied`` with the methods named,
    ``failed`` the sanity check (ρ ≥ 0.9; None: not checked), ``score``, ``rho``."""

    method: str
    rank: int
    tied: tuple[str, ...]
    failed: bool | None
    score: float
    rho: float | None

    def as_json(self) -> dict[str, object]:
        return {"method": self.method, "rank": self.rank, "tied": list(self.tied), "failed": self.failed,
                "score": self.score, "rho": self.rho}


def _score(a: Mapping[str, float]) -> float:
    return float(a["insertion"] - a["deletion"] + a["road_lerf"] - a["road_morf"])


def _fails(rho: float | None, threshold: float) -> bool:
    return rho is not None and rho == rho and rho >= threshold


def rank_cams(auc: Mapping[str, Mapping[str, float]], sanity: Mapping[str, float | None] | None = None,
              threshold: float = THRESHOLD) -> list[CamRank]:
    """Methods in panel order: those passing the sanity check first, ties grouped (see the module doc)."""
    methods = list(auc)
    groups: list[list[str]] = []
    for m in methods:
        for g in groups:
            ref = auc[g[0]]
            same_fail = _fails((sanity or {}).get(m), threshold) == _fails((sanity or {}).get(g[0]), threshold)
            if same_fail and all(abs(auc[m][k] - ref[k]) <= TIE for k in ("deletion", "insertion")):
                g.append(m)
                break
        else:
            groups.append([m])
    checked = sanity is not None and len(sanity) > 0

    def key(g: list[str]) -> tuple[bool, float]:
        failed = checked and _fails(sanity.get(g[0]), threshold)  # type: ignore[union-attr]
        return (failed, -sum(_score(auc[m]) for m in g) / len(g))

    out: list[CamRank] = []
    rank = 1
    for g in sorted(groups, key=key):
        mean = sum(_score(auc[m]) for m in g) / len(g)
        for m in g:
            rho = (sanity or {}).get(m)
            out.append(CamRank(m, rank, tuple(x for x in g if x != m), _fails(rho, threshold) if checked else None,
                               mean, None if rho is None or rho != rho else float(rho)))
        rank += len(g)
    return out


def _names(ms: list[str]) -> str:
    return ms[0] if len(ms) == 1 else ", ".join(ms[:-1]) + " and " + ms[-1]


def cam_headline(ranks: list[CamRank], target_name: str = "") -> str:
    """One verdict line over :func:`rank_cams`' output ("" for no method)."""
    if not ranks:
        return ""
    what = f" for {target_name}" if target_name else ""
    failed = [r.method for r in ranks if r.failed]
    passing = [r for r in ranks if not r.failed]
    if not passing:
        return (f"every method fails the sanity check ({_names(failed)}): no map here depends on the class decision; "
                "don't read any of them as an explanation")
    best = [r.method for r in passing if r.rank == passing[0].rank]
    if len(best) > 1:
        lead = f"{_names(best)} (the same pixel order: tied) are the most faithful{what}"
    else:
        lead = f"{best[0]} is the most faithful{what}"
    if ranks[0].failed is None:
        return lead + " (not sanity-checked: add --sanity)"
    lead += " of the methods that pass the sanity check"
    if failed:
        verb = "fails" if len(failed) == 1 else "fail"
        lead += f"; {_names(failed)} {verb} it (the map barely changes when the decision layers are re-initialised)"
    return lead


def gradcam_headline(method: str, class_name: str, prob: float, layer: str, *, zero_grad: bool = False,
                     sanity: Mapping[str, float | None] | None = None,
                     auc: Mapping[str, Mapping[str, float]] | None = None, target_name: str = "",
                     threshold: float = THRESHOLD) -> str:
    """The Grad-CAM view's headline: the methods panel's verdict when there is one (faithfulness areas,
    or sanity ρ of several methods); otherwise what the one map shows, or that it cannot be read (a zero
    gradient at the layer; a failed sanity check)."""
    if auc:
        return cam_headline(rank_cams(auc, sanity, threshold), target_name)
    where = f"{method} of {class_name} ({fmt_p(prob)}) at `{layer}`"
    if zero_grad:
        return f"{where} is empty: the gradient of the class score at this layer is zero (pick an earlier layer)"
    sanity = {m: r for m, r in (sanity or {}).items()}
    if sanity:
        failed = [m for m, r in sanity.items() if _fails(r, threshold)]
        passed = [m for m in sanity if m not in failed]
        if len(sanity) == 1:
            if failed:
                return (f"{where} fails the sanity check (ρ {sanity[method] or 0:.2f} with the decision layers "
                        "re-initialised): the map does not depend on the class decision")
            return f"{where}: the brightest region is where the evidence for the class lies (passes the sanity check)"
        if not passed:
            return f"every method fails the sanity check ({_names(failed)}): no map here depends on the class decision"
        tail = f"; {_names(failed)} {'fails' if len(failed) == 1 else 'fail'} it" if failed else ""
        return f"{_names(passed)} {'passes' if len(passed) == 1 else 'pass'} the sanity check{tail}"
    return f"{where}: the brightest region is where the evidence for the class lies"
