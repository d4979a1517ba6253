"""nbdebug.doctor: each planted bug is named by its own check, a healthy model passes, the user's
model/optimizer/RNG are untouched, and the numbers equal the reference computations."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nbdebug.capture.state import fingerprint, same_fingerprint
from nbdebug.doctor import DoctorReport, doctor
from nbdebug.inspectors.doctor import CHECKS, softmax_floor

D, C = 64, 10


def digits(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Digits-like data: 8×8 'images' around one prototype per class, standardised per pixel."""
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(C, D, generator=g)
    y = torch.arange(n) % C
    x = protos[y] + 0.5 * torch.randn(n, D, generator=g)
    return (x - x.mean(0)) / x.std(0), y


def mlp(seed: int = 1) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, C))


def cnn(seed: int = 1) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                         nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 32), nn.ReLU(),
                         nn.Dropout(0.1), nn.Linear(32, C))


class Wrap(nn.Module):
    def __init__(self, inner: nn.Module, fn) -> None:
        super().__init__()
        self.inner, self.fn = inner, fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self, x)


class Lambda(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def consequences_point_at(report: DoctorReport, cause: str) -> None:
    """Every failed check other than ``cause`` says it is possibly a consequence of ``cause``."""
    assert cause in report.failed
    for name in report.failed:
        if name != cause:
            assert f"(see {cause})" in report.checks[name].advice, (name, report.checks[name].advice)


# -- healthy models --------------------------------------------------------------------------------
@pytest.mark.parametrize("make,shape", [(mlp, (64, D)), (cnn, (64, 1, 8, 8))], ids=["mlp", "cnn"])
def test_healthy_model_fails_nothing(make, shape) -> None:
    x, y = digits()
    report = doctor(make(), x.reshape(shape), y)
    assert list(report.checks) == list(CHECKS)
    assert report.failed == [], repr(report)
    assert all(c.status == "pass" for n, c in report.checks.items() if n != "optimizer"), repr(report)
    assert report.checks["optimizer"].status == "skip"  # no optimizer given: nothing to check it against
    assert report.kind == "classification" and report.classes == C
    assert report.elapsed_s > 0  # timings (0.1–0.4 s warm) are in the report, not asserted: they follow the machine's load


def test_numbers_equal_the_reference_computations() -> None:
    x, y = digits()
    model = mlp()
    report = doctor(model, x, y)
    with torch.no_grad():
        out = model(x)
        ref_loss = F.cross_entropy(out, y)
        change = (model(x) - model(torch.zeros_like(x))).abs().max()
    ev = report.checks["init_loss"].evidence
    assert ev["loss"] == pytest.approx(float(ref_loss), rel=1e-6)
    assert ev["expected"] == pytest.approx(math.log(C))
    assert ev["logit_std"] == pytest.approx(float(out.std()), rel=1e-5)
    assert report.checks["input_dependence"].evidence["max_change"] == pytest.approx(float(change), rel=1e-6)
    assert report.checks["batch_independence"].evidence["max_leak"] == 0.0
    with torch.no_grad():
        h = model[:4](x)
    dead = int((h == 0).all(0).sum())  # units of the second ReLU zero for every sample
    assert dead > 0 and (model[:2](x) == 0).all(0).sum() == 0
    assert report.checks["dead_units"].evidence == {"samples": 64, "worst_frac": dead / 64, "worst_layer": "3",
                                                    "layers": ["3"], "dead_frac": [round(dead / 64, 4)]}
    means, stds = x.mean(0), x.std(0, correction=0)
    ev = report.checks["input_scale"].evidence
    assert ev["channels"] == D and ev["std"] == pytest.approx(float(stds.max()), rel=1e-5)
    assert abs(ev["mean"]) == pytest.approx(float(means.abs().max()), rel=1e-4, abs=1e-6)
    curve = report.checks["overfit_batch"].evidence["curve"]
    with torch.no_grad():
        assert curve[0] == pytest.approx(float(F.cross_entropy(model(x[:8]), y[:8])), rel=1e-6)
    assert curve[-1] <= 0.05 * math.log(C) < min(curve[:-1])  # stops at the first step under the target


def test_deterministic_and_user_state_untouched() -> None:
    x, y = digits()
    model = mlp()
    model[4].weight.grad = torch.ones_like(model[4].weight)  # a .grad the user has
    model.eval()
    calls: list[int] = []
    model[1].register_forward_hook(lambda *_: calls.append(1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    calls.clear()
    before, opt_before = fingerprint(model), copy.deepcopy(opt.state_dict())
    rng = torch.get_rng_state()
    a = doctor(model, x, y, optimizer=opt)
    b = doctor(model, x, y, optimizer=opt)
    assert same_fingerprint(before, fingerprint(model)) == []
    assert torch.equal(torch.get_rng_state(), rng)
    assert calls == []  # the user's hooks do not run in the doctor's passes
    after = opt.state_dict()
    assert after["param_groups"] == opt_before["param_groups"]
    for k, st in opt_before["state"].items():
        for name, v in st.items():
            assert torch.equal(after["state"][k][name], v), (k, name)
    assert a.checks["overfit_batch"].evidence["curve"] == b.checks["overfit_batch"].evidence["curve"]
    assert {n: c.status for n, c in a.checks.items()} == {n: c.status for n, c in b.checks.items()}


def test_user_optimizer_is_recreated_with_its_hyperparameters() -> None:
    x, y = digits()
    model = mlp()
    report = doctor(model, x, y, optimizer=torch.optim.SGD(model.parameters(), lr=0.0), steps=5)
    curve = report.checks["overfit_batch"].evidence["curve"]
    assert len(curve) == 6 and len(set(curve)) == 1  # lr 0: the copy never moves
    assert report.failed == ["overfit_batch"] and report.checks["optimizer"].status == "pass"
    assert "never moved" in report.checks["overfit_batch"].advice


# -- planted bugs ---------------------------------------------------------------------------------
def test_double_softmax_is_caught_by_overfit_batch() -> None:
    x, y = digits()
    model = Wrap(mlp(), lambda self, x: F.softmax(self.inner(x), dim=-1))
    report = doctor(model, x, y)
    assert report.failed == ["overfit_batch"], repr(report)
    ev = report.checks["overfit_batch"].evidence
    assert ev["softmax_floor"] == pytest.approx(math.log1p((C - 1) / math.e))
    assert ev["floor"] == pytest.approx(softmax_floor(C), rel=1e-3)
    assert ev["reached_at"] == -1 and ev["steps"] == 200
    assert ev["outputs_are_probabilities"] is True
    assert "ln(1 + (C−1)/e)" in report.checks["overfit_batch"].advice


def test_last_layer_std_10_is_caught_by_init_loss() -> None:
    x, y = digits()
    model = mlp()
    nn.init.normal_(model[4].weight, std=10)
    report = doctor(model, x, y)
    assert report.failed == ["init_loss"], repr(report)
    assert report.checks["init_loss"].evidence["loss"] > math.log(C) + 10


@pytest.mark.parametrize("mix", [
    lambda x: x - x.mean(0, keepdim=True),
    lambda x: F.batch_norm(x, None, None, training=True),  # batch statistics even in eval mode
], ids=["minus-batch-mean", "batchnorm-always-training"])
def test_mixing_samples_is_caught_by_batch_independence(mix) -> None:
    x, y = digits()
    model = mlp()
    model.insert(2, Lambda(mix))
    report = doctor(model, x, y)
    assert report.failed == ["batch_independence"], repr(report)
    ev = report.checks["batch_independence"].evidence
    assert ev["max_leak"] > 1e-6 * ev["own_grad"] > 0 and ev["leak_from"] != 0


def test_batchnorm_module_does_not_trip_batch_independence() -> None:
    x, y = digits()
    model = mlp()
    model.insert(1, nn.BatchNorm1d(64))
    report = doctor(model, x, y)
    assert report.checks["batch_independence"].status == "pass"
    assert report.checks["batch_independence"].evidence["max_leak"] == 0.0
    assert report.failed == []


def test_model_ignoring_its_input_is_caught_by_input_dependence() -> None:
    x, y = digits()
    model = Wrap(mlp(), lambda self, x: self.inner(torch.ones_like(x)))
    report = doctor(model, x, y)
    assert report.checks["input_dependence"].status == "fail"
    assert report.checks["input_dependence"].evidence["max_change"] == 0.0
    assert report.checks["batch_independence"].status == "skip"
    assert report.checks["dead_units"].status == "pass"  # constant activations are not judged as dead units
    consequences_point_at(report, "input_dependence")


def test_relu_with_bias_minus_10_is_caught_by_dead_units() -> None:
    x, y = digits()
    model = mlp()
    nn.init.constant_(model[2].bias, -10.0)
    report = doctor(model, x, y)
    ev = report.checks["dead_units"].evidence
    assert report.checks["dead_units"].status == "fail"
    assert ev["worst_layer"] == "3" and ev["worst_frac"] == 1.0
    consequences_point_at(report, "dead_units")


def test_dead_unit_counts_are_exact() -> None:
    torch.manual_seed(0)
    x = torch.randn(16, 4)
    lin = nn.Linear(4, 6)
    with torch.no_grad():
        lin.weight.mul_(0.01)
        lin.bias.copy_(torch.tensor([-10.0, -10.0, -10.0, 1.0, 1.0, 1.0]))
    model = nn.Sequential(lin, nn.ReLU(), nn.Linear(6, 3))
    y = torch.arange(16) % 3
    ev = doctor(model, x, y, steps=0).checks["dead_units"]
    assert ev.status == "pass" and ev.evidence["worst_layer"] == "1" and ev.evidence["worst_frac"] == 0.5
    with torch.no_grad():
        lin.bias[3] = -10.0
    ev = doctor(model, x, y, steps=0).checks["dead_units"]
    assert ev.status == "fail" and ev.evidence["worst_frac"] == pytest.approx(4 / 6)
    assert "`1` 4/6" in ev.advice


@pytest.mark.parametrize("make,shape", [(mlp, (64, D)), (cnn, (64, 1, 8, 8))], ids=["mlp", "cnn"])
def test_dead_units_agree_with_the_thermometer_capture(make, shape) -> None:
    """The doctor's per-layer dead fraction is the thermometer's ``dead_unit_frac`` for the same forward."""
    from nbdebug.capture.session import Capture

    x, y = digits()
    x = x.reshape(shape)
    model = make()
    relu = next(m for m in model if isinstance(m, nn.ReLU))
    idx = list(model).index(relu)
    with torch.no_grad():
        model[idx - 1].bias[: model[idx - 1].bias.numel() // 2] -= 3.0  # some units of the first ReLU die
    report = doctor(model, x, y, steps=0)
    train = copy.deepcopy(model).train()
    with Capture(train, grads=False) as cap, torch.no_grad():
        train(x)
    ref = {r.name: r.stats["dead_unit_frac"] for r in cap.result.layers
           if r.stats.get("dead_unit_frac", 0) > 0 and not r.type.startswith("Dropout")}
    ev = report.checks["dead_units"].evidence
    assert str(idx) in ref
    assert dict(zip(ev["layers"], ev["dead_frac"], strict=True)) == pytest.approx({k: round(v, 4) for k, v in ref.items()}, abs=1e-4)


def test_raw_pixels_are_caught_by_input_scale() -> None:
    x, y = digits()
    raw = ((x - x.min()) / (x.max() - x.min()) * 255).round()
    report = doctor(mlp(), raw, y)
    ev = report.checks["input_scale"].evidence
    assert report.checks["input_scale"].status == "fail" and ev["mean"] > 50
    consequences_point_at(report, "input_scale")


def test_nan_is_caught_by_nonfinite_with_its_layer() -> None:
    x, y = digits()
    model = mlp()
    model.insert(1, Lambda(torch.log))  # log of negative pre-activations: NaN
    report = doctor(model, x, y)
    assert report.checks["nonfinite"].status == "fail"
    assert report.checks["nonfinite"].evidence == {"origin": "1", "phase": "forward"}


def test_nan_in_the_inputs_is_named_as_such() -> None:
    x, y = digits()
    x[3, 5] = math.nan
    check = doctor(mlp(), x, y, steps=0).checks["nonfinite"]
    assert check.status == "fail" and check.evidence == {"origin": "input", "phase": "input"}


def test_nbdebug_doctor_is_callable_whatever_was_imported_first() -> None:
    import nbdebug
    import nbdebug.doctor as module

    x, y = digits(16)
    assert isinstance(module(mlp(), x, y, steps=1), DoctorReport)
    assert isinstance(nbdebug.doctor(mlp(), x, y, steps=1), DoctorReport)


@pytest.mark.parametrize("scale,word", [(1e-5, "vanish"), (1e5, "explode")])
def test_gradient_flow_ratio(scale: float, word: str) -> None:
    x, y = digits()
    model = mlp()
    # the forward is unchanged; the gradient flowing back into the first layer is scaled
    model.insert(1, Lambda(lambda h: h * scale + (h * (1 - scale)).detach()))
    report = doctor(model, x, y, steps=0)
    ev = report.checks["gradient_flow"].evidence
    assert report.checks["gradient_flow"].status == "fail" and word in report.checks["gradient_flow"].advice
    assert ev["ratio"] == pytest.approx(ev["first_norm"] / ev["last_norm"])
    assert (ev["ratio"] < 1e-3) if scale < 1 else (ev["ratio"] > 1e3)


# -- other losses and inputs ------------------------------------------------------------------------
def test_mse_regression() -> None:
    x, _ = digits()
    torch.manual_seed(3)
    y = x[:, :3] @ torch.randn(3, 2)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(D, 64), nn.Tanh(), nn.Linear(64, 2))
    report = doctor(model, x, y, loss_fn=F.mse_loss)
    assert report.kind == "regression" and report.classes is None
    assert report.failed == [], repr(report)
    ev = report.checks["init_loss"].evidence
    assert ev["mean_baseline"] == pytest.approx(float(F.mse_loss(y.mean(0, keepdim=True).expand_as(y), y)), rel=1e-6)
    same = doctor(model, x, y, loss_fn=nn.MSELoss(reduction="none"))  # per-element losses are averaged
    assert same.checks["init_loss"].evidence == report.checks["init_loss"].evidence
    # off-centre targets: the initial loss is far above predicting their mean
    report = doctor(model, x, y + 100, loss_fn=nn.MSELoss())
    assert report.kind == "regression" and "init_loss" in report.failed


def test_token_ids_use_the_embedding_and_skip_input_scale() -> None:
    class Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.out = nn.Embedding(50, 16), nn.Linear(16, 4)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.out(self.emb(ids).mean(1))

    torch.manual_seed(0)
    ids, y = torch.randint(1, 50, (8, 5)), torch.arange(8) % 4
    report = doctor(Bag(), ids, y)
    assert report.checks["batch_independence"].status == "pass"
    assert report.checks["batch_independence"].evidence["via"] == "embedding `emb`"
    assert report.checks["input_scale"].status == "skip" and "integer" in report.checks["input_scale"].advice
    assert report.checks["input_dependence"].status == "pass"


def test_unknown_loss_kind_skips_with_reasons_and_report_reads() -> None:
    x, y = digits()

    def weird(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return out.pow(2).mean()

    # float targets whose size differs from the output; a few steps: the overfit check skips whatever the curve
    report = doctor(mlp(), x, x[:, :1].clone(), loss_fn=weird, steps=5)
    assert report.kind == "unknown"
    assert report.checks["init_loss"].status == "skip" and report.checks["overfit_batch"].status == "skip"
    overfit = report.checks["overfit_batch"]
    assert "unknown loss kind" in overfit.advice and overfit.evidence["steps"] == 5
    text = repr(report)
    assert text.splitlines()[0].startswith("DoctorReport(unknown") and "– init_loss" in text
    assert "<table>" in report._repr_html_() and "init_loss" in report._repr_html_()
    with pytest.raises(ValueError, match="steps"):
        doctor(mlp(), x, y, steps=-1)
