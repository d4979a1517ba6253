"""OptimizerWatch (update ratios, learning rates, GradScaler skips), loss_of_output and as_float_later."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.optim import optimizer as torch_optimizer

from nbdebug.capture.hooks import HookSet, optimizer_hook_count
from nbdebug.capture.optim import (
    OptimizerWatch,
    StepUpdates,
    as_float_later,
    loss_of_output,
    scaler_patched,
)
from nbdebug.capture.state import fingerprint, same_fingerprint

ORIGINAL_SCALER_STEP = torch.amp.GradScaler.__dict__["step"]


def leaf_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if n and not list(m.children())]


def hand_set_linear() -> nn.Sequential:
    """fc: 2→2 with weight [[1, 2], [3, 4]] and bias [0.5, -0.5]."""
    model = nn.Sequential(OrderedDict(fc=nn.Linear(2, 2)))
    with torch.no_grad():
        model.fc.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        model.fc.bias.copy_(torch.tensor([0.5, -0.5]))
    return model


def own(module: nn.Module, what: str = "data") -> torch.Tensor:
    return torch.cat([(p.detach() if what == "data" else p.grad).flatten() for p in module.parameters(recurse=False)])


@pytest.fixture(autouse=True)
def _clean() -> object:
    yield
    assert optimizer_hook_count() == 0
    assert torch.amp.GradScaler.__dict__["step"] is ORIGINAL_SCALER_STEP
    assert not scaler_patched()


def test_sgd_update_ratio_is_lr_times_grad_norm_over_param_norm() -> None:
    model = hand_set_linear()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # created before the watch: global hooks cover it
    x = torch.tensor([[1.0, -1.0], [2.0, 0.5]])
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20) as watch:
        model(x).pow(2).sum().backward()
        g, theta = own(model.fc, "grad"), own(model.fc)
        opt.step()
        upd = watch.take()
    assert upd.stepped == 1 and upd.skipped is False
    expected = (0.1 * g.norm() / theta.norm()).item()
    assert upd.update_ratio["fc"] == pytest.approx(expected, rel=1e-6)
    assert upd.param_norm["fc"] == pytest.approx(theta.norm().item(), rel=1e-6)
    assert upd.lr == {"": 0.1, "fc": 0.1}
    assert all(isinstance(v, float) for v in upd.update_ratio.values())


def test_adam_first_step_moves_every_element_by_lr() -> None:
    model = hand_set_linear()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.tensor([[1.0, -1.0], [2.0, 0.5]])
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20) as watch:
        model(x).pow(2).sum().backward()
        g, theta = own(model.fc, "grad"), own(model.fc)
        assert bool((g.abs() > 1e-3).all())  # |Δθ_i| = lr·|g|/(|g| + eps) = lr up to eps/|g|
        before = theta.clone()
        opt.step()
        upd = watch.take()
    assert torch.allclose((own(model.fc) - before).abs(), torch.full_like(before, 0.01), rtol=1e-5)
    assert upd.update_ratio["fc"] == pytest.approx(0.01 * math.sqrt(g.numel()) / theta.norm().item(), rel=1e-5)


def test_param_groups_with_their_own_lr_and_weight_decay() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(a=nn.Linear(3, 4), act=nn.Tanh(), b=nn.Linear(4, 2)))
    opt = torch.optim.SGD([
        {"params": model.a.parameters(), "lr": 0.1},
        {"params": model.b.parameters(), "lr": 0.01, "weight_decay": 0.5},
    ])
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20) as watch:
        model(torch.randn(5, 3)).pow(2).mean().backward()
        ga, ta = own(model.a, "grad"), own(model.a)
        gb, tb = own(model.b, "grad"), own(model.b)
        opt.step()
        upd = watch.take()
    assert upd.lr == {"": 0.1, "a": 0.1, "b": 0.01}
    assert upd.update_ratio["a"] == pytest.approx((0.1 * ga.norm() / ta.norm()).item(), rel=1e-5)
    assert upd.update_ratio["b"] == pytest.approx((0.01 * (gb + 0.5 * tb).norm() / tb.norm()).item(), rel=1e-5)
    assert "act" not in upd.update_ratio  # no parameters of its own


def test_hand_written_update_loop_has_no_ratio() -> None:
    model = hand_set_linear()
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20) as watch:
        model(torch.ones(1, 2)).sum().backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        upd = watch.take()
    assert upd == StepUpdates()
    assert watch.optimizer_steps == 0


def test_optimizer_of_another_model_is_not_counted() -> None:
    model, other = hand_set_linear(), hand_set_linear()
    opt = torch.optim.SGD(other.parameters(), lr=0.1)
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20) as watch:
        other(torch.ones(1, 2)).sum().backward()
        opt.step()
        assert watch.take() == StepUpdates()


def test_two_optimizers_and_two_steps_between_takes() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(OrderedDict(a=nn.Linear(3, 3), b=nn.Linear(3, 1)))
    opt_a = torch.optim.SGD(model.a.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(model.b.parameters(), lr=0.2)
    calls: list[int] = []
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20, on_step=lambda: calls.append(1)) as watch:
        model(torch.randn(4, 3)).sum().backward()
        ga, ta, gb, tb = own(model.a, "grad"), own(model.a), own(model.b, "grad"), own(model.b)
        opt_a.step()
        opt_b.step()
        upd = watch.take()
        assert upd.stepped == 2 and len(calls) == 2
        assert upd.lr == {"": 0.1, "a": 0.1, "b": 0.2}  # "" is the first optimizer that stepped
        assert upd.update_ratio["a"] == pytest.approx((0.1 * ga.norm() / ta.norm()).item(), rel=1e-5)
        assert upd.update_ratio["b"] == pytest.approx((0.2 * gb.norm() / tb.norm()).item(), rel=1e-5)
        # the same optimizer twice: the module keeps its last step's numbers
        opt_a.step()
        t2 = own(model.a)
        opt_a.step()
        upd = watch.take()
    assert upd.stepped == 2 and set(upd.update_ratio) == {"a"}
    assert upd.update_ratio["a"] == pytest.approx((0.1 * ga.norm() / t2.norm()).item(), rel=1e-5)
    assert upd.param_norm["a"] == pytest.approx(t2.norm().item(), rel=1e-6)


def test_shared_parameter_counts_for_each_module() -> None:
    model = nn.Sequential(OrderedDict(a=nn.Linear(2, 2, bias=False), b=nn.Linear(2, 2, bias=False)))
    model.b.weight = model.a.weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20) as watch:
        model(torch.randn(3, 2)).sum().backward()
        expected = (0.1 * model.a.weight.grad.norm() / model.a.weight.norm()).item()
        opt.step()
        upd = watch.take()
    assert upd.update_ratio["a"] == pytest.approx(expected, rel=1e-6)
    assert upd.update_ratio["b"] == pytest.approx(expected, rel=1e-6)


def test_copy_over_budget_gives_no_ratio_and_a_note() -> None:
    model = hand_set_linear()  # 6 float32 parameters = 24 bytes
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 23) as watch:
        model(torch.ones(1, 2)).sum().backward()
        theta = own(model.fc)
        opt.step()
        upd = watch.take()
    assert upd.stepped == 1 and upd.update_ratio == {}
    assert upd.param_norm["fc"] == pytest.approx(theta.norm().item(), rel=1e-6)
    assert len(watch.notes) == 1 and "24 B" in watch.notes[0] and "--max-bytes" in watch.notes[0]


def test_bfloat16_parameters() -> None:
    model = hand_set_linear().to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20) as watch:
        model(torch.ones(1, 2, dtype=torch.bfloat16)).sum().backward()
        before = own(model.fc).float()
        opt.step()
        upd = watch.take()
    expected = ((own(model.fc).float() - before).norm() / before.norm()).item()
    assert upd.update_ratio["fc"] == pytest.approx(expected, rel=1e-6)


def test_device_path_keeps_tensors() -> None:
    model = hand_set_linear()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20, on_device=True) as watch:
        model(torch.ones(1, 2)).sum().backward()
        g, theta = own(model.fc, "grad"), own(model.fc)
        opt.step()
        upd = watch.take()
    r = upd.update_ratio["fc"]
    assert isinstance(r, torch.Tensor) and r.dim() == 0 and r.dtype == torch.float32
    assert r.item() == pytest.approx((0.1 * g.norm() / theta.norm()).item(), rel=1e-6)
    assert isinstance(upd.param_norm["fc"], torch.Tensor)


@pytest.mark.parametrize("fused", [False, True])
def test_grad_scaler_skipped_step(fused: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(a=nn.Linear(3, 4), b=nn.Linear(4, 2)))
    try:
        opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=fused)
    except (RuntimeError, TypeError) as exc:  # fused Adam on the CPU needs a recent torch
        pytest.skip(f"fused Adam unavailable: {exc}")
    scaler = torch.amp.GradScaler("cpu")
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20) as watch:
        scaler.scale(model(torch.randn(5, 3)).sum()).backward()
        model.a.weight.grad[0, 0] = float("inf")  # planted
        before = [p.detach().clone() for p in model.parameters()]
        scaler.step(opt)
        scaler.update()
        upd = watch.take()
        assert bool(upd.skipped) is True
        assert upd.scale == 65536.0 and scaler.get_scale() == 32768.0  # the scale the backward used, not update()'s
        assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # nothing moved
        assert all(math.isnan(v) for v in upd.update_ratio.values())
        assert upd.lr["a"] == 0.01
        opt.zero_grad()
        scaler.scale(model(torch.randn(5, 3)).sum()).backward()
        scaler.step(opt)
        scaler.update()
        upd = watch.take()
    assert bool(upd.skipped) is False and upd.stepped == 1 and upd.scale == 32768.0
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20) as watch:
        model(torch.randn(5, 3)).sum().backward()  # no scaler: no scale
        assert watch.take().scale is None
    assert not scaler_patched() and type(scaler).scale.__name__ == "scale" and "scale" not in vars(scaler)
    assert set(upd.update_ratio) == {"a", "b"} and all(v > 0 for v in upd.update_ratio.values())


def test_scaler_patch_is_reference_counted_and_restored() -> None:
    model = hand_set_linear()
    with HookSet() as outer_hooks, OptimizerWatch(leaf_modules(model), outer_hooks, 2**20) as outer:
        assert scaler_patched()
        with HookSet() as inner_hooks, OptimizerWatch(leaf_modules(model), inner_hooks, 2**20):
            assert optimizer_hook_count() == 4
        assert scaler_patched() and optimizer_hook_count() == 2  # the outer capture still watches
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(model(torch.ones(1, 2)).sum()).backward()
        scaler.step(opt)
        assert outer.take().stepped == 1
    assert not scaler_patched()


def test_keyboard_interrupt_restores_everything() -> None:
    model = hand_set_linear()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(KeyboardInterrupt):
        with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
            raise KeyboardInterrupt
    assert not torch_optimizer._global_optimizer_pre_hooks and not torch_optimizer._global_optimizer_post_hooks


def test_hookset_removal_alone_undoes_the_watch() -> None:
    """A capture that dies before calling the watch's __exit__ still leaves nothing behind."""
    model = hand_set_linear()
    hooks = HookSet()
    watch = OptimizerWatch(leaf_modules(model), hooks, 2**20).__enter__()
    assert optimizer_hook_count() == 2 and scaler_patched()
    hooks.remove()
    assert optimizer_hook_count() == 0 and not scaler_patched()
    watch.__exit__()  # idempotent


