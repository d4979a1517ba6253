"""The distributed run's view (RunWidget) without a browser: a real 2-rank gloo DDP spool (NaN planted
on rank 1 at step 3, a parameter changed on rank 1 only) and spools written in this process by two
``SpoolDebug`` blocks with ``RANK=0/1``: the state, the on-demand rank fetch, the fallback."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from ipywidgets.widgets.widget import _remove_buffers
from snapshot_models import HOSTILE  # tests/widget is on sys.path
from torch import nn

from nbdebug.capture.history import FIELD_INDEX
from nbdebug.distributed import Run, SpoolDebug, load
from nbdebug.inspectors.thermometer import COLUMNS, diagnose
from nbdebug.widgets._transport import decode_array
from nbdebug.widgets.run import FALLBACK_BYTES, SPREAD_FIELDS, RunWidget
from nbdebug.widgets.thermometer import WIRE_FIELDS, ThermometerWidget

try:  # the module tests/unit/test_distributed.py imports: one cache of launches (W.launched), not two
    import _dist_workers as W
except ImportError:  # collected without tests/unit (not on sys.path)
    from tests.unit import _dist_workers as W


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k


def two_ranks(spool: Path, *, steps: int = 4, nan: tuple[int, int] | None = (1, 3), change: str | None = "3.bias",
              name: str = HOSTILE, width: int = 8, extra: int = 0) -> Run:
    """Two ranks written in this process (``RANK=0``, then ``RANK=1``): the same model and seed, each rank
    its own batches; rank 1 gets NaN from module ``1`` at step ``nan[1]`` and, after its last step,
    ``change`` += 1 (a parameter changed outside any sync); ``extra`` more Identity layers with long names."""
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
    try:
        for rank in (0, 1):
            os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), "2"
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, width), Scale(), nn.ReLU(), nn.Linear(width, 2))
            model.add_module(name, nn.Identity())
            for i in range(extra):
                model.add_module(f"{'block_' * 20}{i}", nn.Identity())
            g = torch.Generator().manual_seed(100 + rank)
            with SpoolDebug(model, spool=spool, resume=None):  # resume=None: rank 1 does not continue rank 0
                for step in range(1, steps + 1):
                    if nan is not None and (rank, step) == nan:
                        model[1].k = float("nan")
                    model(torch.randn(6, 4, generator=g)).pow(2).mean().backward()
                if change and rank == 1:
                    with torch.no_grad():
                        dict(model.named_parameters())[change].add_(1.0)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return load(spool)


def fetch(w: RunWidget, rank: int) -> tuple[dict, dict[str, np.ndarray]]:
    """What the browser gets for ``rank``: the traits with the arrays put back in place."""
    body, buffers = w.handle_request("rank", {"rank": rank})
    arrays = {k: np.frombuffer(bytes(buffers[m["buffer"]]), dtype=m["dtype"]).reshape(m["shape"])
              for k, m in body["arrays"].items()}
    return body["result"], arrays


#: the launches tests/unit/test_distributed.py reads too: one worker, one launch of each (W.launched)
shared_launch = pytest.mark.xdist_group("ddp-launches")


@pytest.fixture
def ddp_nan(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run, _ = W.launched("nan", tmp_path_factory)  # retried once if the fork launch hangs
    assert run.error is None, run.error
    return run


# ------------------------------------------------------------------ a real 2-rank gloo DDP run
@shared_launch
def test_ddp_nan_run_view_state(ddp_nan: Run) -> None:
    run = ddp_nan
    w = run.widget()
    assert isinstance(w, RunWidget) and w.rank == w.focus == 1 == run.first_nonfinite_rank
    assert [(r["rank"], r["steps"], r["nonfinite"], r["error"], r["hooks_left"]) for r in w.ranks] == [
        (0, W.STEPS, True, "", 0), (1, W.STEPS, True, "", 0)]
    assert [(f["rank"], f["step"], f["phase"], f["module"]) for f in w.nonfinite] == [(1, 3, "forward", "1"), (0, 3, "param_grad", "0")]
    # the focus rank is sent up front, binary: its table (the whole run's merged rows) equals the rank's own
    assert w.rank_state["rank"] == 1
    stats = decode_array(w.rank_state["traits"]["stats"])
    ref = diagnose(run.ranks[1], step="run")
    np.testing.assert_array_equal(stats, ref.table.astype(np.float32).reshape(len(ref.names), len(COLUMNS)))
    _, paths, _ = _remove_buffers(w.get_state())
    assert ["rank_state", "traits", "stats", "view"] in paths and ["rank_state", "traits", "history", "last", "view"] in paths
    # the spread of each row across ranks at the last step, from the ranks' own histories
    for field in SPREAD_FIELDS:
        for row in run.ranks[0].history.rows:
            vals = [res.history.at(W.STEPS)[row][field] for res in run.ranks]
            vals = [np.float32(v) for v in vals if v == v]
            got = w.spread_range(row, field)
            assert got == (min(vals), max(vals)) if vals else all(np.isnan(got)), (row, field)
    _, paths, _ = _remove_buffers(w.get_state())
    assert ["spread", "lo", "view"] in paths and ["spread", "hi", "view"] in paths


@shared_launch
def test_ddp_choosing_rank0_fetches_its_table_and_history(ddp_nan: Run) -> None:
    run = ddp_nan
    w = run.widget()
    result, arrays = fetch(w, 0)
    assert result["rank"] == 0 and result["traits"]["stats"] == {"__array__": "stats"}
    assert [r["name"] for r in result["traits"]["layers"]] == ["0", "1", "2", "3"]
    ref = diagnose(run.ranks[0], step="run")
    np.testing.assert_array_equal(arrays["stats"], ref.table.astype(np.float32).reshape(len(ref.names), len(COLUMNS)))
    # the per-step history: rank 0's forward `1` is finite until its weights turn NaN after step 3
    h = run.ranks[0].history
    assert arrays["history.steps"].tolist() == [1, 2, 3, 4, 5]
    nan = arrays["history.last"][:, h.rows.index("1"), WIRE_FIELDS.index("nan")]
    assert nan.tolist() == run.ranks[0].series("1", "nan").tolist() == [0, 0, 0, 48, 48]
    np.testing.assert_array_equal(arrays["history.last"][:, :, WIRE_FIELDS.index("mean")],
                                  h.values("last")[:, :, FIELD_INDEX["mean"]])
    # and the same traits a ThermometerWidget of rank 0 has
    tw = run.widget(0)
    assert isinstance(tw, ThermometerWidget) and [x["name"] for x in tw.layers] == [x["name"] for x in result["traits"]["layers"]]
    tw.close()
    w.close()


@shared_launch
def test_ddp_diverged_parameter_listed_with_its_step(tmp_path_factory: pytest.TempPathFactory) -> None:
    run, _ = W.launched("diverge", tmp_path_factory)
    w = RunWidget(run)
    assert w.diverged == [{"name": "0.weight", "step": W.DIVERGE_AFTER}] and w.buffers_differ == []
    assert w.compared_step == W.STEPS and w.nonfinite == [] and w.rank == 0
    assert "<code>0.weight</code> from step 2" in w.fallback_html()


# ------------------------------------------------------------------ spools written in this process
def test_in_process_two_ranks(tmp_path: Path) -> None:
    run = two_ranks(tmp_path)
    assert [r.steps for r in run.ranks] == [4, 4] and run.hooks_left == {0: 0, 1: 0}
    w = RunWidget(run)
    assert w.rank == 1 and w.nonfinite[0]["rank"] == 1 and w.nonfinite[0]["step"] == 3 and w.nonfinite[0]["module"] == "1"
    assert w.diverged == [{"name": "3.bias", "step": 4}]
    assert w.report.names == diagnose(run.ranks[1]).names and HOSTILE in w.report.names
    # rank 0's table differs from rank 1's (each rank its own batches)
    _, a0 = fetch(w, 0)
    _, a1 = fetch(w, 1)
    m = COLUMNS.index("mean")
    assert a0["stats"][0, m] == np.float32(run.ranks[0].layers[0].stats["mean"]) != a1["stats"][0, m]
    assert w.spread_range("0", "mean") == tuple(sorted(float(np.float32(r.history.at(4)["0"]["mean"])) for r in run.ranks))
    assert w.spread_range("1", "nan") == (0.0, 48.0)  # rank 1's NaN from step 3; "mean" skips it
    assert w.spread_range("1", "mean") == (np.float32(run.ranks[0].history.at(4)["1"]["mean"]),) * 2
    w.rank = 0
    assert w.report.names == diagnose(run.ranks[0]).names


def test_histograms_and_unknown_ranks_answer_errors(tmp_path: Path) -> None:
    w = RunWidget(two_ranks(tmp_path, nan=None, change=None))
    with pytest.raises(ValueError, match="histograms are not kept across processes"):
        w.handle_request("rank_request", {"rank": 0, "method": "histogram", "params": {"row": 0}})
    with pytest.raises(LookupError, match="rank 5 recorded nothing"):
        w.handle_request("rank", {"rank": 5})
    # through the widget's message handler, the error goes back as data
    sent: list = []
    w.send = lambda content, buffers=None: sent.append(content)  # type: ignore[method-assign]
    w._handle_request(w, {"type": "request", "id": "a", "method": "rank", "params": {"rank": 7}}, [])
    assert sent[0]["ok"] is False and "rank 7 recorded nothing" in sent[0]["error"]
    assert w.diverged == [] and w.compared_step == 4 and w.nonfinite == [] and w.rank == 0


def test_fallback_is_escaped_and_bounded(tmp_path: Path) -> None:
    run = two_ranks(tmp_path)
    w = RunWidget(run)
    page = w.fallback_html()
    assert HOSTILE not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "first NaN/Inf: rank 1, step 3, <code>1</code> (forward)" in page and "<code>3.bias</code> from step 4" in page
    assert "<script" not in page and len(page.encode()) <= FALLBACK_BYTES
    bundle, _ = w._repr_mimebundle_()
    assert bundle["text/html"] == page and bundle["text/plain"].startswith("RunWidget(2 ranks; rank 1: ThermometerWidget(")


def test_fallback_of_a_wide_model_stays_under_200kb(tmp_path: Path) -> None:
    run = two_ranks(tmp_path, nan=None, change=None, steps=1, extra=1500)  # 1,505 rows with 124-character names
    w = RunWidget(run)
    assert len(w.report.names) == 1505
    page = w.fallback_html()
    assert 190_000 < len(page.encode()) <= FALLBACK_BYTES
    assert "block_" * 20 + "0" in page and "more rows left out" in page


def test_show_displays_the_run_view_and_widget_rank_gives_a_thermometer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = two_ranks(tmp_path)
    shown: list = []
    monkeypatch.setattr("IPython.display.display", lambda *objs, **kw: shown.extend(objs))
    run.show()
    assert len(shown) == 1 and isinstance(shown[0], RunWidget) and shown[0].rank == 1
    assert isinstance(run.widget(0), ThermometerWidget)
    with pytest.raises(LookupError, match="rank 4 recorded nothing"):
        run.widget(4)
    empty = Run([])
    shown.clear()
    empty.show()
    assert len(shown) == 1 and "no worker entered nbdebug.debug" in repr(shown[0]._repr_html_() if hasattr(shown[0], "_repr_html_") else shown[0])
    with pytest.raises(LookupError):
        empty.widget()


def test_save_html_carries_every_rank(tmp_path: Path) -> None:
    w = RunWidget(two_ranks(tmp_path / "spool"))
    assert w.export_requests() == [("rank", {"rank": 0}), ("rank", {"rank": 1})]
    page = w.export_html()
    assert "nbdebug run" in page and HOSTILE not in page.replace("\\u003c", "<").split("<script")[0]


def test_spread_at_every_kept_step_and_over_the_whole_run(tmp_path: Path) -> None:
    """What the spread column shows when the rank's step slider moves: at each kept step k, min/max
    over the ranks of ``series(row, field)`` at k (rank 1's NaN skipped); at "whole run", over the
    ranks' whole-run tables (``diagnose(res, step="run")``, what the rank thermometer shows there)."""
    run = two_ranks(tmp_path)
    w = RunWidget(run)
    sp = w.spread
    steps = decode_array(sp["steps"]).tolist()
    assert steps == [1, 2, 3, 4]
    assert steps == decode_array(w.rank_state["traits"]["history"]["steps"]).tolist()  # the slider's steps
    lo, hi = decode_array(sp["step_lo"]), decode_array(sp["step_hi"])
    wlo, whi = decode_array(sp["whole_lo"]), decode_array(sp["whole_hi"])
    assert lo.shape == hi.shape == (4, len(sp["rows"]), len(SPREAD_FIELDS)) and wlo.shape == (len(sp["rows"]), len(SPREAD_FIELDS))
    whole = [diagnose(res, step="run") for res in run.ranks]
    checked = 0
    for i, row in enumerate(sp["rows"]):
        for j, field in enumerate(SPREAD_FIELDS):
            for k, step in enumerate(steps):
                vals = [np.float32(res.series(row, field)[res.step_index.tolist().index(step)]) for res in run.ranks]
                vals = [v for v in vals if v == v]
                got = (lo[k, i, j], hi[k, i, j])
                assert got == (min(vals), max(vals)) if vals else np.isnan(got).all(), (row, field, step)
                checked += bool(vals)
            ref = [np.float32(rep.column(field)[rep.names.index(row)]) for rep in whole]
            ref = [v for v in ref if v == v]
            assert (wlo[i, j], whi[i, j]) == (min(ref), max(ref)) if ref else np.isnan([wlo[i, j], whi[i, j]]).all()
    assert checked > 80
    # rank 1's `1` is NaN from step 3: the mean's spread there is rank 0's alone, its NaN count is 0 … 48
    r, m, n = sp["rows"].index("1"), SPREAD_FIELDS.index("mean"), SPREAD_FIELDS.index("nan")
    assert lo[3, r, m] == hi[3, r, m] and (lo[3, r, n], hi[3, r, n]) == (0, 48) and (lo[0, r, n], hi[0, r, n]) == (0, 0)
    assert lo[0, 0, m] < hi[0, 0, m]  # the ranks differ (each its own batches)


def test_spread_over_time_stays_within_its_budget(tmp_path: Path) -> None:
    from nbdebug.widgets.run import spread_over_time

    run = two_ranks(tmp_path, nan=None, change=None, steps=9)
    rows = list(run.ranks[0].history.rows)
    per_step = len(rows) * len(SPREAD_FIELDS) * 8
    out = spread_over_time(run, rows, max_bytes=3 * per_step)
    assert out["steps"].tolist() == [1, 5, 9]  # evenly spaced, the last kept
    assert out["step_lo"].nbytes + out["step_hi"].nbytes <= 3 * per_step
    k = run.ranks[1].step_index.tolist().index(5)
    assert out["step_hi"][1, 0, 0] == max(np.float32(res.series(rows[0], "mean")[k]) for res in run.ranks)
    assert spread_over_time(run, rows, max_bytes=0)["steps"].tolist() == [9]


def test_rank_tables_say_histograms_are_not_kept_so_a_click_asks_nothing(tmp_path: Path) -> None:
    """A rank's thermometer traits carry ``histogram_note`` (its rows then send no histogram request:
    js/tests/thermometer_step.test.ts), the per-step texts of the rank's report and its whole run."""
    run = two_ranks(tmp_path, nan=None, change=None)
    w = RunWidget(run)
    assert all(r.sample is None and r.histogram is None for res in run.ranks for r in res.layers)
    for traits in (w.rank_state["traits"], w.rank_traits(1)):
        assert traits["histogram_note"].startswith("no histogram: values are not kept across processes")
    rep = w.report_of(1)
    t = w.rank_traits(1)
    assert t["report_step"] == rep.step == 4 and t["summary"] == rep.summary
    assert t["run_texts"]["summary"] == diagnose(run.ranks[1], step="run").summary
    # a thermometer of this process keeps values: no note, histograms answered
    torch.manual_seed(0)
    from nbdebug.capture.session import Capture

    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
    with Capture(m) as cap:
        m(torch.randn(6, 4)).sum().backward()
    assert ThermometerWidget.from_capture(cap.result).histogram_note == ""
