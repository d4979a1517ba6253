"""Per-step flags, events and the report at a step, on hand-built histories with exact expectations;
every number a message cites checked against the table / ``result.at(step)``; then a real digits
MLP trained at lr=3.0 (the issue's collapse: dead units after a too-large update, not "vanishing")."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pytest

from nbdebug.capture.history import HISTORY_FIELDS, History
from nbdebug.capture.result import CaptureResult, LayerRecord
from nbdebug.inspectors.events import events
from nbdebug.inspectors.history import (
    FLAG_BITS,
    Thresholds,
    flag_names,
    input_graph,
    step_flags,
)
from nbdebug.inspectors.thermometer import COLUMNS, ThermometerReport, diagnose

F = len(HISTORY_FIELDS)


def fields(k: int, r: int, **cols: Sequence[Sequence[float]]) -> dict[str, np.ndarray]:
    """field → [K, R] (NaN where not given); ``cols`` values are per row lists of K values."""
    return {f: np.asarray(v, dtype=np.float64).T.reshape(k, r) for f, v in cols.items()}


def result_of(h: History, types: Sequence[str], inputs: Sequence[tuple[int, ...]], dtypes: Sequence[str] | None = None,
              **kw: object) -> CaptureResult:
    """A CaptureResult whose rows are ``h``'s rows (merged stats = the last step's, enough here)."""
    last = h.values()[-1]
    layers = [
        LayerRecord(name=n, module=n, type=t, shape=(4, 8), dtype=(dtypes[i] if dtypes else "float32"), calls=h.appended,
                    stats={"numel": 32.0, "zero_frac": float(last[i, 4]), "nan": 0.0, "inf": 0.0, "mean": 0.0},
                    grad=None, param_grad_norm=None, inputs=tuple(inputs[i]))
        for i, (n, t) in enumerate(zip(h.rows, types))
    ]
    base: dict[str, object] = dict(
        layers=layers, forward_passes=h.appended, backward_ran=True, calls_recorded=0, truncated=False, sample_size=4096,
        near_zero_eps=1e-6, bytes_kept=0, budget_exceeded=False, forward_nonfinite_call=None, backward_nonfinite_row=None,
        elapsed_s=0.0, steps=h.steps, history=h,
    )
    base.update(kw)
    return CaptureResult(**base)  # type: ignore[arg-type]


# -- the collapse, by hand: Linear `0` → ReLU `1` → MaxPool `2` → Linear `3` ------------------------
ROWS = ["0", "1", "2", "3"]
TYPES = ["Linear", "ReLU", "MaxPool1d", "Linear"]
CHAIN = [(), (0,), (1,), (2,)]


def collapse() -> History:
    nan = math.nan
    v = fields(
        5, 4,
        dead_unit_frac=[[0, 0, 0, 0, 0], [0.1, 0.2, 0.95, 0.97, 0.97], [0.1, 0.2, 0.95, 0.97, 0.97], [0, 0, 0, 0, 0]],
        zero_frac=[[0, 0, 0, 0, 0], [0.5, 0.5, 0.98, 0.98, 0.98], [0.5, 0.5, 0.98, 0.98, 0.98], [0, 0, 0, 0, 0]],
        update_ratio=[[1e-3, 0.31, 1e-3, 1e-3, 1e-3], [nan] * 5, [nan] * 5, [1e-3, 0.02, 1e-3, 1e-3, 5e-5]],
        param_grad_norm=[[2.0, 1.5, 1e-3, 1.9e-3, 1e-4], [nan] * 5, [nan] * 5, [0.5] * 5],
        grad_norm=[[1.0, 1.0, 1e-9, 1e-9, 1e-9], [1.0] * 5, [1.0] * 5, [0.2] * 5],
        nan=[[0] * 5] * 4, inf=[[0] * 5] * 4, grad_nan=[[0] * 5] * 4, grad_inf=[[0] * 5] * 4,
    )
    return History.from_arrays([1, 2, 3, 4, 5], ROWS, v, {"loss": [2.3, 2.2, 2.303, 2.303, 2.303]},
                               row_info=[{"type": t, "dtype": "float32"} for t in TYPES])


def test_flag_bits_are_distinct_powers_of_two() -> None:
    bits = list(FLAG_BITS.values())
    assert len(set(bits)) == len(bits) == 9 and all(b & (b - 1) == 0 for b in bits) and max(bits) < 2**16
    assert flag_names(FLAG_BITS["dead_units"] | FLAG_BITS["update_ratio"]) == ["dead_units", "update_ratio"]


def test_step_flags_of_the_collapse() -> None:
    h = collapse()
    bits = step_flags(h.values(), TYPES, Thresholds(), inputs=CHAIN)
    assert bits.dtype == np.uint16 and bits.shape == (5, 4)
    names = [[flag_names(int(b)) for b in row] for row in bits]
    assert [n[1] for n in names] == [[], [], ["dead_units"], ["dead_units"], ["dead_units"]]
    assert all(n[2] == [] for n in names)  # the pool after the dead ReLU inherits it: not news
    assert [n[0] for n in names] == [[], ["update_ratio"], [], [], []]  # 0.31 > 1e-2
    assert [n[3] for n in names] == [[], ["update_ratio"], [], [], ["update_ratio"]]  # 0.02, then 5e-5 < 1e-4
    # A 1e-9 parameter gradient behind the dead ReLU is the dead story; without the dead units it is vanishing.
    v = h.values()
    v[2:, 0, HISTORY_FIELDS.index("param_grad_norm")] = 1e-9
    cut = step_flags(v, TYPES, Thresholds(), inputs=CHAIN)
    assert [flag_names(int(b)) for b in cut[:, 0]] == [[], ["update_ratio"], [], [], []]
    v[:, :, HISTORY_FIELDS.index("dead_unit_frac")] = 0.0
    v[:, :, HISTORY_FIELDS.index("zero_frac")] = 0.0
    alive = step_flags(v, TYPES, Thresholds(), inputs=CHAIN)
    assert [flag_names(int(b)) for b in alive[:, 0]] == [[], ["update_ratio"], ["vanishing"], ["vanishing"], ["vanishing"]]


def test_thresholds_are_configurable() -> None:
    h = collapse()
    bits = step_flags(h.values(), TYPES, Thresholds(dead_units=0.15, update_high=0.5, update_low=0.0), inputs=CHAIN)
    assert [flag_names(int(b)) for b in bits[:, 1]] == [[], ["dead_units"], ["dead_units"], ["dead_units"], ["dead_units"]]
    assert not (bits[:, [0, 3]] & FLAG_BITS["update_ratio"]).any()


def test_events_of_the_collapse_exact() -> None:
    evs = events(collapse(), inputs=CHAIN)
    assert [(e.step, e.row, e.code) for e in evs] == [  # by step, then row order
        (2, "0", "update_ratio"), (2, "3", "update_ratio"), (3, "0", "grad_fell"), (3, "1", "became_dead"),
    ]
    by = {(e.row, e.code): e for e in evs}
    assert by[("1", "became_dead")].message == (
        "ReLU `1`: 95% of units dead from step 3, after an update ratio of 0.31 at step 2 in `0` (learning rate too high)"
    )
    assert "Lower the learning rate" in by[("1", "became_dead")].suggestion
    assert by[("0", "grad_fell")].message == "`0`: parameter-gradient norm fell from 2 at step 1 to 0.001 at step 3 (10^3 smaller)"
    assert by[("0", "update_ratio")].message == "`0`: update ratio ‖Δθ‖/‖θ‖ of 0.31 at step 2, above the 0.01 rule of thumb"
    assert by[("3", "update_ratio")].message.startswith("`3`: update ratio ‖Δθ‖/‖θ‖ of 0.02 at step 2, above the 0.01 rule of thumb")
    # only the first out-of-range step of a row is an event (step 5's 5e-5 is a flag, not a new event)
    assert sum(e.row == "3" and e.code == "update_ratio" for e in evs) == 1


def test_became_dead_cites_the_model_s_out_of_range_updates_when_no_layer_feeds_it() -> None:
    h = collapse()
    evs = events(h, inputs=[(), (), (1,), (2,)])  # ReLU `1` with no captured input
    e = next(e for e in evs if e.code == "became_dead")
    assert e.message == ("ReLU `1`: 95% of units dead from step 3, after update ratios of 0.02–0.31 at step 2 in `0`, `3` "
                         "(no layer feeding it has an update ratio; learning rate too high)")


def test_no_became_dead_when_dead_from_the_start_or_recovering() -> None:
    base = dict(update_ratio=[[1e-3] * 4, [math.nan] * 4])
    dead_always = History.from_arrays([1, 2, 3, 4], ["0", "1"], fields(4, 2, dead_unit_frac=[[0] * 4, [0.95] * 4], **base),
                                      row_info=[{"type": "Linear"}, {"type": "ReLU"}])
    assert [e.code for e in events(dead_always)] == []
    recovers = History.from_arrays([1, 2, 3, 4], ["0", "1"], fields(4, 2, dead_unit_frac=[[0] * 4, [0.1, 0.95, 0.3, 0.1]], **base),
                                   row_info=[{"type": "Linear"}, {"type": "ReLU"}])
    assert [e.code for e in events(recovers)] == []
    # gradual: 0.6 (flagged, below became_dead) then 0.92: the event is at the step it reached 0.9
    gradual = History.from_arrays([1, 2, 3, 4], ["0", "1"], fields(4, 2, dead_unit_frac=[[0] * 4, [0.1, 0.6, 0.92, 0.93]], **base),
                                  row_info=[{"type": "Linear"}, {"type": "ReLU"}])
    (e,) = events(gradual)
    # every update before it was healthy (1e-3): the story says nothing about updates
    assert (e.step, e.message) == (3, "ReLU `1`: 92% of units dead from step 3")
    assert "Lower the learning rate" not in e.suggestion and "init" in e.suggestion


# -- the dead-unit story names the steps whose updates were out of range (issue 19) ----------------
MLP_ROWS = ["0", "1", "2", "3", "4"]  # Linear → ReLU → Linear → ReLU → Linear
MLP_TYPES = ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
MLP_CHAIN = [(), (0,), (1,), (2,), (3,)]


def mlp_history(ratios: dict[str, list[float]], dead_from: int, steps: int = 30) -> History:
    """ReLU `3` alive (10% dead units) until ``dead_from``, then 97% dead for good; ReLU `1` healthy;
    the Linears' update ratios as given (1-based step s at index s - 1)."""
    nan = [math.nan] * steps
    v = fields(
        steps, 5,
        update_ratio=[ratios["0"], nan, ratios["2"], nan, ratios["4"]],
        dead_unit_frac=[nan, [0.1] * steps, nan, [0.1 if s < dead_from else 0.97 for s in range(1, steps + 1)], nan],
    )
    return History.from_arrays(range(1, steps + 1), MLP_ROWS, v, row_info=[{"type": t, "dtype": "float32"} for t in MLP_TYPES])


