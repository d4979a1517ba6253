"""Capture in the modes real cells run: inference_mode/no_grad/autocast, loops (steps), shared
modules, gradient checkpointing, integer outputs, graphs the user holds, KeyboardInterrupt."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.capture.session import Capture
from nbdebug.inspectors.thermometer import diagnose
from nbdebug.recorders.thermometer import ThermometerRecorder


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def reference_stats(m: nn.Sequential, x: torch.Tensor) -> list[tuple[float, float, float]]:
    out, ref = x, []
    with torch.no_grad():
        for layer in m:
            out = layer(out)
            f = out.float()
            ref.append((f.mean().item(), f.min().item(), f.max().item()))
    return ref


@pytest.mark.parametrize("device_path", [False, True])
@pytest.mark.parametrize("mode", ["inference_mode", "no_grad", "autocast", "plain"])
def test_modes_capture_rows_normally(mode: str, device_path: bool) -> None:
    m = nn.Sequential(*mlp()[:2], nn.Identity(), mlp()[2])  # Identity: an aliased output
    x = torch.randn(5, 4)
    before = fingerprint(m)
    ctx = {
        "inference_mode": torch.inference_mode,
        "no_grad": torch.no_grad,
        "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
        "plain": torch.enable_grad,
    }[mode]
    with Capture(m, device_path=device_path) as cap:
        with ctx():
            y = m(x)
            y2 = m(x)
    res = cap.result
    assert [r.name for r in res.layers] == ["0", "1", "2", "3"]
    assert res.steps == 2 and [r.calls for r in res.layers] == [2, 2, 2, 2]
    ref = reference_stats(m, x)
    tol = 5e-2 if mode == "autocast" else 1e-5
    for i in range(4):
        s = res[str(i)].stats
        assert (s["mean"], s["min"], s["max"]) == pytest.approx(ref[i], abs=tol)
    relu = torch.relu(m[0](x))
    assert res["2"].stats["zero_frac"] == res["1"].stats["zero_frac"] == pytest.approx(float((relu == 0).float().mean()))
    assert res["3"].dtype == ("bfloat16" if mode == "autocast" else "float32")
    assert torch.equal(y, y2) and not res.backward_ran
    assert same_fingerprint(before, fingerprint(m)) == []


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


def nan_at_step_model() -> nn.Sequential:
    m = nn.Sequential()
    m.add_module("a", nn.Linear(2, 2))
    m.add_module("b", Log())
    m.add_module("c", nn.Linear(2, 1))
    with torch.no_grad():
        m.a.weight.copy_(torch.eye(2))
        m.a.bias.zero_()
    return m


@pytest.mark.parametrize("device_path", [False, True])
def test_loop_nan_origin_is_decided_per_step(device_path: bool) -> None:
    m = nan_at_step_model()
    xs = [torch.full((3, 2), float(k + 1)) for k in range(8)]
    xs[5] = torch.tensor([[1.0, -1.0], [2.0, 2.0], [3.0, 3.0]])  # step 6: log of a negative value
    with Capture(m, device_path=device_path) as cap:
        for x in xs:
            m(x)
    res = cap.result
    assert res.steps == 8 and res.forward_passes == 8
    assert res.first_nonfinite_step == 6 and res.forward_nonfinite_step == 6
    assert res.forward_nonfinite_call == (1, True)  # row `b`, its inputs were finite
    assert [r.calls for r in res.layers] == [8, 8, 8]  # merged rows, as before
    assert res["b"].stats["nan"] == 1 and res["c"].stats["nan"] == 1  # one bad row of 3
    rep = diagnose(res, step=6)
    assert "first non-finite value at step 6, in `b`" in rep.summary
    d = next(d for d in rep.diagnoses if d.code == "nan_origin_fwd")
    assert d.layer == "b" and "at step 6" in d.message and "inputs were finite" in d.message
    assert rep.first_nonfinite_step == 6 and rep.flagged("nan_origin_fwd") == ["b"]
    assert rep.flagged("nonfinite") == ["c"]


def test_nan_in_the_input_at_a_later_step_is_not_blamed_on_a_layer() -> None:
    m = nan_at_step_model()
    xs = [torch.ones(1, 2), torch.ones(1, 2), torch.tensor([[float("nan"), 1.0]])]
    with Capture(m) as cap:
        for x in xs:
            m(x)
    res = cap.result
    assert res.first_nonfinite_step == 3 and res.forward_nonfinite_call == (0, False)
    assert res.incident.step == 3 and res.incident.module == "a" and "from a non-finite input" in res.incident.message


class Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


@pytest.mark.parametrize("device_path", [False, True])
def test_backward_nan_step_and_origin(device_path: bool) -> None:
    m = nn.Sequential(nn.Identity(), Sqrt(), nn.Identity())
    with Capture(m, device_path=device_path) as cap:
        for k in range(4):
            x = torch.full((2,), 0.0 if k == 2 else 1.0, requires_grad=True)
            m(x * 1.0).sum().backward()
    res = cap.result
    assert res.steps == 4 and res.forward_nonfinite_step is None
    assert res.backward_nonfinite_step == 3 and res.first_nonfinite_step == 3
    assert res.layers[res.backward_nonfinite_row].name == "0"  # d/d(out of 0) is inf (sqrt'(0))
    assert res.layers[res.backward_origin_row].name == "1"  # made in the backward of the sqrt
    rep = diagnose(res, step=3)
    assert "first non-finite value at step 3, in `1`" in rep.summary


def test_shared_module_names_restart_every_step() -> None:
    relu = nn.ReLU()
    m = nn.Sequential(nn.Linear(2, 2), relu, nn.Linear(2, 2), relu)
    with Capture(m) as cap:
        for _ in range(3):
            m(torch.randn(4, 2))
    assert [r.name for r in cap.result.layers] == ["0", "1", "2", "1#2"]
    assert [r.calls for r in cap.result.layers] == [3, 3, 3, 3] and cap.result.steps == 3


class Checkpointed(nn.Module):
    """b → [b → a → b] → c: the ReLU ``b`` runs outside and (twice) inside the checkpointed segment."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c, self.mode = nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1), mode

    def segment(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(self.b(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.b(x)
        if self.mode == "none":
            h = self.segment(x)
        else:
            h = checkpoint(self.segment, x, use_reentrant=self.mode == "reentrant")
        return self.c(h)


@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant"])
@pytest.mark.parametrize("device_path", [False, True])
def test_gradient_checkpointing_adds_no_rows_and_keeps_gradients(mode: str, device_path: bool) -> None:
    x = torch.randn(3, 4, requires_grad=True)

    def run(m: Checkpointed) -> tuple[object, list[str]]:
        seen: list[str] = []
        h = m.a.register_forward_hook(lambda *_: seen.append("a"))
        before = fingerprint(m)
        with Capture(m, device_path=device_path) as cap:
            m(x).sum().backward()
        after = fingerprint(m)
        assert same_fingerprint({**before, "grads": after["grads"]}, after) == []  # the user's hook stays
        h.remove()
        assert hook_count(m) == 0
        return cap.result, seen

    ref, seen_ref = run(Checkpointed("none"))
    res, seen = run(Checkpointed(mode))
    assert seen == ["a", "a"] and seen_ref == ["a"]  # the segment really was recomputed
    assert [r.name for r in res.layers] == [r.name for r in ref.layers] == ["b", "b#2", "a", "b#3", "c"]
    assert [r.calls for r in res.layers] == [1, 1, 1, 1, 1] and res.steps == 1
    for r, q in zip(res.layers, ref.layers):
        assert r.stats["mean"] == pytest.approx(q.stats["mean"])
        assert r.grad is not None and q.grad is not None, r.name
        assert r.grad["norm"] == pytest.approx(q.grad["norm"]) and r.grad["mean"] == pytest.approx(q.grad["mean"])
        assert r.param_grad_norm == pytest.approx(q.param_grad_norm) if q.param_grad_norm else r.param_grad_norm is None


@pytest.mark.parametrize("kwargs", [None, {"use_reentrant": True}])
def test_hf_gradient_checkpointing_adds_no_rows(kwargs: dict | None) -> None:
    from nbdebug.adapters.offline import tiny_lm

    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))

    def run(ck: bool) -> tuple[object, int]:
        m = tiny_lm("llama")
        m.train()
        if ck:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        mlp_calls: list[int] = []
        h = m.model.layers[0].self_attn.q_proj.register_forward_hook(lambda *_: mlp_calls.append(1))
        hooks = hook_count(m)  # HF adds one of its own for checkpointing (input requires grad)
        with Capture(m) as cap:
            m(ids, labels=ids).loss.backward()
        assert hook_count(m) == hooks
        h.remove()
        return cap.result, len(mlp_calls)

    ref, n_ref = run(False)
    res, n = run(True)
    assert n == 2 and n_ref == 1  # recomputed in backward
    assert [r.name for r in res.layers] == [r.name for r in ref.layers]
    assert not any("#" in r.name for r in res.layers) and res.steps == 1
    assert sum(r.calls for r in res.layers) == sum(r.calls for r in ref.layers)
    for r, q in zip(res.layers, ref.layers):
        assert (r.grad is None) == (q.grad is None), r.name
        if q.grad is not None:
            assert r.grad["norm"] == pytest.approx(q.grad["norm"], rel=1e-4), r.name


class Argmax(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.argmax(-1), x > 100


def test_integer_and_bool_outputs_are_not_activations() -> None:
    m = nn.Sequential(nn.Linear(3, 3), Argmax())
    with torch.no_grad():
        m[0].weight.zero_()
        m[0].bias.copy_(torch.tensor([1.0, 0.5, 0.25]))  # argmax is always 0, the mask always False (no dead unit)
    with Capture(m) as cap:
        m(torch.randn(6, 3))
    res = cap.result
    assert res["1[0]"].dtype == "int64" and res["1[1]"].dtype == "bool"
    assert res["1[0]"].stats["zero_frac"] == 1.0 and res["1[1]"].stats["zero_frac"] == 1.0
    assert res["1[0]"].stats["numel"] == 6 and not res["1[0]"].is_float and res["0"].is_float
    rep = diagnose(res)
    assert rep.flagged("dead") == [] and rep.flagged("saturated") == []
    assert rep.summary.endswith("no problems found")
    note = next(n for n in rep.notes if "integer/bool" in n)
    assert "2 integer/bool outputs (`1[0]`, `1[1]`)" in note and "never flagged dead" in note
    from nbdebug.widgets.thermometer import ThermometerWidget

    w = ThermometerWidget(rep, res)
    page = w.fallback_html()
    assert "<td>6 int64</td>" in page and "<td>6×3 bool</td>" in page and "<td>6×3</td>" in page
    w.close()


def test_user_graphs_stay_valid_and_our_hooks_do_not_fire_after_the_cell() -> None:
    m = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 1))
    m.train()
    pending = m(torch.randn(4, 3)).sum()  # a graph the user holds from before the cell
    with Capture(m) as cap:
        kept = m(torch.randn(4, 3)).sum()  # built inside the cell, backward after it
        m(torch.randn(4, 3)).sum().backward()
    grads_in_cell = cap.result["3"].grad
    assert grads_in_cell is not None and hook_count(m) == 0
    pending.backward()  # no "modified by an inplace operation"
    kept.backward()
    assert cap.result["3"].grad == grads_in_cell  # the finished capture saw nothing more


