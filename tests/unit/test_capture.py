"""Capture core: exact stats, hygiene, selection, output structures."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from nbdebug.capture import (
    HookSet,
    LayerNotFoundError,
    fingerprint,
    hook_count,
    same_fingerprint,
    select_modules,
    tensor_leaves,
)
from nbdebug.capture.session import Capture


def hand_model() -> nn.Sequential:
    """Linear(2→3) with hand-set weights, ReLU, Linear(3→1)."""
    m = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    with torch.no_grad():
        m[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]))
        m[0].bias.copy_(torch.tensor([0.0, -1.0, 0.5]))
        m[2].weight.copy_(torch.tensor([[1.0, 2.0, -1.0]]))
        m[2].bias.copy_(torch.tensor([0.25]))
    return m


def test_stats_equal_hand_computation() -> None:
    m = hand_model()
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5]])
    with Capture(m) as cap:
        out = m(x)
        out.sum().backward()
    res = cap.result
    assert [r.name for r in res.layers] == ["0", "1", "2"]
    # Linear 0 by hand: rows [1, 1, -0.5] and [-1, -0.5, -1]
    lin = np.array([1, 1, -0.5, -1, -0.5, -1.0])
    s = res["0"].stats
    assert s["mean"] == pytest.approx(lin.mean())
    assert s["std"] == pytest.approx(lin.std(ddof=1))
    assert (s["min"], s["max"]) == (-1.0, 1.0)
    assert s["zero_frac"] == 0.0 and s["nan"] == 0 and s["inf"] == 0 and s["numel"] == 6
    relu = np.maximum(lin, 0)
    r = res["1"].stats
    assert r["mean"] == pytest.approx(relu.mean())
    assert r["zero_frac"] == pytest.approx(4 / 6)
    assert r["near_zero_frac"] == pytest.approx(4 / 6)
    assert res["1"].shape == (2, 3) and res["1"].type == "ReLU" and res["1"].dtype == "float32"
    # d(sum out)/d(out of layer 2) = 1 for both rows; d/d(relu out) = w2 per row.
    g2 = res["2"].grad
    assert g2 is not None and g2["norm"] == pytest.approx(math.sqrt(2)) and g2["mean"] == 1.0
    g1 = res["1"].grad
    assert g1 is not None and g1["norm"] == pytest.approx(math.sqrt(2 * (1 + 4 + 1)))
    # Parameter gradient norm of layer 2: d/dW = sum over batch of relu outputs, d/db = 2
    pg = np.concatenate([relu.reshape(2, 3).sum(0), [2.0]])
    assert res["2"].param_grad_norm == pytest.approx(np.linalg.norm(pg))
    assert res.backward_ran and res.forward_passes == 1
    # Inputs are linked by tensor identity: layer 1 consumed layer 0's output.
    assert res["1"].inputs == (0,) and res["2"].inputs == (1,)


def test_no_side_effects_without_backward() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Dropout(0.5))
    m.train()
    m[0].weight.requires_grad_(False)
    m(torch.randn(8, 4)).sum().backward()  # pre-existing .grad on the other parameters
    before = fingerprint(m)
    x = torch.randn(8, 4)
    with Capture(m, histograms=True):
        with torch.no_grad():
            m.eval()
            m.train()  # the user's own calls are theirs; ours change nothing
    assert same_fingerprint(before, fingerprint(m)) == []
    with Capture(m):
        pass
    assert same_fingerprint(before, fingerprint(m)) == []
    # A forward pass under capture changes only what the forward itself changes (BN stats).
    ref = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Dropout(0.5))
    ref.load_state_dict(m.state_dict())
    torch.manual_seed(1)
    ref(x)
    torch.manual_seed(1)
    with Capture(m):
        m(x)
    for (n, a), (_, b) in zip(ref.state_dict().items(), m.state_dict().items()):
        assert torch.equal(a, b), n
    after = fingerprint(m)
    assert after["grads"].keys() == before["grads"].keys()
    assert all(
        (before["grads"][k] is None and after["grads"][k] is None) or torch.equal(before["grads"][k], after["grads"][k])
        for k in before["grads"]
    )
    assert after["requires_grad"] == before["requires_grad"] and after["hooks"] == 0
    assert after["attrs"] == before["attrs"]


class Boom(nn.Module):
    def __init__(self, exc: type[BaseException]) -> None:
        super().__init__()
        self.exc = exc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise self.exc("boom")


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_exception_inside_capture_leaves_model_identical(exc: type[BaseException]) -> None:
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), Boom(exc))
    user_calls: list[str] = []
    m[0].register_forward_hook(lambda *a: user_calls.append("fwd"))
    m[1].register_forward_pre_hook(lambda *a: user_calls.append("pre"))
    m[0].weight.grad = torch.ones_like(m[0].weight)
    before = fingerprint(m)
    assert before["hooks"] == 2
    with pytest.raises(exc):
        with Capture(m):
            m[1](m[0](torch.randn(2, 3, requires_grad=True)))  # grad hooks registered on outputs
            m(torch.randn(2, 3))  # raises inside the model
    assert same_fingerprint(before, fingerprint(m)) == []
    assert hook_count(m) == 2  # the user's hooks stay, ours are gone
    user_calls.clear()
    m[1](m[0](torch.randn(1, 3)))
    assert user_calls == ["fwd", "pre"]


def test_selection_filters() -> None:
    m = nn.Sequential()
    m.add_module("features", nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Conv2d(2, 2, 3)))
    m.add_module("head", nn.Linear(2, 2))
    names = lambda f: [n for n, _ in select_modules(m, f)]  # noqa: E731
    assert names(None) == ["features.0", "features.1", "features.2", "head"]
    assert names("features.*") == ["features.0", "features.1", "features.2"]
    assert names("re:features\\.[02]") == ["features.0", "features.2"]
    assert names(["head", "features.1"]) == ["features.1", "head"]  # model order, not request order
    assert names(nn.Conv2d) == ["features.0", "features.2"]
    assert names(lambda n: n.endswith("1")) == ["features.1"]
    assert names("features") == ["features"]  # exact names may be containers
    with pytest.raises(LayerNotFoundError, match=r"Did you mean: features\.1"):
        select_modules(m, "feature.1")
    with pytest.raises(LayerNotFoundError, match="matches no"):
        select_modules(m, "nothing.*")


class TupleOut(nn.Module):
    def forward(self, x: torch.Tensor):  # type: ignore[no-untyped-def]
        return x * 2, None, [x + 1]


class DictOut(nn.Module):
    def forward(self, x: torch.Tensor):  # type: ignore[no-untyped-def]
        return {"a": x - 1, "b": 3}


def test_structured_outputs_are_named_per_leaf() -> None:
    from transformers.modeling_outputs import BaseModelOutput

    class HFOut(nn.Module):
        def forward(self, x: torch.Tensor) -> BaseModelOutput:
            return BaseModelOutput(last_hidden_state=x, attentions=(x.softmax(-1),))

    m = nn.Sequential(TupleOut(), nn.Identity())
    m2 = nn.ModuleDict({"t": TupleOut(), "d": DictOut(), "hf": HFOut()})
    x = torch.ones(2, 2)
    with Capture(m2) as cap:
        m2["t"](x), m2["d"](x), m2["hf"](x)
    names = [r.name for r in cap.result.layers]
    assert names == ["t[0]", "t[2][0]", "d.a", "hf.last_hidden_state", "hf.attentions[0]"]
    assert cap.result["t[0]"].stats["mean"] == 2.0
    assert cap.result["d.a"].stats["zero_frac"] == 1.0
    assert cap.result["hf.attentions[0]"].stats["mean"] == pytest.approx(0.5)
    assert tensor_leaves(None) == []
    with Capture(m) as cap2:
        m(x)
    assert [r.name for r in cap2.result.layers][:2] == ["0[0]", "0[2][0]"]


def test_fp16_and_integer_outputs() -> None:
    class Ints(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x > 0).long() * 3

    m = nn.Sequential(nn.Identity(), Ints())
    x = torch.tensor([[1.0, -1.0], [65504.0, 0.5]], dtype=torch.float16)
    with Capture(m) as cap:
        m(x)
    s = cap.result["0"].stats
    assert cap.result["0"].dtype == "float16"
    # Upcast before reducing: the float16 sum would overflow to inf.
    assert s["mean"] == pytest.approx((1 - 1 + 65504 + 0.5) / 4) and s["inf"] == 0
    i = cap.result["1"].stats
    assert cap.result["1"].dtype == "int64" and i["mean"] == pytest.approx(2.25) and i["zero_frac"] == 0.25


def test_nan_and_inf_counts_are_exact() -> None:
    m = nn.Sequential(nn.Identity())
    x = torch.tensor([1.0, float("nan"), float("inf"), float("-inf"), 0.0])
    with Capture(m) as cap:
        m(x)
    s = cap.result["0"].stats
    assert (s["nan"], s["inf"]) == (1, 2)


def test_byte_budget_drops_samples_keeps_stats() -> None:
    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    with Capture(m, max_bytes=64 * 8 * 4 + 10, sample_size=1024) as cap:
        m(torch.randn(8, 64))
    res = cap.result
    assert res.budget_exceeded and any("budget" in n for n in res.notes)
    assert res["0"].sample is not None and res["2"].sample is None
    assert all(math.isfinite(r.stats["mean"]) for r in res.layers)


def test_repeated_calls_get_separate_rows_and_passes_merge() -> None:
    relu = nn.ReLU()
    m = nn.Sequential(nn.Linear(2, 2), relu, nn.Linear(2, 2), relu)
    with Capture(m) as cap:
        m(torch.randn(3, 2))
        m(torch.randn(3, 2))
    res = cap.result
    assert [r.name for r in res.layers] == ["0", "1", "2", "1#2"]
    assert all(r.calls == 2 for r in res.layers) and res.forward_passes == res.steps == 2
    assert res["0"].stats["numel"] == 12


def test_hookset_removes_tensor_hooks() -> None:
    t = torch.ones(2, requires_grad=True)
    seen: list[int] = []
    with HookSet() as hs:
        hs.tensor(t, lambda g: seen.append(1))
        assert len(hs) == 1
    (t * 2).sum().backward()
    assert seen == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_zero_count_is_exact_with_negative_zero(dtype: torch.dtype) -> None:
    from nbdebug.capture.stats import IDX, tensor_stats

    x = torch.tensor([0.0, -0.0, -0.0, 1.0, -2.0, float("nan")], dtype=dtype)
    raw = tensor_stats(x)
    assert raw[IDX["nonzero"]] == 3  # 1, -2 and NaN; both signed zeros count as zero
    assert tensor_stats(torch.tensor([-0.0, 2.0], dtype=dtype))[IDX["nonzero"]] == 1
    assert tensor_stats(torch.tensor([3.0, 2.0], dtype=dtype))[IDX["nonzero"]] == 2  # min > 0: no count needed
    assert tensor_stats(torch.tensor([-3.0, -0.0], dtype=dtype))[IDX["nonzero"]] == 1


def test_sample_is_spread_over_the_whole_tensor() -> None:
    m = nn.Sequential(nn.Identity())
    x = torch.arange(1_000_000, dtype=torch.float32).reshape(10, 100, 1000)
    with Capture(m, sample_size=1000) as cap:
        m(x)
    s = cap.result["0"].sample
    assert s is not None and s.size == 1000
    assert s.min() < 2_000 and s.max() > 990_000  # covers the range evenly
    assert len(np.unique(s.astype(np.int64) % 1000)) > 900  # does not lock onto the last dimension


def test_aliased_outputs_reuse_stats_but_in_place_changes_are_seen() -> None:
    class AddOneInPlace(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.add_(1.0)

    m = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5), nn.Flatten(), AddOneInPlace(), nn.Identity())
    m.eval()  # Dropout returns its input itself; Flatten a view
    x = torch.randn(5, 3)
    with Capture(m) as cap, torch.no_grad():
        y = m(x)
    ref = (m[0](x)).detach()
    r = cap.result
    for name in ("0", "1", "2"):
        assert r[name].stats["mean"] == pytest.approx(ref.mean().item(), abs=1e-6)
        assert r[name].stats["max"] == pytest.approx(ref.max().item(), abs=1e-6)
    assert r["3"].stats["mean"] == pytest.approx(ref.mean().item() + 1, abs=1e-6)  # in place: recomputed
    assert r["4"].stats["mean"] == pytest.approx(y.mean().item(), abs=1e-6)


def test_parametrized_modules_are_leaves_and_their_parametrizations_not_rows() -> None:
    from torch.nn.utils.parametrizations import weight_norm

    from nbdebug.capture import select_modules

    m = nn.Sequential(weight_norm(nn.Conv2d(3, 4, 3)), nn.ReLU(), weight_norm(nn.Linear(4, 2)))
    assert [n for n, _ in select_modules(m)] == ["0", "1", "2"]
    with Capture(m[:2]) as cap:
        m[:2](torch.randn(1, 3, 5, 5))
    assert [r.name for r in cap.result.layers] == ["0", "1"] and cap.result.layers[0].shape == (1, 4, 3, 3)


def _large_cases() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = (1 << 16) + 7  # above NUMPY_MAX: the torch path of tensor_stats
    r, u = torch.randn(n, generator=g), torch.rand(n, generator=g)
    nan, inf = float("nan"), float("inf")
    return [
        r, r.relu(), torch.zeros(n), -torch.zeros(n), -u - 0.1, u + 0.1, -u,
        torch.cat([r.relu(), torch.tensor([-0.0, nan])]), torch.cat([r, torch.tensor([-nan])]),
        torch.cat([r, torch.tensor([-0.0, inf, 0.0])]), torch.cat([u, torch.tensor([-inf])]),
        torch.cat([-u - 0.1, torch.tensor([-0.0])]), torch.cat([r.relu(), torch.tensor([-0.0])]),
    ]


@pytest.mark.parametrize("k", range(13))
def test_large_cpu_float32_stats_are_exact_on_signs_zeros_and_nonfinite(k: int) -> None:
    """The float32 CPU path reads min/max from the int32 bit pattern: every sign mix, -0.0, NaN and Inf."""
    from nbdebug.capture.stats import IDX, tensor_stats

    t = _large_cases()[k]
    raw = tensor_stats(t)
    fin = t[torch.isfinite(t)]
    assert raw[IDX["numel"]] == t.numel()
    assert raw[IDX["nonzero"]] == int((t != 0).sum())  # -0.0 is zero, NaN is not
    assert raw[IDX["nan"]] == int(t.isnan().sum()) and raw[IDX["inf"]] == int(t.isinf().sum())
    if t.isnan().any():
        assert math.isnan(raw[IDX["min"]]) and math.isnan(raw[IDX["max"]])
    else:
        assert raw[IDX["min"]] == float(t.min()) and raw[IDX["max"]] == float(t.max())
    if fin.numel() == t.numel():
        assert raw[IDX["sum"]] == pytest.approx(float(t.double().sum()), rel=1e-5, abs=1e-3)
        assert raw[IDX["sumsq"]] == pytest.approx(float(t.double().square().sum()), rel=1e-5)


def test_step_history_values_equal_summarize() -> None:
    """The vectorised per-step close gives the same numbers as :func:`summarize` (outputs, saturation,
    gradients; a row without gradient stays NaN)."""
    from nbdebug.capture.fold import stat_values
    from nbdebug.capture.history import FIELD_INDEX as FI
    from nbdebug.capture.stats import summarize, tensor_stats

    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(50, generator=g), torch.tanh(torch.randn(40, generator=g) * 5), torch.zeros(1),
          torch.randn(3, 4, generator=g).relu()]
    raw = np.stack([tensor_stats(t, saturation=(-1.0, 1.0) if i == 1 else None) for i, t in enumerate(ts)])
    grad = np.stack([tensor_stats(torch.randn(5, generator=g)), np.full(9, np.nan),
                     tensor_stats(torch.randn(7, generator=g)), tensor_stats(torch.randn(2, generator=g))])
    v = stat_values(raw, grad, [1])  # row 1 saturates
    s, gs = summarize(raw), summarize(grad)
    for k in ("mean", "std", "min", "max", "zero_frac", "norm", "nan", "inf"):
        np.testing.assert_allclose(v[:, FI[k]], s[k].astype(np.float32), rtol=1e-6, equal_nan=True)
    for k in ("mean", "std", "min", "max", "norm", "nan", "inf"):
        np.testing.assert_allclose(v[:, FI["grad_" + k]], gs[k].astype(np.float32), rtol=1e-6, equal_nan=True)
    assert v[1, FI["saturated_frac"]] == pytest.approx(float(s["extra_frac"][1]), rel=1e-6) and v[1, FI["saturated_frac"]] > 0
    assert np.isnan(v[[0, 2, 3], FI["saturated_frac"]]).all() and np.isnan(v[1, FI["grad_mean"]])