def story_of(h: History, inputs: list[tuple[int, ...]] | None = MLP_CHAIN) -> str:
    (e,) = [e for e in events(h, inputs=inputs) if e.code == "became_dead"]
    assert (e.row, e.step) == ("3", 27)
    return e.message


def test_dead_story_names_the_large_updates_at_step_1_not_the_healthy_one_before_the_death() -> None:
    # the run: 0.04–0.15 at step 1 in `0`, `2`, `4`, then a healthy ~7e-4 everywhere; dead from step 27
    calm = [7.02e-4] * 29
    h = mlp_history({"0": [0.04, *calm], "2": [0.15, *calm], "4": [0.09, *calm]}, dead_from=27)
    msg = story_of(h)
    # `4` comes after ReLU `3`: its update cannot have killed it
    assert msg == "ReLU `3`: 97% of units dead from step 27, after update ratios of 0.04–0.15 at step 1 in `0`, `2` (learning rate too high)"
    assert "0.000702" not in msg and "step 26" not in msg
    res = result_of(h, MLP_TYPES, MLP_CHAIN)
    rep = diagnose(res)
    assert "from step 27 (learning rate too high)" in rep.summary, rep.summary
    assert check_numbers(res, rep) >= 3


def test_dead_story_says_nothing_about_updates_that_were_all_in_range() -> None:
    h = mlp_history({"0": [1e-3] * 30, "2": [5e-3] * 30, "4": [0.5] * 30}, dead_from=27)  # only `4`, after it, is too large
    assert story_of(h) == "ReLU `3`: 97% of units dead from step 27"
    res = result_of(h, MLP_TYPES, MLP_CHAIN)
    assert "learning rate too high" not in diagnose(res).summary


