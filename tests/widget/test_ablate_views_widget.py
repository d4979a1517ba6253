"""Click-to-test in the existing views (issue 20): a feature-map channel → ablate → Δ class probability and
the new Grad-CAM; a thermometer row → ablate → Δ loss (or Δ output).

Through ``%%nndebug`` in a fresh InteractiveShell on tiny hand-built models in training mode (BatchNorm,
dropout): the widget's answers equal hand-hooked forwards computed here (plain ``register_forward_hook``
on a deep copy); the request leaves parameters, ``.grad``, buffers (BatchNorm running statistics), modes,
the RNG and the hook count as found; ``del model`` → the answer says to re-run the cell.
"""

from __future__ import annotations

import copy
import gc
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from nbdebug.cams.methods import grad_cam
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.sessions.thermometer import OUTPUT_NOTE
from nbdebug.widgets._transport import decode_array

CNN = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 6)).train()
names = [f"class {i}" for i in range(6)]
x = torch.rand(3, 3, 16, 16)
"""


def arrays_of(content: dict[str, Any], buffers: list[Any]) -> dict[str, np.ndarray]:
    return {k: decode_array({"view": buffers[m["buffer"]], "dtype": m["dtype"], "shape": m["shape"]})
            for k, m in content["arrays"].items()}


def zero_channels(chans: list[int], mean: bool = False) -> Any:
    def hook(_m: nn.Module, _a: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        for c in chans:
            out[:, c] = out[:, c].mean(dim=(-2, -1), keepdim=True) if mean else 0
        return out
    return hook


def hand(model: nn.Module, x: torch.Tensor, layer: str, chans: list[int], cam_layer: str, cls: int | None,
         mean: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Probabilities of a deep copy with ``chans`` of ``layer`` ablated, and the Grad-CAM (layer size) of ``cls``."""
    ref = copy.deepcopy(model)
    seen: dict[str, torch.Tensor] = {}
    h1 = ref.get_submodule(layer).register_forward_hook(zero_channels(chans, mean)) if chans else None

    def keep(_m: nn.Module, _a: Any, out: torch.Tensor) -> None:
        out.retain_grad()
        seen["a"] = out

    h2 = ref.get_submodule(cam_layer).register_forward_hook(keep)
    logits = ref(x)
    p = torch.softmax(logits.double(), -1)[0]
    cam = None
    if cls is not None:
        logits[0, cls].backward()
        a, g = seen["a"], seen["a"].grad
        cam = torch.relu((g.mean(dim=(2, 3), keepdim=True) * a).sum(1))[0].detach()
    for h in (h1, h2):
        if h is not None:
            h.remove()
    return p.detach(), cam


@pytest.fixture
def fm(shell):  # type: ignore[no-untyped-def]
    assert shell.run_cell(CNN).success
    res = shell.run_cell("%%nndebug model --view featuremaps --class-names names -o fm\nout = model(x)")
    assert res.success, res.error_in_exec
    return shell


@pytest.mark.parametrize(("layer", "chans", "mode"), [("0", [2], "zero"), ("0", [1, 5], "mean"), ("4", [3, 7], "zero")])
def test_channel_ablation_equals_a_hand_hooked_forward(fm, layer: str, chans: list[int], mode: str) -> None:  # type: ignore[no-untyped-def]
    ns = fm.user_ns
    model, x, w = ns["model"], ns["x"], ns["_nndebug_widget"]
    assert w.can_ablate
    before, rng, hooks = fingerprint(model), torch.get_rng_state(), hook_count(model)
    content, buffers = w.handle_request("ablate", {"kind": "channels", "targets": [{"layer": layer, "units": chans}], "mode": mode})
    out, arrays = content["result"], arrays_of(content, buffers)
    assert same_fingerprint(before, fingerprint(model)) == []  # params, .grad, BN running stats, modes, hooks
    assert torch.equal(torch.get_rng_state(), rng) and hook_count(model) == hooks == 0 and model.training
    # the CAM layer is the one the Grad-CAM view picks, the class the clean run's top-1
    maps, classes, _, _, _ = grad_cam(model, x[:1], topk=1)
    assert out["cam"]["layer"] == maps.layer == "4" and out["metric"]["of"]["id"] == int(classes[0, 0])
    p_clean, _ = hand(model, x[:1], layer, [], "4", None)
    cls = out["metric"]["of"]["id"]
    p_abl, cam = hand(model, x[:1], layer, chans, "4", cls, mean=mode == "mean")
    assert out["metric"]["clean"] == pytest.approx(float(p_clean[cls]), abs=1e-6)
    assert out["metric"]["delta"] == pytest.approx(float(p_abl[cls] - p_clean[cls]), abs=1e-6)
    assert out["metric"]["delta"] != 0
    top = p_abl.topk(5)
    assert [t["id"] for t in out["top"]["ablated"]] == top.indices.tolist()
    assert [t["label"] for t in out["top"]["ablated"]] == [f"class {i}" for i in top.indices.tolist()]
    assert [t["p"] for t in out["top"]["ablated"]] == pytest.approx(top.values.tolist(), abs=1e-6)
    low = w.ablation.ablate(layer, chans, mode)["cam_low"]
    np.testing.assert_allclose(low, cam.numpy(), rtol=1e-4, atol=1e-6)
    assert arrays["cam"].shape == (16, 16) and arrays["cam_clean"].shape == (16, 16)
    assert not np.allclose(arrays["cam"], arrays["cam_clean"])
    assert w.ablations == 1


