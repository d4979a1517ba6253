"""Samples mixed across the batch, measured by the run (``nbdebug.runs.batch_probe``, issue 26): once after a
training cell, the last call again as nbdebug's own passes in eval mode, whole and its first half alone.
Planted faults (a reshape where a transpose was meant, a normalisation over the batch) are named
``batch_mixed``; their twins (the transpose, a normalisation over the features; a BatchNorm + dropout CNN
in train mode) are quiet. The probe's number is checked against a hand computation, and the model is left
exactly as found."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nbdebug
from nbdebug.inspectors.run_findings import BATCH_CHANGE
from nbdebug.runs.batch_probe import batch_probe
from tests.unit.test_findings_loop import C, linear_labels, train_ce


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
    return train_ce(model, torch.optim.Adam(model.parameters(), lr=1e-3), x, y, 30, bs=32)


def _steps(m: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, n: int = 5) -> None:
    """``n`` steps of the plain classification loop on batches of 32 taken in turn (inside the test's own
    ``nbdebug.debug``, which reads the model before the cell ends)."""
    for i in range(n):
        opt.zero_grad()
        F.cross_entropy(m(x[i * 32:(i + 1) * 32]), y[i * 32:(i + 1) * 32]).backward()
        opt.step()


class Rows(nn.Module):
    """16 features as 4 rows of 4, embedded per row, flattened per sample; ``mix``: (B, 4, 8) reshaped to
    (4, B, 8) where a transpose was meant (each "sample" of the head then holds rows of 4 samples)."""

    def __init__(self, mix: bool) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.embed = nn.Linear(4, 8)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(32, C))
        self.mix = mix

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.reshape(-1, 4, 4))
        rows_first = h.reshape(4, -1, 8) if self.mix else h.transpose(0, 1)
        return self.head(rows_first.transpose(0, 1).reshape(h.shape[0], 32))


class Norm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (h - h.mean(self.dim, keepdim=True)) / (h.std(self.dim, keepdim=True) + 1e-5)


@pytest.mark.parametrize("faulty", [True, False])
def test_a_reshape_for_a_transpose_mixes_samples_and_the_transpose_does_not(faulty: bool) -> None:
    x, y = linear_labels()
    res = _train(Rows(mix=faulty), x, y)
    serious = [f for f in res.findings if f.severity != "note"]
    probe = res.loop["batch_probe"]
    assert (probe["batch"], probe["half"]) == (32, 16)
    if faulty:
        assert serious[0].code == "batch_mixed" and serious[0].step == 30, res.findings
        assert probe["change"] >= BATCH_CHANGE and "first 16 samples" in serious[0].text
    else:
        assert serious == [] and probe["change"] == 0.0, res.findings


@pytest.mark.parametrize("faulty", [True, False])
def test_a_normalisation_over_the_batch_is_a_note_and_one_over_features_is_nothing(faulty: bool) -> None:
    """Round 5 (h-ddata): statistics over the batch written by hand (as BatchNorm does in train mode) are said as a
    note (``batch_stats``), not as samples mixed: duplicating every sample leaves the outputs (almost) as they were."""
    x, y = linear_labels()
    torch.manual_seed(4)
    m = nn.Sequential(nn.Linear(x.shape[1], 32), Norm(0 if faulty else 1), nn.ReLU(), nn.Linear(32, C))
    res = _train(m, x, y)
    assert [f.code for f in res.findings if f.severity != "note"] == [], res.findings
    assert ("batch_stats" in [f.code for f in res.findings]) == faulty, res.findings


def test_batchnorm_and_dropout_in_train_mode_are_not_mixing_and_the_model_is_left_as_found() -> None:
    """BatchNorm mixes the batch in train mode by design: the probe runs in eval mode (running statistics).
    After the run: modes, parameters, buffers, .grad and the RNG as the user's loop left them, no hook."""
    x, y = linear_labels()
    torch.manual_seed(6)
    m = nn.Sequential(nn.Linear(x.shape[1], 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, C))
    res = _train(m, x, y)
    assert [f.code for f in res.findings if f.severity != "note"] == [] and res.loop["batch_probe"]["change"] == 0.0
    # the probe alone, on a model in train mode with gradients and a generator in a known state
    m.train()
    F.cross_entropy(m(x[:32]), y[:32]).backward()
    state = {k: v.clone() for k, v in m.state_dict().items()}
    grads = [p.grad.clone() for p in m.parameters()]
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    probe = batch_probe(m, ((x[:32],), {}))
    assert probe == {"batch": 32, "half": 16, "change": 0.0}
    assert all(mod.training for mod in m.modules())
    assert all(torch.equal(v, state[k]) for k, v in m.state_dict().items())
    assert all(torch.equal(p.grad, g) for p, g in zip(m.parameters(), grads, strict=True))
    assert torch.equal(torch.get_rng_state(), rng)
    assert not any(mod._forward_hooks or mod._forward_pre_hooks for mod in m.modules())


def test_the_probes_change_is_the_hand_computed_one() -> None:
    """out = x − mean over the batch: the first half's outputs move by mean(all) − mean(first half)."""

    class Centre(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x - x.mean(0, keepdim=True)

    x = torch.arange(24, dtype=torch.float32).reshape(6, 4) ** 1.5
    full = x - x.mean(0, keepdim=True)
    part = x[:3] - x[:3].mean(0, keepdim=True)
    want = float((full[:3] - part).abs().max() / full[:3].abs().max())
    got = batch_probe(Centre(), ((x,), {}))
    assert got is not None and got["batch"] == 6 and got["half"] == 3 and got["change"] == pytest.approx(want, rel=1e-6)


def test_no_probe_when_the_model_cannot_run_on_half_a_batch_or_the_batch_is_too_small() -> None:
    class Fixed(nn.Module):  # a hard-coded batch size: raises on half a batch
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x).reshape(8, 2)

    assert batch_probe(Fixed(), ((torch.randn(8, 4),), {})) is None
    assert batch_probe(nn.Linear(4, 2), ((torch.randn(3, 4),), {})) is None  # each half would hold one sample


