"""Modes of the real-use matrix that need more than a fresh tiny model per cell, each with its content
and hygiene checked: a model offloaded by accelerate to the CPU and disk (``offload.py``, through
``%%nndebug``), a DDP model trained on two gloo processes under ``%%nndebug --distributed``
(``ddp.py``), TorchScript modules and ``torch.export`` graphs (one line per view: hooks cannot see
their layers) next to an FX-traced model (watched as usual), ``transformers.Trainer.train()`` and
Lightning's ``trainer.fit`` in a ``%%nndebug`` cell (``trainers.py``), and an evaluation loop.
"""

from __future__ import annotations

from typing import Any

import pytest

from . import offload
from .checks import check
from .test_matrix import _params, no_interrupt


@pytest.mark.parametrize(("mode", "view"), _params({m: offload.VIEWS for m in offload.MODES}))
def test_offloaded(mode: str, view: str, shell: Any, offloaded: Any, capsys: pytest.CaptureFixture[str], record_property: Any) -> None:
    record_property("cell", (mode, view))
    res = no_interrupt(offload.run_offloaded, shell, mode, view, *offloaded, check)
    assert "nbdebug" not in capsys.readouterr().err
    if res.note:
        record_property("note", res.note)


def test_ddp_distributed(shell: Any, tmp_path: Any, record_property: Any) -> None:
    """``%%nndebug --distributed`` around a cell that trains a DDP model on 2 gloo CPU processes: each
    rank's per-step history equals that rank's own measurements of the same loop without nbdebug, the
    ranks stay in sync (nothing diverged), no hook left, each rank's model as without nbdebug."""
    import json

    import numpy as np

    from . import ddp

    record_property("cell", ("ddp", "thermometer"))
    for attempt in range(2):  # a launch that hangs (workers killed) is retried once on a fresh port
        shell.user_ns.update(ddp=ddp, out=str(tmp_path), port=ddp.free_port())
        r = shell.run_cell("%%nndebug --distributed -o run\nddp.launch(port, out)")
        if not isinstance(r.error_in_exec, TimeoutError) or attempt:
            break
    assert r.success and r.result == "trained", r.error_in_exec
    run = shell.user_ns["run"]
    assert shell.user_ns["_nndebug"] is run and run.error is None, run.error
    assert run.world_size == 2 and run.hooks_left == {0: 0, 1: 0}
    assert run.diverged == [] and run.first_nonfinite == [] and run.buffers_differ == []
    for rank, res in enumerate(run.ranks):
        meas = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert (meas["hooks_left"], meas["optimizer_hooks_left"], meas["diffs"], meas["training"]) == (0, 0, [], True), meas
        assert res.history.rows == ddp.ROWS and res.step_index.tolist() == list(range(1, ddp.STEPS + 1))
        for row in ddp.ROWS:
            np.testing.assert_allclose(res.series(row, "mean"), meas["means"][row], rtol=1e-5, atol=1e-7, err_msg=f"rank {rank} {row}")
        for module in ddp.PARAM_MODULES:
            np.testing.assert_allclose(res.series(module, "update_ratio"), meas["ratio"][module], rtol=1e-4, err_msg=f"rank {rank} {module}")
    last = {row: sorted(float(res.series(row, "mean")[-1]) for res in run.ranks) for row in ddp.ROWS}
    spread = run.spread("mean")
    assert sorted(spread) == sorted(ddp.ROWS), spread
    for row, (lo, hi) in spread.items():  # the per-rank spread at the last step
        assert (lo, hi) == pytest.approx(tuple(last[row]), rel=1e-6) and lo != hi, (row, lo, hi)
    assert run.widget().report.names == ddp.ROWS
    assert any("ThermometerWidget" in str(d.get("text/plain", "")) for d in shell.displayed), shell.displayed


UNHOOKABLE = ([("torchscript", v) for v in ("thermometer", "featuremaps", "gradcam", "attention", "logitlens", "all")]
              + [("torchscript_mlp", "thermometer"), ("exported", "thermometer"), ("exported", "featuremaps"), ("exported", "all")])


