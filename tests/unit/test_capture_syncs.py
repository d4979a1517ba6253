"""The accelerator path run on the CPU: stats stay on the device, the host sees them a fixed number
of times per capture (not once per layer), and nothing float64 is created on the device."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from nbdebug.capture import hook_count
from nbdebug.capture.session import Capture, device_path_default
from nbdebug.capture.stats import DeviceStats, tensor_stats, to_host_rows

aten = torch.ops.aten
# Ops whose result size or value depends on the data: each one waits for the device.
_SYNC_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
             aten.unique_dim.default, aten._unique2.default, aten.bincount.default, aten.histc.default}


class DispatchSpy(TorchDispatchMode):
    """Counts data-dependent ops (also those called from C++, e.g. boolean indexing) and records
    the dtype of everything created."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: Counter[str] = Counter()
        self.dtypes: Counter[torch.dtype] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _SYNC_OPS or (func is aten.index.Tensor and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])):
            self.syncs[str(func)] += 1
        out = func(*args, **kwargs)
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.dtypes[t.dtype] += 1
        return out


_METHODS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__array__")


@contextmanager
def count_host_syncs() -> Iterator[Counter[str]]:
    """Every Python-level way of reading a tensor on the host, counted (a dispatch mode sees only
    ``item``/``bool``); ``.to("cpu")`` and ``.to(device="cpu")`` count too."""
    seen: Counter[str] = Counter()
    saved = {name: getattr(torch.Tensor, name) for name in (*_METHODS, "to")}

    def wrap(name: str) -> Any:
        orig = saved[name]

        def method(self: torch.Tensor, *a: Any, **k: Any) -> Any:
            if name != "to" or any(str(v) == "cpu" for v in (*a, *k.values()) if isinstance(v, (str, torch.device))):
                seen[name] += 1
            return orig(self, *a, **k)

        return method

    try:
        for name in saved:
            setattr(torch.Tensor, name, wrap(name))
        yield seen
    finally:
        for name, orig in saved.items():
            setattr(torch.Tensor, name, orig)


def deep(n_blocks: int) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i in range(n_blocks):
        layers += [nn.Linear(16, 16), nn.Tanh() if i % 2 else nn.ReLU(), nn.Identity()]
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(16, 2))


def captured_run(model: nn.Module, **kw: Any) -> tuple[Counter[str], Counter[str], DispatchSpy, Any]:
    x = torch.randn(4, 16)
    spy = DispatchSpy()
    with count_host_syncs() as py:
        with Capture(model, device_path=True, **kw) as cap:
            with spy:
                model(x).pow(2).mean().backward()
        exit_py = Counter(py)
    return exit_py, Counter(spy.syncs), spy, cap.result


@pytest.mark.parametrize("histograms", [False, True])
def test_host_syncs_do_not_grow_with_depth(histograms: bool) -> None:
    small, big = deep(2), deep(20)  # 8 vs 62 captured layers
    py_small, disp_small, _, res_small = captured_run(small, histograms=histograms)
    py_big, disp_big, _, res_big = captured_run(big, histograms=histograms)
    assert len(res_small.layers) == 8 and len(res_big.layers) == 62 and res_big.backward_ran
    # Nothing during the forward and backward; only the transfers at exit, the same for both depths.
    assert disp_small == disp_big == Counter()
    assert py_small == py_big
    assert sum(py_big.values()) <= 8, py_big
    assert py_big["item"] == py_big["__bool__"] == py_big["__float__"] == py_big["tolist"] == 0
    assert hook_count(big) == 0


