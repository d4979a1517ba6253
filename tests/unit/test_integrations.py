"""Where training already lives: nbdebug.TrainerCallback (transformers.Trainer) and
nbdebug.LightningCallback, on tiny random-init models on the CPU (nothing downloaded)."""

from __future__ import annotations

import gc
import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from nbdebug.capture.hooks import hook_count
from nbdebug.testing import TokenDataset as _Tokens
from nbdebug.testing import lit_autoencoder
from nbdebug.testing import tiny_gpt2 as _gpt2

STEPS = 6
LR = 1e-3


# -- import weight ------------------------------------------------------------------------------
@pytest.mark.slow
def test_import_stays_light() -> None:
    """`import nbdebug`, the callbacks' names and `%load_ext nbdebug` import no framework or exporter."""
    code = (
        "import sys, nbdebug\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "assert InteractiveShell.instance().run_cell('%load_ext nbdebug').success\n"
        "nbdebug.TrainerCallback, nbdebug.LightningCallback\n"
        "import nbdebug.integrations.hf, nbdebug.integrations.lightning\n"
        "print(sorted(m for m in ('transformers', 'pandas', 'lightning', 'pytorch_lightning', 'tensorboard', 'accelerate') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_lazy_names_resolve() -> None:
    import nbdebug
    from nbdebug.integrations.hf import TrainerCallback
    from nbdebug.integrations.lightning import LightningCallback

    assert nbdebug.TrainerCallback is TrainerCallback
    assert nbdebug.LightningCallback is LightningCallback
    assert {"TrainerCallback", "LightningCallback", "doctor", "DoctorReport", "NonFiniteError"} <= set(nbdebug.__all__)
    from nbdebug.capture.incidents import NonFiniteError
    from nbdebug.doctor import DoctorReport

    assert nbdebug.NonFiniteError is NonFiniteError and issubclass(NonFiniteError, FloatingPointError)
    assert nbdebug.DoctorReport is DoctorReport and callable(nbdebug.doctor)


# -- Hugging Face Trainer ----------------------------------------------------------------------
transformers = pytest.importorskip("transformers")


class _Logs(transformers.TrainerCallback):
    """The Trainer's own logged training loss per optimizer step."""

    def __init__(self) -> None:
        self.loss: dict[int, float] = {}

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
        if logs and "loss" in logs:
            self.loss[state.global_step] = float(logs["loss"])


def _trainer(model: nn.Module, tmp_path: Any, callbacks: list, steps: int = STEPS, accumulate: int = 2) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, per_device_eval_batch_size=8,
        gradient_accumulation_steps=accumulate, max_steps=steps, eval_strategy="steps", eval_steps=3,
        logging_steps=1, learning_rate=LR, report_to=[], use_cpu=True, save_strategy="no",
        disable_tqdm=True, seed=0, dataloader_num_workers=0,
    )
    return transformers.Trainer(model=model, args=args, train_dataset=_Tokens(64, 1),
                                eval_dataset=_Tokens(8, 2), callbacks=callbacks)


def test_trainer_callback_is_a_transformers_callback() -> None:
    import nbdebug

    cb = nbdebug.TrainerCallback(live=False)
    assert isinstance(cb, transformers.TrainerCallback) and isinstance(cb, nbdebug.TrainerCallback)
    assert cb.result is None and not cb.running


