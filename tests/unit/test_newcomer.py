"""What a newcomer meets first, from README and docs/training.md: printing a record, a wrong argument to
``run.series``. Each test here failed on the mistake it names (issue 30)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nbdebug.capture.session import Capture


@pytest.fixture(scope="module")
def run():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 64), torch.randn(64, 2)
    with Capture(model) as cap:
        for _ in range(3):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
    return cap.result


def test_a_records_repr_is_one_short_line_without_its_sample(run) -> None:  # type: ignore[no-untyped-def]
    rec = run["0"]
    assert rec.sample is not None and rec.sample.size == 4096  # 64 × 128 values: the sample is full
    text = repr(rec)
    # planted mistake: the dataclass's generated repr (every field, the 4,096-value sample) — ~30,000 chars
    assert "\n" not in text and len(text) < 200, text
    assert text.startswith("LayerRecord('0', Linear, shape=(64, 128), float32, calls=3, mean=")
    assert f"mean={rec.stats['mean']:.4g}," in text and f"grad norm={rec.grad['norm']:.4g})" in text
    assert "array" not in text and "sample" not in text
    assert len(repr(run)) < 200 * (len(run.layers) + 10)  # the whole result prints in a screenful or so


def test_series_given_a_record_says_to_pass_its_name(run) -> None:  # type: ignore[no-untyped-def]
    rec = run["0"]
    with pytest.raises(KeyError) as err:
        run.series(rec)
    msg = str(err.value)
    # planted mistake: "no row LayerRecord(name='0', ..., sample=array([...4,096 values...]))"
    assert msg == "\"a row is named by a string, got a LayerRecord; for this record pass its name, '0'\""
    assert list(run.series(rec.name, "mean")) == list(run.series("0", "mean"))
    with pytest.raises(KeyError, match=r"no row 'fc'; valid names: 'loss', 'lr', 'skipped', 'class_share', 'class_top' or a row: '0', '1', '2'"):
        run.series("fc")
