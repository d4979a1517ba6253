"""result.to_pandas() / result.to_tensorboard(): exact values round-trip from a hand-built history."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from nbdebug.capture.history import HISTORY_FIELDS, SCALARS, History
from nbdebug.capture.result import CaptureResult, LayerRecord
from nbdebug.exports import to_pandas, to_tensorboard

F = len(HISTORY_FIELDS)


def _result(history: History | None, layers: list[LayerRecord] | None = None) -> CaptureResult:
    return CaptureResult(
        layers=layers or [], forward_passes=3, backward_ran=True, calls_recorded=6, truncated=False, sample_size=8,
        near_zero_eps=1e-6, bytes_kept=0, budget_exceeded=False, forward_nonfinite_call=None,
        backward_nonfinite_row=None, elapsed_s=0.0, steps=3, history=history,
    )


def _hand_built() -> CaptureResult:
    """Rows a (steps 1, 2, 4) and b (from step 2); field f of row r at step s = s + r/10 + f/100."""
    steps = [1, 2, 4]
    vals = np.array([[[s + r / 10 + f / 100 for f in range(F)] for r in range(2)] for s in steps], np.float32)
    vals[0, 1] = np.nan  # row b appears at step 2
    h = History.from_arrays(steps, ["a", "b"], vals, {"loss": [2.5, 2.0, 1.25], "lr": [0.1, 0.1, 0.05]},
                            [{"module": "net.a", "type": "Linear"}, {"module": "net.b", "type": "ReLU"}])
    sample = np.array([-1.0, 0.0, 0.5, 2.0, np.nan], np.float32)
    layers = [LayerRecord("a", "net.a", "Linear", (2, 3), "float32", 3, {}, None, None, sample=sample),
              LayerRecord("b", "net.b", "ReLU", (2, 3), "float32", 2, {}, None, None, first_step=2)]
    return _result(h, layers)


def test_to_pandas_one_row_per_kept_step_and_layer_exact() -> None:
    pytest.importorskip("pandas")
    res = _hand_built()
    df = res.to_pandas()
    assert list(df.columns) == ["step", "layer", "module", "type", *HISTORY_FIELDS, *SCALARS]
    assert len(df) == 3 * 2
    assert df["step"].tolist() == [1, 1, 2, 2, 4, 4] and df["layer"].tolist() == ["a", "b"] * 3
    assert df["module"].tolist() == ["net.a", "net.b"] * 3 and df["type"].tolist()[:2] == ["Linear", "ReLU"]
    h = res.history
    assert h is not None
    for f in HISTORY_FIELDS:
        np.testing.assert_array_equal(df[f].to_numpy(), h.values()[:, :, HISTORY_FIELDS.index(f)].reshape(-1).astype(np.float64))
    row = df[(df.step == 4) & (df.layer == "b")].iloc[0]
    assert row["grad_norm"] == np.float32(4 + 0.1 + HISTORY_FIELDS.index("grad_norm") / 100)
    assert row["loss"] == 1.25 and row["lr"] == np.float32(0.05) and math.isnan(row["skipped"])
    assert math.isnan(df[(df.step == 1) & (df.layer == "b")].iloc[0]["mean"])
    assert df["loss"].tolist() == [2.5, 2.5, 2.0, 2.0, 1.25, 1.25]
    np.testing.assert_array_equal(to_pandas(res, agg="max")["mean"].to_numpy(), df["mean"].to_numpy())


def test_to_pandas_missing_pandas_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"pip install nbdebug\[pandas\]"):
        _hand_built().to_pandas()


def test_exports_need_a_history() -> None:
    with pytest.raises(ValueError, match="no per-step history"):
        to_pandas(_result(None))


def test_to_tensorboard_scalars_and_histograms_read_back(tmp_path) -> None:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        pytest.skip("tensorboard is not installed")
    res = _hand_built()
    assert res.to_tensorboard(tmp_path / "run") == str(tmp_path / "run")
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"loss", "lr", "a/mean", "b/grad_norm", "a/update_ratio"} <= set(tags)
    assert "skipped" not in tags  # all NaN: nothing written
    a_mean = acc.Scalars("a/mean")
    assert [e.step for e in a_mean] == [1, 2, 4]
    assert [e.value for e in a_mean] == [float(np.float32(s + 0.0)) for s in (1, 2, 4)]
    b_norm = acc.Scalars("b/norm")  # NaN at step 1 is left out
    assert [e.step for e in b_norm] == [2, 4]
    assert [e.value for e in b_norm] == [float(np.float32(s + 0.1 + HISTORY_FIELDS.index("norm") / 100)) for s in (2, 4)]
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 2.5), (2, 2.0), (4, 1.25)]
    hist = acc.Histograms("a/values")
    assert len(hist) == 1 and hist[0].step == 1
    assert hist[0].histogram_value.num == 4 and hist[0].histogram_value.min == -1.0 and hist[0].histogram_value.max == 2.0
    assert hist[0].histogram_value.sum == 1.5
    assert "b/values" not in acc.Tags()["histograms"]  # no sample kept


def test_to_tensorboard_fields_subset_and_bad_field(tmp_path) -> None:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        pytest.skip("tensorboard is not installed")
    res = _hand_built()
    to_tensorboard(res, tmp_path / "sub", fields=["grad_norm"], histograms=False)
    acc = EventAccumulator(str(tmp_path / "sub"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["a/grad_norm", "b/grad_norm", "loss", "lr"]
    assert acc.Tags()["histograms"] == []
    with pytest.raises(KeyError, match="valid fields"):
        to_tensorboard(res, tmp_path / "bad", fields=["gradnorm"])


def test_to_tensorboard_missing_names_the_extra(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match=r"pip install nbdebug\[tensorboard\]"):
        _hand_built().to_tensorboard(tmp_path)


def test_scalar_block_encoding_matches_protobuf() -> None:
    try:
        from tensorboard.compat.proto.summary_pb2 import Summary
    except ImportError:
        pytest.skip("tensorboard is not installed")
    from nbdebug.capture.history_export import ScalarBlock as _ScalarBlock

    tags = ["a/mean", "blöck.0/grad_norm", "x" * 200 + "/max"]  # non-ASCII; a tag length needing a 2-byte varint
    values = np.array([1.5, np.nan, -3.25e-7], np.float32)
    expected = Summary(value=[Summary.Value(tag=t, simple_value=float(v)) for t, v in zip(tags, values) if not np.isnan(v)])
    assert _ScalarBlock(tags).encode(values) == expected.SerializeToString()
    full = np.array([0.0, 2.0, np.inf], np.float32)
    parsed = Summary.FromString(_ScalarBlock(tags).encode(full))
    assert [(v.tag, v.simple_value) for v in parsed.value] == list(zip(tags, [0.0, 2.0, float("inf")]))