@pytest.mark.slow
def test_trainer_callback_one_step_per_optimizer_step(tmp_path: Any) -> None:
    """6 optimizer steps × 2 micro-batches, evaluations after steps 3 and 6: 6 steps, eval kept out,
    the Trainer's own loss and learning rate per step, and every hook gone afterwards."""
    import nbdebug

    model = _gpt2()
    own = hook_count(model)
    cb, logs = nbdebug.TrainerCallback(live=False), _Logs()
    _trainer(model, tmp_path, [cb, logs]).train()
    res = cb.result
    assert not cb.running and hook_count(model) == own
    assert res.steps == STEPS
    assert res.step_index.tolist() == list(range(1, STEPS + 1))
    assert res.eval_steps == 2  # one eval batch after step 3 and one after step 6
    # the linear schedule's lr while optimizer step k ran (the Trainer logs the one after it)
    lr = res.series("lr")
    assert np.allclose(lr, [LR * (STEPS - k + 1) / STEPS for k in range(1, STEPS + 1)], rtol=1e-6), lr
    # nbdebug's step loss is the mean of the micro-batches' own `.loss`; GPT-2 divides each
    # micro-batch's token-loss sum by the tokens of the whole accumulated step, and the Trainer logs
    # their sum: exactly 2× here (equal without accumulation: the next test)
    loss = res.series("loss")
    assert np.allclose(2 * loss, [logs.loss[k] for k in range(1, STEPS + 1)], rtol=1e-5), (loss, logs.loss)
    first = res.layers[0].name
    for field in ("mean", "std", "norm", "grad_norm"):
        s = res.series(first, field)
        assert s.shape == (STEPS,) and np.isfinite(s).all(), (field, s)
    assert res.first_nonfinite_step is None and res.incident is None
    assert cb.widget is not None


@pytest.mark.slow
def test_trainer_callback_loss_equals_the_trainers_every_2(tmp_path: Any) -> None:
    """Without gradient accumulation the step's loss is the Trainer's logged loss; `every=2` keeps
    steps 1, 3, 5 and the last one."""
    import nbdebug

    model = _gpt2()
    cb, logs = nbdebug.TrainerCallback(every=2, live=False), _Logs()
    _trainer(model, tmp_path, [cb, logs], accumulate=1).train()
    res = cb.result
    assert res.steps == STEPS and res.every == 2
    assert res.step_index.tolist() == [1, 3, 5, 6]
    assert np.allclose(res.series("loss"), [logs.loss[k] for k in (1, 3, 5, 6)], rtol=1e-5), (res.series("loss"), logs.loss)


@pytest.mark.slow
def test_trainer_callback_shows_the_live_view_once(shell: Any, tmp_path: Any) -> None:
    """In IPython the live thermometer is displayed when training starts and refreshed in place at
    the end (one widget); `cb.widget` is that widget, with its final state."""
    import nbdebug

    model = _gpt2()
    cb = nbdebug.TrainerCallback()
    shell.user_ns.update(trainer=_trainer(model, tmp_path, [cb], steps=3))
    assert shell.run_cell("trainer.train()").success
    views = [d["application/vnd.jupyter.widget-view+json"]["model_id"] for d in shell.displayed
             if "application/vnd.jupyter.widget-view+json" in d]
    assert views and set(views) == {cb.widget.model_id}
    assert cb.result.steps == 3 and not cb.widget.running


@pytest.mark.slow
def test_trainer_callback_does_not_change_the_run(tmp_path: Any) -> None:
    """The same training with and without the callback ends with bit-identical parameters."""
    import nbdebug

    ref = _gpt2()
    _trainer(ref, tmp_path / "ref", []).train()
    model = _gpt2()
    _trainer(model, tmp_path / "cb", [nbdebug.TrainerCallback(live=False)]).train()
    a, b = ref.state_dict(), model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


class _Boom(transformers.TrainerCallback):
    def __init__(self, exc: type[BaseException] = RuntimeError) -> None:
        self.exc = exc

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == 3:
            raise self.exc("boom at step 3")


@pytest.mark.slow
def test_trainer_exception_then_close_then_second_run(tmp_path: Any) -> None:
    """Trainer calls no callback when train() raises: the capture stays open until cb.close();
    the same callback then watches a second train() from scratch."""
    import nbdebug

    model = _gpt2()
    own = hook_count(model)
    cb = nbdebug.TrainerCallback(live=False)
    with pytest.raises(RuntimeError, match="boom at step 3"):
        _trainer(model, tmp_path / "a", [cb, _Boom()]).train()
    assert cb.running and hook_count(model) > own
    cb.close()
    assert not cb.running and hook_count(model) == own
    assert cb.result.steps == 3
    _trainer(model, tmp_path / "b", [cb]).train()
    assert cb.result.steps == STEPS and hook_count(model) == own


