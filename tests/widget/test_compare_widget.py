"""nbdebug.compare (issue 22): the synced state is small and binary (steps int32, each run's loss and the
chosen series float32 [runs, steps] on the union of the kept steps), the first divergence follows its
documented definition exactly on hand-built runs, choosing a row/field in the browser recomputes the
series in the kernel, and the static fallback is escaped; then two real runs (lr=3.0 and lr=0.1 from the
same weights and batches) diverge at step 2."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import traitlets
from ipywidgets.widgets.widget import _remove_buffers
from snapshot_models import HOSTILE  # tests/widget is on sys.path
from torch import nn

import nbdebug
from nbdebug.capture.history import History
from nbdebug.capture.session import Capture
from nbdebug.inspectors.compare import first_divergence
from nbdebug.widgets._transport import decode_array
from nbdebug.widgets.compare import CompareWidget, compare
from tests.unit.test_history_flags import result_of


def run(steps: list[int], loss: list[float], mean: list[float]) -> object:
    k = len(steps)
    h = History.from_arrays(steps, ["a", "b"], {"mean": np.array([mean, [0.0] * k]).T}, {"loss": loss},
                            row_info=[{"type": "Linear", "dtype": "float32"}] * 2)
    return result_of(h, ["Linear", "Linear"], [(), (0,)])


A = run([1, 2, 3, 4, 5], [2.0, 1.9, 1.8, 1.7, 1.6], [0.1, 0.2, 0.3, 0.4, 0.5])
B = run([1, 2, 3, 5], [2.0, 1.9005, 2.5, math.nan], [0.1, 0.2, 0.3, 0.5])  # kept no step 4; NaN at 5


def test_state_is_small_binary_and_aligned_by_step() -> None:
    w = compare(A, B, labels=["lr=0.1", HOSTILE])
    try:
        state, paths, buffers = _remove_buffers(w.get_state())
        assert ["steps", "view"] in paths and ["loss", "view"] in paths
        assert decode_array(w.steps).tolist() == [1, 2, 3, 4, 5]
        loss = decode_array(w.loss)
        assert loss.dtype == np.float32 and loss.shape == (2, 5)
        np.testing.assert_allclose(loss[0], [2.0, 1.9, 1.8, 1.7, 1.6], rtol=1e-6)
        assert np.isnan(loss[1, 3]) and np.isnan(loss[1, 4]) and loss[1, 2] == pytest.approx(2.5)
        assert sum(len(bytes(b)) for b in buffers) == 5 * 4 + 2 * 5 * 4  # nothing but the two arrays
        assert len(json.dumps({k: v for k, v in state.items() if k not in ("_esm", "_css")}, default=str)) < 4000
        assert w.rows == ["a", "b"] and w.row == "" and w.series == {}
        assert any("kept different steps" in n for n in w.notes)
        assert repr(w) == f"CompareWidget(2 runs: lr=0.1, {HOSTILE})"
    finally:
        w.close()


def test_first_divergence_follows_its_definition() -> None:
    w = compare(A, B)
    try:
        # common steps 1, 2, 3, 5; scale = the larger median |loss| (1.85 for A there, 2.0 for B's finite
        # ones); step 2 differs by 5e-4 < 10% of it; step 3 by 0.7 and step 5 is NaN in one only: apart
        # two common steps in a row from step 3, the first divergence
        (d,) = w.divergence["loss"]
        assert (d["run"], d["step"], d["a"], d["b"]) == (1, 3, pytest.approx(1.8), pytest.approx(2.5))
        assert d["scale"] == pytest.approx(2.0) and d["rtol"] == 0.1
        assert w.headline == w.summary == ("`run 1` ends at 1.60 (the only run with a finite loss to the end); `run 2` "
                                           "breaks at step 5 (NaN/Inf loss; last finite 2.50 at step 3)")
        assert w.divergence["loss_text"].startswith("first divergence in loss: `run 2` leaves `run 1` at step 3: 2.50 vs 1.80")
        assert w.colours == ["#1f77b4", "#d62728"]
    finally:
        w.close()
    tight = first_divergence(A.step_index, A.series("loss"), B.step_index, B.series("loss"), rtol=1e-4)
    assert tight is not None and tight.step == 2
    # a one-step blip is not a divergence: apart at step 2 only, then together again
    blip = first_divergence(np.arange(1, 5), np.array([2.0, 1.9, 1.8, 1.7]), np.arange(1, 5), np.array([2.0, 2.4, 1.8, 1.7]))
    assert blip is None
    assert first_divergence(np.arange(1, 5), np.array([2.0, 1.9, 1.8, 1.7]), np.arange(1, 5),
                            np.array([2.0, 2.4, 1.8, 1.7]), hold=1).step == 2
    nan_only = first_divergence(np.array([1, 2]), np.array([1.0, 1.0]), np.array([1, 2]), np.array([1.0, math.nan]))
    assert nan_only is not None and nan_only.step == 2 and math.isnan(nan_only.b)  # one broke, the other did not
    assert first_divergence(np.array([1, 2]), np.array([1.0, math.nan]), np.array([1, 2]), np.array([1.0, math.nan])) is None
    assert first_divergence(np.array([1]), np.array([1.0]), np.array([2]), np.array([5.0])) is None  # no common step


def test_choosing_a_row_recomputes_its_series_and_divergence() -> None:
    w = compare(A, B, labels=["x", "y"])
    try:
        w.set_state({"row": "a", "field": "mean"})  # what the browser's selects send
        vals = decode_array(w.series)
        assert vals.shape == (2, 5)
        np.testing.assert_allclose(vals[0], [0.1, 0.2, 0.3, 0.4, 0.5], rtol=1e-6)
        assert np.isnan(vals[1, 3])
        assert w.divergence["series"] == [None]  # the same means at every common step
        w.set_state({"row": ""})
        assert w.series == {} and w.divergence["series"] == []
        with pytest.raises(traitlets.TraitError, match="no row 'zz'"):
            w.row = "zz"
        with pytest.raises(traitlets.TraitError, match="no field"):
            w.field = "nope"
    finally:
        w.close()


def test_fallback_is_static_and_escaped_and_arguments_are_checked() -> None:
    w = compare(A, B, labels=[HOSTILE, "b"])
    try:
        page = w.fallback_html()
        assert HOSTILE not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
        assert "<script" not in page and page.count("<polyline") == 2
    finally:
        w.close()
    with pytest.raises(ValueError, match="two or more"):
        compare(A)
    with pytest.raises(ValueError, match="1 labels for 2 runs"):
        compare(A, B, labels=["one"])
    with pytest.raises(TypeError, match="cannot compare a str"):
        compare(A, "B")
    assert nbdebug.compare is compare


def _train(lr: float) -> object:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 32, 8, generator=g), torch.randint(0, 3, (10, 32), generator=g)
    with Capture(m) as cap:  # no loss given: the one .backward() ran on
        for i in range(10):
            loss = nn.functional.cross_entropy(m(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return cap.result


def test_two_learning_rates_the_spiking_one_leaves_the_healthy_one_at_step_2() -> None:
    fast, slow = _train(3.0), _train(0.1)
    w = CompareWidget([fast, slow], ["lr=3.0", "lr=0.1"], row="2", field="mean")
    try:
        assert fast.series("loss")[0] == slow.series("loss")[0]  # step 1: no update yet
        assert w.divergence["loss"][0]["step"] == 2 and w.divergence["series"][0]["step"] >= 2
        peak = float(fast.series("loss")[1:].max())
        assert peak > 1.5 * fast.series("loss")[0] and slow.series("loss").max() < 1.5 * slow.series("loss")[0]
        assert w.headline.startswith(f"`lr=3.0` spikes to {peak:#.3g} near step ")
        assert f"`lr=0.1` ends at {float(slow.series('loss')[-1]):#.3g}" in w.headline
        assert w.divergence["loss_text"].startswith("first divergence in loss: `lr=3.0` leaves `lr=0.1` at step 2: ")
        assert w.colours == ["#d62728", "#1f77b4"]  # red for the run that went wrong only
        np.testing.assert_allclose(decode_array(w.series)[1], slow.series("2", "mean"), rtol=1e-6)
    finally:
        w.close()


def test_a_healthy_run_beside_a_diverging_one_is_said_of_the_diverging_one() -> None:
    """Planted: lr=0.1 (the reference, healthy: a 3% wobble at step 2) and lr=3.0 (spikes to 14.5 at
    step 6, ends at 2.43). The naive sentence ("`lr=3.0` diverges … at step 2", of the wobble; the
    healthy run red; a linear axis) is wrong on each count."""
    steps = list(range(1, 11))
    slow_loss = [2.30, 2.37, 2.0, 1.7, 1.5, 1.3, 1.15, 1.0, 0.92, 0.856]  # +3% at step 2: wobble
    fast_loss = [2.30, 2.24, 2.2, 4.0, 9.0, 14.5, 7.0, 3.5, 2.6, 2.43]
    slow = run(steps, slow_loss, [0.1] * 10)
    fast = History.from_arrays(steps, ["a", "b"], {"mean": np.array([[0.1] * 10, [0.2 + k for k in range(10)]]).T},
                               {"loss": fast_loss}, row_info=[{"type": "Linear", "dtype": "float32"}] * 2)
    fast = result_of(fast, ["Linear", "Linear"], [(), (0,)])
    w = compare(slow, fast, labels=["lr=0.1", "lr=3.0"])
    try:
        assert w.headline == "`lr=0.1` ends at 0.856, 2.8× lower; `lr=3.0` spikes to 14.5 near step 6 and ends at 2.43"
        (d,) = w.divergence["loss"]
        assert d["step"] == 4  # not step 2's wobble (0.13 apart, under 10% of the scale 2.5; step 3: 0.2)
        assert w.divergence["loss_text"].startswith("first divergence in loss: `lr=3.0` leaves `lr=0.1` at step 4: 4.00 vs 1.70")
        assert w.colours[0] != "#d62728" and w.colours[1] == "#d62728"
        assert w.loss_log  # 0.856 … 14.5: more than 10×
        assert w.row == "b"  # preselected: row a is the same in both runs, row b differs
        assert [o["wrong"] for o in w.outcomes] == [False, True]
        page = w.fallback_html()
        # one grammar with the live view: run names as code spans, never a literal backtick
        assert page.index("<code>lr=0.1</code> ends at 0.856") < page.index("<svg") and "log scale" in page
        assert "`" not in page and "<code>lr=3.0</code> leaves <code>lr=0.1</code> at step 4" in page
    finally:
        w.close()
    # the healthy twin: two healthy runs, neither red nor "leaving", a linear axis, ends said as close
    twin = compare(slow, run(steps, [v * 1.02 for v in slow_loss], [0.1] * 10), labels=["seed 0", "seed 1"])
    try:
        assert twin.headline == "`seed 0` ends at 0.856; `seed 1` ends at 0.873; both end within 10% of each other"
        assert twin.divergence["loss"] == [None] and "#d62728" not in twin.colours and not twin.loss_log
        assert "leaves" not in twin.divergence["loss_text"] and twin.row == ""
    finally:
        twin.close()