def test_dead_story_lists_a_few_steps_and_summarises_many() -> None:
    few = [1e-3] * 30
    few[4], few[9], few[19] = 0.02, 0.5, 0.03  # steps 5, 10, 20
    msg = story_of(mlp_history({"0": [1e-3] * 30, "2": few, "4": [1e-3] * 30}, dead_from=27))
    assert msg == ("ReLU `3`: 97% of units dead from step 27, after update ratios above 0.01 at steps 5, 10 and 20, "
                   "the largest 0.5 at step 10 in `2` (learning rate too high)")
    many = [0.02 + s / 1000 for s in range(30)]  # steps 1..26 before the death, all too large; 0.045 at step 26
    msg = story_of(mlp_history({"0": many, "2": [1e-3] * 30, "4": [1e-3] * 30}, dead_from=27))
    assert msg == ("ReLU `3`: 97% of units dead from step 27, after update ratios above 0.01 at 26 steps from step 1 "
                   "to step 26, the largest 0.045 at step 26 in `0` (learning rate too high)")


def test_dead_story_cites_too_large_updates_before_too_small_ones() -> None:
    low = [1e-3] * 30
    low[2] = 2e-5  # step 3: too small
    high = [1e-3] * 30
    high[6] = 0.2  # step 7: too large
    assert story_of(mlp_history({"0": low, "2": high, "4": [1e-3] * 30}, dead_from=27)).endswith(
        "after an update ratio of 0.2 at step 7 in `2` (learning rate too high)")
    # only too-small ones: named as such, and the advice is not "lower the learning rate"
    h = mlp_history({"0": low, "2": [1e-3] * 30, "4": [1e-3] * 30}, dead_from=27)
    assert story_of(h) == "ReLU `3`: 97% of units dead from step 27, after an update ratio of 2e-05 at step 3 in `0` (the layers barely moved)"
    (e,) = [e for e in events(h, inputs=MLP_CHAIN) if e.code == "became_dead"]
    assert "Lower the learning rate" not in e.suggestion
    # an exact 0 (a frozen layer) is not out of range
    frozen = [1e-3] * 30
    frozen[2] = 0.0
    assert story_of(mlp_history({"0": frozen, "2": [1e-3] * 30, "4": [1e-3] * 30}, dead_from=27)) == \
        "ReLU `3`: 97% of units dead from step 27"


