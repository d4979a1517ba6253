"""The live thermometer: history pushed as custom messages while a loop runs (only new slots, at most
4 a second, one final), final state in the traits (whole history, ≤ 4 MB at 10k steps × 300 rows),
and the magic/API wiring (shown once, when the cell starts; KeyboardInterrupt keeps the steps)."""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np
import pytest
from ipywidgets.widgets.widget import _remove_buffers

from nbdebug.capture.history import FIELD_INDEX, HISTORY_FIELDS, History
from nbdebug.capture.result import CaptureResult, LayerRecord
from nbdebug.inspectors.history import FLAG_BITS
from nbdebug.widgets import thermometer as tw
from nbdebug.widgets._transport import decode_array
from nbdebug.widgets.thermometer import WIRE_FIELDS, ThermometerWidget

F = len(HISTORY_FIELDS)
WIRE = [FIELD_INDEX[f] for f in WIRE_FIELDS]


def rows_history(r: int, max_bytes: int = 2**40) -> tuple[History, np.ndarray]:
    h = History(max_bytes)
    ids = np.array([h.row_id(f"l{i}", {"module": f"l{i}", "type": "Linear", "shape": (4, 8), "dtype": "float32"})
                    for i in range(r)])
    return h, ids


def step_values(step: int, r: int) -> np.ndarray:
    """Distinct values per (step, row, field), healthy: no NaN/Inf, few zeros, update ratio 1e-3."""
    v = (step + np.arange(r)[:, None] * 0.1 + np.arange(F)[None, :] * 0.001).astype(np.float32)
    for f in ("nan", "inf", "grad_nan", "grad_inf", "dead_unit_frac", "saturated_frac"):
        v[:, FIELD_INDEX[f]] = 0
    v[:, FIELD_INDEX["zero_frac"]] = 0.1
    v[:, FIELD_INDEX["update_ratio"]] = 1e-3
    return v


def sent_arrays(content: dict[str, Any], buffers: list[Any]) -> dict[str, np.ndarray]:
    return {name: decode_array({"view": buffers[m["buffer"]], "dtype": m["dtype"], "shape": m["shape"]})
            for name, m in content["arrays"].items()}


@pytest.fixture
def outbox(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, dict[str, Any], list[Any]]]:
    """Every custom message a thermometer widget sends (a fake comm): (time, content, buffers)."""
    box: list[tuple[float, dict[str, Any], list[Any]]] = []

    def send(self: Any, content: Any, buffers: Any = None) -> None:
        box.append((time.monotonic(), content, list(buffers or [])))

    monkeypatch.setattr(ThermometerWidget, "send", send)
    return box


def test_push_sends_only_new_slots_with_exact_values(outbox) -> None:  # type: ignore[no-untyped-def]
    h, ids = rows_history(3)
    w = ThermometerWidget.waiting()
    assert w.running and w.history == {}
    seen: list[int] = []
    for step in range(1, 8):
        h.append(step, ids, step_values(step, 3), {"loss": 1.0 / step, "lr": 0.1, "skipped": float(step == 5)})
        if step in (2, 3, 7):
            assert w.push_history(h)
            content, buffers = outbox[-1][1:]
            a = sent_arrays(content, buffers)
            assert content["type"] == "history" and content["from"] == len(seen)
            seen += a["steps"].tolist()
            np.testing.assert_array_equal(a["last"], h.values("last", content["from"])[:, :, WIRE])
            np.testing.assert_allclose(a["loss"], [1.0 / s for s in a["steps"]], rtol=1e-6)
            assert a["flags"].dtype == np.uint16 and a["flags"].shape == (len(a["steps"]), 3)
            assert "lo" not in a  # nothing merged: no band
    assert seen == list(range(1, 8))  # every step exactly once, in order
    assert [c["reset"] for _, c, _ in outbox] == [True, False, False]
    assert "rows" in outbox[0][1] and "rows" not in outbox[1][1]
    assert outbox[-1][1]["total_steps"] == 7
    np.testing.assert_array_equal(sent_arrays(*outbox[-1][1:])["skipped"], [0, 1, 0, 0])  # steps 4..7
    assert not w.push_history(h)  # nothing new: nothing sent
    # late gradients for step 7 change its slot: only that slot is sent again
    late = np.full((1, F), np.nan, np.float32)
    late[0, FIELD_INDEX["grad_norm"]] = 0.5
    h.update(7, ids[:1], late)
    assert w.push_history(h)
    content, buffers = outbox[-1][1:]
    a = sent_arrays(content, buffers)
    assert content["from"] == 6 and a["steps"].tolist() == [7]
    assert a["last"][0, 0, WIRE_FIELDS.index("grad_norm")] == 0.5
    w.close()


