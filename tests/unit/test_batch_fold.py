"""The batched step fold (nbdebug/capture/batch.py) against the slow reference (batching off, the
forward short path off): freezing layers mid-run, KeyboardInterrupt while folding and at exit, the
bulk reduction really exercised, ``hooks.tensor_hook`` next to the user's own tensor hooks, and the
step extras and unit masks of k steps at once against k folds of one step."""

from __future__ import annotations

import gc
import traceback
import weakref
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import nbdebug.capture.batch as batch
from nbdebug.capture import hook_count
from nbdebug.capture.fold import Layout
from nbdebug.capture.history import FIELD_INDEX
from nbdebug.capture.session import Capture
from nbdebug.capture.steps import Steps


def _run(loop: Callable[..., Capture], reference: bool, mp: pytest.MonkeyPatch) -> Capture:
    """``loop`` seeded, on the reference path (``fast_paths=False``: no batched fold, no forward short
    path) when ``reference``."""
    torch.manual_seed(0)
    return loop(fast_paths=not reference)


def _assert_same(a: Any, b: Any) -> None:
    """Exactly the same result: kept steps, history last/min/max and scalars, whole-run rows, first
    non-finite step, skipped steps, notes."""
    assert a.steps == b.steps
    ha, hb = a.history, b.history
    assert ha.rows == hb.rows and len(ha) == len(hb)
    np.testing.assert_array_equal(ha.step_index, hb.step_index)
    for agg in ("last", "min", "max"):
        np.testing.assert_array_equal(ha.values(agg), hb.values(agg))
        for s in ("loss", "lr", "skipped"):
            np.testing.assert_array_equal(ha.scalar(s, agg), hb.scalar(s, agg))
    assert [(r.name, r.calls, r.inputs) for r in a.layers] == [(r.name, r.calls, r.inputs) for r in b.layers]
    for ra, rb in zip(a.layers, b.layers, strict=True):
        for da, db in ((ra.stats, rb.stats), (ra.grad or {}, rb.grad or {})):
            assert da.keys() == db.keys()
            np.testing.assert_array_equal(np.array(list(da.values()), float), np.array(list(db.values()), float))
    assert (a.first_nonfinite_step, a.first_nonfinite_phase) == (b.first_nonfinite_step, b.first_nonfinite_phase)
    assert str(getattr(a, "skipped_steps", None)) == str(getattr(b, "skipped_steps", None))
    assert a.notes == b.notes


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))


# 1. a change in which parameters get gradients (HEAD~1: ValueError comparing the batch signature,
#    every later step lost)

def _freeze_optim(fast_paths: bool = True) -> Capture:
    m = _mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with Capture(m, fast_paths=fast_paths) as cap:
        for i in range(30):
            if i == 10:  # freeze a layer mid-run (gradual unfreezing), unfreeze it at 20
                m[2].requires_grad_(False)
            if i == 20:
                m[2].requires_grad_(True)
            opt.zero_grad(set_to_none=False)
            m(torch.randn(4, 6, generator=g)).pow(2).mean().backward()
            opt.step()
    return cap


def _freeze_by_hand(fast_paths: bool = True) -> Capture:
    m = _mlp()
    g = torch.Generator().manual_seed(1)
    with Capture(m, fast_paths=fast_paths) as cap:
        for i in range(30):
            if i == 10:
                m[2].requires_grad_(False)
            m.zero_grad()
            m(torch.randn(4, 6, generator=g)).pow(2).mean().backward()
            with torch.no_grad():  # a hand-written update, no torch.optim
                for p in m.parameters():
                    if p.grad is not None:
                        p -= 0.05 * p.grad
    return cap


