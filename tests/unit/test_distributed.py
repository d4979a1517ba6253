"""Many processes: the spool format, and DDP / FSDP2 ranks on gloo (2 CPU processes) read back as a Run.

The launches go through :func:`nbdebug.distributed.run_distributed` (what ``%%nndebug --distributed``
does): fork with one intra-op thread per worker, a spawn launch with the worker in ``_dist_workers.py``,
and a script launch read with :func:`nbdebug.distributed.load`.
"""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import time
import weakref
from pathlib import Path

import _dist_workers as W
import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from nbdebug.capture.history import HISTORY_FIELDS, SCALARS, History
from nbdebug.capture.hooks import hook_count
from nbdebug.capture.spool import (
    LAUNCHER_ENV,
    SPOOL_ENV,
    SpoolWriter,
    progress,
    read_rank,
    wants_spool,
)
from nbdebug.distributed import SpoolDebug, load, run_distributed

ROWS = ["0", "1", "2", "3"]  # the inner Sequential's names, never "module.0"


free_port, launch = W.free_port, W.launch


def worker_json(out: Path, rank: int) -> dict:
    return json.loads((out / f"rank{rank}.json").read_text())


# ------------------------------------------------------------------ the spool format (no processes)
def _history_steps(writer: SpoolWriter, n: int, max_bytes: int) -> History:
    h = History(max_bytes)
    rng = np.random.default_rng(0)
    for s in range(1, n + 1):
        ids = [h.row_id("fc", {"module": "fc", "type": "Linear", "shape": (2, 3), "dtype": "float32"})]
        if s > 3:  # a row that appears later: earlier slots are NaN there
            ids.append(h.row_id("relu", {"module": "relu", "type": "ReLU"}))
        v = rng.standard_normal((len(ids), len(HISTORY_FIELDS))).astype(np.float32)
        h.append(s, np.array(ids), v, {"loss": float(s), "lr": 0.1})
        if s % 7 == 0:  # late gradients for the previous step
            h.update(s - 1, np.array([0]), np.where(np.arange(len(HISTORY_FIELDS)) > 9, 5.0, np.nan)[None].astype(np.float32))
        writer.write_step(s, h, {"fp_params": np.full((2, 3), s, np.float32)}, {"incidents": []})
    return h


@pytest.mark.parametrize("max_bytes", [2**20, 20_000])  # all steps kept; decimated (pairwise merges)
def test_spool_history_round_trip(tmp_path: Path, max_bytes: int) -> None:
    w = SpoolWriter(tmp_path, 3)
    h = _history_steps(w, 150, max_bytes)
    back = read_rank(w.dir)
    g = back.history
    assert (back.rank, back.pid, back.step, w.chunks) == (3, os.getpid(), 150, 150)
    assert g.rows == h.rows and [i["shape"] for i in g.row_info] == [(2, 3), ()]
    assert g.steps == h.steps == 150 and g.appended == h.appended and g.decimated == h.decimated
    assert np.array_equal(g.step_index, h.step_index) and np.array_equal(g.bucket_steps, h.bucket_steps)
    for agg in ("last", "min", "max"):
        assert np.array_equal(g.values(agg), h.values(agg), equal_nan=True)
        for s in SCALARS:
            assert np.array_equal(g.scalar(s, agg), h.scalar(s, agg), equal_nan=True)
    assert list(range(150 - 63, 151)) == sorted(back.fingerprints)[-64:]  # the recent steps' fingerprints
    assert back.fingerprints[142]["fp_params"].tolist() == [[142.0] * 3] * 2


def test_spool_stays_bounded_on_long_runs(tmp_path: Path) -> None:
    w = SpoolWriter(tmp_path, 0)
    h = History(2**30)
    ids = np.array([h.row_id(f"l{i}") for i in range(3)])
    for s in range(1, 1001):
        h.append(s, ids, np.full((3, len(HISTORY_FIELDS)), s, np.float32), {"loss": s})
        inc = [{"kind": "nonfinite", "step": 5, "module": "l1", "phase": "forward"}] if s == 5 else []
        g = np.array([np.nan if s == 7 else 1.0, 1.0], np.float32)
        w.write_step(s, h, {"fp_grads": g, "fp_params": np.full((2, 3), s, np.float32)}, {"incidents": inc})
    files = list(w.dir.glob("c*.npz"))
    assert len(files) < 200 and w.chunks == 1000  # whole-history chunks replace the old ones
    back = read_rank(w.dir)
    assert back.history.series("l2", "mean").tolist() == list(range(1, 1001))
    assert [d["step"] for d in back.incidents] == [5] and back.first_bad_grad == (7, 0)  # carried over
    assert min(back.fingerprints) <= 1000 - 63 and sorted(back.fingerprints)[-1] == 1000
    assert sum(f.stat().st_size for f in files) < 3 * max(f.stat().st_size for f in files) + 64 * 4000