def test_integer_rows_are_never_dead() -> None:
    v = fields(2, 2, zero_frac=[[1.0, 1.0], [1.0, 1.0]], dead_unit_frac=[[1.0, 1.0], [1.0, 1.0]])
    h = History.from_arrays([1, 2], ["mask", "h"], v)
    vals = h.values()
    bits = step_flags(vals, ["Gt", "ReLU"], dtypes=["bool", "float32"], inputs=[(), ()])
    assert [flag_names(int(b)) for b in bits[-1]] == [[], ["dead"]]  # a dead row: "dead" alone says its units are


def test_nan_origins_per_step_follow_the_input_graph() -> None:
    # step 1 finite; step 2: `a` NaN from finite inputs, `b` inherits; step 3: forward finite, the
    # gradient turns NaN in `c`'s backward (finite at its output, NaN at `b`, its input, and before).
    v = {"nan": np.array([[0, 0, 0], [0, 5, 5], [0, 0, 0]]), "inf": np.zeros((3, 3)),
         "grad_nan": np.array([[0, 0, 0], [0, 0, 0], [4, 4, 0]]), "grad_inf": np.zeros((3, 3))}
    h = History.from_arrays([1, 2, 3], ["a0", "b", "c"], v)
    chain = [(), (0,), (1,)]
    bits = step_flags(h.values(), ["Linear", "Log", "Linear"], inputs=chain)
    assert [[flag_names(int(b)) for b in row] for row in bits] == [
        [[], [], []],
        [[], ["nan_origin_fwd"], ["nonfinite"]],
        [["nonfinite"], ["nonfinite"], ["nan_origin_bwd"]],
    ]
    # two branches from `a0`: both NaN outputs are origins (neither fed the other)
    branch = step_flags(h.values(), ["Linear", "Log", "Log"], inputs=[(), (0,), (0,)])
    assert [flag_names(int(b)) for b in branch[1]] == [[], ["nan_origin_fwd"], ["nan_origin_fwd"]]
    # a non-finite output gradient of a row nothing captured consumed: the loss or code after it
    v2 = fields(1, 2, nan=[[0], [0]], grad_nan=[[3], [3]])
    last = step_flags(History.from_arrays([1], ["x", "y"], v2).values(), ["Linear", "Linear"], inputs=[(), (0,)])
    assert [flag_names(int(b)) for b in last[0]] == [["nonfinite"], ["nan_origin_bwd"]]


def test_exploding_uses_either_norm() -> None:
    v = fields(2, 2, grad_norm=[[1.0, 2e3], [1.0, 1.0]], param_grad_norm=[[math.nan, math.nan], [5.0, 1.0]])
    bits = step_flags(History.from_arrays([1, 2], ["a", "b"], v).values(), ["Linear", "Linear"])
    assert [flag_names(int(b)) for b in bits[:, 0]] == [[], ["exploding"]]
    assert not bits[:, 1].any()


def test_a_skipped_step_s_inf_gradients_are_not_flags() -> None:
    inf = math.inf
    v = fields(3, 2, grad_inf=[[0, 6, 0], [0, 6, 0]], grad_nan=[[0, 0, 0], [0, 0, 0]], grad_norm=[[1, inf, 1], [1, inf, 1]],
               nan=[[0] * 3, [0] * 3], inf=[[0] * 3, [0] * 3])
    h = History.from_arrays([1, 2, 3], ["a", "b"], v, {"skipped": [0.0, 1.0, 0.0]})
    plain = step_flags(h.values(), ["Linear", "Linear"], inputs=[(), (0,)])
    assert [flag_names(int(b)) for b in plain[1]] == [["nonfinite", "exploding"], ["nan_origin_bwd", "exploding"]]
    scaled = step_flags(h.values(), ["Linear", "Linear"], inputs=[(), (0,)], skipped=h.scalar("skipped") == 1)
    assert not scaled.any()
    res = result_of(h, ["Linear", "Linear"], [(), (0,)])
    assert not diagnose(res, step=2).history_flags.any() and events(h) == []