def test_watch_changes_nothing_a_training_step_does() -> None:
    """The same Adam steps with and without the watch: identical parameters, grads, versions, state."""
    runs = []
    for watched in (False, True):
        model = hand_set_linear()
        opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.1)
        hooks = HookSet()
        with hooks, (OptimizerWatch(leaf_modules(model), hooks, 2**20) if watched else HookSet()):
            for _ in range(3):
                opt.zero_grad()
                model(torch.tensor([[1.0, -2.0]])).pow(2).sum().backward()
                opt.step()
        runs.append((fingerprint(model), [p._version for p in model.parameters()],
                     {k: v.clone() for k, v in opt.state[model.fc.weight].items()}))
    (fa, va, sa), (fb, vb, sb) = runs
    assert same_fingerprint(fa, fb) == [] and va == vb
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_state_of_reports_optimizer_state_norms() -> None:
    model = hand_set_linear()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20) as watch:
        model(torch.ones(1, 2)).sum().backward()
        gw, gb = model.fc.weight.grad.norm().item(), model.fc.bias.grad.norm().item()
        sgd.step()
    state = watch.state_of("fc")  # still answers after exit (optimizers and modules held weakly)
    assert set(state) == {"weight", "bias"}
    assert state["weight"]["lr"] == 0.1
    assert state["weight"]["momentum_buffer"] == pytest.approx(gw, rel=1e-6)  # first step: buffer = g
    assert state["bias"]["momentum_buffer"] == pytest.approx(gb, rel=1e-6)
    assert watch.state_of("nope") == {}

    model = hand_set_linear()
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20) as watch:
        model(torch.ones(1, 2)).sum().backward()
        gw = model.fc.weight.grad.norm().item()
        gw4 = model.fc.weight.grad.pow(2).norm().item()
        adam.step()
        state = watch.state_of("fc")
    assert state["weight"]["step"] == 1.0
    assert state["weight"]["exp_avg"] == pytest.approx(0.1 * gw, rel=1e-6)  # (1 − β1)·g
    assert state["weight"]["exp_avg_sq"] == pytest.approx(0.001 * gw4, rel=1e-5)  # (1 − β2)·g²


