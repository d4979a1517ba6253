"""``torch.amp.GradScaler`` seen by every entered :class:`~nbdebug.capture.optim.OptimizerWatch`:
``GradScaler.step`` and ``.scale`` are wrapped while any watch holds them (one wrapper per process,
reference counted through :class:`~nbdebug.capture.hooks.SharedPatch`, restored on every exit
path). ``step`` tells the watches which optimizer step a scaler skipped (no step hook fired during
it) and both record the scale in effect (the capture divides the step's gradient statistics by it).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .hooks import SharedPatch

__all__ = ["SCALER_SCALE", "SCALER_STEP", "scaler_patched"]


# -- GradScaler: one wrapper per process, shared by every entered watch ---------------------------
def _wrap_scaler_step(original: Any) -> Any:
    @functools.wraps(original)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        watches = tuple(SCALER_STEP.users)
        if not watches or not getattr(self, "_enabled", True):
            return original(self, optimizer, *args, **kwargs)
        for w in watches:
            w.note_scale(self)
        tokens = [w.scaler_before(optimizer) for w in watches]
        out = original(self, optimizer, *args, **kwargs)
        for w, token in zip(watches, tokens):
            w.scaler_after(optimizer, token)
        return out

    return step


# torch.amp.GradScaler since torch 2.3 (torch.cuda.amp.GradScaler subclasses it); before, the CUDA one
SCALER_STEP = SharedPatch(getattr(torch.amp, "GradScaler", None) or getattr(torch.cuda.amp, "GradScaler", None),
                      "step", _wrap_scaler_step)


def _wrap_scaler_scale(original: Any) -> Any:
    @functools.wraps(original)
    def scale(self: Any, outputs: Any) -> Any:
        out = original(self, outputs)
        if getattr(self, "_enabled", True):
            for w in tuple(SCALER_SCALE.users):
                w.note_scale(self)
        return out

    return scale


SCALER_SCALE = SharedPatch(SCALER_STEP.owner, "scale", _wrap_scaler_scale)


def scaler_patched() -> bool:
    """Whether ``torch.amp.GradScaler.step`` (or ``.scale``) is wrapped right now (for hygiene checks)."""
    return SCALER_STEP.active or SCALER_SCALE.active