@pytest.mark.parametrize("loop", [_freeze_optim, _freeze_by_hand], ids=["optim", "by_hand"])
def test_freezing_a_layer_mid_run_keeps_every_step(loop: Callable[[], Capture], monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow = _run(loop, False, monkeypatch).result, _run(loop, True, monkeypatch).result
    assert fast.steps == slow.steps == 30 and len(fast.history) == 30
    assert not any("ValueError" in n for n in fast.notes)
    _assert_same(fast, slow)


# 2. a KeyboardInterrupt inside flush (HEAD~1 emptied the batch first: the waiting steps were lost)

def _interrupted_in_flush(mp: pytest.MonkeyPatch, interrupt: bool) -> Any:
    real, fired = batch.step_values, [False]

    def flaky(rg: np.ndarray, *a: Any) -> Any:
        if interrupt and not fired[0] and rg.shape[0] > 6 * 20:  # a fold of 20+ waiting steps
            fired[0] = True
            raise KeyboardInterrupt
        return real(rg, *a)

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Flatten(), nn.Linear(16, 2))
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(3)
    cap = Capture(m)
    with mp.context() as p:
        p.setattr(batch, "step_values", flaky)
        try:
            with cap:
                for _ in range(100):
                    opt.zero_grad()
                    m(torch.randn(4, 6, generator=g)).pow(2).mean().backward()
                    opt.step()
        except KeyboardInterrupt:
            pass
    assert fired[0] == interrupt
    return cap, m


def test_keyboard_interrupt_inside_flush_keeps_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    cap, m = _interrupted_in_flush(monkeypatch, True)
    whole, _ = _interrupted_in_flush(monkeypatch, False)
    r, w = cap.result, whole.result
    assert r.steps < 100 and r.steps > 20  # interrupted at the first full flush
    assert len(r.history) == r.steps
    assert [x.calls for x in r.layers] == [r.steps] * len(r.layers)
    assert hook_count(m) == 0
    # the steps kept equal the first r.steps of the uninterrupted run
    np.testing.assert_array_equal(r.history.values("last"), w.history.values("last")[: r.steps])
    np.testing.assert_array_equal(r.history.step_index, w.history.step_index[: r.steps])


# 3. a KeyboardInterrupt inside finish at exit (HEAD~1 kept the model strongly)

def test_keyboard_interrupt_inside_finish_lets_go_of_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Steps.flush

    def flaky(self: Steps) -> None:
        if len(self.batch) and any(f.name == "finish" for f in traceback.extract_stack()):
            raise KeyboardInterrupt  # a second Ctrl-C while the capture folds its waiting steps at exit
        real(self)

    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    cap = Capture(m)
    raised = False
    with monkeypatch.context() as p:
        p.setattr(Steps, "flush", flaky)
        try:
            with cap:
                for _ in range(10):
                    opt.zero_grad()
                    m(torch.randn(3, 4)).sum().backward()
                    opt.step()
        except KeyboardInterrupt:
            raised = True
    assert raised
    assert hook_count(m) == 0
    ref = weakref.ref(m)
    del m, opt
    gc.collect()
    assert ref() is None
    assert cap._hold is None and cap.modules == []


# 4. the bulk reduction really runs (no empty outputs: no NaN min/max) and equals the step-by-step path