def test_device_path_gives_the_same_result_as_the_cpu_path() -> None:
    m = deep(3)
    x = torch.randn(4, 16)
    x[0, 0] = float("nan")
    results = []
    for device_path in (False, True):
        m.zero_grad(set_to_none=True)
        with Capture(m, device_path=device_path, histograms=True) as cap:
            m(x).nansum().backward()
        results.append(cap.result)
    a, b = results
    assert [r.name for r in a.layers] == [r.name for r in b.layers]
    for ra, rb in zip(a.layers, b.layers):
        for k, v in ra.stats.items():
            assert rb.stats[k] == pytest.approx(v, rel=1e-5, abs=1e-6, nan_ok=True), (ra.name, k)
        assert (ra.grad is None) == (rb.grad is None)
        if ra.grad is not None:
            assert rb.grad["norm"] == pytest.approx(ra.grad["norm"], rel=1e-5, nan_ok=True)
        assert rb.param_grad_norm == pytest.approx(ra.param_grad_norm, rel=1e-5, nan_ok=True) if ra.param_grad_norm else rb.param_grad_norm is None
        np.testing.assert_array_equal(ra.sample, rb.sample)
        np.testing.assert_array_equal(ra.histogram[0], rb.histogram[0])
        np.testing.assert_allclose(ra.histogram[1], rb.histogram[1], rtol=1e-6)
        assert ra.external_input_nonfinite == rb.external_input_nonfinite
    assert a.forward_nonfinite_call == b.forward_nonfinite_call == (0, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_no_float64_is_created_on_the_device(dtype: torch.dtype) -> None:
    m = deep(2).to(dtype)
    spy = DispatchSpy()
    with spy, Capture(m, device_path=True, histograms=True) as cap:
        m(torch.randn(4, 16, dtype=dtype)).float().pow(2).mean().backward()
    assert torch.float64 not in spy.dtypes, spy.dtypes
    assert cap.result.backward_ran and all(r.dtype == str(dtype)[6:] for r in cap.result.layers)


def test_half_precision_stats_accumulate_in_float32_on_the_device() -> None:
    x = torch.tensor([[1.0, -1.0], [65504.0, 0.5]] * 4, dtype=torch.float16)  # fp16 sum overflows
    raw = tensor_stats(x, on_device=True)
    assert isinstance(raw, DeviceStats)
    assert raw.floats.dtype == torch.float32 and raw.counts.dtype == torch.int64
    row = to_host_rows([raw])[0]
    assert row[1] == pytest.approx(4 * (65504 + 0.5)) and row[0] == 16 and row[5] == 16
    with pytest.raises(AssertionError):
        assert torch.isfinite(x.sum())  # what summing in float16 would have given


def test_device_path_switch_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NBDEBUG_DEVICE_PATH", raising=False)
    assert not device_path_default() and not Capture(nn.Linear(1, 1)).options.device_path
    monkeypatch.setenv("NBDEBUG_DEVICE_PATH", "1")
    assert device_path_default() and Capture(nn.Linear(1, 1)).options.device_path
    assert not Capture(nn.Linear(1, 1), device_path=False).options.device_path


@pytest.mark.parametrize("device_path", [False, True])
def test_histograms_equal_numpy_over_the_finite_values(device_path: bool) -> None:
    torch.manual_seed(3)
    x = torch.randn(1000)
    x[::97] = float("nan")
    x[5] = float("inf")
    m = nn.Sequential(nn.Identity())
    with Capture(m, histograms=True, device_path=device_path) as cap:
        m(x)
    counts, edges = cap.result["0"].histogram
    fin = x[torch.isfinite(x)].numpy().astype(np.float64)
    ref, ref_edges = np.histogram(fin, bins=32, range=(fin.min(), fin.max()))
    np.testing.assert_allclose(edges, ref_edges, rtol=1e-6)
    np.testing.assert_array_equal(counts, ref)
    assert counts.sum() == fin.size == 1000 - 11 - 1


def training_run(model: nn.Module, steps: int, user_loss: bool = False) -> tuple[Counter[str], Counter[str], Any]:
    """``steps`` SGD steps on the device path; host reads counted during the loop and at exit.
    ``user_loss``: the loss read through ``Capture(loss=...)`` (the magic's ``--loss``)."""
    torch.manual_seed(1)
    xs = [torch.randn(4, 16) for _ in range(steps)]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    spy = DispatchSpy()
    ns: dict[str, Any] = {}
    with count_host_syncs() as py:
        with Capture(model, device_path=True, loss=(lambda: ns.get("loss")) if user_loss else None) as cap:
            with spy:
                for x in xs:
                    opt.zero_grad()
                    ns["loss"] = model(x).pow(2).mean()
                    ns["loss"].backward()
                    opt.step()
        total = Counter(py)
    return total, Counter(spy.syncs), cap.result


def test_host_syncs_per_step_do_not_grow_with_depth() -> None:
    runs = {(n, s): training_run(deep(n), s) for n in (2, 20) for s in (3, 6)}
    for (_n, s), (_, disp, res) in runs.items():
        assert disp == Counter(), disp  # nothing data-dependent while the loop runs
        assert res.steps == s and len(res.step_index) == s and res.backward_ran
        assert np.isfinite(res.series("0", "update_ratio")).all() and np.isfinite(res.series("0", "param_grad_norm")).all()
    # the same host reads for 8 and 62 layers, and a constant number more per step
    assert runs[(2, 3)][0] == runs[(20, 3)][0] and runs[(2, 6)][0] == runs[(20, 6)][0]
    per_step = {k: (runs[(2, 6)][0][k] - runs[(2, 3)][0][k]) / 3 for k in runs[(2, 6)][0]}
    # ONE transfer per step (``.cpu().numpy()``); the optimizer watch's same-device ``.to(acc.device)``
    # is counted as a "to cpu" by the spy on the CPU-run device path but moves nothing
    assert per_step.get("cpu") == 1 and per_step.get("numpy") == 1, per_step
    assert sum(v for k, v in per_step.items() if k not in ("cpu", "numpy", "to")) == 0 and per_step.get("to", 0) <= 1, per_step
    assert runs[(20, 6)][0]["item"] == 0 and runs[(20, 6)][0]["tolist"] == 0


def test_a_user_loss_is_read_with_the_steps_transfer_not_synced() -> None:
    """``--loss`` on the device path: the loss tensor travels with the step's one transfer (no
    ``item()`` per step), and the values are the loop's own."""
    (py3, disp3, res3), (py6, _, res6) = (training_run(deep(2), s, user_loss=True) for s in (3, 6))
    assert disp3 == Counter() and len(res3.series("loss")) == 3
    assert py3["item"] == py6["item"] == 0 and py3["__float__"] == py6["__float__"] == 0
    plain = training_run(deep(2), 6)[2]  # loss from backward(): the same values
    mine, theirs = res6.series("loss"), plain.series("loss")
    assert len(mine) == 6 and np.isfinite(mine).all()
    np.testing.assert_array_equal(mine, theirs)
