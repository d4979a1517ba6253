"""Modes of the real-use matrix that need more than a fresh tiny model per cell: a model offloaded by
accelerate to the CPU and disk (``offload.py``), and a DDP model trained on two gloo processes under
``%%nndebug --distributed`` (``ddp.py``). Each through the magic, with content and hygiene checked."""

from __future__ import annotations

from typing import Any

import pytest

from . import offload
from .checks import check
from .test_matrix import _params, no_interrupt


@pytest.mark.parametrize(("mode", "view"), _params({m: offload.VIEWS for m in offload.MODES}))
def test_offloaded(mode: str, view: str, shell: Any, offloaded: Any, capsys: pytest.CaptureFixture[str], record_property: Any) -> None:
    record_property("cell", (mode, view))
    res = no_interrupt(offload.run_offloaded, shell, mode, view, *offloaded, check)
    assert "nbdebug" not in capsys.readouterr().err
    if res.note:
        record_property("note", res.note)
