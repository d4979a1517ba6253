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