def test_dead_units_need_several_values_per_unit() -> None:
    # one sample: half a ReLU's features are zero by chance, which says nothing about the units
    v = fields(1, 1, dead_unit_frac=[[0.5]])
    vals = History.from_arrays([1], ["r"], v).values()
    for shape, flagged in (((1, 8), False), ((3, 8), False), ((4, 8), True), ((1, 8, 2, 2), True), (None, True)):
        bits = step_flags(vals, ["ReLU"], shapes=[shape])
        assert bool(bits[0, 0] & FLAG_BITS["dead_units"]) is flagged, shape
    assert step_flags(vals, ["ReLU"], Thresholds(unit_values=1), shapes=[(1, 8)])[0, 0] & FLAG_BITS["dead_units"]


def test_step_flags_from_a_start_slot_equal_the_tail_of_the_whole() -> None:
    # live updates compute only the changed slots: start= reads values/skipped from that slot on
    inf = math.inf
    nan = math.nan
    v = fields(4, 2, grad_inf=[[0, 6, 0, 0], [0, 6, 0, 0]], grad_norm=[[1, inf, 1e-9, nan], [1, inf, 1, nan]],
               nan=[[0, 0, 0, 2], [0, 0, 0, 2]], inf=[[0] * 4, [0] * 4], grad_nan=[[0, 0, 0, 6], [0, 0, 0, 6]],
               dead_unit_frac=[[0, 0, 0, 0], [0, 0, 0.8, 0.8]], update_ratio=[[1e-3, 0.5, 1e-3, 1e-3], [math.nan] * 4])
    h = History.from_arrays([1, 2, 3, 4], ["a", "b"], v, {"skipped": [0.0, 1.0, 0.0, 0.0]})
    kw = dict(inputs=[(), (0,)], skipped=h.scalar("skipped") == 1, shapes=[(4, 8), (4, 8)])
    whole = step_flags(h.values(), ["Linear", "Linear"], **kw)  # type: ignore[arg-type]
    assert [[flag_names(int(b)) for b in row] for row in whole] == [
        [[], []],
        [["update_ratio"], []],  # step 2: skipped by a GradScaler: its inf gradients are no flags
        [[], ["dead_units"]],  # step 3: `a`'s 1e-9 before dead units is the dead story, not vanishing
        [["nan_origin_fwd"], ["nonfinite", "dead_units"]],  # step 4: forward NaN from `a`; NaN gradients inherit it
    ]
    for s in range(5):
        tail = step_flags(h.values(), ["Linear", "Linear"], start=s, **kw)  # type: ignore[arg-type]
        assert tail.shape == (4 - s, 2) and np.array_equal(tail, whole[s:]), s


# -- the report at a step ------------------------------------------------------------------------
NUM = r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)"


def fmt(x: float) -> str:
    return f"{x:.3g}"


def check_update_story(res: CaptureResult, e: object) -> int:
    """The update ratios a became-dead story cites are the history's at the steps it names, and those
    steps come before the death. Returns how many numbers were checked."""
    ratio = lambda step, row: next(r for r in res.at(step) if r.name == row).stats["update_ratio"]  # noqa: E731
    msg, died = e.message, e.step  # type: ignore[attr-defined]
    m = re.search(rf"after an update ratio of {NUM} at step (\d+) in `([^`]+)`", msg)
    if m:
        assert int(m.group(2)) < died and fmt(ratio(int(m.group(2)), m.group(3))) == m.group(1), msg
        return 1
    m = re.search(rf"after update ratios of {NUM}–{NUM} at step (\d+) in ((?:`[^`]+`(?:, )?)+)(…?)", msg)
    if m:
        s, names = int(m.group(3)), re.findall(r"`([^`]+)`", m.group(4))
        vals = [ratio(s, n) for n in names]
        assert s < died, msg
        if not m.group(5):  # every row is listed: the range is theirs
            assert (fmt(min(vals)), fmt(max(vals))) == (m.group(1), m.group(2)), msg
        return 2
    m = re.search(rf"after update ratios (?:above|below) \S+ at .*?, the (?:largest|smallest) {NUM} at step (\d+) in `([^`]+)`", msg)
    if m:
        assert int(m.group(2)) < died and fmt(ratio(int(m.group(2)), m.group(3))) == m.group(1), msg
        return 1
    assert "update ratio" not in msg, msg
    return 0