def test_watch_does_not_keep_the_model_alive() -> None:
    import gc
    import weakref

    model = hand_set_linear()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20) as watch:
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
    ref = weakref.ref(model)
    del model, opt
    gc.collect()
    assert ref() is None
    assert watch.state_of("fc") == {}


# -- loss and numbers ---------------------------------------------------------------------------
@dataclass
class FakeOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor


def test_loss_of_output() -> None:
    w = torch.ones(2, requires_grad=True)
    loss = (w * 3).sum()
    got = loss_of_output(loss)
    assert got is not None and not got.requires_grad and got.item() == 6.0
    assert loss_of_output({"loss": loss, "logits": w}).item() == 6.0
    assert loss_of_output(FakeOutput(loss, w)).item() == 6.0
    assert loss_of_output((loss, w)).item() == 6.0
    assert loss_of_output(FakeOutput(None, w)) is None
    assert loss_of_output(w) is None  # not a scalar: logits, not a loss
    assert loss_of_output(torch.tensor(3)) is None  # integer
    assert loss_of_output((w, loss)) is None
    assert loss_of_output("text") is None


def test_as_float_later() -> None:
    assert as_float_later(torch.tensor(2.5, requires_grad=True)) == 2.5
    assert as_float_later(torch.tensor([1.0, 3.0])) == 2.0  # reduction="none": the mean
    assert as_float_later(torch.tensor(1.5, dtype=torch.bfloat16)) == 1.5
    assert as_float_later(3) == 3.0
    assert math.isnan(as_float_later(None))
    assert math.isnan(as_float_later("x"))
    assert math.isnan(as_float_later(torch.tensor([])))