def test_spool_chunks_are_small_and_atomic(tmp_path: Path) -> None:
    w = SpoolWriter(tmp_path, 0)
    h = History(2**20)
    v = np.zeros((10, len(HISTORY_FIELDS)), np.float32)
    ids = np.array([h.row_id(f"l{i}") for i in range(10)])
    sizes = []
    for s in range(1, 6):
        h.append(s, ids, v + s, {"loss": 1.0})
        sizes.append(w.write_step(s, h, {"fp_params": np.zeros((20, 3), np.float32)}))
    # only the new slot goes to disk: the same size every step (10 rows × 20 fields × 4 bytes + overhead)
    assert max(sizes[1:]) - min(sizes[1:]) < 16 and 800 < sizes[-1] < 3500
    (w.dir / ".c00000009_9.npz.123.tmp").write_bytes(b"half a file")  # a write in progress is not read
    back = read_rank(w.dir)
    assert back.step == 5 and back.history.series("l3", "mean").tolist() == [1, 2, 3, 4, 5]
    assert progress(tmp_path)[(0, os.getpid())][0] == 5


# ------------------------------------------------------------------ DDP on 2 CPU ranks (fork)
#: the launches tests/widget/test_run_widget.py reads too: one worker, one launch of each (W.launched)
shared_launch = pytest.mark.xdist_group("ddp-launches")


@shared_launch
def test_ddp_nan_on_rank1_is_reported_with_rank_step_module(tmp_path_factory: pytest.TempPathFactory) -> None:
    run, tmp_path = W.launched("nan", tmp_path_factory)
    assert run.error is None, run.error
    assert run.world_size == 2 and len(run.ranks) == 2
    for r, res in enumerate(run.ranks):
        assert res.history.rows == ROWS  # the inner module's names: DDP unwrapped
        assert res.steps == W.STEPS and res.step_index.tolist() == [1, 2, 3, 4, 5]
        assert run.hooks_left[r] == 0 and worker_json(tmp_path, r)["hooks_left"] == 0
    first = run.first_nonfinite[0]
    assert run.first_nonfinite_rank == W.NAN_RANK
    assert (first.rank, first.step, first.phase, first.module) == (1, 3, "forward", "1")
    # rank 0's own forward was finite at step 3; the all-reduced gradients brought the NaN
    other = [f for f in run.first_nonfinite if f.rank == 0]
    assert len(other) == 1 and (other[0].step, other[0].phase) == (3, "param_grad")
    assert "first NaN/Inf: rank 1, step 3, `1` (forward); also rank 0 step 3 (param_grad)" in run.summary()
    assert run.focus == 1 and run.widget().report.names == ROWS
    assert run.ranks[1].series("1", "nan").tolist() == [0, 0, 48, 48, 48]  # every element of the 6×8 output
    assert run.ranks[0].series("1", "nan").tolist() == [0, 0, 0, 48, 48]  # rank 0: from the NaN weights on


@shared_launch
def test_ddp_parameter_changed_on_one_rank_is_diverged(tmp_path_factory: pytest.TempPathFactory) -> None:
    run, _ = W.launched("diverge", tmp_path_factory)
    assert run.error is None and run.first_nonfinite == []
    assert run.diverged == ["0.weight"] and run.buffers_differ == []
    assert run.diverged_steps == {"0.weight": W.DIVERGE_AFTER} and run.compared_step == W.STEPS


def test_ddp_batchnorm_healthy_lists_buffers_apart(tmp_path: Path) -> None:
    run = launch("bn", tmp_path)
    assert run.error is None
    assert run.diverged == []
    assert run.buffers_differ == ["1.running_mean", "1.running_var"]  # num_batches_tracked agrees
    assert any("re-broadcasts" in n for n in run.notes)
    assert [r.history.rows for r in run.ranks] == [ROWS, ROWS]
    last = [float(r.series("0", "mean")[-1]) for r in run.ranks]  # each rank's own batch at the last step
    assert run.spread("mean")["0"] == pytest.approx((min(last), max(last)), rel=1e-6) and last[0] != last[1]