class _Tied(nn.Module):
    """An MLP with a dead-unit ReLU and an input projection tied to the output's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.act = nn.ReLU()
        self.mid = nn.Linear(16, 16)
        self.tanh = nn.Tanh()
        self.out = nn.Linear(16, 6)
        self.back = nn.Linear(6, 16, bias=False)
        self.back.weight = self.inp.weight  # a shared parameter (two modules, one tensor)
        with torch.no_grad():
            self.mid.bias[:4] = -50.0  # four units that never fire (dead units)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.mid(self.act(self.inp(x))))
        return self.out(self.tanh(h)) + self.back(x).sum(-1, keepdim=True)


def _plain(fast_paths: bool = True) -> Capture:
    m = _Tied()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    with Capture(m, fast_paths=fast_paths) as cap:
        for _ in range(80):
            opt.zero_grad()
            m(torch.randn(4, 6, generator=g)).pow(2).mean().backward()
            opt.step()
    return cap


def _scaled(bf16: bool = False, fast_paths: bool = True) -> Capture:
    m = _Tied()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(3)
    sc = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=5)
    with Capture(m, fast_paths=fast_paths) as cap:
        for i in range(80):
            x = torch.randn(4, 6, generator=g)
            if i == 72:  # after a full batch
                x[0, 0] = float("nan")  # a skipped step
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = m(x).float().pow(2).mean()
            sc.scale(loss).backward()
            sc.step(opt)
            sc.update()
    return cap


def _scaled_bf16(fast_paths: bool = True) -> Capture:
    return _scaled(True, fast_paths)


@pytest.mark.parametrize("loop", [_plain, _scaled, _scaled_bf16], ids=["tied_dead", "gradscaler", "gradscaler_bf16"])
def test_bulk_fold_runs_and_equals_the_step_by_step_path(loop: Callable[[], Capture], monkeypatch: pytest.MonkeyPatch) -> None:
    folds: list[int] = []  # steps per flush
    per_step = [0]  # the step-by-step branch inside flush
    real_sv, real_acc = batch.step_values, batch.fold_one_by_one
    with monkeypatch.context() as p:
        p.setattr(batch, "step_values", lambda rg, *a: (folds.append(rg.shape[0]), real_sv(rg, *a))[1])
        p.setattr(batch, "fold_one_by_one", lambda *a: (per_step.__setitem__(0, per_step[0] + 1), real_acc(*a))[1])
        fast = _run(loop, False, monkeypatch).result
    slow = _run(loop, True, monkeypatch).result
    rows = len(fast.layers)
    assert per_step[0] == 0  # never the NaN min/max fallback: the bulk branch folded every batch
    if loop is not _scaled_bf16:  # bf16 autocast: the steps are folded one by one (not deferred) today
        assert any(k == batch.BATCH * rows for k in folds)  # a full BATCH of waiting steps folded at once
        assert sum(folds) // rows >= 70
    assert fast.steps == slow.steps == 80
    dead = fast.history.values("last")[:, fast.history.rows.index("act#2"), FIELD_INDEX["dead_unit_frac"]]
    finite = fast.history.step_index != (fast.first_nonfinite_step or -1)  # the NaN input of the GradScaler runs: no zero, no dead unit
    assert (dead[finite] >= 4 / 16).all()  # the four dead units are seen in every other step
    _assert_same(fast, slow)
    if loop is not _plain:
        assert fast.first_nonfinite_step == 73  # i == 72, steps count from 1
        assert fast.history.scalar("skipped", "last").any()


# 4b. steps without gradients (an inference loop, forwards without backward): batched too, the held-back
#     no-grad steps before any training forward included (HEAD~1 folded each of them on its own)

def _no_grad_loop(mode: str, steps: int = 100, train_after: int = 0, fast_paths: bool = True) -> Capture:
    m = _Tied()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(3)
    ctx = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode)
    outs = []
    with Capture(m, fast_paths=fast_paths) as cap:
        for _ in range(steps):
            x = torch.randn(4, 6, generator=g)
            if ctx is None:  # grad mode, no backward (outputs kept: a list of predictions)
                outs.append(m(x))
            else:
                with ctx():
                    m(x)
        if mode == "delayed_backward":  # every step's gradients arrive after it closed (late)
            torch.stack(outs).pow(2).mean().backward()
        for _ in range(train_after):
            opt.zero_grad()
            m(torch.randn(4, 6, generator=g)).pow(2).mean().backward()
            opt.step()
    return cap


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "grad_no_backward", "delayed_backward"])
def test_steps_without_gradients_fold_in_bulk_and_equal_the_step_by_step_path(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    folds: list[int] = []
    real_sv = batch.step_values
    with monkeypatch.context() as p:
        p.setattr(batch, "step_values", lambda rg, *a: (folds.append(rg.shape[0]), real_sv(rg, *a))[1])
        fast = _run(lambda **kw: _no_grad_loop(mode, **kw), False, monkeypatch).result
    slow = _run(lambda **kw: _no_grad_loop(mode, **kw), True, monkeypatch).result
    rows = len(fast.layers)
    assert fast.steps == slow.steps == 100 and len(fast.history) == 100
    # held back (16 no-grad steps, the first one folded alone as it meets new rows), then in batches
    assert sum(folds) // rows >= 80 and max(folds) >= 15 * rows
    grad_norm = fast.history.values("last")[:, :, FIELD_INDEX["grad_norm"]]
    if mode == "delayed_backward":  # the late gradients reached every step's history entry
        assert (grad_norm[:, fast.history.rows.index("out")] > 0).all()
    else:
        assert np.isnan(grad_norm).all()
    dead = fast.history.values("last")[:, fast.history.rows.index("act#2"), FIELD_INDEX["dead_unit_frac"]]
    assert (dead >= 4 / 16).all()
    _assert_same(fast, slow)


def _generate(fast_paths: bool = True) -> Capture:
    """``generate()`` with a KV cache: one step per new token, the attention rows' shapes grow every step."""
    from nbdebug.adapters.offline import tiny_lm

    lm = tiny_lm("llama", vocab=64)
    ids = torch.randint(1, 64, (1, 5), generator=torch.Generator().manual_seed(2))
    with Capture(lm, fast_paths=fast_paths) as cap:
        cap.tokens = lm.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=0)  # type: ignore[attr-defined]
    return cap