def test_capture_shows_a_scaler_skipped_step_as_skipped_not_as_an_incident() -> None:
    """Through the capture: a GradScaler whose first scale overflows skips step 1 (inf gradients);
    the history marks it skipped with no update ratio, later ratios equal ‖Δθ‖/‖θ‖ measured by hand."""
    from nbdebug.capture.session import Capture

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, backoff_factor=2.0**-110)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    expected = []
    with Capture(model) as cap:
        for _ in range(4):
            opt.zero_grad()
            scaler.scale(nn.functional.mse_loss(model(x), y) * 10).backward()
            before = own(model[0]).clone()
            scaler.step(opt)
            scaler.update()
            expected.append(((own(model[0]) - before).norm() / before.norm()).item())
    res = cap.result
    assert expected[0] == 0.0  # the scaler did not step: nothing moved
    assert list(res.skipped_steps) == [1]
    assert list(res.series("skipped")) == [1.0, 0.0, 0.0, 0.0]
    ratio = res.series("0", "update_ratio")
    assert math.isnan(ratio[0])
    assert list(ratio[1:]) == pytest.approx(expected[1:], rel=1e-5)
    assert res.first_nonfinite_step is None and not [i for i in res.incidents if i.kind == "nonfinite"]


def test_many_same_shape_parameters_are_stacked_and_exact() -> None:
    """Six Linear(3, 3) layers (then, alone, only same-shape ones): on the CPU their weights and biases
    are copied as stacked runs; the ratios equal the hand-computed ones and the device path's."""
    torch.manual_seed(3)
    results = []
    for on_device, head in ((False, True), (True, True), (False, False)):
        torch.manual_seed(3)
        model = nn.Sequential(*[nn.Linear(3, 3) for _ in range(6)], *([nn.Linear(3, 1)] if head else []))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        mods = leaf_modules(model)
        with HookSet() as hooks, OptimizerWatch(mods, hooks, 2**20, on_device=on_device) as watch:
            for _ in range(2):
                opt.zero_grad()
                model(torch.randn(4, 3)).pow(2).sum().backward()
                before = {n: own(m).clone() for n, m in mods}
                opt.step()
                upd = watch.take()
            hand = {n: ((own(m) - before[n]).norm() / before[n].norm()).item() for n, m in mods}
        got = {k: float(v) for k, v in upd.update_ratio.items()}
        assert got == pytest.approx(hand, rel=1e-5)
        assert {k: float(v) for k, v in upd.param_norm.items()} == pytest.approx({n: before[n].norm().item() for n in before}, rel=1e-6)
        results.append(got)
    assert results[0] == pytest.approx(results[1], rel=1e-6)
    assert len(results[2]) == 6


