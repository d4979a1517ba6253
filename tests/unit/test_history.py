"""The per-step history store: exact values kept, decimation within the budget, late data, --continue."""

from __future__ import annotations

import ast
import math
import time
from pathlib import Path

import numpy as np
import pytest

from nbdebug.capture import history as history_mod
from nbdebug.capture.history import FIELD_INDEX, HISTORY_FIELDS, SCALARS, History
from nbdebug.capture.history_store import Buckets

F = len(HISTORY_FIELDS)
MEAN, MAX, GN = FIELD_INDEX["mean"], FIELD_INDEX["max"], FIELD_INDEX["grad_norm"]


def _vals(step: int, rows: int) -> np.ndarray:
    """Row r at step s: field f = 1000 s + 10 r + f (distinct, exact in float32)."""
    return (1000.0 * step + 10.0 * np.arange(rows)[:, None] + np.arange(F)[None, :]).astype(np.float32)


def _filled(steps, rows: int = 2, max_bytes: int = 2**30) -> History:
    h = History(max_bytes)
    ids = np.array([h.row_id(f"r{i}", {"module": f"m{i}", "type": "ReLU"}) for i in range(rows)])
    for s in steps:
        h.append(s, ids, _vals(s, rows), {"loss": float(s), "lr": 0.1, "skipped": 0.0})
    return h


def test_ten_steps_kept_exactly() -> None:
    h = _filled(range(1, 11), rows=3)
    assert h.steps == 10 and len(h) == 10 and not h.decimated and h.notes == []
    assert h.step_index.tolist() == list(range(1, 11))
    assert h.step_index.dtype == np.int64
    np.testing.assert_array_equal(h.values(), np.stack([_vals(s, 3) for s in range(1, 11)]))
    for agg in ("min", "max"):
        np.testing.assert_array_equal(h.values(agg), h.values("last"))
    assert h.series("r2", "mean").tolist() == [1000.0 * s + 20 + MEAN for s in range(1, 11)]
    assert h.scalar("loss").tolist() == [float(s) for s in range(1, 11)]
    assert h.values().shape == (10, 3, F) and h.values().dtype == np.float32
    at7 = h.at(7)
    assert list(at7) == ["r0", "r1", "r2"] and at7["r1"]["max"] == 7000 + 10 + MAX
    at7s = h.scalars_at(7)
    assert {k: at7s[k] for k in ("loss", "lr", "skipped")} == {"loss": 7.0, "lr": pytest.approx(0.1), "skipped": 0.0}
    assert np.isnan(at7s["class_share"]) and np.isnan(at7s["class_top"])  # not appended: NaN
    assert h.row_info[1] == {"name": "r1", "module": "m1", "type": "ReLU", "shape": (), "dtype": ""}


def test_steps_with_gaps_are_kept_as_given() -> None:
    h = _filled([1, 3, 5, 6])
    assert h.step_index.tolist() == [1, 3, 5, 6] and h.appended == 4 and h.steps == 6
    with pytest.raises(KeyError, match=r"step 4 is not a kept step; nearest kept: \[3, 5\]"):
        h.at(4)
    with pytest.raises(ValueError, match="steps must increase"):
        h.append(6, np.array([0]), _vals(6, 1), {})


def test_decimation_keeps_spike_and_each_bucket_last_step() -> None:
    budget = 4 * History.slot_bytes(2)  # room for exactly 4 slots of 2 rows
    h = History(budget)
    ids = np.array([h.row_id("a", {}), h.row_id("b", {})])
    for s in range(1, 21):
        v = np.full((2, F), float(s), np.float32)
        if s == 7:
            v[0, MAX] = 100.0  # a one-step spike in row a's max
        h.append(s, ids, v, {"loss": 50.0 if s == 6 else float(s)})
    # 4 slots of 1 → 2 of 2 (+ steps 5..8) → 2 of 4 (+ 9..16) → 2 of 8, then 17..20 in an open bucket
    assert h.step_index.tolist() == [8, 16, 20]
    assert h.bucket_first.tolist() == [1, 9, 17] and h.bucket_steps.tolist() == [8, 8, 4]
    assert h.series("a", "max").tolist() == [8.0, 16.0, 20.0]  # last step of each bucket
    assert h.series("a", "max", agg="max").tolist() == [100.0, 16.0, 20.0]  # the spike survives
    assert h.series("b", "max", agg="max").tolist() == [8.0, 16.0, 20.0]
    assert h.series("a", "mean", agg="min").tolist() == [1.0, 9.0, 17.0]
    assert h.scalar("loss", agg="max").tolist() == [50.0, 16.0, 20.0]
    assert h.nbytes <= budget and h.decimated
    assert h.notes and "20 steps kept as 3 points of up to 8 steps" in h.notes[0]
    assert h.at(16)["a"]["mean"] == 16.0


