"""Moved to :mod:`nbdebug.runs.patchrun` (nbdebug's own forwards live in ``nbdebug/runs/``); this name stays
until the click sessions in ``recorders/`` import from there (issue 28). Re-exports only."""

from ..runs.patchrun import Recorded, frozen_params, own_pass, record_run

__all__ = ["Recorded", "frozen_params", "own_pass", "record_run"]
