"""Capture over a training loop: steps, per-step history values, the first non-finite step and phase,
dead units, evaluation forwards, delayed backward, --every, --continue, interrupts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.capture.session import Capture


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


def abc() -> nn.Sequential:
    """a: Linear(2→2) = identity, b: log, c: Linear(2→1) with hand-set weights."""
    m = nn.Sequential()
    m.add_module("a", nn.Linear(2, 2))
    m.add_module("b", Log())
    m.add_module("c", nn.Linear(2, 1))
    with torch.no_grad():
        m.a.weight.copy_(torch.eye(2))
        m.a.bias.zero_()
        m.c.weight.copy_(torch.tensor([[0.5, -0.25]]))
        m.c.bias.fill_(0.1)
    return m


def batches(n: int = 8, bad: int | None = 6) -> list[torch.Tensor]:
    xs = [torch.full((3, 2), 2.0 + k) + torch.arange(6.0).reshape(3, 2) / 10 for k in range(n)]
    if bad is not None:
        xs[bad - 1] = torch.tensor([[1.0, -1.0], [2.0, 2.0], [3.0, 3.0]])  # log of a negative value
    return xs


def train(m: nn.Module, xs: list[torch.Tensor], cap_kw: dict | None = None, lr: float = 1e-3):
    """SGD on MSE to zero; returns (result, per-step records of what the model really computed)."""
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    seen: dict[str, list[torch.Tensor]] = {"a_out": [], "b_in": [], "c_out": [], "loss": [], "c_pgn": [], "ratio_c": []}
    h1 = m.a.register_forward_hook(lambda _m, _i, o: seen["a_out"].append(o.detach().clone()))
    h2 = m.b.register_forward_hook(lambda _m, i, _o: seen["b_in"].append(i[0].detach().clone()))
    h3 = m.c.register_forward_hook(lambda _m, _i, o: seen["c_out"].append(o.detach().clone()))
    holder: list[torch.Tensor] = []
    kw = {"loss": lambda: holder[-1] if holder else None, **(cap_kw or {})}
    try:
        with Capture(m, **kw) as cap:
            for x in xs:
                opt.zero_grad()
                loss = m(x).pow(2).mean()
                holder.append(loss)
                loss.backward()
                seen["loss"].append(loss.detach().clone())
                g = torch.cat([p.grad.reshape(-1) for p in m.c.parameters()])
                seen["c_pgn"].append(g.norm())
                before = torch.cat([p.detach().reshape(-1).clone() for p in m.c.parameters()])
                opt.step()
                after = torch.cat([p.detach().reshape(-1) for p in m.c.parameters()])
                seen["ratio_c"].append((before - after).norm() / before.norm())
    finally:
        h1.remove()
        h2.remove()
        h3.remove()
    return cap.result, seen


@pytest.mark.parametrize("device_path", [False, True])
def test_nan_in_forward_at_step_6_is_found_with_its_inputs(device_path: bool) -> None:
    m = abc()
    res, seen = train(m, batches(), {"device_path": device_path})
    assert res.steps == 8 and list(res.step_index) == list(range(1, 9))
    assert res.first_nonfinite_step == 6 and res.first_nonfinite_phase == "forward"
    assert res.forward_nonfinite_step == 6 and res.layers[res.forward_nonfinite_call[0]].name == "b"
    inc = res.incident
    assert inc is not None and inc.kind == "nonfinite" and inc.step == 6 and inc.module == "b" and inc.phase == "forward"
    assert len(inc.inputs) == 1 and torch.equal(inc.inputs[0], seen["b_in"][5])
    assert torch.equal(inc.output.isnan(), torch.log(seen["b_in"][5]).isnan())
    assert "step 6: `b` produced NaN from finite inputs" in inc.message
    # the previous step's row stats are step 5's values of `b`
    assert inc.previous is not None and inc.previous["mean"] == pytest.approx(float(torch.log(seen["b_in"][4]).mean()), rel=1e-6)
    c_inc = res.incidents[0]
    assert c_inc is inc and all(i.kind in ("nonfinite", "loss_spike") for i in res.incidents)
    assert res.series("b", "nan")[:6].tolist() == [0, 0, 0, 0, 0, 1]


@pytest.mark.parametrize("device_path", [False, True])
def test_series_equal_hand_computed_per_step_values(device_path: bool) -> None:
    m = abc()
    res, seen = train(m, batches(bad=None), {"device_path": device_path}, lr=1e-2)
    np.testing.assert_allclose(res.series("a", "mean"), [float(o.mean()) for o in seen["a_out"]], rtol=1e-6)
    np.testing.assert_allclose(res.series("a", "max"), [float(o.max()) for o in seen["a_out"]], rtol=1e-6)
    np.testing.assert_allclose(res.series("a", "std"), [float(o.std()) for o in seen["a_out"]], rtol=1e-4)
    np.testing.assert_allclose(res.series("loss"), [float(v) for v in seen["loss"]], rtol=1e-6)
    np.testing.assert_allclose(res.series("c", "param_grad_norm"), [float(v) for v in seen["c_pgn"]], rtol=1e-5)
    np.testing.assert_allclose(res.series("c", "update_ratio"), [float(v) for v in seen["ratio_c"]], rtol=1e-4)
    np.testing.assert_allclose(res.series("lr"), [1e-2] * 8, rtol=1e-6)
    assert np.isnan(res.series("b", "param_grad_norm")).all()  # no parameters
    # grad of the output y (3×1) of c: d(mean(y²))/dy = 2y/3
    y = seen["c_out"]
    assert len(y) == 8 and all(t.shape == (3, 1) for t in y)
    np.testing.assert_allclose(res.series("c", "grad_norm"), [float((2 * t / 3).norm()) for t in y], rtol=1e-5)
    assert res.first_nonfinite_step is None and res.incident is None
    # merged rows still whole-run
    assert res["a"].calls == 8 and res["a"].stats["mean"] == pytest.approx(float(torch.stack(seen["a_out"]).mean()), rel=1e-6)


def test_backward_only_nan_is_output_grad() -> None:
    m = nn.Sequential(nn.Linear(2, 2), Sqrt(), nn.Linear(2, 1))
    with torch.no_grad():
        m[0].weight.copy_(torch.eye(2))
        m[0].bias.zero_()
    opt = torch.optim.SGD(m[2].parameters(), lr=1e-3)  # the sqrt's input stays exactly 0 at step 3
    with Capture(m) as cap:
        for k in range(4):
            x = torch.full((2, 2), 0.0 if k == 2 else 1.0 + k)
            opt.zero_grad()
            m(x).sum().backward()
            opt.step()
    res = cap.result
    assert res.forward_nonfinite_step is None  # sqrt(0) = 0: every forward value is finite
    assert res.first_nonfinite_step == 3 and res.first_nonfinite_phase == "output_grad"
    assert res.backward_nonfinite_step == 3 and res.param_grad_nonfinite_step == 3
    inc = res.incident
    assert inc.phase == "output_grad" and inc.step == 3 and inc.module == "1" and inc.inputs is None
    g = res.series("0", "grad_inf")
    assert g[:2].tolist() == [0, 0] and g[2] > 0


class Scale(nn.Module):
    """y = x · sqrt(|w|): at w = 0 the gradient of w is non-finite while every output gradient is finite."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w.abs().sqrt()


