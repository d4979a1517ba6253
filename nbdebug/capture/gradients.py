"""Moved to :mod:`nbdebug.runs.gradients` (nbdebug's own forwards live in ``nbdebug/runs/``); this name stays
until the click sessions in ``recorders/`` import from there (issue 28). Re-exports only."""

from ..runs.gradients import (
    LayerDidNotRun,
    autograd_inputs,
    class_grads,
    layer_pass,
    probe_pass,
    swap_first,
    target_grads,
    weight_versions,
)

__all__ = ["LayerDidNotRun", "autograd_inputs", "class_grads", "layer_pass", "probe_pass", "swap_first", "target_grads", "weight_versions"]
