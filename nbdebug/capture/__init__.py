"""Capture core: hooks that clean up after themselves, layer selection, output leaves, stats."""

from .hooks import HookSet, hook_count, no_param_grads
from .inputs import ModelCall
from .leaves import first_tensor, tensor_leaves
from .select import LayerFilter, LayerNotFoundError, select_modules
from .state import fingerprint, preserve_buffers, preserve_modes, same_fingerprint

__all__ = [
    "HookSet",
    "LayerFilter",
    "LayerNotFoundError",
    "ModelCall",
    "fingerprint",
    "first_tensor",
    "hook_count",
    "no_param_grads",
    "preserve_buffers",
    "preserve_modes",
    "same_fingerprint",
    "select_modules",
    "tensor_leaves",
]
