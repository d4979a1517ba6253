"""Moved to :mod:`nbdebug.runs.replay` (nbdebug's own forwards live in ``nbdebug/runs/``); this name stays
until the click sessions in ``recorders/`` import from there (issue 28). Re-exports only."""

from ..runs.replay import (
    Replay,
    ReplayMember,
    forward_again,
    generation_note,
    int_option,
    join,
    leave,
    nothing_shown,
    replay_final,
)

__all__ = ["Replay", "ReplayMember", "forward_again", "generation_note", "int_option", "join", "leave", "nothing_shown", "replay_final"]
