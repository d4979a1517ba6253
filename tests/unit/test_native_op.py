"""The host statistics while TorchDynamo traces (``nbdebug/capture/native_op.py``, issue 19): one custom
op ``nbdebug::host_stats`` in the graph, values equal to the eager calls bit for bit, nothing added to
the eager calls, and the registration made without importing ``torch._dynamo`` ourselves."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
import torch._dynamo

from nbdebug.capture import native, native_op
from nbdebug.capture.stats import stats_and_units, tensor_stats, unit_alive

REPO = Path(__file__).resolve().parents[2]

ENV_OFF = os.environ.get("NBDEBUG_NATIVE", "1") == "0"
#: the kernel as the environment has it (skipped under NBDEBUG_NATIVE=0), and its numpy/torch fallback
KERNELS = [pytest.param(True, id="native", marks=pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")),
           pytest.param(False, id="fallback")]


@contextmanager
def _kernel(on: bool) -> Iterator[None]:
    """The native kernel (as the environment has it) or its numpy/torch fallback (NBDEBUG_NATIVE=0)."""
    saved = os.environ.get("NBDEBUG_NATIVE")
    if not on:
        os.environ["NBDEBUG_NATIVE"] = "0"
    native._reset()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("NBDEBUG_NATIVE", None)
        else:
            os.environ["NBDEBUG_NATIVE"] = saved
        native._reset()


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, 4, 3, generator=g)
    t = torch.randn(7, 9, generator=g).relu()
    t[:, 2] = 0.0  # a dead unit
    big = torch.randn(300, 256, generator=g)  # >= GIL_MAX elements: the ctypes path eagerly
    big[:, 7] = -0.0
    odd = torch.randn(5, 4, generator=g)
    odd[1, 1], odd[2, 3], odd[0, 0] = float("nan"), float("inf"), 1.0
    return {
        "relu": t, "4d": x, "big": big, "nonfinite": odd, "transposed": t.t(), "channels_last": x.to(memory_format=torch.channels_last),
        "sliced": x[:, 1:3], "float64": x.double(), "bf16": x.bfloat16(), "empty": torch.zeros(0, 4), "scalar": torch.tensor(0.5),
        "tanh": torch.randn(64, 8, generator=g).mul(4).tanh(),
    }


def _calls(t: torch.Tensor) -> tuple[object, ...]:
    """Every host entry point of stats.py on ``t``, with and without saturation bounds."""
    return (tensor_stats(t), tensor_stats(t, saturation=(-1.0, 1.0), sat_eps=0.01),
            *stats_and_units(t, saturation=(-1.0, 1.0), units=True), *stats_and_units(t), unit_alive(t))


def _equal(got: object, want: object, what: str) -> None:
    """Bit for bit (NaN and -0.0 included); a unit mask the eager call gave as None (every unit
    alive) is all True when traced, and a torch mask is a numpy one."""
    if want is None:
        assert got is None or (isinstance(got, np.ndarray) and got.dtype == bool and got.all()), (what, got)
        return
    if isinstance(want, torch.Tensor):
        want = want.numpy()
    assert isinstance(got, np.ndarray) and isinstance(want, np.ndarray), (what, type(got), type(want))
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (what, got, want)


class _Graphs:
    """``backend="eager"`` keeping every graph it was given."""

    def __init__(self) -> None:
        self.graphs: list[str] = []

    def __call__(self, gm: torch.fx.GraphModule, _example: object) -> Callable[..., object]:
        self.graphs.append(str(gm.graph))
        return gm.forward


@pytest.mark.parametrize("kernel", KERNELS)
def test_traced_calls_are_one_op_each_and_equal_the_eager_calls(kernel: bool) -> None:
    """``fullgraph=True``: any graph break in stats.py/native.py fails; each of the six calls is one op."""
    with _kernel(kernel):
        assert native.available() is kernel
        for name, t in _tensors().items():
            torch._dynamo.reset()
            backend = _Graphs()
            traced = torch.compile(_calls, backend=backend, fullgraph=True)(t)
            want = _calls(t)
            for i, (g, w) in enumerate(zip(traced, want)):
                _equal(g, w, f"{name} [{i}]")
            ops = sum(gr.count("torch.ops.nbdebug.host_stats") for gr in backend.graphs)
            assert ops == (5 if t.dim() >= 2 and t.numel() else 4), (name, ops, backend.graphs)  # unit_alive: None before any op
    torch._dynamo.reset()


@pytest.mark.parametrize("kernel", KERNELS)
def test_eager_calls_never_take_the_op(kernel: bool) -> None:
    """With the op registered, eager calls still run the kernel's C entry point (no torch op at all)
    or the numpy/torch path: the dispatcher never sees nbdebug::host_stats."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with _kernel(kernel):
        assert native.available() is kernel and native_op.status().startswith("registered"), native_op.status()
        small = _tensors()["relu"]
        with Ops() as spy:
            for t in _tensors().values():
                _calls(t)
        assert not [op for op in spy.ops if "nbdebug" in op], spy.ops
        with Ops() as spy:
            _calls(small)
        assert (spy.ops == []) is kernel, spy.ops  # the C entry point: no torch op (the fallback: torch ops)
        if kernel:
            assert type(native._fast_stats).__name__ == "builtin_function_or_method"


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_registered_when_dynamo_is_imported_later_and_never_imported_by_us() -> None:
    out = _run("""
import sys, torch
from nbdebug.capture import native, native_op, stats
stats.tensor_stats(torch.ones(3, 2))
stats.stats_and_units(torch.ones(3, 2), units=True)
assert "torch._dynamo" not in sys.modules, "imported torch._dynamo"
print(native_op.status())
import torch._dynamo.compiled_autograd  # the parent package first: registered right after it ran
print(native_op.status())
f = torch.compile(lambda x: stats.tensor_stats(x), backend="eager", fullgraph=True)
assert f(torch.ones(3, 2)).tobytes() == stats.tensor_stats(torch.ones(3, 2)).tobytes()
print(native.available(), type(sys.modules["torch._dynamo"].__spec__.loader).__name__)
""").splitlines()
    assert out[0] == "not registered (torch._dynamo not imported)", out
    n = 1 if out[2].startswith("True") else 0  # the module's stats entry point (none on the fallback)
    assert out[1] == f"registered (nbdebug::host_stats; {n} entry points declined while tracing)", out


def test_registered_when_dynamo_was_imported_first() -> None:
    out = _run("""
import torch, torch._dynamo
from nbdebug.capture import native, native_op, stats
print(native_op.status())
print(native.available())
print(native_op.status())
f = torch.compile(lambda x: stats.stats_and_units(x, units=True), backend="eager", fullgraph=True)
x = torch.randn(4, 3).relu()
row, alive = f(x)
assert row.tobytes() == stats.tensor_stats(x).tobytes()
""").splitlines()
    assert out[0] == "registered (nbdebug::host_stats; 0 entry points declined while tracing)", out
    n = 1 if out[1] == "True" else 0  # loading the kernel registers its entry point
    assert out[2] == f"registered (nbdebug::host_stats; {n} entry points declined while tracing)", out
