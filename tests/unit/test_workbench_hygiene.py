"""nbdebug.patch leaves the model as found (hooks, parameters, buffers, .grad, modes, RNG) after success,
an exception and a KeyboardInterrupt mid-grid; never calls the user's hooks; gives the same grid under
no_grad / inference_mode, in bf16 (tolerance) and on an accelerate-offloaded model (1e-4); and its
errors say what is wrong."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from _workbench_ref import answer_pair, hand_grid, hooked, logit_diff, prompts, tiny
from _workbench_ref import sites as site_modules

import nbdebug
from nbdebug.adapters.transformers import AdapterError
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.workbench.metric import MetricError


def snapshot(m: torch.nn.Module) -> dict[str, Any]:
    return {"fp": fingerprint(m), "rng": torch.get_rng_state(), "modes": [x.training for x in m.modules()]}


def unchanged(m: torch.nn.Module, before: dict[str, Any]) -> None:
    assert same_fingerprint(before["fp"], fingerprint(m)) == []
    assert torch.equal(before["rng"], torch.get_rng_state())
    assert before["modes"] == [x.training for x in m.modules()]


class Stop(Exception):
    pass


@pytest.mark.parametrize("method", ["exact", "attribution"])
def test_success_leaves_the_model_and_skips_user_hooks(method: str) -> None:
    m = tiny("llama")
    m.model.layers[1].train()  # a mode that must survive (dropout is 0 in this config)
    clean, corrupt = prompts(changed=(2,))
    a, w = answer_pair(m, clean, corrupt)
    called: list[int] = []
    h = m.model.layers[0].register_forward_hook(lambda *args: called.append(1))
    # a gradient the user holds: .grad must survive unchanged
    logit_diff(a, w)(m(clean).logits).sum().backward()
    try:
        assert called == [1]  # the user's own forward
        called.clear()
        before = snapshot(m)
        g = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="heads", positions="each", method=method,
                          verify=3 if method == "attribution" else 0, progress=False)
        unchanged(m, before)
        assert called == [] and hook_count(m) == 1 and g.effect.shape == (12, 7)
    finally:
        h.remove()
        m.zero_grad(set_to_none=True)


@pytest.mark.parametrize("exc", [Stop("from the callback"), KeyboardInterrupt()])
def test_interrupt_mid_grid(exc: BaseException) -> None:
    m = tiny("gpt2")
    clean, corrupt = prompts(changed=(1,))
    a, w = answer_pair(m, clean, corrupt)
    before = snapshot(m)
    steps: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> None:
        steps.append((done, total))
        if done == 4:
            raise exc

    with pytest.raises(type(exc)):
        nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="resid", progress=progress)
    assert steps[-1][0] == 4 and steps[-1][1] > 4
    unchanged(m, before)
    assert hook_count(m) == 0


def test_exception_from_the_metric_mid_grid() -> None:
    m = tiny("hooked")
    clean, corrupt = prompts(changed=(1,))
    calls = {"n": 0}

    def metric(logits: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] > 2:  # the two recorded runs pass, the first patched chunk fails
            raise Stop("metric")
        return logits[:, -1, 3] - logits[:, -1, 5]

    before = snapshot(m)
    with pytest.raises(Stop):
        nbdebug.patch(m, clean, corrupt, metric=metric, sites="attn", progress=False)
    unchanged(m, before)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_same_grid_inside_no_grad_and_inference_mode(mode: str) -> None:
    m = tiny("llama")
    clean, corrupt = prompts(changed=(2,))
    a, w = answer_pair(m, clean, corrupt)
    ref = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="attn", progress=False)
    ref_at = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="attn", method="attribution", progress=False)
    ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with ctx:
        g = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="attn", progress=False)
        at = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="attn", method="attribution", progress=False)
    np.testing.assert_allclose(g.raw, ref.raw, atol=1e-6, equal_nan=True)
    # the estimate needs a backward: inside the context it equals the same call outside it (which
    # test_workbench_attribution checks against hand autograd), not merely something finite
    assert np.isfinite(ref_at.raw[~ref_at.identical]).all() and (ref_at.raw[~ref_at.identical] != ref_at.metric_corrupt).any()
    np.testing.assert_array_equal(at.identical, ref_at.identical)
    np.testing.assert_allclose(at.raw, ref_at.raw, atol=1e-6, rtol=0, equal_nan=True)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_bf16(family: str) -> None:
    m = tiny(family).to(torch.bfloat16)
    clean, corrupt = prompts(changed=(2,))
    a, w = answer_pair(m, clean, corrupt)
    g = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="resid", progress=False)
    ref = hand_grid(m, corrupt, clean, site_modules(m, family, "resid"), logit_diff(a, w))
    scale = abs(g.metric_clean - g.metric_corrupt)
    np.testing.assert_allclose(g.raw[~g.identical], ref[~g.identical], atol=0.05 * scale + 0.05)
    assert g.raw.dtype == np.float64 and next(m.parameters()).dtype == torch.bfloat16


def test_offloaded_model_equals_in_memory(tmp_path: Any) -> None:
    pytest.importorskip("accelerate")
    from nbdebug.testing import offloaded_llama

    m, ref = offloaded_llama(tmp_path)
    clean = torch.randint(1, 512, (1, 8), generator=torch.Generator().manual_seed(4))
    corrupt = clean.clone()
    corrupt[0, 3] = (clean[0, 3] + 7) % 512
    a, w = answer_pair(ref, clean, corrupt)
    with torch.no_grad():
        m(clean)  # accelerate's first forward unties weights: take the state after it
    devices = {n: p.device.type for n, p in m.named_parameters()}
    before = snapshot(m)
    for sites in ("resid", "heads"):
        for method in ("exact", "attribution"):
            g = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites=sites, method=method, progress=False)
            r = nbdebug.patch(ref, clean, corrupt, answer=a, wrong=w, sites=sites, method=method, progress=False)
            np.testing.assert_allclose(g.raw, r.raw, atol=1e-4, equal_nan=True)
    unchanged(m, before)
    assert devices == {n: p.device.type for n, p in m.named_parameters()}
    with torch.no_grad(), nbdebug.ablate(m, heads={2: [1]}), nbdebug.steer(m, layer=1, vector=torch.ones(64)):
        out = m(clean).logits
    with torch.no_grad(), nbdebug.ablate(ref, heads={2: [1]}), nbdebug.steer(ref, layer=1, vector=torch.ones(64)):
        torch.testing.assert_close(out, ref(clean).logits, rtol=0, atol=1e-4)
    unchanged(m, before)


class CharTokenizer:
    """One token per character (ids 1..63), enough for error messages."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1 + ord(c) % 63 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + (i - 1) % 26) for i in ids)

    def __call__(self, text: str, return_tensors: str = "pt") -> dict[str, torch.Tensor]:
        return {"input_ids": torch.tensor([self.encode(text)])}