def check_numbers(res: CaptureResult, rep: ThermometerReport) -> int:
    """Every number an event or a per-step diagnosis cites is the value at the step it names, in
    ``result.at(step)`` and in the report's table when the report is at that step. Returns how many
    numbers were checked."""
    checked = 0

    def at(step: int, row: str) -> LayerRecord:
        return next(r for r in res.at(step) if r.name == row)

    for e in rep.events:
        if e.code == "became_dead":
            m = re.search(r"`([^`]+)`: (\d+)% of (units dead|outputs exactly zero) from step (\d+)", e.message)
            assert m and m.group(1) == e.row and int(m.group(4)) == e.step, e.message
            key = "dead_unit_frac" if m.group(3) == "units dead" else "zero_frac"
            assert f"{at(e.step, e.row).stats[key]:.0%}" == m.group(2) + "%"
            checked += 1
            checked += check_update_story(res, e)
        elif e.code == "grad_fell":
            m = re.search(rf"fell from {NUM} at step (\d+) to {NUM} at step (\d+)(?: \(10\^(\d+) smaller\))?$", e.message)
            assert m and int(m.group(4)) == e.step, e.message
            a, b = at(int(m.group(2)), e.row), at(e.step, e.row)
            key = "param_grad_norm" if "parameter" in e.message else None
            va = a.param_grad_norm if key else a.grad["norm"]  # type: ignore[index]
            vb = b.param_grad_norm if key else b.grad["norm"]  # type: ignore[index]
            assert (fmt(va), fmt(vb)) == (m.group(1), m.group(3)), e.message
            assert (m.group(5) is None) == (vb == 0) and (vb == 0 or int(m.group(5)) == math.floor(math.log10(va / vb)))
            checked += 2
        elif e.code == "update_ratio":
            m = re.search(rf"of {NUM} at step (\d+)", e.message)
            assert m and int(m.group(2)) == e.step and fmt(at(e.step, e.row).stats["update_ratio"]) == m.group(1)
            checked += 1
    s = rep.step
    for d in rep.diagnoses:
        if d.code == "dead_units":
            m = re.search(rf"(\d+)%(?: of its units are zero for every sample)? at step {s}", d.message)
            assert m, d.message
            i = rep.names.index(d.layer)
            assert f"{rep.column('dead_unit_frac')[i]:.0%}" == m.group(1) + "%" == f"{at(s, d.layer).stats['dead_unit_frac']:.0%}"
            checked += 1
        if d.code == "dead":
            m = re.search(rf"(\d+\.\d)% exact zeros at step {s}", d.message)
            assert m, d.message
            i = rep.names.index(d.layer)
            assert f"{rep.column('zero_frac')[i]:.1%}" == m.group(1) + "%" == f"{at(s, d.layer).stats['zero_frac']:.1%}"
            checked += 1
        if d.code == "update_ratio":
            for row, num in re.findall(rf"`([^`]+)` {NUM}", d.message):
                i = rep.names.index(row)
                assert fmt(rep.column("update_ratio")[i]) == num == fmt(at(s, row).stats["update_ratio"])
                checked += 1
    return checked


def test_report_at_the_last_step_tells_the_dead_story_not_vanishing() -> None:
    res = result_of(collapse(), TYPES, CHAIN)
    rep = diagnose(res)
    assert rep.step == 5 and rep.step_index.tolist() == [1, 2, 3, 4, 5]
    assert COLUMNS[-2:] == ("dead_unit_frac", "update_ratio")
    assert rep.flags == [[], ["dead_units"], [], ["update_ratio"]]
    assert rep.column("dead_unit_frac").tolist() == pytest.approx([0.0, 0.97, 0.97, 0.0])
    assert rep.column("update_ratio")[3] == pytest.approx(5e-5)
    d = next(d for d in rep.diagnoses if d.code == "dead_units")
    assert d.message == ("ReLU `1`: 95% of units dead from step 3, after an update ratio of 0.31 at step 2 in `0` "
                         "(learning rate too high); 97% at step 5.")
    assert rep.summary.startswith("step 5: 4 layers: dead units in 1 layer (`1`) from step 3 (learning rate too high)")
    assert "vanishing" not in rep.summary and not any(d.code == "vanishing" for d in rep.diagnoses)
    assert rep.history_flags.shape == (5, 4) and int(rep.history_flags[2, 1]) == FLAG_BITS["dead_units"]
    assert check_numbers(res, rep) >= 7


def test_report_at_an_earlier_step_and_whole_run() -> None:
    res = result_of(collapse(), TYPES, CHAIN)
    rep = diagnose(res, step=2)
    assert rep.step == 2 and rep.flags == [["update_ratio"], [], [], ["update_ratio"]]
    assert rep.column("update_ratio")[0] == pytest.approx(0.31)
    d = next(d for d in rep.diagnoses if d.code == "update_ratio")
    assert d.message == "update ratio ‖Δθ‖/‖θ‖ high (above 0.01) at step 2 in 2 layers: `0` 0.31, `3` 0.02."
    assert not any(d.code == "dead_units" for d in rep.diagnoses)  # not dead yet at step 2
    assert check_numbers(res, rep) >= 2
    with pytest.raises(KeyError, match="nearest kept"):
        diagnose(res, step=7)
    whole = diagnose(res, step="run")  # the merged whole-run table tells the same story
    assert whole.step is None and whole.events == diagnose(res).events
    assert whole.flags[1] == ["dead_units"] and "from step 3 (learning rate too high)" in whole.summary, whole.summary


