"""The output/input findings of issue 26 (``nbdebug.inspectors.run_findings``), each run for real on a
small model under ``nbdebug.debug``: the planted fault is named by its code, its healthy twin (the same
model and data without the mistake) gets no warning or error at all."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nbdebug
from tests.unit.test_findings_loop import C, D, linear_labels


def _mlp(d_out: int = C, *tail: nn.Module, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, d_out), *tail)


def _run(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable[..., torch.Tensor],
         steps: int = 60, lr: float = 1e-2, bs: int = 64) -> Any:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with nbdebug.debug(model) as dbg:
        for i in range(steps):
            j = (i * bs) % len(x)
            opt.zero_grad()
            loss_fn(model(x[j:j + bs]), y[j:j + bs]).backward()
            opt.step()
    return dbg.result


def _serious(res: Any) -> list[str]:
    return [f.code for f in res.findings if f.severity != "note"]


# -- loss_at_chance: labels shuffled apart from the inputs vs the matching labels ----------------------
@pytest.mark.parametrize("faulty", [True, False])
def test_labels_shuffled_apart_stay_at_chance_and_matching_labels_do_not(faulty: bool) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(60 * 64, D, generator=g)  # a fresh batch every step (an epoch of 60 steps: nothing to memorise)
    y = (x @ torch.randn(D, C, generator=g)).argmax(1)
    if faulty:  # balanced labels (chance is then ln C) dealt out apart from the inputs
        y = (torch.arange(len(x)) % C)[torch.randperm(len(x), generator=g)]
    res = _run(_mlp(), x, y, F.cross_entropy, steps=60, lr=1e-3)
    if faulty:
        assert _serious(res)[:1] == ["loss_at_chance"], res.findings
        f = res.findings[0]
        assert f.rows == ("2",) and f"ln {C} = {math.log(C):.3g}" in f.text and "labels shuffled apart" in f.detail
    else:
        assert _serious(res) == [], res.findings


def test_a_healthy_cnn_on_its_first_plateau_is_a_note_and_the_same_labels_shuffled_stay_a_warning() -> None:
    """README's digits CNN (SGD lr=0.05 + momentum) is still at ln 10 after 20 steps and learns by step
    ~45: 20 steps at chance is a note (too early to tell); shuffled labels over 60 steps stay a warning."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)

    def cnn_run(labels: torch.Tensor, steps: int) -> Any:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                              nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        with nbdebug.debug(model) as dbg:
            for _ in range(steps):
                idx = torch.randint(0, 1500, (64,))
                loss = F.cross_entropy(model(x[idx]), labels[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        return dbg.result

    early = cnn_run(y, 20)
    assert _serious(early) == [], early.findings
    note = [f for f in early.findings if f.code == "loss_at_chance"]
    assert note and note[0].severity == "note" and "too early to tell" in note[0].text
    assert "no problems found" in early.headline
    shuffled = cnn_run(y[torch.randperm(len(y), generator=torch.Generator().manual_seed(3))], 60)
    assert _serious(shuffled)[:1] == ["loss_at_chance"], shuffled.findings


# -- output_loss_mismatch: what the model outputs is not what the loss expects --------------------------
def _bce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(out, (y % 2).float().unsqueeze(1))


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, y.float().unsqueeze(1) - 1.5)  # targets −1.5 … 1.5: half of them below 0


@pytest.mark.parametrize(("tail", "d_out", "loss_fn", "words"), [
    (nn.Softmax(dim=1), C, F.cross_entropy, "softmax applied twice?"),
    (nn.Sigmoid(), 1, _bce, "sigmoid applied twice?"),
    (nn.ReLU(), 1, _mse, "ends in a ReLU"),
], ids=["double_softmax", "sigmoid_before_bce_logits", "relu_on_regression"])
@pytest.mark.parametrize("faulty", [True, False])
def test_an_output_the_loss_cannot_use_is_named_and_its_twin_is_quiet(tail: nn.Module, d_out: int, loss_fn: Any,
                                                                     words: str, faulty: bool) -> None:
    x, y = linear_labels()
    m = _mlp(d_out, *([tail] if faulty else []))
    res = _run(m, x, y, loss_fn, steps=80)
    if faulty:
        assert _serious(res)[:1] == ["output_loss_mismatch"], res.findings
        assert res.findings[0].rows == ("3",) and words in res.findings[0].text
    else:
        assert _serious(res) == [], res.findings


# -- input_scale: raw inputs far outside the usual scale vs normalised ones ------------------------------
@pytest.mark.parametrize("scale", [255.0, 1.0])
def test_raw_inputs_are_named_at_the_first_step_and_normalised_ones_are_not(scale: float) -> None:
    x, y = linear_labels()
    res = _run(_mlp(), x * scale, y, F.cross_entropy, steps=20, lr=1e-3)
    codes = [f.code for f in res.findings]
    if scale > 1:
        assert "input_scale" in codes and _serious(res)[0] == "input_scale", res.findings
        f = next(f for f in res.findings if f.code == "input_scale")
        assert f.step == 1 and f.rows == ("0",) and "the first layer `0` outputs values of std" in f.text
    else:
        assert "input_scale" not in codes and _serious(res) == [], res.findings


# -- batch_mixed: (log-)softmax over the batch dimension vs over the classes ------------------------------
@pytest.mark.parametrize("kind", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("dim", [0, 1])
def test_softmax_over_the_batch_is_named_and_over_the_classes_is_not(kind: str, dim: int) -> None:
    x, y = linear_labels()
    m = _mlp(C, getattr(nn, kind)(dim=dim))

    def loss_fn(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(out if kind == "LogSoftmax" else torch.log(out + 1e-8), t)

    res = _run(m, x, y, loss_fn, steps=30, lr=1e-3)
    codes = [f.code for f in res.findings]
    if dim == 0:
        assert _serious(res)[:1] == ["batch_mixed"], res.findings
        f = res.findings[0]
        assert f.rows == ("3",) and f.step == 1 and "over the batch" in f.text and "64" in f.text
    else:
        assert "batch_mixed" not in codes, res.findings
