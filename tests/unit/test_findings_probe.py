"""What the model hands the loss and what its first layer is fed (``nbdebug.runs.output_probe``,
``nbdebug.inspectors.run_findings_output``, issue 26 round 5): each planted mistake run for real on a small
model under ``nbdebug.debug`` beside its healthy twin (the same code without the mistake: no warning or
error at all), and the probe's numbers against a hand computation."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nbdebug
from nbdebug.runs.output_probe import output_probe
from tests.unit.test_findings_loop import C, D, N, linear_labels, train_ce


def _serious(res: Any) -> list[str]:
    return [f.code for f in res.findings if f.severity != "note"]


def _root(res: Any) -> Any:
    return next(f for f in res.findings if f.severity != "note")


class Tail(nn.Module):
    """An MLP whose forward applies ``tail`` (a function) to its last layer's output."""

    def __init__(self, tail: Any = None, seed: int = 0, d_out: int = C) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, d_out))
        self.tail = tail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.net(x)
        return self.tail(z) if self.tail is not None else z


def _loop(model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, steps: int, loss_fn: Any) -> Any:
    with nbdebug.debug(model) as dbg:
        for i in range(steps):
            j = (i * 64) % len(x)
            opt.zero_grad()
            loss_fn(model(x[j:j + 64]), y[j:j + 64]).backward()
            opt.step()
    return dbg.result


# -- the probe ----------------------------------------------------------------------------------
def test_output_probe_reads_the_models_own_output_and_its_first_layers_input_and_leaves_the_model_as_found() -> None:
    x = torch.randn(8, D, generator=torch.Generator().manual_seed(1)) * 3.0
    m = Tail(torch.sigmoid, seed=1)
    m.train()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    p = output_probe(m, ((x,), {}))
    assert p is not None
    with torch.no_grad():
        want = torch.sigmoid(m.net(x))
    assert p["shape"] == [8, C] and p["finite"] and p["leaf_finite"]
    assert p["min"] == pytest.approx(float(want.min()), abs=1e-6)
    assert p["max"] == pytest.approx(float(want.max()), abs=1e-6)
    assert p["mean"] == pytest.approx(float(want.mean()), abs=1e-6)
    assert p["std"] == pytest.approx(float(want.std()), abs=1e-6)
    assert p["out_is_leaf"] is False  # the forward computes a sigmoid after `net.2`
    assert p["first"] == "net.0" and p["first_type"] == "Linear" and p["first_is_input"] is True
    assert p["in_rms"] == pytest.approx(float(x.pow(2).mean().sqrt()), rel=1e-5)
    assert p["model_type"] == "Tail"
    # left exactly as found: mode, weights, no gradient, no hook
    assert m.training and all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert all(q.grad is None for q in m.parameters())
    assert all(not mod._forward_hooks and not mod._forward_pre_hooks for mod in m.modules())
    # a Sequential returns its last layer's own output, a view of it is no computation; a normalised copy of the
    # input is not the input
    assert output_probe(m.net, ((x,), {}))["out_is_leaf"] is True
    assert output_probe(Tail(lambda z: z.view(-1), seed=1), ((x,), {}))["out_is_leaf"] is True
    assert output_probe(Tail(lambda z: z * 1.0, seed=1), ((x,), {}))["out_is_leaf"] is False
    norm = Tail(seed=1)
    norm.forward = lambda t: norm.net((t - t.mean(0)) / t.std(0))  # type: ignore[method-assign]
    assert output_probe(norm, ((x,), {}))["first_is_input"] is False


