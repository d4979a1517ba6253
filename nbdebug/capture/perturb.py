"""Moved to :mod:`nbdebug.runs.perturb` (nbdebug's own forwards live in ``nbdebug/runs/``); this name stays
until the click sessions in ``recorders/`` import from there (issue 28). Re-exports only."""

from ..runs.perturb import Perturbed, chunk_size, image_slot

__all__ = ["Perturbed", "chunk_size", "image_slot"]