@pytest.mark.slow
def test_trainer_second_run_closes_a_run_left_open(tmp_path: Any) -> None:
    import nbdebug

    model = _gpt2()
    own = hook_count(model)
    cb = nbdebug.TrainerCallback(live=False)
    with pytest.raises(RuntimeError):
        _trainer(model, tmp_path / "a", [cb, _Boom()]).train()
    _trainer(model, tmp_path / "b", [cb]).train()  # on_train_begin closes the first run
    assert cb.result.steps == STEPS and hook_count(model) == own


@pytest.mark.slow
@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_trainer_exception_in_a_cell_removes_hooks_when_the_cell_ends(shell: Any, tmp_path: Any, exc: type) -> None:
    """In IPython the capture closes when the cell that raised (or was interrupted) ends
    (post_run_cell), with what it recorded, and stops listening to cells."""
    import nbdebug

    model = _gpt2()
    own = hook_count(model)
    cb = nbdebug.TrainerCallback(live=False)
    listeners = len(shell.events.callbacks["post_run_cell"])
    shell.user_ns.update(trainer=_trainer(model, tmp_path, [cb, _Boom(exc)]))
    res = shell.run_cell("trainer.train()")
    assert type(res.error_in_exec) is exc
    assert not cb.running and hook_count(model) == own
    assert cb.result.steps == 3
    assert len(shell.events.callbacks["post_run_cell"]) == listeners


@pytest.mark.slow
def test_trainer_exception_then_garbage_collected(tmp_path: Any) -> None:
    """Neither close() nor a cell end: dropping the callback and its Trainer removes the hooks."""
    import nbdebug

    model = _gpt2()
    own = hook_count(model)
    cb = nbdebug.TrainerCallback(live=False)
    trainer = _trainer(model, tmp_path, [cb, _Boom()])
    try:
        trainer.train()
    except RuntimeError:
        pass
    assert hook_count(model) > own
    del cb, trainer
    gc.collect()
    assert hook_count(model) == own


# -- PyTorch Lightning ---------------------------------------------------------------------------
def _lightning_module() -> Any:
    L = pytest.importorskip("lightning.pytorch")
    import torch.nn.functional as F

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
            self.losses: list[torch.Tensor] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.losses.append(loss.detach())
            return loss

        def validation_step(self, batch: Any, i: int) -> None:
            x, y = batch
            self.log("val_loss", F.cross_entropy(self(x), y))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    return L, Tiny()


def _loader() -> Any:
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=4)


