"""Headlines of the attribution and patching views (nbdebug.inspectors.token_headlines), on planted
numbers where the naive sentence would be wrong, and on their healthy twins."""

from __future__ import annotations

import numpy as np

from nbdebug.inspectors.token_headlines import (
    SHOWN,
    attribution_headline,
    block_labels,
    next_method,
    patch_headline,
    patch_runs,
)


def attr(**kw: object) -> dict:
    base = {"method": "grad_x_input", "label": "logit[' Paris'] - logit[' Rome']", "tokens": ["The", " E", "iffel", " Tower"],
            "scores": [0.1, 0.4, 2.0, -0.5], "metric": 2.86, "converged": None, "relative_delta": None, "baseline": "zero",
            "faithfulness": {"deletion": 0.1, "random": 0.5}}
    return {**base, **kw}


def test_attribution_worse_than_random_says_so_and_offers_the_next_method() -> None:
    """Planted: gradient × input whose deletion area (0.283) is worse than random orders' (0.061). The
    naive headline ("why? logit … = 2.86", then its top token) reads scores that deleting shows are noise."""
    text, offer = attribution_headline(attr(faithfulness={"deletion": 0.283, "random": 0.061}))
    assert text == ("gradient × input is no better than random here: deleting its top tokens first lowers "
                    "logit[' Paris'] - logit[' Rome'] no faster than random orders (deletion area 0.283 vs random 0.061), "
                    "so don't read these scores; try integrated gradients with the first token kept in the baseline")
    assert offer == {"method": "integrated_gradients", "fix_first": True,
                     "text": "integrated gradients with the first token kept in the baseline"}
    assert "iffel" not in text
    # within the margin of random is no better either; the healthy twin (well below random) names tokens
    assert attribution_headline(attr(faithfulness={"deletion": 0.46, "random": 0.5}))[0].startswith("gradient × input is no better")
    text, offer = attribution_headline(attr())
    assert offer is None and text == ("'iffel' pushes logit[' Paris'] - logit[' Rome'] up most (+2.00), then '␣E' (+0.40) "
                                      "(gradient × input); deleting tokens in this order lowers it faster than random "
                                      "(area 0.100 vs 0.500)")
    assert next_method("integrated_gradients", True)["method"] == "occlusion"
    assert next_method("occlusion", False)["method"] == "integrated_gradients"


def test_attribution_not_converged_comes_first_and_no_tokens_without_a_push() -> None:
    text, offer = attribution_headline(attr(method="integrated_gradients", converged=False, relative_delta=0.31))
    assert text.startswith("integrated gradients: the scores do not add up to the change of logit[' Paris'] - "
                           "logit[' Rome'] (they miss it by 31%)") and offer is not None and offer["fix_first"]
    assert attribution_headline(attr(method="integrated_gradients", converged=False, relative_delta=0.31,
                                     baseline="zero, first token fixed"))[1] is None
    text, _ = attribution_headline(attr(scores=[-1.0, -2.0, 0.0, -0.1], faithfulness={}))
    assert text == "gradient × input: no token pushes logit[' Paris'] - logit[' Rome'] up; faithfulness not measured"


def test_patching_answer_landing_in_the_last_blocks() -> None:
    """Planted: 30 block inputs × 4 positions; 'iffel' restores the answer in blocks 0–23, ' of' (the last
    position) from block 24 on: the part a 600-px box hid. Small effects (< 0.05) elsewhere are noise."""
    cols = ["The", "␣E", "iffel", "␣of"]
    e = np.full((30, 4), 0.01)
    e[:24, 2] = np.linspace(0.95, 0.6, 24)
    e[24:, 3] = np.linspace(0.7, 1.0, 6)
    e[5, 0] = -0.3  # a negative effect is never "restored"
    assert patch_runs(e, cols) == [(0, 23, 2, 0.95), (24, 29, 3, 1.0)]
    assert patch_headline(e, cols, "'␣Paris'", list(range(30)), "resid") == (
        "'␣Paris' is restored by 'iffel' in blocks 0–23 and by '␣of' from block 24")
    # the naive reading of the first rows only would name 'iffel' alone
    assert "from block 24" not in patch_headline(e[:24], cols, "'␣Paris'", list(range(24)), "resid", n_blocks=30)
    assert patch_headline(np.full((3, 4), 0.02), cols, "'␣Paris'", [0, 1, 2], "mlp", estimate=True) == (
        f"no single site restores '␣Paris' through MLP outputs: every effect is below {SHOWN:g} (attribution estimate)")
    heads = np.zeros((4, 4))
    heads[2, 3], heads[1, 2] = 0.8, 0.3
    assert patch_headline(heads, cols, "'␣Paris'", [0, 0, 1, 1], "heads",
                          labels=["block 0 head 0", "block 0 head 1", "block 1 head 0", "block 1 head 1"]) == (
        "'␣Paris' is restored most by block 1 head 0 at '␣of' (0.80), then block 0 head 1 at 'iffel' (0.30)")


def test_rows_are_named_for_what_they_are() -> None:
    assert block_labels(["model.layers.3", "model.layers.3.mlp", "model.layers.3.self_attn", "h.1.attn.c_proj:h5"],
                        ["resid", "mlp", "attn", "heads"], [3, 3, 3, 1], [None, None, None, 5]) == [
        "block 3 input", "block 3 mlp out", "block 3 attn out", "block 1 head 5"]