def test_worker_that_raises_ends_the_run_with_its_error_and_what_it_recorded(tmp_path: Path) -> None:
    run = launch("raise", tmp_path)
    # the cell's error is torch's: rank 1's, or rank 0's collective that failed when rank 1 went away
    assert isinstance(run.error, mp.ProcessRaisedException)
    assert run.errors[1] == "RuntimeError: boom on rank 1 at step 3" and next(iter(run.errors)) == 1  # raised first
    assert "raise RuntimeError" in run.tracebacks[1]
    assert run.ranks[1].steps == 3 and run.ranks[1].raised.startswith("RuntimeError: boom")
    assert run.hooks_left[1] == 0
    assert run.focus == 1 and "rank 1 raised RuntimeError: boom on rank 1 at step 3" in run.summary()
    assert [r.name for r in run.ranks[0].layers] == ROWS  # killed or closed: its rows are there
    # rank 0 waited in the all-reduce of step 3 and was stopped: steps 1-2 are there
    assert run.ranks[0].history.step_index.tolist()[:2] == [1, 2]


# ------------------------------------------------------------------ FSDP2, spawn, script, collisions
def test_fsdp2_fully_shard_ranks_and_combined_gradient_norms(tmp_path: Path) -> None:
    run = launch("fsdp", tmp_path)
    assert run.error is None, run.error
    assert [r.history.rows for r in run.ranks] == [ROWS, ROWS]  # FSDP2 keeps the names
    assert run.diverged == [] and any(n.startswith("FSDP: each shard lives on one rank") for n in run.notes)
    ref = worker_json(tmp_path, 0)["ref_grad_norms"]
    got = run.grad_norms(W.STEPS)
    assert sorted(got) == sorted(ref)
    for name, norm in ref.items():  # √(Σ over the two shards of ‖shard‖²) = ‖full gradient‖
        assert got[name] == pytest.approx(norm, rel=1e-5), name
    assert run.hooks_left == {0: 0, 1: 0}
    # the thermometer's per-module gradient norm: each rank's history holds its shard's, combined here
    mod0 = np.hypot(ref["0.weight"], ref["0.bias"])
    assert run.combined("0", "param_grad_norm")[-1] == pytest.approx(mod0, rel=1e-5)
    assert run.ranks[0].series("0", "param_grad_norm")[-1] < mod0 * (1 - 1e-3)  # one shard alone is less


def test_spawn_launch(tmp_path: Path) -> None:
    run = launch("ddp", tmp_path, start_method="spawn")
    assert run.error is None, run.error
    assert [r.steps for r in run.ranks] == [W.STEPS, W.STEPS] and run.hooks_left == {0: 0, 1: 0}
    # parameter-gradient norms are read after DDP averaged the gradients (each rank has its own batch,
    # so a norm read before the all-reduce differs between the ranks)
    ref = worker_json(tmp_path, 0)["ref_grad_norms"]
    for name in ("0", "3"):
        want = np.hypot(ref[f"{name}.weight"], ref[f"{name}.bias"])
        assert [float(r.series(name, "param_grad_norm")[-1]) for r in run.ranks] == pytest.approx([want, want], rel=1e-5)
    assert run.diverged == [] and run.first_nonfinite == []
    assert {p.meta["rank_source"] for p in run.processes} == {"torch.distributed"}


def test_load_reads_a_script_launch(tmp_path: Path) -> None:
    spool, out = tmp_path / "spool", tmp_path / "out"
    out.mkdir()
    env = {**os.environ, SPOOL_ENV: str(spool)}
    env.pop(LAUNCHER_ENV, None)
    subprocess.run([sys.executable, W.__file__, "ddp", str(out), str(free_port())], env=env, check=True, timeout=120,
                   cwd=Path(W.__file__).parent)
    run = load(spool)
    assert run.world_size == 2 and [r.steps for r in run.ranks] == [W.STEPS, W.STEPS]
    assert run.ranks[0].series("0", "mean").shape == (W.STEPS,) and run.notes == []
    assert spool.is_dir()  # load never removes a spool it did not create