def unhookable(kind: str) -> tuple[Any, Any]:
    """(module, input): the CNN traced by ``torch.jit.trace``, the MLP by ``torch.jit.script``, the CNN
    exported by ``torch.export`` (``.module()``)."""
    import warnings

    import torch

    from . import models as M

    with warnings.catch_warnings():  # torch.jit is deprecated in favour of torch.export / torch.compile
        warnings.simplefilter("ignore", DeprecationWarning)
        if kind == "torchscript":
            return torch.jit.trace(M.tiny_cnn().eval(), M.image()), M.image()
        if kind == "torchscript_mlp":
            return torch.jit.script(M.mlp()), torch.randn(2, 6, generator=torch.Generator().manual_seed(3))
    return torch.export.export(M.tiny_cnn().eval(), (M.image(),)).module(), M.image()


@pytest.mark.parametrize(("kind", "view"), UNHOOKABLE, ids=[f"{k}-{v}" for k, v in UNHOOKABLE])
def test_unhookable(kind: str, view: str, record_property: Any) -> None:
    """A TorchScript module (what ``torch.jit.trace``/``script``/``load`` give) or a ``torch.export``ed
    graph: hooks cannot see its layers, so every view is one line saying why (not an empty table, not
    "the cell never called the model"); no widget; the cell's output and the module as without nbdebug."""
    import torch

    import nbdebug
    from nbdebug.capture import fingerprint, hook_count, same_fingerprint

    from .cells import one_line
    from .checks import VIEWS, widget_count

    record_property("cell", (kind.removesuffix("_mlp"), view))
    ts, x = unhookable(kind)
    want = ts(x)
    before, hooks, widgets = fingerprint(ts), hook_count(ts), widget_count()
    dbg = nbdebug.debug(ts, view=view)
    with dbg:
        out = ts(x)
    assert torch.equal(out, want), "the cell's output changed"
    assert dbg.results == {} and dbg.widgets() == [], list(dbg.results)
    names = list(VIEWS) if view == "all" else [view]
    word = "TorchScript" if kind.startswith("torchscript") else "torch.export"
    for v in names:
        why = dbg.skipped.get(v, "")
        assert one_line(why) and word in why and "Error" not in why, (v, why)
        assert view == "all" or "debug the Python model" in why, why  # alone: the way out too (all: the gist)
    note = dbg.note()
    assert "\n" not in note and all(v in note for v in names), note
    assert widget_count() == widgets, "a widget was created for a view that cannot show"
    assert hook_count(ts) == hooks and same_fingerprint(before, fingerprint(ts)) == []
    record_property("note", dbg.skipped[names[0]])


def test_fx_traced_model_is_watched(record_property: Any) -> None:
    """``torch.fx.symbolic_trace`` keeps its layers as module calls: the thermometer sees every one,
    each row equal to the same MLP run eagerly."""
    import torch

    import nbdebug
    from nbdebug.capture import hook_count

    from . import models as M
    from .usercode import reference_activations

    record_property("cell", ("fx_traced", "thermometer"))
    gm = torch.fx.symbolic_trace(M.mlp())
    x = torch.randn(2, 6, generator=torch.Generator().manual_seed(3))
    acts = reference_activations(M.mlp(), lambda m: m(x))
    with nbdebug.debug(gm, view="thermometer") as dbg:
        gm(x)
    rows = dbg.result.layers
    assert [r.name for r in rows] == ["0", "1", "2"] == sorted(acts), [r.name for r in rows]
    for r in rows:
        assert r.stats["mean"] == pytest.approx(float(acts[r.name].mean()), rel=1e-5, abs=1e-7), r.name
    assert hook_count(gm) == 0
    for w in dbg.widgets():
        w.close()


