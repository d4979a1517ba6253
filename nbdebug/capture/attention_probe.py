"""Moved to :mod:`nbdebug.runs.attention_probe` (nbdebug's own forwards live in ``nbdebug/runs/``); this name stays
until the click sessions in ``recorders/`` import from there (issue 28). Re-exports only."""

from ..runs.attention_probe import QKCall, probe_attention, probe_supported

__all__ = ["QKCall", "probe_attention", "probe_supported"]