def test_generate_folds_in_bulk_and_equals_the_step_by_step_path(monkeypatch: pytest.MonkeyPatch) -> None:
    folds: list[int] = []
    real_sv = batch.step_values
    with monkeypatch.context() as p:
        p.setattr(batch, "step_values", lambda rg, *a: (folds.append(rg.shape[0]), real_sv(rg, *a))[1])
        fast = _run(_generate, False, monkeypatch)
    slow = _run(_generate, True, monkeypatch)
    assert torch.equal(fast.tokens, slow.tokens)  # type: ignore[attr-defined]
    rows = len(fast.result.layers)
    assert fast.result.steps == 40 and max(folds) >= 15 * rows
    _assert_same(fast.result, slow.result)


class _LossOut(nn.Module):
    """Returns its own loss (a scalar output: the step's loss, as an HF model given labels)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.r, self.b = nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (self.b(self.r(self.a(x))) - y).pow(2).mean()


def _eval_losses(fast_paths: bool = True) -> Capture:
    m = _LossOut()
    g = torch.Generator().manual_seed(1)
    with Capture(m, fast_paths=fast_paths) as cap, torch.no_grad():
        for i in range(40):
            m(torch.randn(4, 6, generator=g), torch.full((4, 1), 100.0 if i == 30 else 0.0))
    return cap


def test_held_back_steps_keep_their_losses_and_loss_spikes(monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow = _run(_eval_losses, False, monkeypatch).result, _run(_eval_losses, True, monkeypatch).result
    assert [(i.kind, i.step, i.message) for i in fast.incidents] == [(i.kind, i.step, i.message) for i in slow.incidents]
    assert [(i.kind, i.step) for i in fast.incidents] == [("loss_spike", 31)]
    assert np.isfinite(fast.series("loss")).all()
    _assert_same(fast, slow)


@pytest.mark.parametrize("before", [10, 40])
def test_no_grad_steps_before_training_are_dropped_or_kept_as_before(before: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Held-back no-grad steps: the first 16 of them are committed (an inference cell), the rest still
    held back when training begins become evaluations, batched or not."""
    fast = _run(lambda **kw: _no_grad_loop("no_grad", before, 30, **kw), False, monkeypatch).result
    slow = _run(lambda **kw: _no_grad_loop("no_grad", before, 30, **kw), True, monkeypatch).result
    committed = before // 16 * 16
    assert fast.steps == slow.steps == committed + 30
    assert fast.eval_steps == slow.eval_steps == before - committed
    _assert_same(fast, slow)


