"""The CAM family, --faithfulness and --sanity leave the model as they found it: no hook left, parameters,
buffers, ``.grad`` and modes bit-identical, the user's hooks not called again, the random stream
unmoved, also when the model raises or the user presses Ctrl-C in the middle of the perturbation
forwards; the broadcast shortcut of the ablation forwards falls back when a model cannot take it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.recorders.gradcam import GradCamRecorder, grad_cam
from nbdebug.runs.perturb import Perturbed


class Trip(nn.Module):
    """Identity that raises ``exc`` on the ``after``-th call with a batch of more than one (of any
    batch with ``every``) when armed."""

    def __init__(self) -> None:
        super().__init__()
        self.exc: type[BaseException] | None = None
        self.after = 2
        self.seen = 0
        self.every = False

    def arm(self, exc: type[BaseException] | None, every: bool = False) -> None:
        self.exc, self.after, self.seen, self.every = exc, 2, 0, every

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.exc is not None and (x.shape[0] > 1 or self.every):
            self.seen += 1
            if self.seen >= self.after:
                raise self.exc("planted in the perturbation forwards")
        return x


class Net(nn.Module):
    """trip_in → conv → bn (train mode) → relu (the CAM layer) → trip_out → pool → fc."""

    def __init__(self) -> None:
        super().__init__()
        self.trip_in = Trip()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.act = nn.ReLU()
        self.trip_out = Trip()
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.trip_out(self.act(self.bn(self.conv(self.trip_in(x)))))
        return self.fc(self.drop(h.mean((2, 3))))


def training_cell(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    out.sum().backward()
    return out


def test_everything_at_once_in_a_training_cell_leaves_the_model_alone() -> None:
    torch.manual_seed(0)
    model = Net().train()
    x = torch.randn(2, 3, 8, 8)
    calls = [0]
    model.conv.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    torch.manual_seed(1)
    rec = GradCamRecorder(model, gradcam_layer="act", cam_method="all", faithfulness=True, sanity=True, cam_topk=2)
    with rec:
        training_cell(model, x)
    assert calls[0] == 1
    before, hooks, rng = fingerprint(model), hook_count(model), torch.get_rng_state()
    res = rec.result()
    assert res.methods and res.faithfulness and res.sanity
    assert same_fingerprint(before, fingerprint(model)) == [] and hook_count(model) == hooks
    assert torch.equal(rng, torch.get_rng_state()) and calls[0] == 1  # no pass of ours called the user's hook
    assert any("training mode: batch statistics and dropout" in n for n in res.notes)
    w = rec.widget()
    w.handle_request("view", {"layer": "conv", "sample": 1})  # another layer on demand, every method
    assert same_fingerprint(before, fingerprint(model)) == [] and hook_count(model) == hooks
    assert set(res.maps["conv"].methods) == set(res.methods)


@pytest.mark.parametrize("exc", [ValueError, KeyboardInterrupt])
@pytest.mark.parametrize("where", ["scorecam", "ablationcam", "faithfulness", "sanity"])
def test_an_error_mid_perturbation_leaves_the_model_as_it_was(exc: type[BaseException], where: str) -> None:
    torch.manual_seed(0)
    model = Net().train()
    x = torch.randn(1, 3, 8, 8)
    model(x).sum().backward()  # .grad present, BatchNorm's running stats moved
    before, hooks, rng = fingerprint(model), hook_count(model), torch.get_rng_state()
    trip = model.trip_out if where == "ablationcam" else model.trip_in
    method = where if where in ("scorecam", "ablationcam") else "gradcam"
    rec = GradCamRecorder(model, gradcam_layer="act", cam_method=method, faithfulness=where == "faithfulness",
                          sanity=where == "sanity", max_bytes=2 * (3 * 6 * 64 * 4 + 3 * 64 * 4))  # two copies a chunk
    with rec, torch.no_grad():
        model(x)
    before, hooks, rng = fingerprint(model), hook_count(model), torch.get_rng_state()
    # sanity: the copy's trip (armed as the model's was when copied) raises in the copy's first pass
    trip.arm(exc, every=where == "sanity")
    with pytest.raises(exc, match="planted"):
        rec.result()
    assert trip.seen == (1 if where == "sanity" else 2), trip.seen  # sanity: the user's model ran once, the copy raised
    trip.arm(None)  # (the trip's own counters are settings the fingerprint compares)
    assert same_fingerprint(before, fingerprint(model)) == [], where
    assert hook_count(model) == hooks and torch.equal(rng, torch.get_rng_state())
    out = model(x)  # the model still works as before
    assert out.shape == (1, 4)


class BatchFromInput(nn.Module):
    """Reads the batch size from its input (as many HF models do): the ablated copies cannot broadcast."""

    def __init__(self, silent: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.ReLU()
        self.fc = nn.Linear(4 * 16, 3)
        self.silent = silent

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        h = self.act(self.conv(x))
        if self.silent:  # no error: the output just has the input's batch size
            return self.fc(h.flatten(1)).reshape(b, -1)[:, :3]
        return self.fc(h.reshape(b, -1))


@pytest.mark.parametrize("silent", [False, True])
def test_ablation_falls_back_to_repeating_the_input(silent: bool) -> None:
    torch.manual_seed(2)
    model = BatchFromInput(silent).eval()
    plain = BatchFromInput(False).eval()
    plain.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 4, 4)
    got, classes, *_ = grad_cam(model, x, layer="act", topk=2, methods="ablationcam")
    want, *_ = grad_cam(plain, x, layer="act", targets=classes[0].tolist(), methods="ablationcam")
    np.testing.assert_allclose(got.of("ablationcam")[1][0], want.of("ablationcam")[1][0], atol=1e-5)
    runner = Perturbed(model, (x,), {}, sample=1, chunk=3)
    runner.layer("act", 0, lambda i, j: torch.zeros(j - i, 4, 4, 4), 4, lambda out: out[:, :1])
    assert runner.broadcast is False and runner.items == 4 and runner.forwards == 2


def test_ablation_broadcasts_when_the_model_allows() -> None:
    torch.manual_seed(3)
    model = Net().eval()
    seen: list[int] = []
    model.trip_in.register_forward_hook(lambda m, i, o: seen.append(int(o.shape[0])))
    runner = Perturbed(model, (torch.randn(2, 3, 8, 8),), {}, sample=1, chunk=4)
    out = runner.layer("act", 0, lambda i, j: torch.zeros(j - i, 6, 8, 8), 6, lambda o: o)
    assert runner.broadcast and out.shape == (6, 4) and seen == []  # suspended user hooks: ours only
    assert hook_count(model) == 1
