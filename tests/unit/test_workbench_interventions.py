"""nbdebug.ablate / steer / steering_vector equal the same interventions written as plain hooks, leave no
hooks (also when the block raises), and say what is wrong with bad targets."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from _workbench_ref import logits, prompts, tiny

import nbdebug
from nbdebug.capture import fingerprint, hook_count, same_fingerprint


def with_hook(m: nn.Module, module: nn.Module, fn: Any, ids: torch.Tensor, pre: bool = False) -> torch.Tensor:
    h = module.register_forward_pre_hook(fn) if pre else module.register_forward_hook(fn)
    try:
        with torch.no_grad():
            return logits(m, ids)
    finally:
        h.remove()


def test_zero_and_mean_ablation_of_heads_equal_hand_hooks() -> None:
    m = tiny("llama")
    ids, _ = prompts()
    o = m.model.layers[1].self_attn.o_proj

    def zero(mod: nn.Module, a: tuple[Any, ...]) -> tuple[Any, ...]:
        x = a[0].clone()
        x[..., 8:16] = 0  # head 1 of 4, head_dim 8
        x[..., 24:32] = 0
        return (x,)

    def mean(mod: nn.Module, a: tuple[Any, ...]) -> tuple[Any, ...]:
        x = a[0].clone()
        x[..., 8:16] = a[0][..., 8:16].mean(dim=(0, 1))
        return (x,)

    ref_zero, ref_mean = with_hook(m, o, zero, ids, pre=True), with_hook(m, o, mean, ids, pre=True)
    before = fingerprint(m)
    with torch.no_grad(), nbdebug.ablate(m, heads={1: [1, 3]}) as ab:
        out = logits(m, ids)
    assert ab.names == ["model.layers.1.self_attn.o_proj"] and torch.equal(out, ref_zero)
    with torch.no_grad(), nbdebug.ablate(m, heads={"model.layers.1": [1]}, mode="mean"):
        torch.testing.assert_close(logits(m, ids), ref_mean, rtol=0, atol=1e-6)
    assert same_fingerprint(before, fingerprint(m)) == []
    with torch.no_grad():
        torch.testing.assert_close(logits(m, ids), with_hook(m, o, lambda *a: None, ids), rtol=0, atol=0)


def test_hooked_transformer_heads_are_hook_z() -> None:
    m = tiny("hooked")
    ids, _ = prompts()
    z = m.blocks[2].attn.hook_z

    def zero(mod: nn.Module, a: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[:, :, 0] = 0
        return out

    ref = with_hook(m, z, zero, ids)
    with torch.no_grad(), nbdebug.ablate(m, heads={2: [0]}):
        assert torch.equal(logits(m, ids), ref)


def test_mean_over_given_inputs_and_neurons_of_an_mlp() -> None:
    m = tiny("llama")
    ids, other = prompts(changed=(1, 2, 3))
    proj = m.model.layers[0].mlp.down_proj
    seen: list[torch.Tensor] = []
    h = proj.register_forward_pre_hook(lambda mod, a: seen.append(a[0].detach().clone()))
    with torch.no_grad():
        logits(m, other)
        logits(m, ids[:, :4])
    h.remove()
    mu = torch.cat([s.flatten(0, 1) for s in seen]).mean(0)  # over both batches' positions

    def put(mod: nn.Module, a: tuple[Any, ...]) -> tuple[Any, ...]:
        x = a[0].clone()
        x[..., [3, 7]] = mu[[3, 7]]
        return (x,)

    ref = with_hook(m, proj, put, ids, pre=True)
    with torch.no_grad(), nbdebug.ablate(m, neurons={"model.layers.0.mlp": [3, 7]}, mode="mean",
                                         mean_over=[other, ids[:, :4]]) as ab:
        out = logits(m, ids)
    assert ab.names == ["model.layers.0.mlp.down_proj"]
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


class TwoRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        return self.fc(x.mean(dim=(2, 3)))


def test_channels_layers_and_call_names_on_a_cnn() -> None:
    m = TwoRelu().eval()
    x = torch.randn(2, 3, 6, 5, generator=torch.Generator().manual_seed(3))
    calls = {"n": 0}

    def second_relu_channels(mod: nn.Module, a: Any, out: torch.Tensor) -> torch.Tensor | None:
        calls["n"] += 1
        if calls["n"] % 2:  # the first call in each forward
            return None
        out = out.clone()
        out[:, [0, 2]] = out[:, [0, 2]].mean(dim=(0, 2, 3), keepdim=True)  # per-channel mean over batch and space
        return out

    ref = with_hook(m, m.relu, second_relu_channels, x)
    with torch.no_grad(), nbdebug.ablate(m, channels={"relu#2": [0, 2]}, mode="mean"):
        torch.testing.assert_close(m(x), ref, rtol=0, atol=1e-6)
    ref = with_hook(m, m.conv1, lambda mod, a, out: torch.zeros_like(out), x)
    with torch.no_grad(), nbdebug.ablate(m, layers=["conv1"]):
        assert torch.equal(m(x), ref)
    assert hook_count(m) == 0


def test_steer_equals_a_hand_hook_and_survives_generate() -> None:
    m = tiny("llama")
    ids, _ = prompts()
    v = torch.randn(32, generator=torch.Generator().manual_seed(5))
    block = m.model.layers[1]
    ref = with_hook(m, block, lambda mod, a, out: out + 2.5 * v, ids)
    with torch.no_grad(), nbdebug.steer(m, layer="model.layers.1", vector=v, alpha=2.5):
        assert torch.equal(logits(m, ids), ref)

    h = block.register_forward_hook(lambda mod, a, out: out + 2.5 * v)
    try:
        ref_gen = m.generate(ids, max_new_tokens=5, do_sample=False)
    finally:
        h.remove()
    with nbdebug.steer(m, layer=1, vector=v, alpha=2.5):
        gen = m.generate(ids, max_new_tokens=5, do_sample=False)
    assert torch.equal(gen, ref_gen)
    assert hook_count(m) == 0


def test_steer_at_absolute_positions_across_generate_steps() -> None:
    """positions=[8, 9]: the prompt has 7 tokens; generate's 2nd and 3rd steps (one token each, cache
    length 7 and 8) are steered, the prompt is not: the same as a full forward steered at 8 and 9."""
    m = tiny("llama")
    ids, _ = prompts()
    v = torch.randn(32, generator=torch.Generator().manual_seed(6))
    with nbdebug.steer(m, layer=1, vector=v, alpha=3.0, positions=[8, 9]):
        gen = m.generate(ids, max_new_tokens=4, do_sample=False)
    with torch.no_grad():
        plain = m.generate(ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(gen[:, :9], plain[:, :9])  # positions 7 and 8 come from unsteered logits at 6 and 7

    def at(mod: nn.Module, a: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[:, [8, 9]] += 3.0 * v
        return out

    full = with_hook(m, m.model.layers[1], at, gen[:, :10])
    assert int(full[0, 9].argmax()) == int(gen[0, 10])  # the step after the steered positions


def test_steering_vector_is_the_mean_difference_at_the_last_token() -> None:
    m = tiny("gpt2")
    pos = [prompts(T=5, seed=s)[0] for s in (1, 2)]
    neg = [prompts(T=4, seed=s)[0] for s in (3, 4, 5)]
    block = m.transformer.h[1]

    def last(ids: torch.Tensor) -> torch.Tensor:
        seen: list[torch.Tensor] = []
        h = block.register_forward_hook(lambda mod, a, out: seen.append((out[0] if isinstance(out, tuple) else out)[0, -1]))
        try:
            with torch.no_grad():
                logits(m, ids)
        finally:
            h.remove()
        return seen[0]

    ref = torch.stack([last(p) for p in pos]).mean(0) - torch.stack([last(n) for n in neg]).mean(0)
    before = fingerprint(m)
    v = nbdebug.steering_vector(m, pos, neg, layer="transformer.h.1")
    torch.testing.assert_close(v, ref, rtol=0, atol=1e-6)
    assert same_fingerprint(before, fingerprint(m)) == []


def test_hooks_removed_when_the_block_raises() -> None:
    m = tiny("llama")
    ids, _ = prompts()
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with nbdebug.ablate(m, heads={0: [0]}), nbdebug.steer(m, layer=0, vector=torch.zeros(32)):
                logits(m, ids)
                raise exc
        assert hook_count(m) == 0


def test_errors_name_what_is_wrong() -> None:
    m = tiny("llama")
    with pytest.raises(KeyError, match=r"no module named 'model\.layer\.1'"):
        with nbdebug.ablate(m, layers=["model.layer.1"]):
            pass
    with pytest.raises(IndexError, match=r"heads of layer 1: \[4\] outside 0..3"):
        with nbdebug.ablate(m, heads={1: [4]}):
            pass
    with pytest.raises(KeyError, match="layer 7 is outside"):
        with nbdebug.ablate(m, heads={7: [0]}):
            pass
    with pytest.raises(ValueError, match="mode='max'"):
        with nbdebug.ablate(m, heads={0: [0]}, mode="max"):
            pass
    with pytest.raises(ValueError, match="nothing to ablate"):
        with nbdebug.ablate(m):
            pass
    with pytest.raises(ValueError, match="32 features, the vector 3"):
        with nbdebug.steer(m, layer="model.layers.0.self_attn.o_proj", vector=torch.zeros(3)):
            logits(m, prompts()[0])
    assert hook_count(m) == 0


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablated_click_from_cached_state_equals_ablate(mode: str) -> None:
    """Workbench.ablated (a view's click: blocks from the ablated one on, from the cached clean run) gives
    the logits of a full forward under nbdebug.ablate."""
    from nbdebug.workbench import Workbench

    m = tiny("gpt2")
    clean, corrupt = prompts(changed=(2,))
    wb = Workbench(m, clean, corrupt, answer=3, wrong=5)
    run = wb.ablated(heads={2: [1]}, mode=mode)
    with torch.no_grad(), nbdebug.ablate(m, heads={2: [1]}, mode=mode):
        out = logits(m, clean)
    torch.testing.assert_close(torch.from_numpy(run.logits), out[0, -1], rtol=0, atol=1e-5)
    assert run.metric == pytest.approx(float(out[0, -1, 3] - out[0, -1, 5]), abs=1e-5)
    assert run.residual.shape == (4, 32) and hook_count(m) == 0


def test_one_prompt_workbench_measures_the_top_token_probability() -> None:
    """A view without a corrupt prompt or an answer (the attention view): Δ probability of the clean run's
    top-1 token under an ablation; a grid needs the corrupt prompt and says so."""
    from nbdebug.workbench import Workbench
    from nbdebug.workbench.metric import MetricError

    m = tiny("llama")
    clean, _ = prompts()
    wb = Workbench(m, clean)
    with torch.no_grad():
        plain = logits(m, clean)[0, -1]
        top = int(plain.argmax())
        with nbdebug.ablate(m, heads={1: [0, 2]}):
            ablated = logits(m, clean)[0, -1]
    assert wb.metric_of("clean") == pytest.approx(float(torch.softmax(plain, -1)[top]), abs=1e-6)
    run = wb.ablated(heads={1: [0, 2]})
    assert run.metric == pytest.approx(float(torch.softmax(ablated, -1)[top]), abs=1e-6)
    assert np.isnan(run.effect) and wb.metric.label.startswith("p(")
    with pytest.raises(MetricError, match="needs a corrupt prompt"):
        wb.grid("heads")