# 5. hooks.tensor_hook next to the user's tensor hooks

def test_tensor_hooks_keep_the_users_order_retain_grad_and_leaf_outputs() -> None:
    order: list[str] = []
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Identity(), nn.Linear(4, 1))
    m[1].register_forward_hook(lambda mod, i, o: (o.register_hook(lambda g: order.append("user-before")), None)[1])
    x = torch.randn(2, 3, requires_grad=True)
    outs: dict[str, torch.Tensor] = {}
    users = hook_count(m)  # the user's forward hook
    with Capture(m) as cap:
        h = m[2].register_forward_hook(lambda mod, i, o: (outs.setdefault("id", o), None)[1])
        y = m(x)
        outs["id"].retain_grad()
        outs["id"].register_hook(lambda g: order.append("user-after"))
        y.sum().backward()
        h.remove()
    assert order == ["user-before", "user-after"]
    grad = outs["id"].grad
    assert grad is not None
    np.testing.assert_array_equal(grad.numpy(), m[3].weight.detach().expand(2, 4).numpy())
    assert hook_count(m) == users == 1
    left = list((outs["id"]._backward_hooks or {}).values())
    # the Identity's output is the ReLU's: both user hooks stay, in their order, none of ours
    assert len(left) == 2 and all(f.__module__ == __name__ for f in left)
    assert {r.name for r in cap.result.layers if r.grad} >= {"0", "1", "2", "3"}
    # the output-gradient stats of the Identity are those of the real gradient
    row = next(r for r in cap.result.layers if r.name == "2")
    assert row.grad["mean"] == pytest.approx(float(grad.mean()), rel=1e-6)

    # a leaf tensor as a selected module's output (Identity on the leaf input)
    x2 = torch.randn(2, 3, requires_grad=True)
    mm = nn.Sequential(nn.Identity(), nn.Linear(3, 1))
    with Capture(mm) as c2:
        mm(x2).sum().backward()
    leaf = next(r for r in c2.result.layers if r.name == "0")
    assert leaf.grad is not None
    assert leaf.grad["mean"] == pytest.approx(float(mm[1].weight.detach().mean()), rel=1e-6)
    assert not x2._backward_hooks and hook_count(mm) == 0


# 6. the step extras (dead units, optimizer numbers, parameter-gradient norms) and the run's unit masks:
#    k steps at once (flush) equal k folds of one step (close_step / commit), on every branch

def _extras_case() -> tuple[Layout, list[Any], list[tuple[str, tuple[str, ...]]], list[list[Any]], Any, list[Any], list[Any]]:
    rng = np.random.default_rng(0)
    rows = [SimpleNamespace(id=i, sat=False, units=u, alive=None) for i, u in enumerate([0, 4, 4, 3, 5])]
    lay = Layout(rows, {"a": rows[0], "b": rows[1], "c": rows[3]})  # type: ignore[arg-type]
    k = 6
    alive = [[None,
              rng.random(4) > 0.4,  # a full mask every step: stacked
              rng.random(4) > 0.4 if j % 2 else None,  # some steps without a zero
              np.ones(2, bool) if j == 3 else rng.random(3) > 0.5,  # a mask of another size: NaN
              None]  # never a zero: 0
             for j in range(k)]
    opt_keys = [("update_ratio", ("a", "b", "x")), ("lr", ("", "a")), ("param_norm", ("c", "a"))]
    opt: list[list[Any]] = [[*rng.random(3).tolist(), 0.1, 0.1, *rng.random(2).tolist()] for _ in range(k)]
    opt[2][0] = np.float32(0.25).reshape(())  # a 0-d host array (the device path)
    opt[4][5] = np.array([1.0, 2.0, 4.0])  # an array of several numbers: its mean
    opt[5][1] = None  # NaN
    pgmap = (np.array([0, 1, 1, 2]), np.array([0, 0, 1, 2]), ("a", "b", "c"))  # parameter 1 shared by a and b
    norms = [rng.random(3) for _ in range(k)]
    norms[4][2] = np.inf
    return lay, alive, opt_keys, opt, pgmap, norms, [None, 2.0, None, 0.5, None, 3.0]