def test_shared_patch_counts_users_and_leaves_a_later_patch_alone() -> None:
    from nbdebug.capture.hooks import SharedPatch

    class Target:
        def f(self) -> str:
            return "original"

    original = Target.__dict__["f"]
    patch = SharedPatch(Target, "f", lambda orig: lambda self: "ours+" + orig(self))
    a, b = object(), object()
    with HookSet() as hooks:
        patch.hold(hooks, a)
        patch.acquire(b)
        assert Target().f() == "ours+original" and patch.active
        patch.release(b)
        patch.release(b)  # idempotent
        assert Target().f() == "ours+original"  # `a` still holds it
    assert Target.__dict__["f"] is original and not patch.active and patch.users == []

    patch.acquire(a)
    theirs = lambda self: "theirs"  # noqa: E731
    Target.f = theirs  # type: ignore[method-assign]
    patch.release(a)
    assert Target.__dict__["f"] is theirs  # never clobber someone else's patch

    nothing = SharedPatch(None, "step", lambda orig: orig)  # e.g. no GradScaler in this torch
    nothing.acquire(a)
    assert not nothing.active and nothing.users == [a]
    nothing.release(a)


def test_update_ratio_follows_a_parameter_whose_storage_is_replaced() -> None:
    """The CPU fast path keeps numpy views of the parameters: `p.data = ...` between steps must be seen."""
    import numpy as np

    from nbdebug.capture.session import Capture

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 3))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(5, 4)
    want = []
    with Capture(m) as cap:
        for k in range(3):
            if k == 1:
                m[0].weight.data = m[0].weight.data.clone() * 2.0  # a new storage
            opt.zero_grad()
            m(x).square().mean().backward()
            before = torch.cat([p.detach().reshape(-1).clone() for p in m[0].parameters()])
            opt.step()
            after = torch.cat([p.detach().reshape(-1) for p in m[0].parameters()])
            want.append(float((before - after).norm() / before.norm()))
    np.testing.assert_allclose(cap.result.series("0", "update_ratio"), want, rtol=1e-5)


def closure_model() -> nn.Sequential:
    """fc (hand-set, trained) and unused (in the optimizer, never reached by the loss)."""
    model = hand_set_linear()
    model.add_module("unused", nn.Linear(2, 1))
    return model


@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize("as_kwarg", [False, True])
def test_closure_step_has_a_ratio_on_its_first_step_and_nan_for_a_parameter_without_grad(
        on_device: bool, as_kwarg: bool) -> None:
    """opt.step(closure) (Lightning's default): the gradients appear inside the step."""
    model = closure_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.tensor([[1.0, -1.0], [2.0, 0.5]])
    seen: dict[str, torch.Tensor] = {}

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model.fc(x).pow(2).sum()
        loss.backward()
        seen["g"], seen["theta"] = own(model.fc, "grad").clone(), own(model.fc).clone()
        return loss

    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20, on_device=on_device) as watch:
        ratios = []
        for _ in range(2):
            opt.step(closure=closure) if as_kwarg else opt.step(closure)
            upd = watch.take()
            ratios.append((float(upd.update_ratio["fc"]), (0.1 * seen["g"].norm() / seen["theta"].norm()).item()))
            assert math.isnan(float(upd.update_ratio["unused"]))  # no gradient: unavailable, not 0
            unused_norm = torch.cat([model.unused.weight.detach().flatten(), model.unused.bias.detach().flatten()]).norm()
            assert float(upd.param_norm["unused"]) == pytest.approx(unused_norm.item(), rel=1e-6)
            assert float(upd.param_norm["fc"]) == pytest.approx(seen["theta"].norm().item(), rel=1e-6)
    for got, want in ratios:
        assert got == pytest.approx(want, rel=1e-6)


