"""Capture core: hooks that clean up after themselves, layer selection, output leaves, stats."""

from .budget import DEFAULT_MAX_BYTES, format_bytes, parse_bytes
from .hooks import HookSet, hook_count, no_param_grads
from .inputs import ModelCall
from .leaves import first_tensor, tensor_leaves
from .names import call_name, split_call_name
from .select import LayerFilter, LayerNotFoundError, select_modules
from .state import fingerprint, preserve_buffers, preserve_modes, same_fingerprint
from .weak import ModelGoneError, ModelRef, weak_method

__all__ = [
    "DEFAULT_MAX_BYTES",
    "HookSet",
    "LayerFilter",
    "LayerNotFoundError",
    "ModelCall",
    "ModelGoneError",
    "ModelRef",
    "call_name",
    "fingerprint",
    "first_tensor",
    "format_bytes",
    "hook_count",
    "no_param_grads",
    "parse_bytes",
    "preserve_buffers",
    "preserve_modes",
    "same_fingerprint",
    "select_modules",
    "split_call_name",
    "tensor_leaves",
    "weak_method",
]
