"""Loops without gradients fold their steps in batches (capture/batch.py) on every stats path: the fused
native kernel (float32 CPU tensors), the torch/numpy path (``NBDEBUG_NATIVE=0``, run by ``make test``)
and the torch path of the dtypes the kernel does not take (bfloat16, float16). The history equals the
step-by-step fold either way (test_batch_fold.py); this is about the batched path being taken.

Found by running the unit tier with ``NBDEBUG_NATIVE=0`` (issue 19): the dead-unit mask of a tensor the
kernel does not take (inference tensors on the numpy path, half precision) came back as a torch tensor,
and the step close then never let such a step wait in the batch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import nbdebug.capture.batch as batch
from nbdebug.capture import native
from nbdebug.capture.session import Capture


@pytest.fixture(params=["native", "numpy"])
def stats_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The kernel as the environment has it ("native"), or switched off ("numpy")."""
    if request.param == "native" and os.environ.get("NBDEBUG_NATIVE", "1") == "0":
        pytest.skip("NBDEBUG_NATIVE=0 in the environment")
    if request.param == "numpy":
        monkeypatch.setenv("NBDEBUG_NATIVE", "0")
    native._reset()
    yield request.param
    monkeypatch.undo()
    native._reset()


def folded_rows(dtype: torch.dtype, ctx: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """(steps, rows folded in batches) of a 100-step loop without gradients on a 3-layer MLP."""
    folds: list[int] = []
    real = batch.step_values
    monkeypatch.setattr(batch, "step_values", lambda rg, *a: (folds.append(rg.shape[0]), real(rg, *a))[1])
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).to(dtype)
    g = torch.Generator().manual_seed(1)
    with Capture(m) as cap:
        for _ in range(100):
            with ctx():
                m(torch.randn(4, 6, generator=g).to(dtype))
    return cap.result.steps, sum(folds)


CASES = [(torch.float32, "no_grad"), (torch.float32, "inference_mode"), (torch.bfloat16, "no_grad"),
         (torch.bfloat16, "inference_mode"), (torch.float16, "no_grad")]


@pytest.mark.parametrize(("dtype", "mode"), CASES, ids=[f"{str(d)[6:]}-{m}" for d, m in CASES])
def test_a_loop_without_gradients_folds_in_batches(dtype: torch.dtype, mode: str, stats_path: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    steps, rows = folded_rows(dtype, getattr(torch, mode), monkeypatch)
    assert steps == 100
    # 3 rows a step: held back for 16 steps (the first folded alone), then in batches: most steps in batches
    assert rows >= 3 * 80, f"{rows // 3} of 100 steps folded in batches"
