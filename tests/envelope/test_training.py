"""Training modes of the real-use matrix (issue 10): loops with optimizer steps under the thermometer
(and every view at once), each against the same loop run on an identical copy without nbdebug.

Checked in every cell: the per-step history equals the reference loop's own measurements (loss,
each row's mean and zero fraction per training step, ``‖Δθ‖/‖θ‖`` per optimizer step), the cell's
outputs, hooks back to the user's count, model and optimizer state equal to the reference run's,
the RNG stream untouched, the report at the last kept step. A row the product does not pass yet is
a strict xfail naming the owner and the issue-10 item (``XFAIL``).
"""

from __future__ import annotations

import math
import traceback
from typing import Any

import numpy as np
import pytest
import torch

import nbdebug
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.inspectors.history import flag_names

from . import training as T
from .cells import close_all, one_line, outcome_of
from .usercode import Float64Watch

VIEWS = {mode: ["thermometer"] for mode in T.MODES}
for _mode in ("train_history", "train_bf16", "compiled_loop"):
    VIEWS[_mode] = ["thermometer", "all[cnn]"]

#: (mode, view) → "owner, issue 10 item: symptom" for cells that fail on the current tree (strict xfail);
#: the failing check is the cell's last, so everything before it is verified either way
XFAIL: dict[tuple[str, str], str] = {}


def _params() -> list[Any]:
    out = []
    for mode, views in VIEWS.items():
        for view in views:
            reason = XFAIL.get((mode, view))
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            out.append(pytest.param(mode, view, marks=marks, id=f"{mode}-{view}"))
    return out


def rows_equal(res: Any, meas: T.Measured, steps: list[int], half: bool) -> None:
    """Each kept step's mean and zero fraction of every row equal the reference's for that step."""
    tol = 2e-2 if half else 1e-5
    for row, per_step in meas.stats.items():
        want = np.array([per_step[s - 1] for s in steps])
        np.testing.assert_allclose(res.series(row, "mean"), want[:, 0], rtol=tol, atol=tol, err_msg=f"{row} mean")
        np.testing.assert_allclose(res.series(row, "zero_frac"), want[:, 1], atol=1e-6, err_msg=f"{row} zero_frac")


def ratios_equal(res: Any, meas: T.Measured, steps: list[int], skipped: list[int], dtype: torch.dtype | None = None) -> None:
    """The update ratio at every kept step equals the reference's ‖Δθ‖/‖θ‖ (in float32); NaN where no
    optimizer stepped. Half-precision parameters: θ_before − θ_after is rounded to their own dtype
    (``capture/optim.py``), so the norm is within half an ulp of that dtype (bf16: 2^-8)."""
    rel = torch.finfo(dtype).eps / 2 if dtype is not None else 1e-4
    for module, by_step in meas.ratio.items():
        got = res.series(module, "update_ratio")
        for s, g in zip(steps, got):
            if s in skipped:
                continue
            if s in by_step:
                assert g == pytest.approx(by_step[s], rel=rel, abs=1e-9), (module, s, g, by_step[s])
            else:
                assert math.isnan(g), f"{module} step {s}: no optimizer step, got a ratio of {g}"