def test_parameter_gradient_only_nan_is_param_grad() -> None:
    m = nn.Sequential(nn.Linear(2, 2), Scale(), nn.Linear(2, 1))
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    with Capture(m) as cap:
        for k in range(5):
            if k == 3:
                with torch.no_grad():
                    m[1].w.zero_()
            opt.zero_grad()
            m(torch.randn(4, 2)).sum().backward()
            opt.step()
    res = cap.result
    assert res.first_nonfinite_step == 4 and res.first_nonfinite_phase == "param_grad"
    assert res.param_grad_nonfinite_step == 4
    # step 4's output gradients are finite; its optimizer step wrote the NaN into w, so step 5's forward is not
    assert (res.backward_nonfinite_step, res.forward_nonfinite_step) == (5, 5)
    assert res.incident.module == "1" and res.incident.phase == "param_grad"
    pgn = res.series("1", "param_grad_norm")
    assert np.all(np.isfinite(pgn[:3])) and not np.isfinite(pgn[3])


@pytest.mark.parametrize("device_path", [False, True])
def test_eval_forwards_inside_a_training_loop_are_not_steps(device_path: bool) -> None:
    m = abc()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    xs = batches(4, bad=None)
    with Capture(m, device_path=device_path) as cap:
        with torch.no_grad():
            m(xs[0] * 100)  # a sanity evaluation before training: held back, then an evaluation
        for x in xs:
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
            with torch.no_grad():
                m(x * 100)  # evaluation: not a step
    res = cap.result
    assert res.steps == 4 and res.eval_steps == 5 and res["a"].calls == 4
    assert res.series("a", "max").max() < 100  # no evaluation value leaked into the history
    assert any("evaluation" in n for n in res.notes)


def test_only_no_grad_forwards_are_steps() -> None:
    m = abc()
    with Capture(m) as cap, torch.inference_mode():
        for x in batches(3, bad=None):
            m(x)
    assert cap.result.steps == 3 and cap.result.eval_steps == 0 and list(cap.result.step_index) == [1, 2, 3]


@pytest.mark.parametrize("device_path", [False, True])
def test_two_calls_per_step_and_delayed_backward(device_path: bool) -> None:
    relu = nn.ReLU()
    m = nn.Sequential(nn.Linear(2, 2), relu, nn.Linear(2, 2), relu)
    x1, x2 = torch.randn(3, 2), torch.randn(3, 2)
    with Capture(m, device_path=device_path) as cap:
        y1 = m(x1)
        y2 = m(x2)  # closes step 1 before its backward ran
        (y1.sum() + 2 * y2.sum()).backward()
    res = cap.result
    assert [r.name for r in res.layers] == ["0", "1", "2", "1#2"] and res.steps == 2
    # output gradient of the last ReLU is 1 (step 1) and 2 (step 2) everywhere: norm sqrt(6), 2·sqrt(6)
    np.testing.assert_allclose(res.series("1#2", "grad_norm"), [math.sqrt(6), 2 * math.sqrt(6)], rtol=1e-6)
    np.testing.assert_allclose(res.series("1#2", "grad_mean"), [1.0, 2.0])
    assert res["1#2"].grad["norm"] == pytest.approx(math.sqrt(6 + 24), rel=1e-6)  # merged rows got the late gradients too
    with torch.no_grad():
        h1, h2 = torch.relu(m[0](x1)), torch.relu(m[0](x2))
    np.testing.assert_allclose(res.series("1", "mean"), [float(h1.mean()), float(h2.mean())], rtol=1e-6)


