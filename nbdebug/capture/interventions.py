"""Moved to :mod:`nbdebug.runs.interventions` (nbdebug's own forwards live in ``nbdebug/runs/``); this name stays
until the click sessions in ``recorders/`` import from there (issue 28). Re-exports only."""

from ..runs.interventions import (
    Replacement,
    Stopped,
    edit_activations,
    patch_points,
    read_activations,
)
from .leaves import first_input, replace_first_input

__all__ = ["Replacement", "Stopped", "edit_activations", "first_input", "patch_points", "read_activations", "replace_first_input"]