def test_closure_step_leaves_out_a_parameter_of_a_module_without_grad() -> None:
    """A module whose weight got a gradient in the closure but not its bias: the ratio is over the
    weight alone (the optimizer stepped only that), as without a closure."""
    model = hand_set_linear()
    model.fc.bias.requires_grad_(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.tensor([[1.0, -1.0]])

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = (x @ model.fc.weight.t()).pow(2).sum()  # the bias takes no part
        loss.backward()
        return loss

    w = model.fc.weight.detach().clone()
    with HookSet() as hooks, OptimizerWatch(leaf_modules(model), hooks, 2**20) as watch:
        opt.step(closure)
        upd = watch.take()
    assert model.fc.bias.grad is None
    want = ((w - model.fc.weight.detach()).norm() / w.norm()).item()
    assert upd.update_ratio["fc"] == pytest.approx(want, rel=1e-6)
    assert upd.param_norm["fc"] == pytest.approx(w.norm().item(), rel=1e-6)


def test_seg_plan_caller_rebuilds_when_a_storage_moves_and_equals_seg_norms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flat group uses the native kernel's ``seg_plan`` when there is one (a reference built on ``seg_norms``
    here): the same ratios and norms as without it, one plan while the parameters stay put, a new
    one after ``p.data = ...`` moves a storage."""
    import numpy as np

    from nbdebug.capture import native, plans
    from nbdebug.capture.session import Capture

    if not native.available():
        pytest.skip(native.status())
    built: list[list[int]] = []

    def seg_plan(before_flat: np.ndarray, params: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        built.append([p.data_ptr() for p in params])
        return lambda: native.seg_norms(before_flat, params)

    def run(plan: bool) -> tuple[np.ndarray, np.ndarray]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(4, 6)
        with monkeypatch.context() as mp:
            real = plans._native
            mp.setattr(plans, "_native", lambda name: (seg_plan if plan else None) if name == "seg_plan" else real(name))
            with Capture(model) as cap:
                for i in range(6):
                    if i == 3:
                        with torch.no_grad():
                            model[0].weight.data = model[0].weight.data.clone()  # a new storage
                    opt.zero_grad()
                    model(x).pow(2).sum().backward()
                    opt.step()
        res = cap.result
        return (np.array([res.series(r, "update_ratio") for r in ("0", "2")]),
                np.array([res.series(r, "param_norm") for r in ("0", "2")]))

    with_plan, without = run(True), run(False)
    assert len(built) == 2 and built[0] != built[1]  # built once, again after the storage moved
    np.testing.assert_array_equal(with_plan[0], without[0])
    np.testing.assert_array_equal(with_plan[1], without[1])
    assert with_plan[0].shape == (2, 6) and np.isfinite(with_plan[0]).all() and (with_plan[0] > 0).all()


@pytest.mark.parametrize("where", ["flat_update", "_plan"])
def test_an_error_in_the_watch_is_a_note_and_the_users_loop_runs_on(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    from nbdebug.capture import optim as O
    from nbdebug.capture.session import Capture

    def boom(*_a: object, **_k: object) -> None:
        raise ValueError("boom")

    if where == "flat_update":
        monkeypatch.setattr(O, "flat_update", boom)
    else:
        monkeypatch.setattr(O.OptimizerWatch, "_plan", boom)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ref = [p.detach().clone() for p in m.parameters()]
    before = optimizer_hook_count()
    with Capture(m) as cap:
        for _ in range(3):
            opt.zero_grad()
            m(torch.ones(2, 3)).sum().backward()
            opt.step()
    res = cap.result
    assert res.steps == 3 and optimizer_hook_count() == before
    assert any(n.startswith("nbdebug could not read an optimizer step: ValueError: boom") for n in res.notes)
    assert all(not torch.equal(a, b) for a, b in zip(ref, m.parameters()))  # the optimizer stepped
    assert math.isnan(res.series("0", "update_ratio")[-1])
