"""Attribution patching equals a hand autograd computation ((a_clean - a_corrupt) · ∂m/∂a on the corrupt
run), leaves no .grad, works on frozen models and under inference_mode; verify=k equals the exact grid."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from _workbench_ref import HEAD_DIM, HEADS, answer_pair, logit_diff, logits, prompts, record, tiny
from _workbench_ref import sites as site_modules

import nbdebug
from nbdebug.capture import fingerprint, same_fingerprint


def hand_attribution(m: Any, family: str, base: torch.Tensor, source: torch.Tensor, sites: str, metric: Any) -> np.ndarray:
    """(layers, T) for resid/attn/mlp, (layers, heads) for heads: (a_source - a_base) · grad, summed; at
    the modules :data:`_workbench_ref.SITES` names by hand."""
    mods = site_modules(m, family, sites)
    where = mods[0][1]
    acts: list[torch.Tensor] = []
    handles = []
    for mod, _ in mods:
        if where == "input":
            handles.append(mod.register_forward_pre_hook(lambda md, a: acts.append(a[0])))
        else:
            handles.append(mod.register_forward_hook(lambda md, a, o: acts.append(o[0] if isinstance(o, tuple) else o)))
    try:
        with torch.enable_grad():
            value = metric(logits(m, base)).sum()
            grads = torch.autograd.grad(value, acts)
    finally:
        for h in handles:
            h.remove()
    rows = []
    for (mod, _), a, g in zip(mods, acts, grads):
        prod = ((record(m, source, mod, where) - a.detach()) * g)[0]  # (T, ...)
        if sites != "heads":
            rows.append(prod.flatten(1).sum(1).numpy())
        elif family == "hooked":  # hook_z: T×heads×d_head
            rows.append(prod.sum(dim=(0, 2)).numpy())
        else:
            rows.append(prod.reshape(prod.shape[0], HEADS, HEAD_DIM).sum(dim=(0, 2)).numpy())
    return np.array(rows)


@pytest.mark.parametrize("family", ["llama", "gpt2", "hooked"])
@pytest.mark.parametrize("sites", ["resid", "attn", "heads"])
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_attribution_equals_hand_autograd(family: str, sites: str, direction: str) -> None:
    m = tiny(family)
    clean, corrupt = prompts(changed=(2, 4))
    a, w = answer_pair(m, clean, corrupt)
    before = fingerprint(m)
    g = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites=sites, method="attribution", direction=direction,
                      progress=False)
    assert same_fingerprint(before, fingerprint(m)) == []
    base, source = (corrupt, clean) if direction == "denoise" else (clean, corrupt)
    est = hand_attribution(m, family, base, source, sites, logit_diff(a, w))
    m_base = g.metric_corrupt if direction == "denoise" else g.metric_clean
    assert g.estimate and g.raw.shape == est.shape
    np.testing.assert_allclose(g.raw[~g.identical], m_base + est[~g.identical], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(est[g.identical], 0.0, atol=1e-6)


def test_verify_equals_exact_grid() -> None:
    m = tiny("llama")
    clean, corrupt = prompts(changed=(1, 3))
    a, w = answer_pair(m, clean, corrupt)
    g = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="heads", positions="each", method="attribution",
                      verify=5, progress=False)
    exact = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="heads", positions="each", progress=False)
    assert len(g.verified) == 5 and set(g.verified) == set(g.top_cells(5))
    for (r, c), v in g.verified.items():
        assert v == pytest.approx(exact.effect[r, c], abs=1e-4)


def test_frozen_model_and_inference_mode() -> None:
    m = tiny("gpt2")
    clean, corrupt = prompts(changed=(2,))
    a, w = answer_pair(m, clean, corrupt)
    ref = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="resid", method="attribution", progress=False)
    for p in m.parameters():
        p.requires_grad_(False)
    before = fingerprint(m)
    with torch.inference_mode():
        g = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="resid", method="attribution", progress=False)
    assert same_fingerprint(before, fingerprint(m)) == []
    assert not any(p.requires_grad for p in m.parameters())
    np.testing.assert_allclose(g.raw, ref.raw, atol=1e-6)


def test_attribution_is_three_passes() -> None:
    """One forward of each prompt and one backward: the model's forward runs exactly twice."""
    m = tiny("llama")
    clean, corrupt = prompts(changed=(2,))
    a, w = answer_pair(m, clean, corrupt)
    calls: list[int] = []

    def spy(mod: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if mod is m:
            calls.append(1)

    h = torch.nn.modules.module.register_module_forward_pre_hook(spy)
    try:
        nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="heads", method="attribution", progress=False)
    finally:
        h.remove()
    assert len(calls) == 2  # the source run (recorded) and the base run that keeps its graph
