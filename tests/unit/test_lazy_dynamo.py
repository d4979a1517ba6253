"""nbdebug never imports ``torch._dynamo`` (~2.5 CPU-s) itself: an inference cell that neither
compiles nor steps an optimizer does not pay it. Its hooks are ``torch.compiler.disable``d only once
TorchDynamo is imported (``nbdebug/capture/eager.py``), the live ones included: a ``torch.compile``
first used inside the watched cell traces none of nbdebug's frames and the capture equals eager.

One fresh process runs both parts (an import of torch costs ~3 CPU-s): first the inference cells,
then the cell that compiles."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = r'''
import json, logging, re, sys
import numpy as np
import torch, torch.nn as nn
import nbdebug
from nbdebug import Capture
from nbdebug.capture import hook_count
from nbdebug.capture.eager import status
from nbdebug.capture.state import fingerprint, same_fingerprint

out = {}
def cnn():
    torch.manual_seed(3)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    return m.eval()
g = torch.Generator().manual_seed(1)
xs = [torch.randn(2, 3, 8, 8, generator=g) for _ in range(3)]

# -- part 1: inference, no compile, no optimizer: torch._dynamo is never imported ----------------
m = cnn()
with Capture(m) as cap, torch.no_grad():
    m(xs[0])
out["capture_rows"] = [r.name for r in cap.result.layers]
from IPython.core.interactiveshell import InteractiveShell
sh = InteractiveShell.instance()
shown = []
sh.display_pub.publish = lambda data, metadata=None, **kw: shown.append(data)
assert sh.run_cell("%load_ext nbdebug").success
sh.user_ns.update(m=m, x=xs[0], torch=torch)
for view in ("gradcam", "featuremaps", "thermometer"):
    r = sh.run_cell(f"%%nndebug m --view {view} -o res\nm(x)")
    assert r.success, r.error_in_exec
    out[f"magic_{view}"] = type(sh.user_ns["_nndebug_widget"]).__name__
out["hooks_after_inference"] = hook_count(m)
out["status_before"] = status()
out["dynamo_after_inference"] = "torch._dynamo" in sys.modules

# -- part 2: torch.compile first used inside the watched cell -----------------------------------
frames = []
class Frames(logging.Handler):
    def emit(self, record):
        hit = re.search(r"torchdynamo start tracing (\S+) (\S+):\d+", record.getMessage())
        if hit:
            frames.append(f"{hit[2]} {hit[1]}")
log = logging.getLogger("torch._dynamo.symbolic_convert")
log.setLevel(logging.INFO); log.propagate = False; log.addHandler(Frames())
graphs = []
def backend(gm, _example):
    graphs.append(str(gm.graph))
    return gm.forward
BODY = """
run = {compile}
for xb in xs:
    loss = run(xb).logsumexp(1).sum()
    loss.backward()
"""
ref, got = cnn(), cnn()
sh.user_ns.update(ref=ref, got=got, xs=xs, backend=backend)
before = fingerprint(got)
assert sh.run_cell("%%nndebug ref --view thermometer -o want" + BODY.format(compile="ref")).success
out["dynamo_after_eager_cell"] = "torch._dynamo" in sys.modules
assert sh.run_cell("%%nndebug got --view thermometer -o have" + BODY.format(compile='torch.compile(got, backend=backend)')).success
out["dynamo_after_compiled_cell"] = "torch._dynamo" in sys.modules
out["status_after"] = status()
want, have = sh.user_ns["want"], sh.user_ns["have"]
out["rows"] = [want.history.rows, have.history.rows]
out["steps"] = [want.step_index.tolist(), have.step_index.tolist()]
out["same_values"] = bool(np.array_equal(want.history.values(), have.history.values(), equal_nan=True))
out["same_loss"] = bool(np.array_equal(want.history.scalar("loss"), have.history.scalar("loss"), equal_nan=True))
out["grad_norm_positive"] = bool((have.series("0", "grad_norm") > 0).all())
out["same_grads"] = all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), got.parameters()))
for p in [*ref.parameters(), *got.parameters()]:  # the cells' own gradients (equal): the rest as found
    p.grad = None
out["state_diffs_vs_before"] = same_fingerprint(before, fingerprint(got))
torch.compile(ref, backend=backend)  # what torch.compile itself marks on the module it wraps
out["state_diffs"] = same_fingerprint(fingerprint(ref), fingerprint(got))
out["hooks_after_compiled"] = hook_count(got)
out["graphs"] = len(graphs)
out["frames"] = frames
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def run() -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_inference_cells_never_import_dynamo(run: dict) -> None:
    """A Capture and three inference views through ``%%nndebug`` on a plain CNN: no ``torch._dynamo``
    (before: imported with ``nbdebug.capture``, by the hooks' ``torch.compiler.disable`` at import)."""
    assert run["capture_rows"] == ["0", "1", "2", "3", "4", "5", "6", "7"], run
    assert (run["magic_gradcam"], run["magic_featuremaps"], run["magic_thermometer"]) == (
        "GradCamWidget", "FeatureMapsWidget", "ThermometerWidget"), run
    assert run["hooks_after_inference"] == 0
    assert run["status_before"] == "plain (torch._dynamo not imported)"
    assert run["dynamo_after_inference"] is False
    assert run["dynamo_after_eager_cell"] is False  # a backward without an optimizer step: still not


def test_compile_first_used_inside_the_cell_equals_eager(run: dict) -> None:
    """``torch.compile(model)`` first called inside the watched cell imports TorchDynamo after the
    hooks were registered: they are swapped for disabled ones before it traces, so it compiles the
    model's own pieces and none of nbdebug's frames (without the swap: the forward hooks, the root
    hooks and what they call, traced and compiled), and the history equals the eager cell's bit for bit."""
    assert run["dynamo_after_compiled_cell"] is True and run["status_after"] == "disabled for TorchDynamo"
    assert run["graphs"] > 0, "nothing was compiled"
    nbdebug_dir = str(REPO / "nbdebug")
    assert [f for f in run["frames"] if f.startswith(nbdebug_dir)] == [], run["frames"]
    assert any(f.endswith(" forward") for f in run["frames"]), run["frames"]  # the model's forward was traced
    assert run["rows"][0] == run["rows"][1] and len(run["rows"][0]) == 8, run["rows"]
    assert run["steps"] == [[1, 2, 3], [1, 2, 3]], run["steps"]
    assert run["same_values"] and run["same_loss"] and run["grad_norm_positive"]
    assert run["same_grads"], "the compiled cell's gradients differ from the eager cell's"
    # as the eager cell's model once torch.compile has marked it (its attributes), else as found
    assert run["state_diffs"] == [] and run["state_diffs_vs_before"] in ([], ["attrs"]), run
    assert run["hooks_after_compiled"] == 0