class UserInterrupt(Exception):
    pass


@pytest.mark.parametrize("where", ["hook", "module", "backward"])
def test_keyboard_interrupt_mid_cell_leaves_no_hooks(where: str) -> None:
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
    m(torch.randn(2, 3)).sum().backward()  # existing .grad
    before = fingerprint(m)

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    if where == "hook":
        user = m[1].register_forward_hook(interrupt)
    elif where == "module":
        user = m[1].register_forward_pre_hook(interrupt)
    else:
        user = m[2].register_full_backward_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        with Capture(m, device_path=True):
            m(torch.randn(2, 3)).sum().backward()
    user.remove()
    assert hook_count(m) == 0
    diffs = same_fingerprint(before, fingerprint(m))
    # an interrupted backward may have accumulated into .grad (that is the user's own backward)
    assert [d for d in diffs if not d.startswith("grads")] == []


def test_recorder_honours_zero_options_and_byte_units() -> None:
    m = mlp()
    rec = ThermometerRecorder(m, dead_threshold=0, vanishing=0, exploding=0.0, max_bytes="0", sample_size=0)
    assert (rec.thresholds.dead, rec.thresholds.vanishing, rec.thresholds.exploding) == (0.0, 0.0, 0.0)
    assert rec.capture.options.max_bytes == 0 and rec.capture.options.sample_size == 0
    with rec:
        m(torch.randn(2, 4)).sum().backward()
    res = rec.result()
    assert all(r.sample is None for r in res.layers) and math.isnan(res["0"].stats["near_zero_frac"])
    rep = diagnose(res, rec.thresholds)
    assert rep.flagged("dead") == ["0"]  # threshold 0: the first layer is "dead", later ones inherit it (default: none)
    assert len(rep.flagged("exploding")) == 3  # every gradient norm is above 0
    assert ThermometerRecorder(m, max_bytes="64MB").capture.options.max_bytes == 64 * 2**20
    assert ThermometerRecorder(m).capture.options.max_bytes == 256 * 2**20