def test_hf_trainer(shell: Any, tmp_path: Any, record_property: Any) -> None:
    """``%%nndebug model`` around ``trainer.train()`` (transformers' Trainer, gradient accumulation, an
    evaluation): one step per training forward, each step's loss and row mean equal to the same run
    without nbdebug, the update ratio only where the optimizer stepped, the evaluation kept out, the
    trained model and the hooks as without nbdebug."""
    pytest.importorskip("transformers")
    import numpy as np

    from nbdebug.capture import fingerprint, hook_count, same_fingerprint
    from nbdebug.capture.hooks import optimizer_hook_count

    from . import trainers as TR

    record_property("cell", ("hf_trainer", "thermometer"))
    ref, meas = TR.reference(tmp_path / "ref")
    n = TR.STEPS * TR.ACCUM
    assert len(meas["loss"]) == len(meas["mean"]) == n, meas  # the premise: one grad-enabled forward per micro-batch
    model = TR.gpt2()
    shell.user_ns.update(model=model, trainer=TR.trainer(model, tmp_path / "run"))
    hooks, opt_hooks = hook_count(model), optimizer_hook_count()
    r = shell.run_cell("%%nndebug model -o run\ntrainer.train()")
    assert r.success, r.error_in_exec
    assert hook_count(model) == hooks and optimizer_hook_count() == opt_hooks
    assert same_fingerprint(fingerprint(ref), fingerprint(model)) == [], "the trained model differs from the run without nbdebug"
    run = shell.user_ns["run"]
    assert run.steps == n and run.step_index.tolist() == list(range(1, n + 1)) and run.eval_steps == 1, (run.steps, run.eval_steps)
    np.testing.assert_allclose(run.series("loss"), meas["loss"], rtol=1e-6)
    np.testing.assert_allclose(run.series(TR.ROW, "mean"), meas["mean"], rtol=1e-5, atol=1e-7)
    ratio = run.series(TR.ROW, "update_ratio")  # the optimizer steps after every ACCUM-th forward
    stepped = np.arange(1, n + 1) % TR.ACCUM == 0
    assert np.isfinite(ratio[stepped]).all() and (ratio[stepped] > 0).all() and np.isnan(ratio[~stepped]).all(), ratio
    w = shell.user_ns["_nndebug_widget"]
    assert (w.steps, w.running) == (n, False)
    shown = {d["application/vnd.jupyter.widget-view+json"]["model_id"] for d in shell.displayed
             if "application/vnd.jupyter.widget-view+json" in d}
    assert shown == {w.model_id}, shown  # the live view, refreshed in place at the end
    w.close()


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*")  # lightning's own use of a deprecated torch name
def test_lightning_fit(shell: Any, record_property: Any) -> None:
    """``%%nndebug module`` around Lightning's ``trainer.fit`` (``training_step`` calls the submodules,
    the module's own forward never runs; a sanity check and validation under ``inference_mode``): one
    step per ``training_step``, the encoder's mean per step equal to what the module measured itself,
    validation kept out, the trained module and the hooks as in the same fit without nbdebug."""
    pytest.importorskip("lightning")
    import logging

    import numpy as np

    from nbdebug.capture import fingerprint, hook_count, same_fingerprint
    from nbdebug.capture.hooks import optimizer_hook_count

    from . import trainers as TR

    record_property("cell", ("lightning", "thermometer"))
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # "GPU available: False" and tips
    ref = TR.lit_module()
    TR.lit_fit(ref)
    module = TR.lit_module()
    shell.user_ns.update(module=module, TR=TR)
    hooks, opt_hooks = hook_count(module), optimizer_hook_count()
    r = shell.run_cell("%%nndebug module -o run\ntrainer = TR.lit_fit(module)")
    assert r.success, r.error_in_exec
    assert shell.user_ns["trainer"].global_step == TR.LIT_STEPS
    assert hook_count(module) == hooks and optimizer_hook_count() == opt_hooks
    assert same_fingerprint(fingerprint(ref), fingerprint(module)) == [], "the trained module differs from the fit without nbdebug"
    assert module.enc_means == ref.enc_means and len(ref.enc_means) == TR.LIT_STEPS
    run = shell.user_ns["run"]
    assert run.steps == TR.LIT_STEPS and run.step_index.tolist() == list(range(1, TR.LIT_STEPS + 1))
    assert run.eval_steps == 1 + TR.LIT_STEPS // TR.LIT_VAL_EVERY, run.eval_steps  # the sanity check and each validation
    assert run["encoder.0"].calls == TR.LIT_STEPS and not any("#" in row.name for row in run.layers)
    np.testing.assert_allclose(run.series("encoder.2", "mean"), ref.enc_means, rtol=1e-5, atol=1e-7)
    assert np.isfinite(run.series("decoder.2", "update_ratio")).all()
    shell.user_ns["_nndebug_widget"].close()


