"""Tutorial 1 (notebooks/01_thermometer_quickstart.ipynb) run as a user would: in JupyterLab and
in Notebook 7, every thermometer draws, and each broken model's view flags its bug."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .harness import kernel_json, open_and_run, screenshot, wait_widget

pytestmark = pytest.mark.browser

TUTORIAL = Path(__file__).resolve().parents[2] / "notebooks" / "01_thermometer_quickstart.ipynb"
# The four thermometers, in order: healthy, dead ReLU, exploding LR (which also killed units), NaN from log(0).
EXPECTED_FLAGS = [set(), {"dead"}, {"exploding", "dead_units"}, {"nan_origin_fwd", "nonfinite"}]


def _run_tutorial(page, server, name: str) -> list:  # type: ignore[no-untyped-def]
    shutil.copy(TUTORIAL, Path(server.root) / f"{name}.ipynb")
    open_and_run(page, server, name)
    widgets = [wait_widget(page, "thermometer", index=i) for i in range(4)]
    # Flag chips show the legend's labels; the kernel says which label each code has.
    labels = kernel_json(page, "{k: v['label'] for k, v in __import__('nbdebug.inspectors.thermometer', fromlist=['LEGEND']).LEGEND.items()}")
    for widget, expected in zip(widgets, EXPECTED_FLAGS):
        assert widget.locator(".nbd-row").count() >= 9
        chips = set(widget.locator(".nbd-row .nbd-chip").all_text_contents())
        assert chips == {labels[c] for c in expected}, (expected, chips)
    return widgets


def test_tutorial_1_lab(page, lab) -> None:  # type: ignore[no-untyped-def]
    widgets = _run_tutorial(page, lab, "tutorial1_lab")
    screenshot(page, "tutorial1-lab-dead", widgets[1])


def test_tutorial_1_notebook7(page, nb7) -> None:  # type: ignore[no-untyped-def]
    widgets = _run_tutorial(page, nb7, "tutorial1_nb7")
    screenshot(page, "tutorial1-nb7-nan", widgets[3])