def test_two_processes_claiming_rank0_are_detected(tmp_path: Path) -> None:
    run = run_distributed(lambda: mp.start_processes(W.no_rank_worker, args=(str(tmp_path),), nprocs=2,
                                                     start_method="fork"))
    assert len(run.processes) == 2 and {p.rank for p in run.processes} == {0}
    assert any("all claim rank 0" in n and "ACCELERATE_USE_CPU=yes" in n for n in run.notes)
    assert run.world_size == 1


@pytest.mark.parametrize("use_cpu", [False, True])
def test_accelerate_notebook_launcher_on_cpu(monkeypatch: pytest.MonkeyPatch, use_cpu: bool) -> None:
    accelerate = pytest.importorskip("accelerate")
    if use_cpu:
        monkeypatch.setenv("ACCELERATE_USE_CPU", "yes")
    else:
        monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    port = str(free_port())
    run = run_distributed(lambda: accelerate.notebook_launcher(W.accelerate_worker, num_processes=2, use_port=port))
    assert run.error is None and [r.steps for r in run.ranks] == [3, 3] and run.hooks_left == {0: 0, 1: 0}
    assert [r.history.rows for r in run.ranks] == [ROWS, ROWS]  # ranks from torch.distributed, not accelerate
    odd = [n for n in run.notes if "ACCELERATE_USE_CPU=yes" in n]
    if use_cpu:  # accelerate wrapped the model in DDP; nothing to say
        assert [p.meta["wrapper"] for p in run.processes] == ["DDP", "DDP"] and odd == [] and run.diverged == []
    else:  # accelerate thinks each process is process 0 of 1: the model is not wrapped, the ranks train alone
        assert [p.meta["wrapper"] for p in run.processes] == [None, None] and len(odd) == 1
        assert run.diverged == ["0.weight", "0.bias", "3.weight", "3.bias"]  # and their parameters drift apart


def test_launcher_options_are_the_workers_defaults(tmp_path: Path) -> None:
    def cell() -> None:
        model = W.make_model("ddp")
        os.environ[LAUNCHER_ENV] = "1"  # as if in a worker
        with SpoolDebug(model, spool=os.environ[SPOOL_ENV]):  # --every 2 --layers 0,3 from the launcher
            for _ in range(5):
                model(torch.randn(2, 4)).sum().backward()
        own = SpoolDebug(model, spool=Path(os.environ[SPOOL_ENV]) / "own", every=3, layers=["1"])  # its own win
        assert (own.capture.every, [n for n, _ in own.capture.modules]) == (3, ["1"])

    run = run_distributed(cell, options={"every": 2, "layers": ["0", "3"], "max_bytes": None})
    assert run.ranks[0].history.rows == ["0", "3"] and run.ranks[0].step_index.tolist() == [1, 3, 5]


def test_no_worker_entered_and_environment_restored() -> None:
    before = dict(os.environ)
    seen = {}

    def cell() -> int:
        seen["spool"] = os.environ[SPOOL_ENV]
        seen["wants"] = wants_spool()  # the launching process never spools itself
        return 7

    run = run_distributed(cell)
    assert run.value == 7 and run.error is None and run.ranks == []
    assert any(n.startswith("no worker entered nbdebug.debug") for n in run.notes)
    assert not Path(seen["spool"]).exists() and seen["wants"] is False
    assert dict(os.environ) == before


def test_watcher_says_which_rank_stopped_and_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def cell() -> None:  # a rank that wrote step 2, then nothing (a hung worker)
        w = SpoolWriter(os.environ[SPOOL_ENV], 1, pid=99999)
        w.write_json("meta.json", {"rank": 1, "world_size": 2})
        w.write_step(1, None)
        w.write_step(2, None)
        time.sleep(3)

    steps: list[dict[int, int]] = []
    run = run_distributed(cell, timeout_s=0.6, on_progress=steps.append)
    err = capsys.readouterr().err
    assert err.count("nbdebug: no rank wrote progress") == 1  # one line per stall
    assert "rank 1 at step 2" in err and "torch.set_num_threads(1)" in err and "spawn" in err
    assert steps[-1] == {1: 2}
    assert any("rank 1 never closed its capture" in n for n in run.notes)