class Noisy(nn.Module):
    """BatchNorm (running statistics, a step counter), dropout, and a forward that draws from the global RNG."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.net = nn.Sequential(nn.Linear(D, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) + 1e-3 * torch.randn(x.shape[0], C)


@pytest.mark.parametrize("probe", ["output_probe", "probes_after_cell"])
def test_the_post_cell_probes_leave_buffers_modes_grads_hooks_and_rng_as_found(probe: str) -> None:
    """REVIEW.md R8: BatchNorm's running statistics and counter, a dropout in train mode, a submodule in eval, the
    parameters' .grad, a user's forward hook (not called: set aside), the global RNG (forked): all exactly as found,
    and no hook of nbdebug's left."""
    from nbdebug.runs.output_probe import probes_after_cell

    x = torch.randn(16, D, generator=torch.Generator().manual_seed(3))
    m = Noisy()
    m.train()
    m(x).pow(2).mean().backward()  # the user's last step: grads and BatchNorm statistics that are not the init's
    m.net[3].eval()  # a mode of the user's own, per module
    calls = []
    user = m.net[0].register_forward_hook(lambda *a: calls.append(1))
    params = {k: v.detach().clone() for k, v in m.named_parameters()}
    grads = {k: v.grad.clone() for k, v in m.named_parameters()}
    buffers = {k: v.clone() for k, v in m.named_buffers()}
    modes = [mod.training for mod in m.modules()]
    rng = torch.get_rng_state()
    got = output_probe(m, ((x,), {})) if probe == "output_probe" else probes_after_cell(m, ((x,), {}))["output_probe"]
    assert got is not None and got["shape"] == [16, C]
    assert torch.equal(torch.get_rng_state(), rng)
    assert calls == []
    assert [mod.training for mod in m.modules()] == modes
    assert all(torch.equal(params[k], v) for k, v in m.named_parameters())
    assert all(torch.equal(grads[k], v.grad) for k, v in m.named_parameters())
    assert {k: v for k, v in m.named_buffers()}.keys() == buffers.keys()
    assert all(torch.equal(buffers[k], v) for k, v in m.named_buffers())
    m(x)
    assert calls == [1]  # the user's hook is back in place
    user.remove()
    assert all(not mod._forward_hooks and not mod._forward_pre_hooks for mod in m.modules())  # none of nbdebug's left


# -- probabilities fed to cross-entropy ---------------------------------------------------------
@pytest.mark.parametrize("planted", [True, False])
def test_sigmoid_in_forward_before_cross_entropy_is_named_and_its_twin_is_quiet(planted: bool) -> None:
    x, y = linear_labels(5)
    m = Tail(torch.sigmoid if planted else None, seed=5)
    res = train_ce(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, y, 80)
    if planted:
        f = _root(res)
        assert f.code == "output_loss_mismatch" and "cross-entropy" in f.text and "[0, 1]" in f.text
    else:
        assert _serious(res) == []


# -- a likelihood loss fed raw scores -----------------------------------------------------------
@pytest.mark.parametrize("planted", [True, False])
def test_nll_loss_on_raw_scores_is_named_by_its_negative_loss_and_its_twin_is_quiet(planted: bool) -> None:
    x, y = linear_labels(6)
    m = Tail(seed=6)

    def loss_fn(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(out if planted else F.log_softmax(out, 1), t)

    res = _loop(m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), x, y, 40, loss_fn)
    if planted:
        f = _root(res)
        assert f.code == "output_loss_mismatch" and "went negative" in f.text and f.rows == ("net.2",)
    else:
        assert _serious(res) == []


# -- a bounded output far from the targets ------------------------------------------------------
@pytest.mark.parametrize("planted", [True, False])
def test_a_sigmoid_on_a_regression_whose_targets_lie_above_1_is_named_and_its_twin_is_quiet(planted: bool) -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N, D, generator=g)
    t = 4.0 + x[:, :2].sum(1, keepdim=True) * 0.5
    m = Tail(torch.sigmoid if planted else None, seed=7, d_out=1)
    res = _loop(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, t, 60, F.mse_loss)
    if planted:
        f = _root(res)
        assert f.code == "output_loss_mismatch" and "pinned at 1" in f.text
    else:
        assert _serious(res) == []


# -- a recurrent layer fed raw values -----------------------------------------------------------
class Seq(nn.Module):
    def __init__(self, normalise: bool = False) -> None:
        super().__init__()
        torch.manual_seed(8)
        self.rnn, self.head, self.normalise = nn.GRU(1, 16, batch_first=True), nn.Linear(16, 2), normalise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.normalise:  # the forward standardises the raw values itself: the GRU is fed ~1
            x = (x - 1000.0) / 50.0
        return self.head(self.rnn(x)[0][:, -1])


def _series(raw: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(8)
    y = torch.randint(0, 2, (N,), generator=g)
    w = 1000.0 + 50.0 * torch.randn(N, 12, generator=g) * 0.2 + (y.float() * 2 - 1).unsqueeze(1) * 5.0 * torch.arange(12)
    return (w if raw else (w - 1000.0) / 50.0).unsqueeze(2), y


@pytest.mark.parametrize("case", ["planted", "standardised", "standardised_in_forward"])
def test_a_gru_fed_raw_values_is_named_input_scale_and_its_twins_are_quiet(case: str) -> None:
    x, y = _series(case != "standardised")
    m = Seq(normalise=case == "standardised_in_forward")
    res = train_ce(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, y, 40)
    if case == "planted":
        f = _root(res)
        assert f.code == "input_scale" and f.rows == ("rnn",) and "GRU" in f.text
        assert res.loop["output_probe"]["in_rms"] == pytest.approx(float(x[-64:].pow(2).mean().sqrt()), rel=1e-4)
    else:
        assert "input_scale" not in _serious(res)


def test_raw_inputs_are_the_root_of_the_large_updates_they_cause() -> None:
    x, y = linear_labels(9)
    torch.manual_seed(9)
    m = nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, C))
    res = train_ce(m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), x * 300.0, y, 30)
    codes = [f.code for f in res.findings]
    assert codes[0] == "input_scale"
    if "lr_high" in codes:  # follows from it, not a root of its own
        assert res.findings[codes.index("lr_high")].cause >= 0