def test_channel_ablation_errors_and_model_gone(fm) -> None:  # type: ignore[no-untyped-def]
    w = fm.user_ns["_nndebug_widget"]
    with pytest.raises(ValueError, match="no channel"):
        w.handle_request("ablate", {"kind": "channels", "targets": [{"layer": "0", "units": []}]})
    with pytest.raises(ValueError, match="mode"):
        w.handle_request("ablate", {"kind": "channels", "targets": [{"layer": "0", "units": [1]}], "mode": "noise"})
    assert fm.run_cell("del model, out").success
    gc.collect()
    with pytest.raises(RuntimeError, match="re-run the cell"):
        w.handle_request("ablate", {"kind": "channels", "targets": [{"layer": "0", "units": [1]}]})


LOOP = """
import torch, torch.nn as nn
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 4))
class WithLoss(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net
    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)
model = WithLoss(net) if {with_loss} else net
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(8, 6), torch.randint(0, 4, (8,))) for _ in range(3)]
"""
BODY_LOSS = "for xb, yb in data:\n    opt.zero_grad(); loss = model(xb, yb); loss.backward(); opt.step()"
BODY_OUT = "for xb, yb in data:\n    opt.zero_grad(); loss = nn.functional.cross_entropy(model(xb), yb); loss.backward(); opt.step()"


def zero_output(_m: nn.Module, _a: Any, out: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(out)


def therm(shell: Any, with_loss: bool) -> Any:
    assert shell.run_cell(LOOP.format(with_loss=with_loss)).success
    res = shell.run_cell(f"%%nndebug model --view thermometer -o t\n{BODY_LOSS if with_loss else BODY_OUT}")
    assert res.success, res.error_in_exec
    return shell.user_ns["_nndebug_widget"]


def hand_run(model: nn.Module, inputs: tuple[Any, ...], module: str | None, rng: torch.Tensor) -> Any:
    ref = copy.deepcopy(model)
    h = ref.get_submodule(module).register_forward_hook(zero_output) if module else None
    torch.set_rng_state(rng)  # the same dropout masks as nbdebug's forked RNG
    with torch.no_grad():
        out = ref(*inputs)
    if h is not None:
        h.remove()
    return out


def test_thermometer_row_ablation_equals_a_hand_forward_on_the_last_batch(shell) -> None:  # type: ignore[no-untyped-def]
    w = therm(shell, with_loss=True)
    model, (xb, yb) = shell.user_ns["model"], shell.user_ns["data"][-1]
    assert w.can_ablate and model.training
    before, rng = fingerprint(model), torch.get_rng_state()
    out = w.handle_request("ablate", {"kind": "modules", "targets": [{"layer": "net.2", "units": []}]})[0]["result"]
    assert same_fingerprint(before, fingerprint(model)) == [] and hook_count(model) == 0
    assert torch.equal(torch.get_rng_state(), rng)
    clean = hand_run(model, (xb, yb), None, rng)
    ablated = hand_run(model, (xb, yb), "net.2", rng)
    torch.set_rng_state(rng)
    assert out["metric"]["kind"] == "loss" and out["note"] == ""
    assert out["metric"]["clean"] == pytest.approx(float(clean), abs=1e-6)
    assert out["metric"]["delta"] == pytest.approx(float(ablated - clean), abs=1e-6) and out["metric"]["delta"] != 0


def test_thermometer_without_a_loss_in_the_output_reports_the_output_change(shell) -> None:  # type: ignore[no-untyped-def]
    w = therm(shell, with_loss=False)
    model, (xb, _) = shell.user_ns["model"], shell.user_ns["data"][-1]
    rng = torch.get_rng_state()
    out = w.handle_request("ablate", {"kind": "modules", "targets": [{"layer": "1", "units": []}], "mode": "zero"})[0]["result"]
    clean = hand_run(model, (xb,), None, rng).double()
    ablated = hand_run(model, (xb,), "1", rng).double()
    torch.set_rng_state(rng)
    assert out["metric"]["kind"] == "output" and out["note"] == OUTPUT_NOTE
    assert out["metric"]["delta"] == pytest.approx(float((ablated - clean).abs().mean()), abs=1e-6)
    assert out["agreement"] == pytest.approx(float((ablated.argmax(-1) == clean.argmax(-1)).double().mean()))
    del model
    assert shell.run_cell("del model, net, opt").success
    gc.collect()
    with pytest.raises(RuntimeError, match="re-run the cell"):
        w.handle_request("ablate", {"kind": "modules", "targets": [{"layer": "1", "units": []}]})


def test_the_kept_inputs_never_hold_the_users_graph() -> None:
    """The thermometer's last-call inputs are detached: a graph built before the model (here an input
    computed from a parameter) is not kept alive by the widget."""
    from nbdebug.sessions.thermometer import LastCall

    model = torch.nn.Linear(3, 2)
    pre = torch.nn.Parameter(torch.ones(3))
    with LastCall(model) as last:
        x = torch.randn(4, 3) * pre  # has a grad_fn
        model(x)
    kept = last.inputs[0][0]
    assert x.grad_fn is not None
    assert kept.grad_fn is None and not kept.requires_grad and torch.equal(kept, x)