def _fit(L: Any, module: Any, callbacks: list) -> Any:
    trainer = L.Trainer(max_steps=STEPS, accumulate_grad_batches=2, val_check_interval=6, limit_val_batches=2,
                        num_sanity_val_steps=2, callbacks=callbacks, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(module, _loader(), _loader())
    return trainer


@pytest.mark.slow
def test_lightning_callback_one_step_per_optimizer_step() -> None:
    import nbdebug

    L, module = _lightning_module()
    own = hook_count(module)
    cb = nbdebug.LightningCallback(live=False)
    assert isinstance(cb, L.Callback)
    trainer = _fit(L, module, [cb])
    res = cb.result
    assert trainer.global_step == STEPS and hook_count(module) == own
    assert res.steps == STEPS and res.step_index.tolist() == list(range(1, STEPS + 1))
    assert res.eval_steps == 4  # two validation batches after 6 and after 12 micro-batches (sanity check not watched)
    assert np.allclose(res.series("lr"), 0.1)
    per_batch = torch.stack(module.losses).reshape(STEPS, 2).mean(1).numpy()  # the step's micro-batches
    assert np.allclose(res.series("loss"), per_batch, rtol=1e-6), (res.series("loss"), per_batch)
    for field in ("mean", "grad_norm", "update_ratio"):
        assert np.isfinite(res.series("net.0", field)).all(), field
    assert not math.isnan(res.series("net.2", "param_grad_norm")[-1])


@pytest.mark.slow
def test_lightning_training_step_calling_submodules_one_step_per_optimizer_step() -> None:
    """LitAutoEncoder-shaped: ``training_step`` calls ``self.decoder(self.encoder(x))`` (the module's own
    forward never runs); validation (inference_mode) after every 4 steps is evaluation, not steps."""
    L = pytest.importorskip("lightning.pytorch")
    import nbdebug

    module = lit_autoencoder()
    own = hook_count(module)
    cb = nbdebug.LightningCallback(live=False)
    steps = 12
    trainer = L.Trainer(max_steps=steps, val_check_interval=4, limit_val_batches=1, num_sanity_val_steps=1,
                        callbacks=[cb], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(module, _loader(), _loader())
    res = cb.result
    assert trainer.global_step == steps and hook_count(module) == own
    assert res.steps == steps and res.step_index.tolist() == list(range(1, steps + 1))
    assert res.eval_steps == steps // 4  # one validation batch after 4, 8 and 12 steps (sanity check not watched)
    assert res["encoder.0"].calls == steps and not any("#" in r.name for r in res.layers)
    assert np.allclose(res.series("loss"), torch.stack(module.losses).numpy(), rtol=1e-6)
    assert np.allclose(res.series("encoder.2", "mean"), module.enc_means, rtol=1e-5, atol=1e-7)
    assert np.isfinite(res.series("decoder.2", "grad_norm")).all()


@pytest.mark.slow
def test_lightning_exception_closes_the_capture() -> None:
    import nbdebug

    L, module = _lightning_module()
    own = hook_count(module)

    class Boom(L.Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, *a: Any) -> None:
            if trainer.global_step == 2:
                raise RuntimeError("boom")

    cb = nbdebug.LightningCallback(live=False)
    with pytest.raises(RuntimeError, match="boom"):
        _fit(L, module, [cb, Boom()])
    assert not cb.running and hook_count(module) == own
    assert cb.result.steps == 2


@pytest.mark.slow
def test_trainer_callback_holds_the_model_weakly(tmp_path: Any) -> None:
    """After training, the callback (its result and widget) does not keep the model alive."""
    import weakref

    import nbdebug

    model = _gpt2()
    ref = weakref.ref(model)
    cb = nbdebug.TrainerCallback(live=False)
    trainer = _trainer(model, tmp_path, [cb], steps=2)
    trainer.train()
    assert cb.result.steps == 2 and cb.widget is not None
    del trainer, model
    gc.collect()
    assert ref() is None
    assert cb.result.series("loss").shape == (2,)  # the data stays


def test_unwrap_data_parallel() -> None:
    from nbdebug.integrations._watch import unwrap

    m = nn.Linear(2, 2)
    assert unwrap(m) is m and unwrap(nn.DataParallel(m)) is m
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        unwrap(object())


def test_watch_says_why_when_building_the_widget_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error from dbg.widget() other than 'the view did not apply' becomes cb.note, not silence."""
    from nbdebug.api import Debug
    from nbdebug.integrations._watch import TrainingWatch

    def broken(self: Any) -> Any:
        raise RuntimeError("widget exploded")

    monkeypatch.setattr(Debug, "widget", broken)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cb = TrainingWatch("thermometer", live=False)
    cb.start(model)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 3)).square().mean().backward()
        opt.step()
    cb.stop()
    assert not cb.running and hook_count(model) == 0
    assert cb.widget is None and cb.note == "RuntimeError: widget exploded"
    assert cb.result is not None and cb.result.steps == 2  # the data is kept all the same


def test_watch_says_why_when_telling_it_the_run_closed_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """_Open.close removes the hooks even when the watch's _closed raises, and says what failed."""
    from nbdebug.integrations._watch import TrainingWatch

    def broken(self: Any, dbg: Any) -> None:
        raise ValueError("closing went wrong")

    monkeypatch.setattr(TrainingWatch, "_closed", broken)
    model = nn.Sequential(nn.Linear(3, 2))
    cb = TrainingWatch("thermometer", live=False)
    cb.start(model)
    cb.stop()
    assert hook_count(model) == 0 and cb.note == "ValueError: closing went wrong"