def test_error_messages() -> None:
    m = tiny("llama")
    tok = CharTokenizer()
    with pytest.raises(MetricError, match=r"clean has 3 \['[a-z]', .*corrupt has 4"):
        nbdebug.patch(m, "abc", "abcd", answer=3, wrong=5, tokenizer=tok)
    with pytest.raises(MetricError, match=r"answer=' P' is 2 tokens \[.*ONE token"):
        nbdebug.patch(m, "abc", "abd", answer=" P", tokenizer=tok)
    with pytest.raises(MetricError, match="pass tokenizer="):
        nbdebug.patch(m, *prompts(), answer=" Paris")
    clean, _ = prompts()
    with pytest.raises(MetricError, match="the same on clean and corrupt"):
        nbdebug.patch(m, clean, clean.clone(), answer=3, wrong=5, progress=False)
    with pytest.raises(MetricError, match="say what to measure"):
        nbdebug.patch(m, *prompts())
    with pytest.raises(ValueError, match="sites='neurons'"):
        nbdebug.patch(m, *prompts(), answer=3, wrong=5, sites="neurons")
    with pytest.raises(ValueError, match="direction='forward'"):
        nbdebug.patch(m, *prompts(), answer=3, wrong=5, direction="forward")
    with pytest.raises(ValueError, match="method='fast'"):
        nbdebug.patch(m, *prompts(), answer=3, wrong=5, method="fast")
    with pytest.raises(ValueError, match="position 9 is outside"):
        nbdebug.patch(m, *prompts(), answer=3, wrong=5, positions=[9])
    with pytest.raises(MetricError, match="one value per run"):
        nbdebug.patch(m, *prompts(), metric=lambda lg: lg[:, -1, :2], progress=False)
    assert hook_count(m) == 0


def test_unsupported_models_name_the_missing_part() -> None:
    from nbdebug.adapters.offline import tiny_lm

    with pytest.raises(AdapterError, match="encoder"):
        nbdebug.patch(tiny_lm("bert"), *prompts(), answer=3, wrong=5)
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    with pytest.raises(AdapterError, match="transformer blocks"):
        nbdebug.patch(cnn, *prompts(), answer=3, wrong=5)
    attn_only = hooked()
    attn_only.cfg.attn_only = True  # read by the adapter only
    with pytest.raises(AdapterError, match="no MLP"):
        nbdebug.patch(attn_only, *prompts(), answer=3, wrong=5, sites="mlp")


def test_progress_bar_and_plain_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """progress=True draws from the first step (tqdm.auto, on stderr); without tqdm a plain stderr line;
    progress=False and a fast grid with the default draw nothing."""
    import sys

    m = tiny("gpt2")
    clean, corrupt = prompts(changed=(1,))
    a, w = answer_pair(m, clean, corrupt)
    nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="resid", progress=False)
    assert capsys.readouterr().err == ""
    nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="resid", progress=True)
    assert "patching resid" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # import fails: the plain line
    nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="resid", progress=True)
    err = capsys.readouterr().err
    assert "patching resid: " in err and err.endswith("\n")


def test_progress_shows_only_after_two_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    from nbdebug.runs import progress as mod

    now = [100.0]
    monkeypatch.setattr(mod.time, "perf_counter", lambda: now[0])
    drawn: list[int] = []
    monkeypatch.setattr(mod.Progress, "_draw", lambda self: drawn.append(self.done))
    with mod.Progress(10) as bar:
        bar.update(1)
        now[0] += 1.9
        bar.update(1)
        now[0] += 0.2
        bar.update(1)
        bar.update(1)
    assert drawn == [3, 4]