def dead_model() -> nn.Sequential:
    m = nn.Sequential(nn.Conv2d(1, 4, 1), nn.ReLU())
    with torch.no_grad():
        m[0].weight.fill_(1.0)
        m[0].bias.copy_(torch.tensor([0.0, -100.0, -100.0, -100.0]))  # 3 of 4 channels dead
    return m


@pytest.mark.parametrize("device_path", [False, True])
def test_dead_unit_fraction_is_exact(device_path: bool) -> None:
    m = dead_model()
    x = torch.randn(5, 1, 3, 3)
    x[0, 0, 0, 0] = 5.0  # channel 0 alive
    with Capture(m, device_path=device_path) as cap:
        m(x)
        m(x + 150.0)  # step 2: every channel alive (and the 2-D path on the Linear-like shape below)
    res = cap.result
    assert res.series("1", "dead_unit_frac").tolist() == [0.75, 0.0]
    assert res.series("0", "dead_unit_frac").tolist() == [0.0, 0.0]
    assert res["1"].stats["dead_unit_frac"] == 0.0  # whole run: dead only when zero in every call
    with Capture(m, device_path=device_path) as cap2:
        m(x)
        m(x)
    assert cap2.result["1"].stats["dead_unit_frac"] == 0.75
    lin = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    with torch.no_grad():
        lin[0].weight.fill_(0.0)
        lin[0].bias.copy_(torch.tensor([1.0, -1.0, 2.0, 0.0]))
    with Capture(lin, device_path=device_path) as cap3:
        lin(torch.randn(6, 3))
    assert cap3.result["1"].stats["dead_unit_frac"] == 0.5 and cap3.result.series("1", "dead_unit_frac").tolist() == [0.5]


def test_dead_units_or_across_micro_batches_of_one_step() -> None:
    m = dead_model()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    x = torch.randn(2, 1, 3, 3)
    with Capture(m, step_on="optimizer") as cap:
        for _ in range(2):
            m(x).sum().backward()  # micro-batch 1: channels 1-3 dead
            m(x + 150.0).sum().backward()  # micro-batch 2: all alive
            opt.step()
            opt.zero_grad()
    res = cap.result
    assert res.steps == 2 and res["1"].calls == 4
    assert res.series("1", "dead_unit_frac").tolist() == [0.0, 0.0]


def test_every_keeps_first_grid_first_nonfinite_and_last() -> None:
    m = abc()
    res, _ = train(m, batches(8, bad=5), {"every": 3})
    assert res.steps == 8 and res.every == 3
    assert list(res.step_index) == [1, 4, 5, 7, 8]
    assert res.first_nonfinite_step == 5


def test_resume_continues_steps_history_and_rows() -> None:
    m = abc()
    res1, _ = train(m, batches(3, bad=None))
    res2, seen = train(m, batches(2, bad=None), {"resume": res1})
    assert res2.steps == 5 and list(res2.step_index) == [1, 2, 3, 4, 5]
    assert res2["a"].calls == 5 and res1.steps == 3 and list(res1.step_index) == [1, 2, 3]
    np.testing.assert_allclose(res2.series("a", "mean")[3:], [float(o.mean()) for o in seen["a_out"]], rtol=1e-6)
    np.testing.assert_allclose(res2.series("a", "mean")[:3], res1.series("a", "mean"))


def test_break_on_nonfinite_raises_in_the_hook_and_leaves_the_model_alone() -> None:
    from nbdebug import NonFiniteError

    m = abc()
    before = fingerprint(m)
    xs = batches(8, bad=6)
    with pytest.raises(NonFiniteError) as info:
        with Capture(m, break_on="nonfinite") as cap:
            for x in xs:
                m(x)
    err = info.value
    assert err.step == 6 and err.module == "b" and torch.equal(err.inputs[0], m.a(xs[5]))
    frame = info.tb
    while frame.tb_next is not None:
        frame = frame.tb_next
    assert {"inputs", "output", "module"} <= set(frame.tb_frame.f_locals)
    assert hook_count(m) == 0 and same_fingerprint(before, fingerprint(m)) == []
    res = cap.result
    assert res.steps == 6 and res.forward_nonfinite_step == 6 and res.incident.module == "b"
    assert res.raised.startswith("NonFiniteError")


def test_keyboard_interrupt_keeps_the_steps_recorded() -> None:
    m = abc()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    with pytest.raises(KeyboardInterrupt):
        with Capture(m) as cap:
            for k, x in enumerate(batches(8, bad=None)):
                opt.zero_grad()
                loss = m(x).pow(2).mean()
                if k == 4:
                    raise KeyboardInterrupt
                loss.backward()
                opt.step()
    assert hook_count(m) == 0
    res = cap.result
    assert res.steps == 5 and list(res.step_index) == [1, 2, 3, 4, 5]
    assert np.isfinite(res.series("c", "grad_norm")[:4]).all() and np.isnan(res.series("c", "grad_norm")[4])


def test_loss_of_output_and_on_step() -> None:
    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x).pow(2).mean()  # the model returns its loss

    m = WithLoss()
    calls: list[int] = []
    xs = [torch.randn(4, 2) for _ in range(3)]
    losses = []
    with Capture(m, on_step=lambda c: calls.append(c.history.steps)) as cap:
        for x in xs:
            out = m(x)
            losses.append(float(out.detach()))
            out.backward()
    assert calls == [1, 2, 3]
    np.testing.assert_allclose(cap.result.series("loss"), losses, rtol=1e-6)