def test_step_extras_of_k_steps_equal_k_folds_of_one() -> None:
    lay, alive, opt_keys, opt, pgmap, norms, div = _extras_case()
    k, n, f = len(alive), len(lay.rows), len(FIELD_INDEX)
    many = np.full((k, n, f), np.nan, np.float32)
    stacked, bad = batch.step_extras(many, lay, alive, opt_keys, opt, (pgmap, norms, div))
    one = np.full((k, n, f), np.nan, np.float32)
    bad_one = set()
    for j in range(k):
        _, b = batch.step_extras(one[j][None], lay, [alive[j]], opt_keys, [opt[j]], (pgmap, [norms[j]], [div[j]]))
        bad_one |= set(b)
    np.testing.assert_array_equal(many.view(np.uint32), one.view(np.uint32))
    assert bad == ["c"] and bad_one == {"c"} and list(stacked) == [1]
    dead = many[:, :, FIELD_INDEX["dead_unit_frac"]]
    np.testing.assert_array_equal(dead[:, 1], [np.float32((4 - a[1].sum()) / 4) for a in alive])
    assert np.isnan(dead[3, 3]) and (dead[:, 4] == 0).all() and dead[0, 2] == 0 and np.isnan(dead[:, 0]).all()
    ur, pn, pgn = (many[:, :, FIELD_INDEX[c]] for c in ("update_ratio", "param_norm", "param_grad_norm"))
    assert ur[2, 0] == np.float32(0.25) and ur[4, 0] == np.float32(opt[4][0]) and np.isnan(ur[5, 1])
    assert pn[4, 3] == np.float32(7 / 3) and pn[0, 0] == np.float32(opt[0][6])
    p = np.array([norms[j] / (div[j] or 1.0) for j in range(k)])
    np.testing.assert_array_equal(pgn[:, 0], np.sqrt(p[:, 0] ** 2 + p[:, 1] ** 2).astype(np.float32))
    np.testing.assert_array_equal(pgn[:, 1], p[:, 1].astype(np.float32))
    assert np.isinf(pgn[4, 3])


def test_merge_alive_of_k_steps_equals_k_merges_of_one() -> None:
    rows = [SimpleNamespace(id=i, sat=False, units=u, alive=None) for i, u in enumerate([0, 4, 4, 3, 5, 2])]
    lay = Layout(rows, {})  # type: ignore[arg-type]
    k = 6
    hot = np.eye(4, dtype=bool)
    alive = [[None,
              hot[j % 2],  # stacked; units 0 and 1 alive: stays a mask
              hot[min(j, 3)],  # every unit alive by step 4: dropped
              np.ones(2, bool) if j == 3 else np.zeros(3, bool),  # a mask of another size: dropped
              None if j == 4 else np.zeros(5, bool),  # a step without a zero: every unit alive, dropped
              np.zeros(2, bool)]  # never alive: stays all false
             for j in range(k)]
    results = []
    for at_once in (True, False):
        for r in rows:
            r.alive = np.zeros(r.units, bool) if r.units else None
        units = np.array([r.units > 0 for r in rows])
        if at_once:
            stacked, _ = batch.step_extras(np.zeros((k, len(rows), len(FIELD_INDEX)), np.float32), lay, alive, [], [[]] * k, None)
            assert sorted(stacked) == [1, 2, 5]
            batch.merge_alive(lay, units, alive, stacked)
        else:
            for a in alive:
                batch.merge_alive(lay, units, [a], {})
        results.append([None if r.alive is None else r.alive.tolist() for r in rows])
    assert results[0] == results[1] == [None, [True, True, False, False], None, None, None, [False, False]]