def test_workers_that_stop_making_progress_are_reported_with_their_steps(capsys: pytest.CaptureFixture[str]) -> None:
    procs = []
    err: list[str] = []

    def cell() -> None:
        ctx = mp.start_processes(W.stall_worker, args=("",), nprocs=2, start_method="fork", join=False)
        procs.extend(ctx.processes)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "no rank wrote progress" not in "".join(err):
            ctx.join(timeout=0.25)
            err.append(capsys.readouterr().err)  # the watcher writes to the cell's stderr
        for p in ctx.processes:  # ours: started by this test
            p.kill()
            p.join()

    run = run_distributed(cell, timeout_s=3)
    text = "".join(err) + capsys.readouterr().err
    assert re.search(r"nbdebug: no rank wrote progress for \d s while the cell runs \(rank 0 at step 1, rank 1 at step 1\)", text)
    assert text.count("no rank wrote progress") == 1
    assert "torch.set_num_threads(1)" in text and "start_method='spawn'" in text
    assert [r.steps for r in run.ranks] == [1, 1] and sum("never closed" in n for n in run.notes) == 2
    # killed: rows from the last step written, the thermometer still draws them
    assert [r.name for r in run.ranks[1].layers] == ROWS and run.widget(1).report.names == ROWS
    assert any(n.startswith("no rank wrote progress") for n in run.notes)
    assert all(not p.is_alive() for p in procs)


def test_spool_debug_in_one_process_leaves_the_model_as_it_was(tmp_path: Path) -> None:
    from nbdebug.capture.state import fingerprint, same_fingerprint

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    ref = fingerprint(model)
    before = hook_count(model)
    with SpoolDebug(model, spool=tmp_path) as dbg:
        for _ in range(3):
            model(torch.randn(5, 4)).sum()
    assert hook_count(model) == before and same_fingerprint(ref, fingerprint(model)) == []
    run = load(tmp_path)
    assert run.ranks[0].steps == dbg.result.steps == 3 and run.hooks_left == {0: 0}
    assert [r.name for r in run.ranks[0].layers] == [r.name for r in dbg.result.layers]
    assert run.ranks[0].layers[0].stats["mean"] == dbg.result.layers[0].stats["mean"]
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None  # neither the SpoolDebug nor its result keeps the model


def test_two_blocks_in_one_worker_continue_one_history(tmp_path: Path) -> None:
    model = W.make_model("ddp")
    for _ in range(2):  # e.g. one block per epoch
        with SpoolDebug(model, spool=tmp_path):
            for _ in range(3):
                model(torch.randn(2, 4)).sum().backward()
    run = load(tmp_path)
    assert len(run.processes) == 1 and run.ranks[0].steps == 6
    assert run.ranks[0].step_index.tolist() == [1, 2, 3, 4, 5, 6] and run.hooks_left == {0: 0}


def test_nbdebug_debug_spools_in_a_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbdebug

    monkeypatch.setenv(SPOOL_ENV, str(tmp_path))
    monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    assert isinstance(nbdebug.debug(nn.Linear(2, 2)), SpoolDebug)


def test_magic_distributed_cell(shell: object, tmp_path: Path) -> None:
    shell.user_ns.update(W=W, mp=mp, out=str(tmp_path), port=free_port(), port2=free_port())
    r = shell.run_cell("%%nndebug --distributed --every 2 -o run\n"
                       "mp.start_processes(W.worker, args=(2, port, 'api', out), nprocs=2, start_method='fork')\n'done'")
    assert r.success and r.result == "done"
    run = shell.user_ns["run"]
    assert shell.user_ns["_nndebug"] is run and [x.steps for x in run.ranks] == [W.STEPS, W.STEPS]
    assert run.hooks_left == {0: 0, 1: 0} and run.ranks[0].history.rows == ROWS
    assert run.ranks[1].step_index.tolist() == [1, 3, 5]  # --every 2 reached the workers' nbdebug.debug
    assert any("ThermometerWidget" in str(d.get("text/plain", "")) for d in shell.displayed)
    r = shell.run_cell("%%nndebug --distributed\n"
                       "mp.start_processes(W.worker, args=(2, port2, 'raise', out), nprocs=2, start_method='fork')")
    assert not r.success and isinstance(r.error_in_exec, mp.ProcessRaisedException)  # the cell's error, after the view
    assert shell.user_ns["_nndebug"].errors[1] == "RuntimeError: boom on rank 1 at step 3"
    assert shell.user_ns["_nndebug"].focus == 1
    assert not shell.run_cell("%%nndebug model --distributed\n1").success  # UsageError: no model argument