def test_ten_thousand_steps_of_300_rows_fit_64mb_with_amortised_appends(monkeypatch) -> None:
    calls = []
    real = Buckets._decimate  # the History's slots (capture/history_store.py)
    monkeypatch.setattr(Buckets, "_decimate", lambda self: (calls.append(len(self)), real(self))[1])
    rows, n, budget = 300, 10_000, 64 * 2**20
    h = History(budget)
    ids = np.array([h.row_id(f"layer{i}", {}) for i in range(rows)])
    v = np.random.default_rng(0).random((rows, F), dtype=np.float32)
    t0 = time.perf_counter()
    for s in range(1, n + 1):
        h.append(s, ids, v, {"loss": float(s)})
    per_append = (time.perf_counter() - t0) / n
    print(f"\n10k appends x 300 rows: {per_append * 1e6:.1f} us/append, {len(h)} slots, {h.nbytes / 2**20:.1f} MB")
    assert h.nbytes <= budget and len(h) >= 100
    assert h.step_index[-1] == n and h.scalar("loss")[-1] == n  # the last step is always kept
    np.testing.assert_array_equal(h.values()[-1], v)
    # Each decimation halves a full history, so there are O(log n) of them: appends stay O(R·F) amortised.
    assert len(calls) <= math.ceil(math.log2(n / h.max_slots())) + 1
    assert all(k == h.max_slots() for k in calls)
    assert per_append < 1e-3  # generous: measured ~20–40 µs on a loaded 2-core machine


def test_rows_appearing_later_are_nan_before() -> None:
    h = History(2**30)
    a = h.row_id("a", {})
    for s in (1, 2):
        h.append(s, np.array([a]), _vals(s, 1), {})
    b = h.row_id("b", {"type": "Linear"})
    assert h.row_id("a", {"type": "ignored"}) == a and b == 1
    h.append(3, np.array([b, a]), np.stack([_vals(3, 1)[0] + 0.5, _vals(3, 1)[0]]), {})
    assert np.isnan(h.series("b", "mean")[:2]).all() and h.series("b", "mean")[2] == 3000.5 + MEAN
    assert h.series("a", "mean").tolist() == [1000.0 + MEAN, 2000.0 + MEAN, 3000.0 + MEAN]
    assert list(h.at(1)) == ["a"] and list(h.at(3)) == ["a", "b"]
    h.append(4, np.array([b]), _vals(4, 1), {})  # row a absent at step 4: NaN there
    assert math.isnan(h.series("a", "mean")[3]) and list(h.at(4)) == ["b"]
    assert np.isnan(h.scalar("loss")).all()


def test_rows_added_after_decimation_shrink_the_slots_within_budget() -> None:
    budget = 8 * History.slot_bytes(1)
    h = History(budget)
    a = h.row_id("a", {})
    for s in range(1, 9):
        h.append(s, np.array([a]), _vals(s, 1), {})
    assert len(h) == 8
    ids = np.array([h.row_id(f"x{i}", {}) for i in range(3)])
    h.append(9, ids, _vals(9, 3), {})
    assert h.nbytes <= budget and len(h) <= h.max_slots() and h.step_index[-1] == 9
    assert np.isnan(h.series("x0", "mean")[:-1]).all() and h.series("x0", "mean")[-1] == 9000 + MEAN
    assert h.series("a", "mean", agg="min")[0] == 1000 + MEAN