def test_loss_spike_is_an_incident_without_module() -> None:
    m = nn.Sequential(nn.Linear(2, 1))
    losses = [1.0, 1.1, 0.9, 1.0, 1.05, 50.0, 1.0]
    k = [0]
    with Capture(m, loss=lambda: losses[k[0]]) as cap:
        for i in range(len(losses)):
            m(torch.randn(2, 2))
            k[0] = i  # the user's `loss` of step i (read when step i closes: next forward, or exit)
    spikes = [i for i in cap.result.incidents if i.kind == "loss_spike"]
    assert len(spikes) == 1 and spikes[0].module is None and spikes[0].value == 50.0
    assert spikes[0].median == pytest.approx(1.0, abs=0.06)


def test_hand_written_update_loop_has_no_update_ratio_and_says_so() -> None:
    from nbdebug.capture.optim import NO_OPTIMIZER_NOTE

    m = abc()
    with Capture(m) as cap:
        for x in batches(3, bad=None):
            m(x).pow(2).mean().backward()
            with torch.no_grad():
                for p in m.parameters():
                    p -= 1e-3 * p.grad
                    p.grad = None
    res = cap.result
    assert np.isnan(res.series("c", "update_ratio")).all() and np.isfinite(res.series("c", "param_grad_norm")).all()
    assert NO_OPTIMIZER_NOTE in res.notes