def test_no_probe_of_a_compiled_model() -> None:
    """Half a batch would make torch.compile recompile: a compiled model is not probed (nor compiled by us)."""
    m = torch.compile(nn.Linear(4, 2))
    assert batch_probe(m, ((torch.randn(8, 4),), {})) is None


def test_a_forward_that_stashes_what_it_saw_keeps_the_users_last_call() -> None:
    """A model keeping its last hidden state (``self.seen = h``): after the cell it holds the user's last
    training forward, not the probe's half batch in eval mode."""

    class Stash(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(8)
            self.fc, self.head = nn.Linear(16, 8), nn.Linear(8, C)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen = self.fc(x)
            return self.head(self.seen.relu())

    x, y = linear_labels()
    m = Stash()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with nbdebug.debug(m) as dbg:
        _steps(m, opt, x, y)
        last = m.seen
    assert dbg.result.loop["batch_probe"]["change"] == 0.0  # the probe ran
    assert m.seen is last and m.seen.shape[0] == 32 and m.seen.requires_grad


def test_no_probe_of_a_model_that_draws_noise_in_eval_mode() -> None:
    """A VAE's reparameterisation draws ``randn_like`` in every mode: its halves differ from the whole by the
    noise alone, so the probe asks the whole batch twice and, when it does not give itself back, says nothing
    (held-out zoo: the healthy VAE recipe was warned ``batch_mixed``). Planted: the same model with the
    noise fixed still gives a probe (0 change)."""

    class Sampler(nn.Module):
        def __init__(self, noisy: bool) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.enc, self.dec, self.noisy = nn.Linear(6, 4), nn.Linear(2, 6), noisy

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mu, logvar = self.enc(x).chunk(2, dim=-1)
            eps = torch.randn_like(mu) if self.noisy else torch.zeros_like(mu)
            return self.dec(mu + eps * (0.5 * logvar).exp())

    x = torch.randn(8, 6)
    assert batch_probe(Sampler(noisy=True), ((x,), {})) is None
    quiet = batch_probe(Sampler(noisy=False), ((x,), {}))
    assert quiet is not None and quiet["change"] < BATCH_CHANGE
    # and a real mixer is still probed: the centring model's change survives the repeat
    class Centre(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x - x.mean(0, keepdim=True)

    got = batch_probe(Centre(), ((x,), {}))
    assert got is not None and got["change"] >= BATCH_CHANGE


@pytest.mark.parametrize("nth", [1, 2], ids=["whole_batch", "half_batch"])
def test_ctrl_c_during_the_probe_leaves_the_model_as_found(nth: int) -> None:
    """Real-use row: a KeyboardInterrupt while a post-cell probe runs (after the user's loop ended) reaches the user,
    and the model keeps its mode, parameters, buffers, ``.grad`` and no hook is left. Planted: the ``nth`` forward
    after the loop raises — the whole batch's (the output probe's hooks on it), or the half batch's (this model's halves
    do not change, so no third pass)."""

    class Interrupted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.fc, self.bn, self.out = nn.Linear(C * 2, 16), nn.BatchNorm1d(16), nn.Linear(16, C)
            self.calls, self.stop_at = 0, 10**9
            self.every = [0]  # counted in place: the probes put rebound attributes back (``calls``), not this

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            self.every[0] += 1
            if self.every[0] >= self.stop_at:
                raise KeyboardInterrupt
            return self.out(torch.relu(self.bn(self.fc(x))))

    x, y = linear_labels()
    x = x[:, : C * 2]
    m = Interrupted()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    before: dict[str, torch.Tensor] = {}
    with pytest.raises(KeyboardInterrupt), nbdebug.debug(m):
        _steps(m, opt, x, y)
        before = {k: v.clone() for k, v in m.state_dict().items()}
        grads = {n: p.grad.clone() for n, p in m.named_parameters()}
        m.stop_at = m.every[0] + nth
    # the loop itself cannot raise: the KeyboardInterrupt above is the probe's; its forward's `self.calls += 1`
    # is undone too (attributes a forward rebinds are put back, also on Ctrl-C)
    assert m.calls == 5
    assert m.training
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert all(torch.equal(grads[n], p.grad) for n, p in m.named_parameters())
    assert not any(mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks for mod in m.modules())


def test_one_whole_batch_pass_serves_both_post_cell_probes() -> None:
    """REVIEW.md R7: after the cell the model runs twice (the whole batch, whose pass the output probe's hooks ride on,
    and its half), not three times (the batch probe's two passes, then the output probe's own whole batch), and each
    probe's result is what it gives alone."""
    from nbdebug.runs.output_probe import output_probe

    class Counted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.fc, self.out = nn.Linear(C * 2, 16), nn.Linear(16, C)
            self.every = [0]  # counted in place (the probes put rebound attributes back)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.every[0] += 1
            return self.out(torch.relu(self.fc(x)))

    x, y = linear_labels()
    x = x[:, : C * 2]
    m = Counted()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with nbdebug.debug(m) as dbg:
        _steps(m, opt, x, y)
        n = m.every[0]
    assert m.every[0] - n == 2
    loop = dbg.result.loop
    last = ((x[128:160],), {})
    assert loop["batch_probe"] == batch_probe(m, last) == {"batch": 32, "half": 16, "change": 0.0}
    assert loop["output_probe"] == output_probe(m, last) and loop["output_probe"]["shape"] == [32, C]