def test_nonfinite_step_and_flags_follow_the_values(outbox) -> None:  # type: ignore[no-untyped-def]
    h, ids = rows_history(2)
    w = ThermometerWidget.waiting()
    for step in range(1, 5):
        v = step_values(step, 2)
        if step == 3:
            v[1, FIELD_INDEX["nan"]] = 4  # row 1's output has NaN at step 3
        if step >= 2:
            v[0, FIELD_INDEX["zero_frac"]] = 1.0  # row 0 dead from step 2
        if step == 2:
            v[:, FIELD_INDEX["grad_inf"]] = 3  # a GradScaler-skipped step: inf gradients expected
        h.append(step, ids, v, {"loss": 1.0, "skipped": float(step == 2)})
    assert w.push_history(h)
    content, buffers = outbox[-1][1:]
    a = sent_arrays(content, buffers)
    assert content["first_nonfinite_step"] == 3 and content["flag_bits"] == FLAG_BITS
    dead = (a["flags"][:, 0] & FLAG_BITS["dead"]) > 0
    assert dead.tolist() == [False, True, True, True]
    nonfinite = FLAG_BITS["nonfinite"] | FLAG_BITS["nan_origin_fwd"] | FLAG_BITS["nan_origin_bwd"]
    assert ((a["flags"][:, 1] & nonfinite) > 0).tolist() == [False, False, True, False]  # not the skipped step
    assert a["skipped"].tolist() == [0, 1, 0, 0]
    w.close()


