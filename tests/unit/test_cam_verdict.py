"""The CAM methods panel's verdict (nbdebug.inspectors.cam_verdict): sanity before rank, ties as ties,
one verdict line naming the most faithful method that passes the sanity check.

Planted: the method with the best faithfulness areas (eigencam) fails the sanity check (ρ 1.00), two
more fail it (ρ 0.95), and gradcam/hirescam/xgradcam give the same map (the same deletion/insertion
areas, 0.675/0.753) with ROAD areas apart only by imputation noise. The naive panel ("methods best
first": eigencam #1, the three look-alikes ranked 2, 3, 4 by noise) is wrong on each count. Its healthy
twin: every method passes, no two alike, and the order is the plain score order."""

from __future__ import annotations

from nbdebug.inspectors.cam_verdict import cam_headline, gradcam_headline, rank_cams
from nbdebug.inspectors.faithfulness import rank_methods


def areas(d: float, i: float, morf: float, lerf: float) -> dict[str, float]:
    return {"deletion": d, "insertion": i, "road_morf": morf, "road_lerf": lerf}


AUC = {
    "gradcam": areas(0.675, 0.753, 0.369, 0.52),
    "hirescam": areas(0.675, 0.753, 0.370, 0.52),
    "xgradcam": areas(0.675, 0.753, 0.375, 0.52),
    "gradcampp": areas(0.70, 0.70, 0.40, 0.50),
    "eigencam": areas(0.30, 0.90, 0.20, 0.70),  # the best areas of all, and fails the sanity check
    "scorecam": areas(0.60, 0.80, 0.35, 0.55),
    "ablationcam": areas(0.65, 0.77, 0.36, 0.53),
}
RHO = {"gradcam": 0.12, "hirescam": 0.12, "xgradcam": 0.12, "gradcampp": 0.2, "eigencam": 1.0, "scorecam": 0.95,
       "ablationcam": 0.95}


def test_sanity_before_rank_and_ties_share_a_rank() -> None:
    assert rank_methods(AUC)[0] == "eigencam"  # the naive order: the sanity-failing method first
    ranks = rank_cams(AUC, RHO)
    assert [(r.method, r.rank, r.failed) for r in ranks] == [
        ("gradcam", 1, False), ("hirescam", 1, False), ("xgradcam", 1, False),  # one map: one rank, noise ignored
        ("gradcampp", 4, False),
        ("eigencam", 5, True), ("scorecam", 6, True), ("ablationcam", 7, True),  # failing ones after, by score
    ]
    assert ranks[0].tied == ("hirescam", "xgradcam") and ranks[3].tied == ()
    mean = sum(AUC[m]["insertion"] - AUC[m]["deletion"] + AUC[m]["road_lerf"] - AUC[m]["road_morf"]
               for m in ("gradcam", "hirescam", "xgradcam")) / 3
    assert ranks[0].score == ranks[2].score == mean
    assert cam_headline(ranks, "tabby") == (
        "gradcam, hirescam and xgradcam (the same pixel order: tied) are the most faithful for tabby of the methods "
        "that pass the sanity check; eigencam, scorecam and ablationcam fail it (the map barely changes when the "
        "decision layers are re-initialised)")


def test_every_method_failing_says_so_and_the_healthy_twin_ranks_by_score() -> None:
    assert cam_headline(rank_cams(AUC, dict.fromkeys(AUC, 0.99))).startswith("every method fails the sanity check (")
    healthy = {m: a for m, a in AUC.items() if m not in ("hirescam", "xgradcam")}
    ranks = rank_cams(healthy, dict.fromkeys(healthy, 0.1))
    assert [r.method for r in ranks] == rank_methods(healthy) and [r.rank for r in ranks] == [1, 2, 3, 4, 5]
    assert cam_headline(ranks) == "eigencam is the most faithful of the methods that pass the sanity check"
    # no --sanity: the order is the score order, and the line says it was not checked
    plain = rank_cams(healthy, {})
    assert [r.failed for r in plain] == [None] * 5
    assert cam_headline(plain) == "eigencam is the most faithful (not sanity-checked: add --sanity)"


def test_single_map_headlines() -> None:
    assert gradcam_headline("gradcam", "tabby", 0.79, "layer4") == (
        "gradcam of tabby (79%) at `layer4`: the brightest region is where the evidence for the class lies")
    assert "is empty: the gradient" in gradcam_headline("gradcam", "tabby", 0.79, "fc", zero_grad=True)
    assert gradcam_headline("gradcam", "tabby", 0.79, "l", sanity={"gradcam": 0.97}).endswith(
        "fails the sanity check (ρ 0.97 with the decision layers re-initialised): the map does not depend on the class decision")
    assert gradcam_headline("gradcam", "t", 0.5, "l", sanity=RHO) == (
        "gradcam, hirescam, xgradcam and gradcampp pass the sanity check; eigencam, scorecam and ablationcam fail it")
    assert gradcam_headline("gradcam", "t", 0.5, "l", sanity=RHO, auc=AUC) == cam_headline(rank_cams(AUC, RHO))