def test_nan_at_one_step_then_finite_again() -> None:
    # an inference loop: `b` (fed by `a`) is NaN at step 2 only. The capture's per-call check says
    # `b`'s inputs were finite at step 2; the last step's report is clean but says where to look.
    v = {"nan": np.array([[0, 0], [0, 3], [0, 0]]), "inf": np.zeros((3, 2))}
    h = History.from_arrays([1, 2, 3], ["a", "b"], v)
    res = result_of(h, ["Linear", "Log"], [(), (0,)], forward_nonfinite_call=(1, True), forward_nonfinite_step=2)
    rep = diagnose(res)
    assert rep.step == 3 and rep.flags == [[], []]
    d = next(d for d in rep.diagnoses if d.code == "nonfinite")
    assert d.layer == "b" and d.message == "NaN/Inf first appeared at step 2 in `b` (forward); step 3 is finite again (choose step 2 to see where it came from)."
    assert rep.summary == "step 3: 2 layers: first non-finite value at step 2, in `b` (forward)"
    at2 = diagnose(res, step=2)
    assert at2.flags == [[], ["nan_origin_fwd"]]
    assert next(d for d in at2.diagnoses if d.code == "nan_origin_fwd").message == "`b` (Log) outputs NaN/Inf at step 2 while its inputs were finite."


def test_single_step_result_is_the_merged_report() -> None:
    h = History.from_arrays([1], ["0", "1"], fields(1, 2, update_ratio=[[2e-3], [math.nan]]))
    res = result_of(h, ["Linear", "ReLU"], [(), (0,)])
    rep = diagnose(res)
    assert rep.step is None and rep.events == []
    assert rep.column("update_ratio")[0] == pytest.approx(2e-3)  # the last step's ratio in the merged table


def test_decimated_history_story_names_kept_steps() -> None:
    h = History(max_bytes=4 * 1024)  # room for a few slots only: decimates
    for name, t in zip(ROWS, TYPES):
        h.row_id(name, {"type": t, "dtype": "float32"})
    fi = {f: i for i, f in enumerate(HISTORY_FIELDS)}
    for s in range(1, 41):
        v = np.full((4, F), np.nan, np.float32)
        v[:, fi["dead_unit_frac"]] = [0, 0.1 if s < 20 else 0.96, 0.1 if s < 20 else 0.96, 0]
        v[:, fi["update_ratio"]] = [0.5 if s == 19 else 1e-3, np.nan, np.nan, 1e-3]
        h.append(s, np.arange(4), v, {})
    assert h.decimated
    res = result_of(h, TYPES, CHAIN)
    rep = diagnose(res)
    e = next(e for e in rep.events if e.code == "became_dead")
    assert e.step in res.step_index.tolist() and check_numbers(res, rep) >= 1


def test_input_graph_maps_layer_indices_to_history_rows() -> None:
    res = result_of(collapse(), TYPES, CHAIN)
    assert input_graph(res.layers, ["3", "1", "0", "x"]) == [(), (2,), (), ()]  # `2` absent from these rows


# -- the real thing: a digits MLP trained at lr=3.0 collapses ------------------------------------
DIGITS_STEPS = 100