@pytest.mark.parametrize("stop_at", [None, 25], ids=["whole", "interrupted"])
def test_eval_loop(stop_at: int | None, record_property: Any) -> None:
    """An evaluation cell: ``model.eval()`` and a loop over batches under ``torch.no_grad()`` (no
    training in the cell): each forward is a step of the history, each step's row means equal that
    batch's own (plain hooks on a copy), the outputs and the model as without nbdebug. 40 batches: held
    back until 16 say it is an inference cell, then folded in batches (capture/batch.py). Interrupted
    (Ctrl-C after batch 25, 9 of its steps still held back): every batch that ran is kept."""
    import copy

    import numpy as np
    import torch

    import nbdebug
    from nbdebug.capture import fingerprint, hook_count, same_fingerprint

    from . import models as M
    from .usercode import reference_activations

    record_property("cell", ("eval_loop" if stop_at is None else "eval_loop_interrupt", "thermometer"))
    model = M.tiny_cnn().eval()
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(*M.IMAGE_SHAPE, generator=g) for _ in range(40)]
    ran = xs if stop_at is None else xs[:stop_at]
    ref = copy.deepcopy(model)
    acts = [reference_activations(ref, lambda m, x=x: m(x)) for x in ran]
    with torch.no_grad():
        want = [ref(x) for x in ran]
    outs: list[torch.Tensor] = []
    try:
        with nbdebug.debug(model, view="thermometer") as dbg, torch.no_grad():
            for i, x in enumerate(xs):
                outs.append(model(x))
                if i + 1 == stop_at:
                    raise KeyboardInterrupt("stopped by the user mid-loop")
    except KeyboardInterrupt:
        assert stop_at is not None
    assert all(torch.equal(a, b) for a, b in zip(outs, want, strict=True)), "the cell's outputs changed"
    res = dbg.result
    assert [r.name for r in res.layers] == M.CNN_ROWS
    assert res.steps == len(ran) and res.step_index.tolist() == list(range(1, len(ran) + 1)) and res.eval_steps == 0
    for row in M.CNN_ROWS:
        np.testing.assert_allclose(res.series(row, "mean"), [float(a[row].mean()) for a in acts], rtol=1e-5, atol=1e-7, err_msg=row)
    assert hook_count(model) == 0 and same_fingerprint(fingerprint(ref), fingerprint(model)) == []
    for w in dbg.widgets():
        w.close()


class _ScriptedInside:
    """A Python model with a TorchScript block inside (``torch.jit.script`` of a Linear-ReLU): ``a → act → b``."""

    @staticmethod
    def build() -> Any:
        import warnings

        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.a = nn.Linear(4, 8)
                with warnings.catch_warnings():  # torch.jit is deprecated in favour of torch.export / torch.compile
                    warnings.simplefilter("ignore", DeprecationWarning)
                    self.act = torch.jit.script(nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
                self.b = nn.Linear(8, 2)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.b(self.act(self.a(x)))

        torch.manual_seed(0)
        return Net()


def test_scripted_submodule(record_property: Any) -> None:
    """A TorchScript block inside a Python model: the thermometer shows the Python layers around it
    (``a``, ``b``), each equal to a plain-hook run, and leaves the model as it was."""
    import torch

    import nbdebug
    from nbdebug.capture import fingerprint, hook_count, same_fingerprint

    record_property("cell", ("script_child", "thermometer"))
    model = _ScriptedInside.build()
    ref = _ScriptedInside.build()  # not deepcopy: copying a ScriptModule makes its parameters non-leaf clones
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(3))
    want = {n: ref.get_submodule(n)(inp) for n, inp in (("a", x),)}
    want["b"] = ref(x)
    with nbdebug.debug(model, view="thermometer") as dbg:
        out = model(x)
    ref_out = ref(x)
    assert torch.equal(out, ref_out)
    assert hook_count(model) == 0 and same_fingerprint(fingerprint(ref), fingerprint(model)) == []
    assert "thermometer" in dbg.results, dbg.skipped
    res = dbg.result
    assert [r.name for r in res.layers] == ["a", "b"], [r.name for r in res.layers]
    for name, t in want.items():
        assert res[name].stats["mean"] == pytest.approx(float(t.detach().mean()), rel=1e-5, abs=1e-7), name