# -- an init that explodes the forward ----------------------------------------------------------
@pytest.mark.parametrize("planted", [True, False])
def test_unit_normal_weights_explode_the_forward_at_init_and_he_init_is_quiet(planted: bool) -> None:
    x, y = linear_labels(10)
    torch.manual_seed(10)
    m = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, C))
    with torch.no_grad():
        for layer in m:
            if isinstance(layer, nn.Linear):
                layer.weight.normal_(0.0, 1.0) if planted else nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
    res = train_ce(m, torch.optim.Adam(m.parameters(), lr=1e-3), x, y, 30)
    if planted:
        f = _root(res)
        assert f.code == "exploding" and "at initialisation" in f.text and f.rows == ("0", "6")
    else:
        assert _serious(res) == []


# -- a NaN made after the model's last module ---------------------------------------------------
def _half_softmax(z: torch.Tensor) -> torch.Tensor:
    e = torch.exp(z.half() * 40.0)  # overflows past 11.09 in float16
    return torch.log(e / e.sum(1, keepdim=True)).float()


@pytest.mark.parametrize("planted", [True, False])
def test_a_half_precision_overflow_in_the_top_forward_is_not_blamed_on_the_loss(planted: bool) -> None:
    x, y = linear_labels(11)
    m = Tail(_half_softmax if planted else (lambda z: F.log_softmax(z * 40.0, 1)), seed=11)
    res = _loop(m, torch.optim.Adam(m.parameters(), lr=1e-3), x, y, 10, F.nll_loss)
    codes = _serious(res)
    if planted:
        f = _root(res)
        assert f.code == "nonfinite" and "after the model's last module `net.2`" in f.text and "Tail.forward" in f.text
        assert "nan_in_loss" not in codes
    else:
        assert codes == []