def digits_collapse() -> tuple[object, dict[str, list[float]], dict[str, list[float]], list[float]]:
    """The issue's run under a Capture, and the same run on a copy measured by hand: per step, each
    ReLU's dead-unit fraction (units zero for every sample) and each Linear's ‖Δθ‖/‖θ‖ (θ before)."""
    import copy

    import torch
    import torch.nn.functional as fn
    from sklearn.datasets import load_digits
    from torch import nn

    from nbdebug.capture.session import Capture

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    ref = copy.deepcopy(model)
    batches = torch.randint(0, len(x), (DIGITS_STEPS, 64), generator=torch.Generator().manual_seed(0))
    # reference: the same loop on a copy, measured with its own hooks
    dead: dict[str, list[float]] = {"1": [], "3": []}
    ratio: dict[str, list[float]] = {"0": [], "2": [], "4": []}
    hooks = [ref[i].register_forward_hook(lambda m, a, o, i=i: dead[str(i)].append(float((o == 0).all(0).float().mean())))
             for i in (1, 3)]
    opt = torch.optim.SGD(ref.parameters(), lr=3.0)
    losses = []
    for idx in batches:
        loss = fn.cross_entropy(ref(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        before = {k: [p.detach().clone() for p in ref[int(k)].parameters()] for k in ratio}
        opt.step()
        for k, ps in before.items():
            d = sum(float((p.detach() - q).pow(2).sum()) for p, q in zip(ref[int(k)].parameters(), ps)) ** 0.5
            ratio[k].append(d / sum(float(q.pow(2).sum()) for q in ps) ** 0.5)
        losses.append(float(loss.detach()))
    for h in hooks:
        h.remove()
    ns: dict[str, object] = {}
    opt = torch.optim.SGD(model.parameters(), lr=3.0)
    with Capture(model, loss=lambda: ns.get("loss")) as cap:
        for idx in batches:
            loss = ns["loss"] = fn.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return cap.result, dead, ratio, losses


@pytest.fixture(scope="module")
def digits() -> tuple[object, dict[str, list[float]], dict[str, list[float]], list[float]]:
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return digits_collapse()
    finally:
        torch.set_num_threads(n)


def test_digits_lr3_history_matches_the_reference_loop(digits) -> None:  # type: ignore[no-untyped-def]
    res, dead, ratio, losses = digits
    assert res.steps == DIGITS_STEPS and res.step_index.tolist() == list(range(1, DIGITS_STEPS + 1))
    np.testing.assert_allclose(res.series("loss"), losses, rtol=1e-5)
    for k, v in dead.items():
        np.testing.assert_allclose(res.series(k, "dead_unit_frac"), v, atol=1e-6)
    for k, v in ratio.items():
        np.testing.assert_allclose(res.series(k, "update_ratio"), v, rtol=1e-3)


def test_digits_lr3_says_dead_units_after_a_large_update_not_vanishing(digits) -> None:  # type: ignore[no-untyped-def]
    res, dead, ratio, _ = digits
    rep = diagnose(res)
    assert rep.step == DIGITS_STEPS
    story = [e for e in rep.events if e.code == "became_dead"]
    assert story, [e.message for e in rep.events]
    e = story[0]
    assert e.row in ("1", "3") and e.message.startswith(f"ReLU `{e.row}`: ")
    k = e.step
    assert dead[e.row][k - 1] >= 0.9  # the reference loop's own measurement at that step
    for ev in story:  # each story names the steps before the death whose updates feeding it were too large
        feeding = [str(i) for i in range(0, int(ev.row), 2)]  # the Linears before that ReLU
        high = sorted({s + 1 for r in feeding for s in range(ev.step - 1) if ratio[r][s] > 1e-2})
        assert high, "lr=3.0: the first steps' updates are far too large"
        big = max((ratio[r][s - 1], s, r) for r in feeding for s in high)
        m = re.search(rf", after update ratios above 0.01 at (\d+) steps from step (\d+) to step (\d+), the largest {NUM} "
                      rf"at step (\d+) in `(\d)` \(learning rate too high\)$", ev.message)
        assert m, ev.message
        assert [int(m.group(i)) for i in (1, 2, 3)] == [len(high), high[0], high[-1]], (ev.message, high)
        assert (m.group(4), int(m.group(5)), m.group(6)) == (fmt(big[0]), big[1], big[2]), (ev.message, big)
    assert check_numbers(res, rep) >= 4
    assert "vanishing" not in rep.summary and not any(d.code == "vanishing" for d in rep.diagnoses), rep.summary
    assert "learning rate too high" in rep.summary, rep.summary
    assert any(d.code in ("dead", "dead_units") and d.layer == e.row for d in rep.diagnoses)
    # "whole run" (the merged table; before issue 10 the only one, and it said "vanishing gradients")
    whole = diagnose(res, step="run")
    assert "vanishing" not in whole.summary and not any(d.code == "vanishing" for d in whole.diagnoses), whole.summary
    assert f"from step {k} (learning rate too high)" in whole.summary, whole.summary


def test_digits_lr3_header_is_the_root_cause_as_a_sentence(digits) -> None:  # type: ignore[no-untyped-def]
    """Issue 22: the header is the finding, root cause first, every number the reference loop's."""
    res, dead, ratio, _ = digits
    rep = diagnose(res)
    m = re.fullmatch(rf"learning rate too high: update ratio {NUM} at step 1 in `(\d)` → `1` dead from step (\d+), "
                     rf"`3` from step (\d+), gradients of `0`, `1` and `2` fell to 0 by step (\d+)", rep.headline)
    assert m, rep.headline
    # the ratio cited: the largest at step 1 among the Linears feeding the dead ReLUs (`4` comes after them)
    big = max(("0", "2"), key=lambda r: ratio[r][0])
    assert (m.group(2), m.group(1)) == (big, fmt(ratio[big][0]))
    assert ratio["4"][0] > ratio[big][0]  # the largest overall is not the one that killed them
    for row, s in (("1", int(m.group(3))), ("3", int(m.group(4)))):  # by the loop's own hooks: ≥ 90% dead at
        assert dead[row][s - 1] >= 0.9 and min(dead[row][s - 1:]) >= 0.5, (row, s)  # that step, dead from there on
    fell = int(m.group(5))
    assert all(res.series(r, "param_grad_norm")[fell - 1] == 0 for r in ("0", "2"))
    assert [(f.code, f.cause) for f in rep.findings] == [("lr_high", -1), ("became_dead", 0), ("grad_fell", 1)]
    assert sum("Karpathy" in f.advice for f in rep.findings) == 1
    # the table's line stays what it was: the state at the last step, names as names
    assert rep.summary.startswith(f"step {DIGITS_STEPS}: 5 layers: 2 dead layers (`1`, `3`) from step {m.group(3)}")