@pytest.mark.parametrize(("mode", "view"), _params())
def test_training_cell(mode: str, view: str, record_property) -> None:  # type: ignore[no-untyped-def]
    record_property("cell", (mode, view))
    spec = T.MODES[mode]
    model, opt, batches = T.build(mode)
    scaler = torch.amp.GradScaler("cpu") if spec.scaler else None
    # the variable the user passes and calls: compiled and warmed up (run compiled) before the cell
    runner, backend = T.compiled(model, warm=batches[0][0]) if spec.compiled else (model, None)
    compiled_runs = backend.calls if backend else 0
    ref, ref_opt = T.copies(model, opt)
    if spec.compiled:  # torch.compile marks the module it wraps: so is the reference's (measured eagerly)
        T.compiled(ref)
    ref_scaler = torch.amp.GradScaler("cpu") if spec.scaler else None
    first_acts = T.first_activations(mode, ref, batches[0][0]) if view.startswith("all") else {}
    # --break-on stops inside step NAN_AT's forward: the reference stops at the same point
    breaks = bool(spec.nan_at and spec.options.get("break_on"))
    ref_batches = batches[: T.NAN_AT - 1] if breaks else batches
    meas = T.reference(mode, ref, ref_opt, ref_batches, ref_scaler)
    if breaks:
        ref_opt.zero_grad()
    hooks_before = hook_count(model)
    rng = torch.get_rng_state()
    ns: dict[str, Any] = {}
    dbg = nbdebug.debug(runner, view=view.split("[")[0], loss=lambda: ns.get("loss"), **spec.options)
    outs, raised = None, None
    try:
        # (not with a GradScaler: its unscale_ takes 1/scale in float64 itself)
        with Float64Watch(spec.half and not spec.scaler) as f64, dbg:
            outs = T.loop(mode, runner, opt, batches, ns, scaler)
    except BaseException as exc:
        raised = exc
    assert not f64.hits, f"float64 tensors created during a half-precision capture: {sorted(set(f64.hits))[:5]}"
    # -- hygiene ---------------------------------------------------------------------------------
    assert hook_count(model) == hooks_before, f"hooks {hooks_before} -> {hook_count(model)}"
    diffs = same_fingerprint(fingerprint(ref), fingerprint(model))
    assert diffs == [], f"model state differs from the loop without nbdebug: {diffs}"
    assert str(opt.state_dict()) == str(ref_opt.state_dict()), "the optimizer's state differs from the loop without nbdebug"
    assert torch.equal(torch.get_rng_state(), rng), "nbdebug consumed random numbers"
    if scaler is not None:
        assert scaler.get_scale() == ref_scaler.get_scale() and scaler.state_dict() == ref_scaler.state_dict()
    if outs is not None:
        assert len(outs) == len(meas.outs) and all(torch.equal(a, b) for a, b in zip(outs, meas.outs)), "the loop's outputs changed"
    res_out = outcome_of(dbg, view)
    res = dbg.results["thermometer"]
    for n in res.notes:
        assert one_line(n), n
    # -- what each mode must show ------------------------------------------------------------------
    n = spec.steps
    if spec.interrupt_at:
        assert type(raised) is KeyboardInterrupt and str(raised) == "stopped by the user mid-loop", repr(raised)
        assert type(meas.raised) is KeyboardInterrupt
        n = spec.interrupt_at  # its forward ran; its backward never did
        if spec.options.get("step_on") == "optimizer":  # the open step: its micro-batches so far
            k, a = -(-n // spec.accum), spec.accum
            assert res.steps == k and res.step_index.tolist() == list(range(1, k + 1)), res.step_index
            for row, per_fwd in meas.stats.items():
                want = [np.mean(per_fwd[i : i + a], axis=0) for i in range(0, n, a)]
                np.testing.assert_allclose(res.series(row, "mean"), [m for m, _ in want], rtol=1e-5, atol=1e-6, err_msg=row)
            np.testing.assert_allclose(res.series("loss"), [meas.loss[min(i + a, n) - 1] for i in range(0, n, a)], rtol=1e-6)
            for module, by_fwd in meas.ratio.items():  # the open step made no optimizer step
                got = res.series(module, "update_ratio")
                np.testing.assert_allclose(got[:-1], [by_fwd[f] for f in sorted(by_fwd)], rtol=1e-4)
                assert math.isnan(got[-1]), (module, got)
        else:
            assert res.steps == n and res.step_index.tolist() == list(range(1, n + 1)), res.step_index
            rows_equal(res, meas, list(range(1, n + 1)), False)
            np.testing.assert_allclose(res.series("loss"), meas.loss, rtol=1e-6)
    elif spec.interrupt_in_forward:  # stopped inside step 4's forward after conv2: steps 1-3 whole, step 4's first rows
        assert type(raised) is KeyboardInterrupt and str(raised) == "raised inside the model's forward", repr(raised)
        k = spec.interrupt_in_forward
        assert res.steps == k and res.step_index.tolist() == list(range(1, k + 1)), res.step_index
        for row, per_step in meas.stats.items():
            got = res.series(row, "mean")
            np.testing.assert_allclose(got[: k - 1], [m for m, _ in per_step[: k - 1]], rtol=1e-5, atol=1e-6, err_msg=row)
            if len(per_step) >= k:  # ran in step k before the interrupt: conv1, bn, relu, conv2
                assert got[k - 1] == pytest.approx(per_step[k - 1][0], rel=1e-5, abs=1e-6), row
            else:
                assert math.isnan(got[k - 1]), (row, got[k - 1])
        assert sorted(r for r, v in meas.stats.items() if len(v) >= k) == ["bn", "conv1", "conv2", "relu"]
    elif breaks:
        check_break(raised, res, model, meas)
    elif spec.nan_at:
        check_anomaly(raised, res, meas)
    elif spec.options.get("step_on") == "optimizer":  # a step = one optimizer step: its micro-batches merge
        assert raised is None, raised
        k = n // spec.accum
        assert res.steps == k and res.step_index.tolist() == list(range(1, k + 1)), (res.steps, res.step_index)
        for row, per_fwd in meas.stats.items():  # equal-size micro-batches: the step's mean is their mean
            want = np.array(per_fwd).reshape(k, spec.accum, 2).mean(axis=1)
            np.testing.assert_allclose(res.series(row, "mean"), want[:, 0], rtol=1e-5, atol=1e-6, err_msg=row)
            np.testing.assert_allclose(res.series(row, "zero_frac"), want[:, 1], atol=1e-6, err_msg=row)
        np.testing.assert_allclose(res.series("loss"), meas.loss[spec.accum - 1 :: spec.accum], rtol=1e-6)
        for module, by_fwd in meas.ratio.items():
            np.testing.assert_allclose(res.series(module, "update_ratio"), [by_fwd[f] for f in sorted(by_fwd)], rtol=1e-4)
    else:
        assert raised is None, raised
        steps = list(range(1, n + 1, spec.options.get("every", 1)))
        if steps[-1] != n:
            steps.append(n)
        assert res.steps == n and res.step_index.tolist() == steps, (res.steps, res.step_index)
        rows_equal(res, meas, steps, spec.half)
        np.testing.assert_allclose(res.series("loss"), [meas.loss[s - 1] for s in steps], rtol=1e-6)
        ratios_equal(res, meas, steps, meas.skipped, spec.dtype)
    if spec.eval_every:
        assert res.eval_steps == n // spec.eval_every and any("eval" in x for x in res.notes), (res.eval_steps, res.notes)
    else:
        assert res.eval_steps == 0
    if spec.scaler:
        assert meas.skipped == [T.SKIP_AT], meas.skipped  # the test's own premise
        assert res.skipped_steps.tolist() == meas.skipped
        assert res.incident is None and not [i for i in res.incidents if i.kind == "nonfinite"], res.incidents
    if spec.accum > 1 and "step_on" not in spec.options:
        assert sorted(meas.ratio["fc"]) == list(range(spec.accum, n + 1, spec.accum))  # the premise: steps 2, 4, …
    # the report is at the last kept step and its table is that step's
    from nbdebug.inspectors.thermometer import diagnose

    rep = diagnose(res)
    last = int(res.step_index[-1])
    assert rep.step == last, (rep.step, last)
    at = {r.name: r for r in res.at(last)}
    for i, name in enumerate(rep.names):
        if name in at:
            assert rep.column("mean")[i] == pytest.approx(at[name].stats["mean"], nan_ok=True)
    if spec.scaler:  # a skipped step's inf gradients are expected: no NaN flags at that step
        k = res.step_index.tolist().index(T.SKIP_AT)
        flags = [flag_names(int(b)) for b in rep.history_flags[k]]
        assert not any({"nonfinite", "nan_origin_bwd", "nan_origin_fwd"} & set(f) for f in flags), flags
    assert res_out.result is not None or view.startswith("all"), res_out.note
    widgets = dbg.widgets()
    assert widgets, dbg.skipped
    w = widgets[dbg.views.index("thermometer")] if "thermometer" in dbg.views and len(widgets) == len(dbg.views) else None
    if w is not None:  # the widget's final state: the whole run, the report's step and events, not running
        assert (w.steps, w.running, w.step) == (res.steps, False, 0), (w.steps, w.running, w.step)  # 0: follows the last step
        assert [(e["step"], e["row"], e["code"]) for e in w.events] == [(e.step, e.row, e.code) for e in rep.events]
    if view.startswith("all"):  # the vision views: the first step's maps, Grad-CAM on the first call (as the train_step cells)
        check_vision(dbg, ref, batches[0][0], meas, first_acts, spec.half)
    close_all(dbg)
    if backend is not None:  # the views watched it run eagerly (hooks_see_compiled); afterwards it runs compiled again
        assert compiled_runs >= 1 and backend.calls == compiled_runs, (compiled_runs, backend.calls)
        runner(batches[0][0])  # the warm-up's graph (same grad mode and shapes): no recompilation
        assert backend.calls > compiled_runs, "the compiled model no longer runs compiled after the cell"
    # -- last: the checks that fail on the current tree (XFAIL) -----------------------------------------
    if spec.scaler:  # GradScaler multiplies the loss: the gradients a user reasons about are the unscaled ones
        assert not [f for f in rep.flags if "exploding" in f], rep.summary
        ok = [k for k, s in enumerate(res.step_index.tolist()) if s not in meas.skipped]
        assert (res.series("2", "param_grad_norm")[ok] < 1e2).all(), res.series("2", "param_grad_norm")
    if breaks:  # the forward of step NAN_AT raised before its loss existed: unknown, not step NAN_AT-1's
        loss = res.series("loss")
        assert math.isnan(loss[T.NAN_AT - 1]), f"step {T.NAN_AT} shows a loss of {loss[T.NAN_AT - 1]} (step {T.NAN_AT - 1}'s)"


def check_vision(dbg: Any, ref: torch.nn.Module, first: torch.Tensor, meas: T.Measured, acts: dict[str, torch.Tensor],
                 half: bool) -> None:
    """``all`` in a loop: feature maps equal to the reference loop's first training forward, Grad-CAM
    (its re-run on the cell's first input) equal to the hand computation with the trained weights
    (``ref``: the reference model after the loop), and a note that its scores differ from the first
    call's — the checks of the matrix's ``train_step`` cells."""
    from .checks import check_featuremaps, check_gradcam
    from .usercode import Outcome

    widgets = dict(zip(dbg.views, dbg.widgets()))
    ctx = dict(mode="train_step", family="cnn", lm=False, ref=ref, inp=first, ref_out=meas.outs, acts=acts, half=half)
    for v, fn in (("featuremaps", check_featuremaps), ("gradcam", check_gradcam)):
        assert v in dbg.results, (v, dbg.skipped.get(v))
        fn(Outcome(v, result=dbg.results[v], widget=widgets.get(v)), {**ctx, "view": v})


def check_break(raised: BaseException | None, res: Any, model: torch.nn.Module, meas: T.Measured) -> None:
    """``--break-on nonfinite``: NonFiniteError from our hook at step NAN_AT in conv1, with the
    tensors in the hook frame's locals (what %debug shows); what ran before is recorded."""
    assert isinstance(raised, nbdebug.NonFiniteError) and isinstance(raised, FloatingPointError), repr(raised)
    assert (raised.step, raised.module, raised.row) == (T.NAN_AT, "conv1", "conv1"), (raised.step, raised.module)
    assert not torch.isfinite(raised.output).all()
    frames = [f for f, _ in traceback.walk_tb(raised.__traceback__)]
    hook = [f for f in frames if {"inputs", "output", "module"} <= set(f.f_locals)]
    assert hook and hook[-1].f_locals["module"] is model.conv1, [f.f_code.co_name for f in frames]
    kept = [s for s in res.step_index.tolist() if s < T.NAN_AT]
    assert kept == list(range(1, T.NAN_AT)), res.step_index
    assert res.first_nonfinite_step == T.NAN_AT
    np.testing.assert_allclose(res.series("conv1", "mean")[: len(kept)], [meas.stats["conv1"][s - 1][0] for s in kept], rtol=1e-5)
    np.testing.assert_allclose(res.series("loss")[: len(kept)], meas.loss[: len(kept)], rtol=1e-6)


def check_anomaly(raised: BaseException | None, res: Any, meas: T.Measured) -> None:
    """``torch.autograd.detect_anomaly()`` and an overflow at step NAN_AT: anomaly mode's own error
    (raised in step NAN_AT's backward) comes out unchanged, steps 1..NAN_AT are recorded (the earlier
    ones equal to the reference's), and the first non-finite value is step NAN_AT's forward in conv1."""
    assert type(raised) is RuntimeError and type(meas.raised) is RuntimeError and str(raised) == str(meas.raised), (raised, meas.raised)
    assert "nan" in str(raised).lower(), raised
    assert res.steps == T.NAN_AT and res.step_index.tolist() == list(range(1, T.NAN_AT + 1)), res.step_index
    for row, per_step in meas.stats.items():
        np.testing.assert_allclose(res.series(row, "mean")[: T.NAN_AT - 1], [m for m, _ in per_step[: T.NAN_AT - 1]], rtol=1e-5, atol=1e-7, err_msg=row)
    assert (res.first_nonfinite_step, res.first_nonfinite_phase) == (T.NAN_AT, "forward"), (res.first_nonfinite_step, res.first_nonfinite_phase)
    assert res.incident is not None and res.incident.module == "conv1", res.incident


def test_continue_across_two_cells(shell, record_property) -> None:  # type: ignore[no-untyped-def]
    """``--continue run1``: the second cell's steps follow the first's, through the magic."""
    record_property("cell", ("continue", "thermometer"))
    setup = """
import torch, copy, torch.nn.functional as F
from envelope import models as M, training as T
model, opt, batches = T.build("train_history")
ref, ref_opt = T.copies(model, opt)
meas = T.reference("train_history", ref, ref_opt, batches)
def steps(part):
    global loss
    for x, y in part:
        opt.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward(); opt.step()
"""
    assert shell.run_cell(setup).success
    r1 = shell.run_cell("%%nndebug model --loss loss -o run1\nsteps(batches[:3])")
    assert r1.success, r1.error_in_exec
    r2 = shell.run_cell("%%nndebug model --loss loss --continue run1 -o run2\nsteps(batches[3:])")
    assert r2.success, r2.error_in_exec
    ns = shell.user_ns
    run1, run2, meas = ns["run1"], ns["run2"], ns["meas"]
    assert run1.steps == 3 and run2.steps == T.STEPS
    assert run2.step_index.tolist() == list(range(1, T.STEPS + 1))
    np.testing.assert_allclose(run2.series("loss"), meas.loss, rtol=1e-6)
    np.testing.assert_allclose(run2.series("conv1", "mean"), [m for m, _ in meas.stats["conv1"]], rtol=1e-5)
    np.testing.assert_allclose(run2.series("fc", "update_ratio"), [meas.ratio["fc"][s] for s in range(1, T.STEPS + 1)], rtol=1e-4)
    assert hook_count(ns["model"]) == 0
    diffs = same_fingerprint(fingerprint(ns["ref"]), fingerprint(ns["model"]))
    assert diffs == [], diffs
    bad = shell.run_cell("%%nndebug model --continue model\nsteps(batches[:1])")
    assert type(bad.error_in_exec).__name__ == "UsageError" and "-o" in str(bad.error_in_exec), bad.error_in_exec
    assert hook_count(ns["model"]) == 0


def test_break_on_and_every_through_the_magic(shell) -> None:  # type: ignore[no-untyped-def]
    """``--break-on nonfinite`` raises NonFiniteError out of the cell (0 hooks left, model as the loop
    left it, the widget of what was recorded shown); ``--every 3`` keeps steps 1, 4, 7, 10. (Not a
    table cell of its own: the matrix rows above decide those cells.)"""
    setup = """
import torch, torch.nn.functional as F
from envelope import training as T
from nbdebug.capture import fingerprint, same_fingerprint
model, opt, batches = T.build("break_nonfinite")
ref, ref_opt = T.copies(model, opt)
meas = T.reference("break_nonfinite", ref, ref_opt, batches[: T.NAN_AT - 1]); ref_opt.zero_grad()
def steps(part):
    global loss
    for x, y in part:
        opt.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward(); opt.step()
"""
    assert shell.run_cell(setup).success
    before = len(shell.displayed)
    res = shell.run_cell("%%nndebug model --break-on nonfinite --loss loss -o run\nsteps(batches)")
    err = res.error_in_exec
    assert type(err).__name__ == "NonFiniteError" and (err.step, err.module) == (T.NAN_AT, "conv1"), repr(err)
    assert hook_count(shell.user_ns["model"]) == 0
    assert same_fingerprint(fingerprint(shell.user_ns["ref"]), fingerprint(shell.user_ns["model"])) == []
    shown = {d["application/vnd.jupyter.widget-view+json"]["model_id"] for d in shell.displayed[before:]
             if "application/vnd.jupyter.widget-view+json" in d}
    assert len(shown) == 1, shell.displayed[before:]  # one widget (live, then updated in place)
    w = shell.user_ns["_nndebug_widget"]
    assert [lay["name"] for lay in w.layers][:1] == ["conv1"] and w.first_nonfinite_step == T.NAN_AT
    assert shell.run_cell("model, opt, batches = T.build('every')").success
    res = shell.run_cell("%%nndebug model --every 3 --loss loss -o run\nsteps(batches)")
    assert res.success, res.error_in_exec
    run = shell.user_ns["run"]
    assert run.steps == 10 and run.step_index.tolist() == [1, 4, 7, 10] and run.every == 3
    assert hook_count(shell.user_ns["model"]) == 0