def test_update_late_gradients_exact_and_into_decimated_buckets() -> None:
    h = _filled(range(1, 4), rows=2)
    nan_row = np.full((1, F), np.nan, np.float32)
    late = nan_row.copy()
    late[0, GN] = -5.0
    assert h.update(2, np.array([1]), late)
    assert h.series("r1", "grad_norm").tolist() == [1000 + 10 + GN, -5.0, 3000 + 10 + GN]
    assert h.series("r1", "grad_norm", agg="max")[1] == -5.0  # a kept step: min/max follow
    assert h.series("r1", "mean")[1] == 2000 + 10 + MEAN  # NaN entries leave values alone
    assert not h.update(7, np.array([0]), late)  # never appended

    budget = 2 * History.slot_bytes(2)
    d = _filled(range(1, 9), rows=2, max_bytes=budget)
    assert d.step_index.tolist() == [4, 8] and d.bucket_first.tolist() == [1, 5]
    late[0, GN] = 99_999.0
    assert d.update(2, np.array([0]), late)  # inside bucket [1, 4], not its last step
    assert d.series("r0", "grad_norm", agg="max").tolist() == [99_999.0, 8000 + GN]
    assert d.series("r0", "grad_norm").tolist() == [4000 + GN, 8000 + GN]  # last unchanged
    late[0, GN] = -1.0
    assert d.update(8, np.array([1]), late)  # the bucket's last step: last and min
    assert d.series("r1", "grad_norm").tolist() == [4000 + 10 + GN, -1.0]
    assert d.series("r1", "grad_norm", agg="min").tolist() == [1000 + 10 + GN, -1.0]
    assert d.series("r1", "grad_norm", agg="max").tolist() == [4000 + 10 + GN, 8000 + 10 + GN]


def test_update_with_a_new_row_at_capacity_lands_in_the_bucket_of_its_step() -> None:
    """A late update that brings a new row when the history is full: the slots shrink (decimate)
    first, then the step's bucket is looked up."""
    h = History(4 * History.slot_bytes(1))  # 4 slots of 1 row, fewer of 2
    a = h.row_id("a", {})
    for s in range(1, 5):
        h.append(s, np.array([a]), _vals(s, 1), {})
    assert h.step_index.tolist() == [1, 2, 3, 4] and not h.decimated
    b = h.row_id("b", {})
    late = np.full((1, F), np.nan, np.float32)
    late[0, GN] = 77.0
    assert h.update(3, np.array([b]), late)  # inside the bucket now holding steps 3..4
    assert h.max_slots() < 4 and h.decimated and h.nbytes <= h.max_bytes
    assert h.bucket_first.tolist() == [1, 3] and h.step_index.tolist() == [2, 4]
    got = h.series("b", "grad_norm", agg="max")
    assert np.isnan(got[0]) and got[1] == 77.0
    assert np.isnan(h.series("b", "grad_norm")).all()  # step 3 is not its bucket's last step
    assert h.series("a", "grad_norm", agg="max").tolist() == [2000 + GN, 4000 + GN]  # a untouched


def test_changes_since_tokens() -> None:
    h = History(3 * History.slot_bytes(1))
    a = np.array([h.row_id("a", {})])
    t0, first = h.changes_since(0)
    assert first == 0
    h.append(1, a, _vals(1, 1), {})
    h.append(2, a, _vals(2, 1), {})
    t1, first = h.changes_since(t0)
    assert first == 0 and t1 > t0
    assert h.changes_since(t1) == (t1, 2)  # nothing new: len(history)
    h.append(3, a, _vals(3, 1), {})
    t2, first = h.changes_since(t1)
    assert first == 2
    h.update(2, a, _vals(2, 1) + 1)
    t3, first = h.changes_since(t2)
    assert first == 1
    h.append(4, a, _vals(4, 1), {})  # full: decimates → the reader must start over
    assert h.step_index.tolist() == [2, 4]
    assert h.changes_since(t3)[1] == 0
    t4, _ = h.changes_since(t3)
    h.append(5, a, _vals(5, 1), {})
    assert h.changes_since(t4)[1] == 2