@pytest.mark.parametrize("device_path", [False, True])
def test_output_gradient_stats_per_step_equal_the_real_gradients(device_path: bool) -> None:
    """Every row's per-step gradient stats equal the gradients autograd computed (a Flatten's gradient
    is a view of the next one's: its stats are copied, not recomputed; both must still be right),
    on tensors large enough for the torch path (ReLU: non-negative outputs and -0.0 values)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 136 * 136, 3))
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    grads: dict[str, list[torch.Tensor]] = {"0": [], "1": [], "2": [], "3": []}
    outs: dict[str, list[torch.Tensor]] = {"1": []}

    def keep(name: str):  # type: ignore[no-untyped-def]
        def hook(_m, _i, o):  # type: ignore[no-untyped-def]
            if name in outs:
                outs[name].append(o.detach().clone())
            o.register_hook(lambda g: grads[name].append(g.detach().clone()))
        return hook

    handles = [getattr(m, k).register_forward_hook(keep(k)) for k in grads]
    try:
        with Capture(m, device_path=device_path) as cap:
            for _ in range(3):
                x = torch.randn(2, 1, 136, 136)
                x[0, 0, :5] = -0.0
                opt.zero_grad()
                m(x).square().mean().backward()
                opt.step()
    finally:
        for h in handles:
            h.remove()
    res = cap.result
    assert res["1"].shape == (2, 4, 136, 136) and res["1"].stats["numel"] * 4 > (1 << 16)  # the torch path
    for name, gs in grads.items():
        np.testing.assert_allclose(res.series(name, "grad_mean"), [float(g.double().mean()) for g in gs], rtol=1e-4, atol=1e-12)
        np.testing.assert_allclose(res.series(name, "grad_norm"), [float(g.double().norm()) for g in gs], rtol=1e-5)
        np.testing.assert_array_equal(res.series(name, "grad_min"), [float(g.min()) for g in gs])
        np.testing.assert_array_equal(res.series(name, "grad_max"), [float(g.max()) for g in gs])
    np.testing.assert_allclose(res.series("1", "zero_frac"), [float((o == 0).double().mean()) for o in outs["1"]], rtol=1e-6)  # float32 history
    np.testing.assert_array_equal(res.series("1", "min"), [float(o.min()) for o in outs["1"]])
    np.testing.assert_array_equal(res.series("1", "max"), [float(o.max()) for o in outs["1"]])


# -- GradScaler: gradients recorded unscaled ----------------------------------------------------------
def _mlp() -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _scaled_run(scaler_kind: str | None, device_path: bool, bf16: bool = False):
    """The same loop without a scaler, with one (``"plain"``), or with one and the clipping recipe
    (``"unscale"``: ``scaler.unscale_(opt)`` then ``clip_grad_norm_`` before ``scaler.step``)."""
    m = _mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if scaler_kind else None
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(4)]
    ns: dict[str, torch.Tensor] = {}
    with Capture(m, loss=lambda: ns.get("loss"), device_path=device_path) as cap:
        for x, y in data:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = nn.functional.cross_entropy(m(x).float(), y)
            ns["loss"] = loss
            if scaler is None:
                loss.backward()
                opt.step()
                continue
            scaler.scale(loss).backward()
            if scaler_kind == "unscale":
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(m.parameters(), 1e9)  # no-op clip: the same parameters
            scaler.step(opt)
            scaler.update()
    return cap.result, scaler


_GRAD_FIELDS = ("grad_mean", "grad_std", "grad_min", "grad_max", "grad_norm")


@pytest.mark.parametrize("device_path", [False, True])
@pytest.mark.parametrize("kind", ["plain", "unscale"])
def test_grad_scaler_gradients_are_recorded_unscaled(kind: str, device_path: bool) -> None:
    ref, _ = _scaled_run(None, device_path)
    res, scaler = _scaled_run(kind, device_path)
    assert scaler.get_scale() == 2.0**10 and res.skipped_steps.tolist() == []  # the premise: no skipped step
    assert res.steps == ref.steps == 4
    for row in ("0", "1", "2"):
        for f in _GRAD_FIELDS:
            np.testing.assert_allclose(res.series(row, f), ref.series(row, f), rtol=1e-5, err_msg=f"{row} {f}")
        np.testing.assert_array_equal(res.series(row, "grad_nan"), ref.series(row, "grad_nan"))
    for row in ("0", "2"):
        np.testing.assert_allclose(res.series(row, "param_grad_norm"), ref.series(row, "param_grad_norm"), rtol=1e-5)
        assert np.isfinite(res.series(row, "param_grad_norm")).all()
        np.testing.assert_allclose(res.series(row, "update_ratio"), ref.series(row, "update_ratio"), rtol=1e-5)
    # the whole-run values are merged from unscaled steps too
    for a, b in zip(res.layers, ref.layers):
        for k in ("mean", "std", "min", "max", "norm"):
            assert a.grad[k] == pytest.approx(b.grad[k], rel=1e-5), (a.name, k)
    from nbdebug.inspectors.thermometer import diagnose

    assert not [f for f in diagnose(res).flags if "exploding" in f]


def test_grad_scaler_bf16_autocast_matches_the_unscaled_loop() -> None:
    ref, _ = _scaled_run(None, False, bf16=True)
    res, _ = _scaled_run("plain", False, bf16=True)
    for f in _GRAD_FIELDS:
        np.testing.assert_allclose(res.series("2", f), ref.series("2", f), rtol=1e-5, err_msg=f)
    np.testing.assert_allclose(res.series("2", "param_grad_norm"), ref.series("2", "param_grad_norm"), rtol=1e-5)


# -- --loss NAME: a loss variable that was not reassigned is unknown, not the previous value ----------
def test_loss_not_reassigned_is_nan_with_a_note() -> None:
    m = _mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ns: dict[str, torch.Tensor] = {}
    want = []
    x, y = torch.ones(2, 4), torch.tensor([0, 2])
    with Capture(m, loss=lambda: ns.get("loss")) as cap:
        for s in range(1, 6):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(m(x), y)
            if s in (1, 2, 4):  # the user forgets to publish the loss at steps 3 and 5
                ns["loss"] = loss
            want.append(loss.item() if s in (1, 2, 4) else math.nan)
            loss.backward()
            opt.step()
    np.testing.assert_allclose(cap.result.series("loss"), want, rtol=1e-6)
    assert cap.stale_loss == [3, 5]
    assert [n for n in cap.result.notes if n.startswith("loss unknown")] == [
        "loss unknown (NaN) at steps 3, 5: the loss variable still held the previous step's loss object "
        "(not reassigned, e.g. the forward raised before it)"]


def test_break_on_nonfinite_step_loss_is_unknown() -> None:
    m = abc()
    ns: dict[str, torch.Tensor] = {}
    xs = batches(bad=3)
    seen = []
    with pytest.raises(FloatingPointError):
        with Capture(m, loss=lambda: ns.get("loss"), break_on="nonfinite") as cap:
            for x in xs:
                loss = m(x).pow(2).mean()
                ns["loss"] = loss
                seen.append(loss.item())
                loss.backward()
    loss_series = cap.result.series("loss")
    assert cap.result.first_nonfinite_step == 3 and len(seen) == 2
    np.testing.assert_allclose(loss_series[:2], seen, rtol=1e-6)
    assert math.isnan(loss_series[2]), loss_series


@pytest.mark.parametrize("device_path", [False, True])
@pytest.mark.parametrize("n", [8, 1 << 17])  # small gradients (BLAS path) and large ones (_foreach_norm)
def test_finite_parameter_gradients_whose_float32_norm_overflows_are_not_non_finite(device_path: bool, n: int) -> None:
    """|g| ~ 1e25 is finite, but its float32 sum of squares overflows: no NaN/Inf step, and the norm is
    the float64 one on the CPU path (float32's largest value on the device path)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(n, 1))
    x = torch.ones(2, n)
    with Capture(model, device_path=device_path) as cap:
        (model(x) * 1e25).sum().backward()
    res = cap.result
    g = model[0].weight.grad.double()
    assert torch.isfinite(model[0].weight.grad).all() and not torch.isfinite(model[0].weight.grad.norm())
    assert res.first_nonfinite_step is None and res.param_grad_nonfinite_step is None
    got = res.series("0", "param_grad_norm")[-1]
    want = float(torch.linalg.vector_norm(torch.cat([g.reshape(-1), model[0].bias.grad.double()])))
    if device_path:
        assert got == pytest.approx(float(torch.finfo(torch.float32).max), rel=1e-6)
    else:
        assert got == pytest.approx(want, rel=1e-6)


# -- the model's own forward never called (Lightning's training_step: self.decoder(self.encoder(x))) --
class AutoEncoder(nn.Module):
    """LitAutoEncoder-shaped: ``forward`` exists but the loop calls the submodules directly."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2))
        self.decoder = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # never called below
        raise AssertionError("the loop calls the submodules")


_AE_ROWS = ["encoder.0", "encoder.1", "encoder.2", "decoder.0", "decoder.1", "decoder.2"]


def _rootless_loop(step_on: str, sanity: bool, device_path: bool, micro: int = 1, steps: int = 12, every: int = 4):
    """``steps`` SGD steps of ``micro`` micro-batches each, calling ``m.decoder(m.encoder(x))``; a
    validation forward under inference_mode after every ``every`` steps (and one before training when
    ``sanity``, like Lightning's sanity check). Returns (result, per-step mean of the encoder's
    training outputs, the model)."""
    m = AutoEncoder()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(5, 6, generator=g) for _ in range(steps * micro)]
    xv = torch.randn(5, 6, generator=g) * 100  # validation values far from the training ones
    enc: list[list[torch.Tensor]] = []
    with Capture(m, step_on=step_on, device_path=device_path) as cap:
        if sanity:
            with torch.inference_mode():
                m.decoder(m.encoder(xv))
        for i in range(steps):
            opt.zero_grad()
            enc.append([])
            for j in range(micro):
                x = xs[i * micro + j]
                z = m.encoder(x)
                enc[-1].append(z.detach().clone())
                (nn.functional.mse_loss(m.decoder(z), x) / micro).backward()
            opt.step()
            if (i + 1) % every == 0:
                with torch.inference_mode():
                    m.decoder(m.encoder(xv))
    return cap.result, [float(torch.cat(zs).mean()) for zs in enc], m


@pytest.mark.parametrize("device_path", [False, True])
@pytest.mark.parametrize("sanity", [False, True])
@pytest.mark.parametrize("step_on", ["optimizer", "forward"])
def test_submodules_called_directly_one_step_per_iteration_validation_is_evaluation(
        step_on: str, sanity: bool, device_path: bool) -> None:
    res, enc_mean, m = _rootless_loop(step_on, sanity, device_path)
    assert res.steps == 12 and list(res.step_index) == list(range(1, 13))
    assert res.eval_steps == 12 // 4 + sanity
    assert [r.name for r in res.layers] == _AE_ROWS  # one call of each per step: no `encoder.0#2`
    assert res["encoder.0"].calls == 12
    np.testing.assert_allclose(res.series("encoder.2", "mean"), enc_mean, rtol=1e-5, atol=1e-7)
    assert res.series("encoder.0", "max").max() < 50  # no validation value leaked into the history
    assert np.isfinite(res.series("decoder.2", "grad_norm")).all()
    assert hook_count(m) == 0


def test_submodules_called_directly_micro_batches_merge_per_optimizer_step() -> None:
    res, enc_mean, _ = _rootless_loop("optimizer", True, False, micro=2, steps=6, every=3)
    assert res.steps == 6 and res.eval_steps == 6 // 3 + 1
    assert [r.name for r in res.layers] == _AE_ROWS and res["encoder.0"].calls == 12
    np.testing.assert_allclose(res.series("encoder.2", "mean"), enc_mean, rtol=1e-5, atol=1e-7)
    res, _, _ = _rootless_loop("forward", False, False, micro=2, steps=6, every=3)
    assert res.steps == 12 and res.eval_steps == 2  # step_on="forward": each micro-batch is a step


def test_submodules_called_directly_under_inference_mode_are_steps() -> None:
    m = AutoEncoder()
    xs = [torch.full((2, 6), float(k)) for k in range(3)]
    outs = []
    with Capture(m) as cap, torch.inference_mode():
        for x in xs:
            outs.append(m.encoder(x))
            m.decoder(outs[-1])
    res = cap.result
    assert res.steps == 3 and res.eval_steps == 0 and [r.name for r in res.layers] == _AE_ROWS
    np.testing.assert_allclose(res.series("encoder.2", "mean"), [float(o.mean()) for o in outs], rtol=1e-6)


class Raises(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inner.encoder(x)
        raise ValueError("bad batch")


def test_submodules_called_directly_after_a_raising_forward_and_with_a_no_grad_target_network() -> None:
    """A top-level forward that raised is over (later direct calls still make steps); a no-grad call
    inside a training pass (a target network, not the pass's first module) is not an evaluation."""
    m = AutoEncoder()
    root = Raises(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    target = nn.Linear(4, 2)
    xs = [torch.randn(4, 6, generator=torch.Generator().manual_seed(k)) for k in range(5)]
    with Capture(root, step_on="forward") as cap:
        with pytest.raises(ValueError):
            root(xs[0])
        for x in xs:
            opt.zero_grad()
            z = m.encoder(x)
            with torch.no_grad():
                t = root.inner.decoder[0](z)  # selected module, no grad, mid-pass
            (nn.functional.mse_loss(m.decoder(z), x) + target(t).sum() * 0).backward()
            opt.step()
    res = cap.result
    assert res.steps == 1 + 5 and res.eval_steps == 0  # the raising forward's pass is a step of its own
    assert [r.name for r in res.layers] == ["inner." + n for n in _AE_ROWS]  # the no-grad call is not recorded
    assert res["inner.encoder.0"].calls == 6 and res["inner.decoder.0"].calls == 5


@pytest.mark.parametrize("step_on", ["forward", "optimizer"])
def test_model_that_is_its_own_only_layer(step_on: str) -> None:
    """The root is the selected module: its own hook runs while its forward is still the top-level one."""
    m = nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    means = []
    with Capture(m, step_on=step_on) as cap:
        for i in range(3):
            opt.zero_grad()
            y = m(torch.ones(1, 2) * i)
            means.append(float(y.detach().mean()))
            y.sum().backward()
            opt.step()
            with torch.no_grad():
                m(torch.ones(1, 2) * 100)
    res = cap.result
    assert res.steps == 3 and res.eval_steps == 3 and res.forward_passes == 3 and [r.name for r in res.layers] == [""]
    np.testing.assert_allclose(res.series("", "mean"), means, rtol=1e-6)
    assert hook_count(m) == 0 and not m._forward_hooks_always_called


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x * 2


class _Empty(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :0]


class _Mixed(nn.Module):
    """Every case the capture's short paths hand to their general path: a tuple output, an aliased view
    (Flatten), a module called twice per step (``relu#2``), a saturating Tanh, an empty output (NaN
    min/max), a 1-element output (the general std branch)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.relu, self.flat = nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten()
        self.fc, self.tanh, self.pair, self.empty = nn.Linear(4 * 6 * 6, 8), nn.Tanh(), _Pair(), _Empty()
        self.head, self.one = nn.Linear(8, 3), nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.flat(self.relu(self.conv(x)))
        a, b = self.pair(self.tanh(self.fc(x)))
        x = self.relu(a + b)
        return self.head(x) + self.empty(x).sum() + self.one(self.head(x)[:1]).sum()


def _mixed_run(step_on: str, general: bool, monkeypatch: pytest.MonkeyPatch, every: int = 1) -> Any:
    torch.manual_seed(0)
    m = _Mixed()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(4, 1, 8, 8, generator=g) for _ in range(12)]
    xs[8][0, 0, 0, 0] = float("nan")  # a non-finite step late in the run
    # general: every short path off (fast_paths=False): the general forward path, the exact accumulation,
    # a full non-finite scan, no batched fold
    seen: list[tuple[int, int, int]] = []  # what on_step sees: (step, kept steps, last kept step)
    on_step = (lambda c: seen.append((c.step, len(c.history), int(c.history.step_index[-1])))) if every > 1 else None
    with Capture(m, step_on=step_on, every=every, on_step=on_step, fast_paths=not general) as cap:
        per_step = 2 if step_on == "optimizer" else 1
        for i in range(0, len(xs), per_step):
            opt.zero_grad()
            for x in xs[i : i + per_step]:
                m(x).pow(2).mean().backward()
            opt.step()
    deferred = [cap.batched_steps]  # the steps folded later in a batch (batch.py)
    cap.result.deferred = deferred[0]  # type: ignore[attr-defined]
    cap.result.seen = seen  # type: ignore[attr-defined]
    return cap.result


@pytest.mark.parametrize(("step_on", "every"), [("forward", 1), ("forward", 3), ("optimizer", 1)])  # optimizer: two passes per step
def test_short_paths_give_the_general_paths_history(step_on: str, every: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward hook's short path, the step close's cached layout and one-slice accumulation, the
    skipped non-finite scan and the batched fold (batch.py) give exactly what the general paths give:
    same history (every kept step, every field, last/min/max and scalars), same whole-run rows, same
    first non-finite step."""
    fast, slow = _mixed_run(step_on, False, monkeypatch, every), _mixed_run(step_on, True, monkeypatch, every)
    assert fast.seen == slow.seen  # on_step (every 3rd step and the first non-finite one) sees the same history
    assert fast.steps == slow.steps == (6 if step_on == "optimizer" else 12)
    # the batched fold ran for the finite steps after the first (rows merged per step are folded at once)
    assert fast.deferred == (7 if step_on == "forward" else 0) and slow.deferred == 0
    assert fast.history.rows == slow.history.rows and "relu#2" in fast.history.rows and "pair[1]" in fast.history.rows
    for agg in ("last", "min", "max"):
        np.testing.assert_array_equal(fast.history.values(agg), slow.history.values(agg))
        for s in ("loss", "lr", "skipped"):
            np.testing.assert_array_equal(fast.history.scalar(s, agg), slow.history.scalar(s, agg))
    assert [(r.name, r.calls, r.stats, r.grad, r.inputs) for r in fast.layers] == \
        [(r.name, r.calls, r.stats, r.grad, r.inputs) for r in slow.layers] or _same_nan(fast, slow)
    assert fast.first_nonfinite_step == slow.first_nonfinite_step is not None
    assert fast.first_nonfinite_phase == slow.first_nonfinite_phase


def _same_nan(a: Any, b: Any) -> bool:
    """Whole-run rows equal, NaN equal to NaN."""
    for ra, rb in zip(a.layers, b.layers, strict=True):
        assert (ra.name, ra.calls, ra.inputs) == (rb.name, rb.calls, rb.inputs)
        for da, db in ((ra.stats, rb.stats), (ra.grad or {}, rb.grad or {})):
            assert da.keys() == db.keys()
            np.testing.assert_array_equal(np.array(list(da.values())), np.array(list(db.values())))
    return True


def test_step_values_fast_branch_equals_general_branch() -> None:
    """``fold.step_values`` takes a shorter branch when every row counts 2+ values: the same numbers as
    the general branch (forced here by one more row counting a single value)."""
    from nbdebug.capture.fold import step_values
    from nbdebug.capture.stats import tensor_stats

    g = torch.Generator().manual_seed(0)
    rows = [np.concatenate([tensor_stats(torch.randn(n, generator=g)), tensor_stats(torch.randn(n + 3, generator=g))])
            for n in (5, 17, 2)]
    rg = np.stack(rows)
    one = np.concatenate([tensor_stats(torch.randn(1, generator=g)), tensor_stats(torch.randn(4, generator=g))])
    fast = step_values(rg, [1], True)
    general = step_values(np.vstack([rg, one]), [1], True)
    np.testing.assert_array_equal(fast, general[:3])
    assert np.isnan(general[3, 1])  # std of one value


class _SignGate(nn.Module):
    """``x * sgn(g)``: ``g`` is used only through ``torch.sgn``, whose gradient is a ZeroTensor (no
    memory: ``data_ptr() == 0``, ``.numpy()`` raises)."""

    def __init__(self) -> None:
        super().__init__()
        self.g = nn.Parameter(torch.tensor([0.5, -2.0, 1.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sgn(self.g)


@pytest.mark.parametrize("device_path", [False, True])
@pytest.mark.parametrize("native_norms", [True, False])
def test_zerotensor_parameter_gradient_has_norm_zero(device_path: bool, native_norms: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A parameter used only through ``torch.sgn`` in an SGD loop: the loop runs, its gradient norm is 0
    every step, the other parameters' norms are the real ones (native norms and the numpy path)."""
    from nbdebug.capture import gradnorms

    if not native_norms:
        monkeypatch.setattr(gradnorms._native, "sq_norms", lambda grads: None)  # the kernel says "not in use"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), _SignGate(), nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(5, 4)
    want: list[float] = []
    with Capture(model, device_path=device_path) as cap:
        for _ in range(3):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            assert model[1].g.grad._is_zerotensor()
            want.append(float(torch.linalg.vector_norm(torch.cat([model[2].weight.grad.reshape(-1), model[2].bias.grad]))))
            opt.step()
    res = cap.result
    assert res.steps == 3 and res.first_nonfinite_step is None and res.param_grad_nonfinite_step is None
    assert list(res.series("1", "param_grad_norm")) == [0.0, 0.0, 0.0]
    np.testing.assert_allclose(res.series("2", "param_grad_norm"), want, rtol=1e-5)


# ------------------------------------------------------------------ which parameter gradients are a step's
def test_param_grad_norms_are_the_steps_own_gradients_without_per_parameter_hooks() -> None:
    """A parameter's gradient is the step's when the step's backward wrote it (a new .grad, or one
    accumulated in place): ``zero_grad(set_to_none=False)`` zeroes in place too, so a layer the backward
    does not reach has no norm (NaN), not 0; a layer it reaches has ‖∇‖ of its own weight and bias."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
            self.side = nn.Linear(3, 2)  # on the loss's path only at even steps

        def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:
            y = self.m(x)
            s = self.side(x)
            return y + s if k % 2 == 0 else y + s.detach()

    model = Net()
    m, side = model.m, model.side
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = [torch.randn(5, 3) for _ in range(4)]
    want: list[dict[str, float]] = []
    with Capture(model) as cap:
        assert not any(p._post_accumulate_grad_hooks for p in model.parameters())  # no hook per parameter
        for k, x in enumerate(xs):
            opt.zero_grad(set_to_none=False)
            model(x, k).pow(2).mean().backward()
            want.append({name: float(torch.cat([mod.weight.grad.reshape(-1), mod.bias.grad]).norm())
                         for name, mod in (("m.0", m[0]), ("m.2", m[2]), ("side", side))})
            opt.step()
    res = cap.result
    assert res.steps == 4
    for name in ("m.0", "m.2"):
        np.testing.assert_allclose(res.series(name, "param_grad_norm"), [w[name] for w in want], rtol=1e-6)
    side_pgn = res.series("side", "param_grad_norm")
    np.testing.assert_allclose(side_pgn[[0, 2]], [want[0]["side"], want[2]["side"]], rtol=1e-6)
    assert np.isnan(side_pgn[[1, 3]]).all()


def test_param_grad_norms_when_no_recorded_output_is_on_the_backwards_path() -> None:
    """A loss on the parameters alone (no output-gradient hook fires): the norms are read before the
    optimizer step; without an optimizer, when the step closes, so a gradient zeroed before that (here
    by the next step's ``zero_grad()``) is not seen: the known limit of having no hook per parameter."""
    m = nn.Linear(2, 2)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        m.bias.copy_(torch.tensor([0.5, -0.5]))
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    want = float(torch.cat([2 * m.weight.detach().reshape(-1), 2 * m.bias.detach()]).norm())
    for use_opt in (True, False):
        with Capture(m) as cap:
            for _ in range(2):
                opt.zero_grad()
                m(torch.ones(1, 2))  # a step opens; its output is not on the loss's path
                (m.weight.pow(2).sum() + m.bias.pow(2).sum()).backward()
                if use_opt:
                    opt.step()
        got = cap.result.series("", "param_grad_norm")
        if use_opt:
            assert got.tolist() == pytest.approx([want, want], rel=1e-6)
        else:
            assert np.isnan(got[0]) and got[1] == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("eval_between", [False, True])
def test_step_on_optimizer_two_optimizers_after_one_backward_are_one_step(eval_between: bool) -> None:
    """step_on="optimizer": a step ends at the first training forward after an optimizer step, so two
    optimizers stepped after one backward (one per part of the model) belong to the same step: every
    step has both parts' update ratios and learning rates, and there is one step per iteration (an
    evaluation forward in between changes nothing)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt_a = torch.optim.SGD(m[0].parameters(), lr=0.1)
    opt_b = torch.optim.SGD(m[2].parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(16, 4)
    want: dict[str, list[float]] = {"0": [], "2": []}
    with Capture(m, step_on="optimizer") as cap:
        for _ in range(3):
            opt_a.zero_grad()
            opt_b.zero_grad()
            m(x).pow(2).mean().backward()
            before = {k: torch.cat([p.detach().reshape(-1).clone() for p in m[int(k)].parameters()]) for k in want}
            opt_a.step()
            opt_b.step()
            for k in want:
                after = torch.cat([p.detach().reshape(-1) for p in m[int(k)].parameters()])
                want[k].append(float((after - before[k]).norm() / before[k].norm()))
            if eval_between:
                with torch.no_grad():
                    m(x)
    res = cap.result
    assert res.steps == 3 and res.step_index.tolist() == [1, 2, 3]
    for k, ratios in want.items():
        assert res.series(k, "update_ratio").tolist() == pytest.approx(ratios, rel=1e-5)
    assert res.lrs == {"0": 0.1, "2": 0.01}
    assert res.eval_steps == (3 if eval_between else 0)