def test_decimation_and_browser_budget_resend_a_bounded_whole(outbox, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    r = 4
    h, ids = rows_history(r, max_bytes=History.slot_bytes(r) * 16)  # 16 slots, then pairwise merges
    w = ThermometerWidget.waiting()
    for step in range(1, 17):
        h.append(step, ids, step_values(step, r), {"loss": float(step)})
    w.push_history(h)
    h.append(17, ids, step_values(17, r), {"loss": 17.0})  # decimates: 9 buckets
    assert h.decimated
    assert w.push_history(h)
    content, buffers = outbox[-1][1:]
    a = sent_arrays(content, buffers)
    assert content["reset"] and content["from"] == 0 and "rows" in content
    np.testing.assert_array_equal(a["steps"], h.step_index)
    np.testing.assert_array_equal(a["lo"], h.values("min")[:, :, WIRE])  # bands: spikes survive
    np.testing.assert_array_equal(a["hi"], h.values("max")[:, :, WIRE])
    np.testing.assert_array_equal(a["loss_hi"], h.scalar("loss", "max"))
    # the browser may hold at most LIVE_BYTES: beyond, the whole again, downsampled to TRAIT_BYTES
    h2, ids2 = rows_history(r)
    w2 = ThermometerWidget.waiting()
    banded = tw.sent_slot_bytes(r, True)
    monkeypatch.setattr(tw, "LIVE_BYTES", banded * 5)  # 13 plain slots fit, 14 do not
    monkeypatch.setattr(tw, "TRAIT_BYTES", banded * 4)
    for step in range(1, 15):
        h2.append(step, ids2, step_values(step, r), {"loss": float(step)})
        w2.push_history(h2)
    resets = [c["from"] for _, c, _ in outbox[-14:] if c["reset"]]
    assert resets == [0, 0]  # the first push, then at 14 slots
    content, buffers = outbox[-1][1:]
    a = sent_arrays(content, buffers)
    assert content["group"] == 4 and a["steps"].tolist() == [4, 8, 12, 14]  # each group's last step
    np.testing.assert_array_equal(a["last"][1], h2.values("last")[7][:, WIRE])
    np.testing.assert_array_equal(a["lo"][1], h2.values("min")[4:8].min(axis=0)[:, WIRE])
    np.testing.assert_array_equal(a["hi"][1], h2.values("max")[4:8].max(axis=0)[:, WIRE])
    assert sum(len(b) for b in buffers) <= banded * 4
    h2.append(15, ids2, step_values(15, r), {"loss": 15.0})
    w2.push_history(h2)  # in the open group: only that group is resent
    content, buffers = outbox[-1][1:]
    assert not content["reset"] and content["from"] == 3
    assert sent_arrays(content, buffers)["steps"].tolist() == [15]
    w.close()
    w2.close()


def hand_result(h: History) -> CaptureResult:
    """A CaptureResult around a hand-built history (rows' merged stats = their last step's)."""
    last = h.values("last")[-1]
    layers = []
    for i, info in enumerate(h.row_info):
        stats = {f: float(last[i, FIELD_INDEX[f]]) for f in HISTORY_FIELDS if not f.startswith(("grad_", "param_"))}
        stats.update(near_zero_frac=stats["zero_frac"], numel=32.0)
        layers.append(LayerRecord(name=info["name"], module=info["module"], type=info["type"], shape=tuple(info["shape"]),
                                  dtype=info["dtype"], calls=h.appended, stats=stats, grad=None, param_grad_norm=None))
    return CaptureResult(layers=layers, forward_passes=h.steps, backward_ran=False, calls_recorded=h.appended * len(layers),
                         truncated=False, sample_size=4096, near_zero_eps=1e-6, bytes_kept=0, budget_exceeded=False,
                         forward_nonfinite_call=None, backward_nonfinite_row=None, elapsed_s=0.0, steps=h.steps, history=h)


def test_final_traits_hold_the_whole_history_and_fallback() -> None:
    h, ids = rows_history(3)
    for step in range(1, 21):
        h.append(step, ids, step_values(step, 3), {"loss": 10.0 / step})
    w = ThermometerWidget.from_capture(hand_result(h))
    hist = w.history
    np.testing.assert_array_equal(decode_array(hist["steps"]), np.arange(1, 21))
    np.testing.assert_array_equal(decode_array(hist["last"]), h.values("last")[:, :, WIRE])
    assert hist["rows"][2]["name"] == "l2" and hist["group"] == 1 and not w.running
    assert [r["name"] for r in w.layers] == ["l0", "l1", "l2"] and w.report.step == 20
    page = w.fallback_html()
    assert "<polyline" in page and "loss, steps 1–20" in page and "<script" not in page
    assert len(page.encode()) < 200_000
    w.close()


def test_payload_at_10k_steps_300_rows_stays_under_4mb() -> None:
    r, k = 300, 10_000
    h, ids = rows_history(r, max_bytes=64 * 2**20)
    base = step_values(1, r)
    for step in range(1, k + 1):
        base[:, FIELD_INDEX["mean"]] = step
        h.append(step, ids, base, {"loss": 1.0 / step})
    assert h.steps == k and h.decimated
    w = ThermometerWidget.from_capture(hand_result(h))
    state, _paths, buffers = _remove_buffers(w.get_state())
    import json

    size = sum(len(bytes(b)) for b in buffers) + len(json.dumps(state, default=str))
    assert size <= 4 * 2**20, size
    steps = decode_array(w.history["steps"])
    assert steps[-1] == k and w.history["group"] > 1 and "lo" in w.history
    assert any("to keep the notebook under" in n for n in w.notes)
    page = w.fallback_html()  # the static copy: loss curve and the last step's table
    assert len(page.encode()) <= 200_000 and f"loss, steps 1–{k}" in page and page.count("<tr") == r + 1
    # the last sent slot is the run's last step, its band covers the merged steps' means
    means = decode_array(w.history["lo"])[:, 0, WIRE_FIELDS.index("mean")]
    assert means[-1] <= steps[-2] + 1 and decode_array(w.history["last"])[-1, 0, 0] == k
    w.close()


def test_histogram_request_while_running_says_so() -> None:
    w = ThermometerWidget.waiting()
    with pytest.raises(ValueError, match="still running"):
        w.handle_request("histogram", {"row": 0})
    w.close()


def test_per_update_cost_300_rows(outbox) -> None:  # type: ignore[no-untyped-def]
    """Each update of a 300-row loop sends its new slots only: the same bytes at the 50th update as at
    the 2nd, within 4 slots' worth (no timing here: a timed unit test fails under load)."""
    h, ids = rows_history(300)
    w = ThermometerWidget.waiting()
    sizes = []
    for step in range(1, 201):
        h.append(step, ids, step_values(step, 300), {"loss": 1.0})
        if step % 4 == 0:  # 4 new steps per update (a loop at 16 steps/s)
            assert w.push_history(h)
            _, content, buffers = outbox[-1]
            assert (content["from"] == step - 4 and not content["reset"]) or step == 4
            sizes.append(sum(len(bytes(b)) for b in buffers))
    assert len(set(sizes[1:])) == 1 and sizes[-1] <= 4 * tw.sent_slot_bytes(300, False), sizes[:3]
    w.close()


def test_live_findings_are_pushed_at_most_once_a_second(outbox, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    clock = [100.0]
    monkeypatch.setattr(tw.time, "monotonic", lambda: clock[0])
    h, ids = rows_history(3)
    w = ThermometerWidget.waiting()
    for step in range(1, 6):
        v = step_values(step, 3)
        v[:, FIELD_INDEX["update_ratio"]] = 0.3  # too large from step 1, and the loss doubles after it: the learning rate
        h.append(step, ids, v, {"loss": float(step)})
        clock[0] += 0.4
        w.push_history(h)
    sent = [c for _, c, _ in outbox]
    with_findings = [i for i, c in enumerate(sent) if "findings" in c]
    assert with_findings == [0, 3], with_findings  # at t = 0.4, then ≥ 1 s later (t = 1.6), not in between
    content = sent[3]
    assert content["headline"] == "learning rate too high: update ratio 0.3 at step 1 in `l0`"
    assert [f["code"] for f in content["findings"]] == ["lr_high"] and content["findings"][0]["rows"] == ["l0", "l1", "l2"]
    w.close()


# -- the magic and the API, with the real per-step capture ---------------------------------------
SETUP = """
import time, torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 2)
"""

LOOP = """%%nndebug model --loss loss -o res
for i in range({n}):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    time.sleep({pause})
    {extra}
"""


@pytest.fixture
def sh(shell):  # type: ignore[no-untyped-def]
    assert shell.run_cell(SETUP).success
    return shell


def widget_displays(sh) -> list[dict]:  # type: ignore[no-untyped-def]
    return [d for d in sh.displayed if "application/vnd.jupyter.widget-view+json" in d]


def test_magic_loop_is_shown_once_and_updated_at_most_4_times_a_second(sh, outbox) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    assert sh.run_cell(LOOP.format(n=60, pause=0.02, extra="")).success
    elapsed = time.monotonic() - t0
    res, w = sh.user_ns["res"], sh.user_ns["_nndebug_widget"]
    # one output: shown when the cell started, refreshed in place at the end (same widget model)
    shown = widget_displays(sh)
    ids = {d["application/vnd.jupyter.widget-view+json"]["model_id"] for d in shown}
    assert ids == {w.model_id} and len(shown) == 2
    assert "nbdebug thermometer" in shown[-1]["text/html"] and "running" not in shown[-1]["text/html"]
    # throttled: at most 4 a second, plus the final one
    times = [t for t, _, _ in outbox]
    assert len(outbox) <= 4 * elapsed + 2, (len(outbox), elapsed)
    assert all(b - a >= 0.24 for a, b in itertools.pairwise(times[:-1])), np.diff(times)  # the last: the final one
    # only the new slots each time; together every step once
    seen: list[int] = []
    for _, content, buffers in outbox:
        steps = sent_arrays(content, buffers)["steps"].tolist()
        assert content["reset"] == (content is outbox[0][1])
        assert content["from"] in (len(seen), len(seen) - 1)  # new slots (or the last one, updated)
        seen = seen[: content["from"]] + steps
    assert seen == list(range(1, 61)) and res.steps == 60
    # the final traits hold the whole history, equal to the result's series
    np.testing.assert_array_equal(decode_array(w.history["steps"]), res.step_index)
    np.testing.assert_allclose(decode_array(w.history["loss"]), res.series("loss"), rtol=1e-6)
    np.testing.assert_array_equal(decode_array(w.history["last"])[:, 0, WIRE_FIELDS.index("mean")],
                                  res.series("0", "mean").astype(np.float32))
    assert not w.running and w.report.step == 60
    # the texts the slider's step is compared with: the kernel's at step 60, and over the whole run
    from nbdebug.inspectors.thermometer import diagnose

    assert w.report_step == 60 and w.summary.startswith("step 60: ")
    assert w.run_texts["summary"] == diagnose(res, step="run").summary and w.histogram_note == ""


def test_keyboard_interrupt_mid_loop_keeps_the_steps(sh, outbox) -> None:  # type: ignore[no-untyped-def]
    from nbdebug.capture import hook_count

    r = sh.run_cell(LOOP.format(n=100, pause=0.0, extra="if i == 24: raise KeyboardInterrupt"))
    assert type(r.error_in_exec) is KeyboardInterrupt
    res, w = sh.user_ns["res"], sh.user_ns["_nndebug_widget"]
    assert res.steps == 25 and res.step_index.tolist() == list(range(1, 26))
    assert decode_array(w.history["steps"]).tolist() == list(range(1, 26)) and not w.running
    assert w.live_rows == [] and w.history["rows"]  # the rows are in the final state, not left in the live trait
    last = outbox[-1][1]
    assert last["total_steps"] == 25  # the final live update went out too
    assert hook_count(sh.user_ns["model"]) == 0
    assert len(widget_displays(sh)) == 2  # shown at the start, refreshed at the end


def test_rerun_closes_the_previous_live_widget(sh, outbox) -> None:  # type: ignore[no-untyped-def]
    cell = LOOP.format(n=3, pause=0.0, extra="")
    assert sh.run_cell(cell).success
    first = sh.user_ns["_nndebug_widget"]
    assert first.comm is not None
    assert sh.run_cell(cell).success
    assert first.comm is None and sh.user_ns["_nndebug_widget"] is not first


def test_api_live_shows_at_start_and_show_does_not_repeat_it(sh, outbox) -> None:  # type: ignore[no-untyped-def]
    code = """
import nbdebug
with nbdebug.debug(model, live=True, loss=lambda: loss) as dbg:
    assert len(dbg.live_widgets) == 1
    for i in range(5):
        opt.zero_grad(); loss = nn.functional.mse_loss(model(x), y); loss.backward(); opt.step()
running_after_block = dbg.live_widgets[0].running
dbg.show()
w = dbg.widget()
"""
    assert sh.run_cell(code).success
    w = sh.user_ns["w"]
    assert sh.user_ns["running_after_block"] is False  # final state at the end of the block, show() or not
    assert w is sh.user_ns["dbg"].live_widgets[0] and w.history["total_steps"] == 5
    assert {d["application/vnd.jupyter.widget-view+json"]["model_id"] for d in widget_displays(sh)} == {w.model_id}
    # without live=True nothing is shown until show(); with several views, no live display
    assert sh.run_cell("d2 = nbdebug.debug(model)\nwith d2: model(x)\nn_live = len(d2.live_widgets)").success
    assert sh.user_ns["n_live"] == 0
    assert sh.run_cell("d3 = nbdebug.debug(model, 'thermometer,featuremaps', live=True)\nwith d3: model(x)\nn3 = len(d3.live_widgets)").success
    assert sh.user_ns["n3"] == 0


def test_nan_loop_shows_the_incident_live_and_in_the_final_state(sh, outbox) -> None:  # type: ignore[no-untyped-def]
    extra = "if i == 4: x[0, 0] = float('nan')"  # from step 6 the batch has a NaN: `0` is the origin
    r = sh.run_cell(LOOP.format(n=8, pause=0.0, extra=extra).replace("for i in", "x = x.clone()\nfor i in"))
    assert r.success
    res, w = sh.user_ns["res"], sh.user_ns["_nndebug_widget"]
    assert res.first_nonfinite_step == 6 and res.incident is not None and res.incident.step == 6
    assert w.history["first_nonfinite_step"] == 6 and w.first_nonfinite_step == 6
    cards = w.incidents
    assert cards[0]["kind"] == "nonfinite" and cards[0]["step"] == 6 and cards[0]["message"] == res.incident.message
    live = [c for _, c, _ in outbox if "incidents" in c]
    assert live and live[-1]["incidents"][0]["step"] == 6  # the cards were pushed while the cell ran
    assert any(c["first_nonfinite_step"] == 6 for _, c, _ in outbox)
    assert "step 6" in w.fallback_html()


def test_rows_that_appear_late_reach_the_browser_with_their_names(outbox) -> None:  # type: ignore[no-untyped-def]
    """A row first seen at a later step (a branch taken late, relu#k, an expert) arrives with its name,
    whether or not the push is a reset: the browser's row list (as js/src/thermometer/history.ts
    applies `rows`/`rows_from`) always equals the history's."""
    h, ids = rows_history(10)
    w = ThermometerWidget.waiting()
    browser: list[str] = []
    for step, r in enumerate((10, 11, 12, 12, 13), start=1):
        while len(h.rows) < r:
            name = f"late{len(h.rows)}"
            ids = np.append(ids, h.row_id(name, {"module": name, "type": "ReLU", "shape": (4, 8), "dtype": "float32"}))
        h.append(step, ids, step_values(step, r), {"loss": 1.0, "lr": 0.1, "skipped": 0.0})
        assert w.push_history(h)
        content, buffers = outbox[-1][1:]
        if "rows" in content:
            at = 0 if content["reset"] else content.get("rows_from", 0)
            browser = browser[:at] + [row["name"] for row in content["rows"]]
        assert browser == h.rows, (step, content["reset"])
        assert sent_arrays(content, buffers)["last"].shape[1] == len(browser)


def test_live_rows_trait_is_set_before_the_push_that_first_carries_the_rows(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The rows travel in the first push only (later pushes: new rows only), and a push that reaches the
    browser before the view's module loaded is lost: the ``live_rows`` trait (kept by the browser's model)
    holds the same rows, set before each push that first carries a row, and is cleared by ``finish``
    (js/tests/thermometer_live.test.ts: the view names its rows from it when the first push was lost)."""
    at_send: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    monkeypatch.setattr(ThermometerWidget, "send", lambda self, content, buffers=None: at_send.append((content, list(self.live_rows))))
    h, ids = rows_history(3)
    w = ThermometerWidget.waiting()
    assert w.live_rows == []
    for step, r in enumerate((3, 3, 4), start=1):
        while len(h.rows) < r:
            ids = np.append(ids, h.row_id("late", {"module": "late", "type": "ReLU", "shape": (4, 8), "dtype": "float32"}))
        h.append(step, ids, step_values(step, r), {"loss": 1.0, "lr": 0.1, "skipped": 0.0})
        assert w.push_history(h)
        content, trait = at_send[-1]
        assert [row["name"] for row in trait] == h.rows  # already set when the push left
        # the push carries the rows the browser lacks (none at step 2), as the trait holds them
        at = 0 if content["reset"] else content.get("rows_from", len(trait))
        assert content.get("rows", []) == trait[at:] and ("rows" in content) == (step != 2)
        assert trait[-1] == {"name": h.rows[-1], "module": h.rows[-1], "type": "ReLU" if r == 4 else "Linear",
                             "shape": [4, 8], "dtype": "float32"}
    assert at_send[0][0]["rows"] == at_send[0][1]  # the first push's rows are the trait's
    result = hand_result(h)
    w.finish(tw.diagnose(result), result)
    assert w.live_rows == [] and [r["name"] for r in w.history["rows"]] == h.rows
    w.close()