def test_zero_budget_keeps_the_last_step_and_says_so() -> None:
    h = _filled(range(1, 6), rows=2, max_bytes=0)
    assert len(h) == 1 and h.step_index.tolist() == [5]
    np.testing.assert_array_equal(h.values()[0], _vals(5, 2))
    np.testing.assert_array_equal(h.values("min")[0], _vals(1, 2))
    assert h.scalar("loss", agg="min").tolist() == [1.0]
    assert "kept only the last step (step 5)" in h.notes[0]


def test_extend_continues_steps_and_rows() -> None:
    h = _filled(range(1, 4), rows=1)
    other = History(2**30)
    ids = np.array([other.row_id("new", {"type": "Linear"}), other.row_id("r0", {})])
    for s in (1, 2):  # numbered from 1: shifted after our step 3
        other.append(s, ids, _vals(s, 2), {"loss": 0.5 * s})
    h.extend(other)
    assert h.step_index.tolist() == [1, 2, 3, 4, 5] and h.steps == 5 and h.appended == 5
    assert h.rows == ["r0", "new"] and h.row_info[1]["type"] == "Linear"
    assert h.series("r0", "mean").tolist() == [1000 + MEAN, 2000 + MEAN, 3000 + MEAN, 1000 + 10 + MEAN, 2000 + 10 + MEAN]
    assert np.isnan(h.series("new", "mean")[:3]).all() and h.series("new", "mean")[3:].tolist() == [1000 + MEAN, 2000 + MEAN]
    assert h.scalar("loss").tolist()[3:] == [0.5, 1.0]
    later = _filled([6, 7], rows=1)  # already numbered after ours: kept as is
    h.extend(later)
    assert h.step_index.tolist()[-2:] == [6, 7]


def test_from_arrays_and_errors() -> None:
    h = History.from_arrays([2, 4], ["x", "y"], {"mean": [[1.0, 2.0], [3.0, 4.0]]}, {"loss": [1.5, 0.5]},
                            [{"module": "m.x", "type": "Tanh"}, {"module": "m.y"}])
    assert h.step_index.tolist() == [2, 4] and h.series("y", "mean").tolist() == [2.0, 4.0]
    assert h.row_info[0]["module"] == "m.x" and math.isnan(h.series("x", "std")[0])
    full = np.arange(2 * 1 * F, dtype=np.float32).reshape(2, 1, F)
    np.testing.assert_array_equal(History.from_arrays([1, 2], ["z"], full).values(), full)
    with pytest.raises(KeyError, match=r"valid: .*'mean'"):
        h.series("x", "avg")
    with pytest.raises(KeyError, match="no row 'q'; rows: \\['x', 'y'\\]"):
        h.series("q", "mean")
    with pytest.raises(KeyError, match="valid"):
        h.scalar("acc")
    with pytest.raises(KeyError, match="unknown scalar"):
        h.append(5, np.array([0]), np.zeros((1, F), np.float32), {"acc": 1.0})
    with pytest.raises(ValueError, match=r"values must be"):
        h.append(5, np.array([0]), np.zeros((1, 3), np.float32), {})
    with pytest.raises(ValueError, match="agg"):
        h.values("mean")
    assert SCALARS == ("loss", "lr", "skipped", "class_share", "class_top") and len(HISTORY_FIELDS) == 20