def test_a_nan_made_by_the_loss_of_a_sequential_is_still_the_losss() -> None:
    x, y = linear_labels(12)
    torch.manual_seed(12)
    m = nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, C))
    with torch.no_grad():
        m[2].weight.mul_(200.0)

    def by_hand(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:  # 0 · log 0 = NaN once softmax underflows
        return -(F.one_hot(t, C) * torch.log(torch.softmax(z, 1))).sum(1).mean()

    res = _loop(m, torch.optim.SGD(m.parameters(), lr=1e-3), x, y, 5, by_hand)
    assert res.loop["output_probe"]["out_is_leaf"] is True
    assert _root(res).code == "nan_in_loss"


def test_the_probability_rule_needs_the_loss_above_the_floor() -> None:
    import numpy as np

    from nbdebug.inspectors.run_evidence import Evidence
    from nbdebug.inspectors.run_findings_output import probabilities_fed_to_ce

    c = 4
    floor = math.log(1 + (c - 1) / math.e)
    p = {"shape": [64, c], "min": 0.0, "max": 1.0, "mean": 0.25, "std": 0.8 * math.sqrt(c - 1) / c, "finite": True}
    steps = np.arange(1, 31)
    at = Evidence(steps, np.full(30, 0.98 * floor), np.ones(30))
    below = Evidence(steps, np.r_[np.full(29, floor), 0.97 * floor], np.ones(30))
    assert probabilities_fed_to_ce(p, at, 1) is not None
    assert probabilities_fed_to_ce(p, below, 1) is None  # a loss below the floor: not probabilities fed to CE
    assert probabilities_fed_to_ce({**p, "std": 0.79 * math.sqrt(c - 1) / c}, at, 1) is None  # unsure outputs
    assert probabilities_fed_to_ce({**p, "max": 1.5}, at, 1) is None  # not in [0, 1]


# -- losses negative by design, and probabilities under a loss other than cross-entropy (h-review) ----------------
def _gaussian_nll(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.gaussian_nll_loss(out[:, :1], t, out[:, 1:].exp())


def _reinforce(out: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
    d = torch.distributions.Categorical(logits=out)
    a = d.sample()
    r = (a == best).float()
    return -(d.log_prob(a) * (r - r.mean())).mean()


def _neg_cosine(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return -F.cosine_similarity(out, t).mean()


@pytest.mark.parametrize("kind", ["gaussian_nll", "reinforce", "neg_cosine"])
def test_a_loss_negative_by_design_on_a_classifier_shaped_output_is_no_finding(kind: str) -> None:
    """A heteroscedastic regression's Gaussian NLL (N×2 head), a policy gradient (N×C logits), a SimSiam-like
    −cosine (N×C embeddings): healthy, their losses go negative and stay bounded; no warning (the negative-loss
    rule named all three before its loss had to reach −10 and keep falling)."""
    g = torch.Generator().manual_seed(21)
    x = torch.randn(N, D, generator=g)
    if kind == "gaussian_nll":
        m, y, loss_fn, steps = Tail(seed=21, d_out=2), 2 * x[:, :1] + 0.05 * torch.randn(N, 1, generator=g), _gaussian_nll, 150
    elif kind == "reinforce":
        m, y, loss_fn, steps = Tail(seed=21, d_out=4), x[:, :4].argmax(1), _reinforce, 100
    else:
        m, y, loss_fn, steps = Tail(seed=21, d_out=C), x[:, :C] + 0.1 * torch.randn(N, C, generator=g), _neg_cosine, 60
    torch.manual_seed(21)
    res = _loop(m, torch.optim.Adam(m.parameters(), lr=3e-3), x, y, steps, loss_fn)
    from nbdebug.inspectors.run_evidence import Evidence
    loss = Evidence.of(res.history).loss
    assert float(loss.min()) < -0.05  # negative: what the old rule named
    assert "output_loss_mismatch" not in [f.code for f in res.findings]
    assert _serious(res) == []  # −cosine's first loss is 0.004: no "rose to 17× its first value" (REVIEW.md R3)


def test_a_multi_label_sigmoid_under_a_summed_bce_is_not_probabilities_fed_to_cross_entropy() -> None:
    """N×6 sigmoid outputs with ``BCELoss(reduction="sum")``: healthy; its loss (a sum over 64×6 terms) never goes
    below CE's floor on [0, 1] values but is far above its ceiling ln(6e) = 2.79, so it is no cross-entropy."""
    g = torch.Generator().manual_seed(22)
    x = torch.randn(N, D, generator=g)
    y = (x @ torch.randn(D, 6, generator=g) > 0).float()
    m = Tail(torch.sigmoid, seed=22, d_out=6)
    res = _loop(m, torch.optim.Adam(m.parameters(), lr=1e-2), x, y, 60,
                lambda o, t: F.binary_cross_entropy(o, t, reduction="sum"))
    p = res.loop["output_probe"]
    assert p["shape"] == [64, 6] and 0.0 <= p["min"] and p["max"] <= 1.0
    assert "output_loss_mismatch" not in [f.code for f in res.findings]


def test_the_probability_rule_needs_the_loss_below_the_ceiling_of_cross_entropy() -> None:
    import numpy as np

    from nbdebug.inspectors.run_evidence import Evidence
    from nbdebug.inspectors.run_findings_output import probabilities_fed_to_ce

    c = 4
    p = {"shape": [64, c], "min": 0.0, "max": 1.0, "mean": 0.25, "std": 0.8 * math.sqrt(c - 1) / c, "finite": True}
    steps = np.arange(1, 31)
    ceiling = 1 + math.log(c)
    assert probabilities_fed_to_ce(p, Evidence(steps, np.full(30, ceiling), np.ones(30)), 1) is not None
    assert probabilities_fed_to_ce(p, Evidence(steps, np.full(30, 1.03 * ceiling), np.ones(30)), 1) is None


def test_no_probe_of_a_model_compiled_in_place() -> None:
    """``model.compile()`` (in place: the type stays ``Sequential``) is as compiled as ``torch.compile(model)``: the
    probes would recompile it (eval mode, half a batch, their hooks), so neither runs; nor for a compiled child."""
    from nbdebug.runs.batch_probe import batch_probe, plain

    m = nn.Sequential(nn.Linear(D, 8), nn.ReLU(), nn.Linear(8, C))
    assert plain(m)
    m.compile()  # lazy: nothing is compiled until it is called, and nothing here calls it
    assert not plain(m)
    assert output_probe(m, ((torch.randn(8, D),), {})) is None and batch_probe(m, ((torch.randn(8, D),), {})) is None
    child = nn.Sequential(nn.Linear(D, 8), nn.ReLU(), nn.Linear(8, C))
    child[0].compile()
    assert not plain(child)