def test_budget_note_says_what_was_dropped_in_binary_units() -> None:
    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    with Capture(m, max_bytes=3000, sample_size=512) as cap:
        m(torch.randn(8, 64))
    note = next(n for n in cap.result.notes if "budget" in n)
    assert note.startswith("byte budget of 2.9 KB reached: kept 2 KB of samples/histograms, dropped 4 KB for later layers")


def test_compiled_model_rows_have_the_plain_names() -> None:
    from nbdebug.capture.select import select_modules, unwrap_compiled

    m = mlp()
    compiled = torch.compile(m)  # lazy: nothing is compiled until it is called
    assert unwrap_compiled(compiled) is m and unwrap_compiled(m) is m
    assert [n for n, _ in select_modules(compiled)] == [n for n, _ in select_modules(m)] == ["0", "1", "2"]
    assert [n for n, _ in select_modules(compiled, "re:[02]")] == ["0", "2"]


@pytest.mark.parametrize("at_call", [2, 5])  # forward hook (2nd layer), gradient hook (in backward)
def test_keyboard_interrupt_inside_our_own_hook(monkeypatch: pytest.MonkeyPatch, at_call: int) -> None:
    import nbdebug.capture.calls as calls
    import nbdebug.capture.forward as forward

    n = [0]

    def interrupting(real: Any) -> Any:
        def interrupted(*a: object, **k: object) -> object:
            n[0] += 1
            if n[0] == at_call:
                raise KeyboardInterrupt
            return real(*a, **k)

        return interrupted

    # the stats of outputs (forward hooks) and of output gradients (gradient hooks), counted together
    monkeypatch.setattr(forward, "stats_and_units", interrupting(forward.stats_and_units))
    monkeypatch.setattr(calls, "tensor_stats", interrupting(calls.tensor_stats))
    m = mlp()
    before = fingerprint(m)
    with pytest.raises(KeyboardInterrupt):
        with Capture(m):
            m(torch.randn(2, 4)).sum().backward()
    assert hook_count(m) == 0
    assert [d for d in same_fingerprint(before, fingerprint(m)) if not d.startswith("grads")] == []
    calls = n[0]
    m(torch.randn(2, 4)).sum().backward()
    assert n[0] == calls  # none of our hooks runs after the interrupted cell


@pytest.mark.parametrize("device_path", [False, True])
def test_inplace_relu_under_inference_mode_has_its_own_stats(device_path: bool) -> None:
    """Inference tensors have no version counter: an in-place ReLU's row must not reuse the Linear's stats."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 16), nn.ReLU(inplace=True), nn.Linear(16, 2))
    x = torch.randn(8, 4)
    rows = {}
    for mode in (torch.no_grad, torch.inference_mode):
        with Capture(m, device_path=device_path) as cap, mode():
            m(x)
        rows[mode.__name__] = [(r.name, r.stats["min"], r.stats["zero_frac"]) for r in cap.result.layers]
    assert rows["inference_mode"] == rows["no_grad"]
    relu = torch.relu(m[0](x))
    assert rows["no_grad"][1] == ("1", 0.0, pytest.approx(float((relu == 0).float().mean())))


def test_capture_does_not_keep_the_model_alive() -> None:
    import gc
    import weakref

    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with Capture(m) as cap:
        m(torch.randn(2, 4))
    ref = weakref.ref(m)
    del m
    gc.collect()
    assert ref() is None and cap.result is not None and len(cap.result.layers) == 2