def test_history_module_does_not_import_torch() -> None:
    from nbdebug.capture import history_store

    for mod in (history_mod, history_store):  # History and the slots it owns
        tree = ast.parse(Path(mod.__file__).read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert "torch" not in imported, mod.__name__


# --------------------------------------------------------------------------- CaptureResult API
def _result(history: History | None, layers=None, **kw):
    from nbdebug.capture.result import CaptureResult

    return CaptureResult(
        layers=layers or [], forward_passes=4, backward_ran=True, calls_recorded=8, truncated=False, sample_size=8,
        near_zero_eps=1e-6, bytes_kept=0, budget_exceeded=False, forward_nonfinite_call=None,
        backward_nonfinite_row=None, elapsed_s=0.0, steps=4, history=history, **kw,
    )


def _two_layer_result(**kw):
    from nbdebug.capture.result import LayerRecord

    vals = np.stack([_vals(s, 2) for s in (1, 2, 4)])
    vals[0, 1] = np.nan  # row "net.1" appears at step 2
    vals[:, 0, FIELD_INDEX["grad_mean"]:FIELD_INDEX["grad_inf"] + 1] = np.nan  # no output gradient for row 0
    vals[:, 1, FIELD_INDEX["update_ratio"]] = np.nan
    h = History.from_arrays([1, 2, 4], ["net.0", "net.1"], vals, {"loss": [2.5, 2.0, 1.0], "skipped": [0, 0, 1]},
                            [{"module": "net.0", "type": "Linear"}, {"module": "net.1", "type": "Tanh"}])
    layers = [LayerRecord("net.0", "net.0", "Linear", (4, 3), "float32", 3, {"zero_frac": 0.0}, None, 1.0),
              LayerRecord("net.1", "net.1", "Tanh", (4, 3), "float32", 2, {"saturated_frac": 0.5}, None, None,
                          inputs=(0,), first_step=2)]
    return _result(h, layers, **kw)


def test_result_series_step_index_and_errors() -> None:
    res = _two_layer_result()
    assert res.step_index.tolist() == [1, 2, 4] and res.step_index.dtype == np.int64
    s = res.series("net.1", "grad_norm")
    assert s.dtype == np.float64 and math.isnan(s[0]) and s[1:].tolist() == [2000 + 10 + GN, 4000 + 10 + GN]
    assert res.series("net.0").tolist() == [1000 + MEAN, 2000 + MEAN, 4000 + MEAN]  # field defaults to mean
    assert res.series("loss").tolist() == [2.5, 2.0, 1.0] and res.series("skipped", agg="max").tolist() == [0, 0, 1]
    with pytest.raises(KeyError, match=r"no field 'avg'; valid fields: mean, std, .*update_ratio"):
        res.series("net.0", "avg")
    with pytest.raises(KeyError, match=r"no row 'fc'; valid names: 'loss', 'lr', 'skipped', 'class_share', 'class_top' or a row: 'net.0', 'net.1'"):
        res.series("fc", "mean")
    empty = _result(None)
    assert empty.step_index.tolist() == [] and empty.series("loss").size == 0
    with pytest.raises(KeyError, match="no row"):
        empty.series("x", "mean")


def test_result_at_step_gives_that_steps_rows() -> None:
    res = _two_layer_result()
    recs = res.at(2)
    assert [r.name for r in recs] == ["net.0", "net.1"]
    a, b = recs
    assert a.stats["mean"] == 2000 + MEAN and a.stats["zero_frac"] == 2000 + FIELD_INDEX["zero_frac"]
    assert a.stats["numel"] == 12 and a.calls == 1 and a.type == "Linear"
    assert a.grad is None and a.param_grad_norm == 2000 + FIELD_INDEX["param_grad_norm"]
    assert a.stats["update_ratio"] == 2000 + FIELD_INDEX["update_ratio"] and "update_ratio" not in b.stats
    assert b.grad is not None and b.grad["norm"] == 2000 + 10 + GN and b.grad["numel"] == 12
    assert b.stats["saturated_frac"] == 2000 + 10 + FIELD_INDEX["saturated_frac"] and b.inputs == (0,)
    merged_keys = {"numel", "mean", "std", "min", "max", "zero_frac", "nan", "inf", "norm", "near_zero_frac", "dead_unit_frac"}
    assert merged_keys <= set(a.stats)
    only = res.at(1)  # net.1 had not appeared yet
    assert [r.name for r in only] == ["net.0"]
    with pytest.raises(KeyError, match=r"nearest kept: \[2, 4\]"):
        res.at(3)


def test_result_first_nonfinite_phase_order_and_incidents() -> None:
    from types import SimpleNamespace

    assert _result(None).first_nonfinite_step is None and _result(None).first_nonfinite_phase is None
    res = _result(None, forward_nonfinite_step=5, backward_nonfinite_step=5, param_grad_nonfinite_step=5)
    assert (res.first_nonfinite_step, res.first_nonfinite_phase) == (5, "forward")
    res = _result(None, forward_nonfinite_step=5, backward_nonfinite_step=5, param_grad_nonfinite_step=4)
    assert (res.first_nonfinite_step, res.first_nonfinite_phase) == (4, "param_grad")
    res = _result(None, backward_nonfinite_step=3, param_grad_nonfinite_step=3)
    assert (res.first_nonfinite_step, res.first_nonfinite_phase) == (3, "output_grad")
    spike, nan = SimpleNamespace(kind="loss_spike", step=2), SimpleNamespace(kind="nonfinite", step=3)
    res = _result(None, incidents=[spike, nan])
    assert res.incident is nan and res.incidents == [spike, nan] and _result(None).incident is None


def test_result_skipped_steps_eval_every_lrs() -> None:
    res = _two_layer_result(skipped=[3], eval_steps=2, every=2, lrs={"net.0": 0.1})
    assert res.skipped_steps.tolist() == [3, 4] and res.skipped_steps.dtype == np.int64
    assert (res.eval_steps, res.every, res.lrs) == (2, 2, {"net.0": 0.1})
    plain = _result(None)
    assert plain.skipped_steps.tolist() == [] and (plain.eval_steps, plain.every, plain.lrs) == (0, 1, {})


def test_copy_is_independent_and_stride_doubles() -> None:
    h = _filled(range(1, 5), rows=1, max_bytes=3 * History.slot_bytes(1))
    assert h.stride == 2 and h.step_index.tolist() == [2, 4]  # [1, 2] [3] → [3, 4] folds in
    c = h.copy()
    c.append(5, np.array([0]), _vals(5, 1) + 0.5, {})
    c.update(4, np.array([0]), _vals(4, 1) - 9999)
    c.row_id("new", {})
    assert c.step_index.tolist() == [2, 4, 5] and c.rows == ["r0", "new"] and c.steps == 5
    assert h.step_index.tolist() == [2, 4] and h.rows == ["r0"] and h.steps == 4
    np.testing.assert_array_equal(h.values("min")[:, 0, 0], [1000.0, 3000.0])
    np.testing.assert_array_equal(c.values("min")[:, 0, 0], [1000.0, 4000.0 - 9999, 5000.5])


@pytest.mark.parametrize("budget_slots", [1000, 5])  # room for every step; a budget that decimates (step by step)
def test_append_many_equals_appending_step_by_step(budget_slots: int) -> None:
    """``append_many`` (the capture's batched steps) leaves the history exactly as one ``append`` per step:
    values, min/max, scalars, bucket bounds, change tokens, and later appends."""
    rng = np.random.default_rng(0)
    rows = ["a", "b", "c"]
    budget = budget_slots * History.slot_bytes(len(rows))
    one, many = History(budget), History(budget)
    for h in (one, many):
        ids = np.array([h.row_id(r) for r in rows])
    vals = rng.standard_normal((9, 3, len(HISTORY_FIELDS))).astype(np.float32)
    vals[2, 1, 4] = np.nan
    sc = [{"loss": float(i), "lr": 0.1, "skipped": 0.0} for i in range(9)]
    steps = [1, 2, 3, 5, 6, 7, 9, 10, 11]
    one.append(steps[0], ids, vals[0], sc[0])
    many.append(steps[0], ids, vals[0], sc[0])
    for s, v, c in zip(steps[1:6], vals[1:6], sc[1:6]):
        one.append(s, ids, v, c)
    many.append_many(steps[1:6], ids, vals[1:6], sc[1:6])
    for s, v, c in zip(steps[6:], vals[6:], sc[6:]):
        one.append(s, ids, v, c)
    many.append_many(steps[6:], ids[[2, 0, 1]], vals[6:][:, [2, 0, 1]], sc[6:])  # rows in another order
    for agg in ("last", "min", "max"):
        np.testing.assert_array_equal(one.values(agg), many.values(agg))
        np.testing.assert_array_equal(one.scalar("loss", agg), many.scalar("loss", agg))
    for attr in ("step_index", "bucket_first", "bucket_steps", "steps", "appended", "stride", "nbytes"):
        assert np.array_equal(getattr(one, attr), getattr(many, attr)), attr
    assert one.changes_since(3) == many.changes_since(3) and one.changes_since(0) == many.changes_since(0)
    with pytest.raises(ValueError):
        many.append_many([11, 12], ids, vals[:2], sc[:2])  # steps must increase
