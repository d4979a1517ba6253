"""Leaving the model exactly as we found it.

:func:`preserve_buffers` wraps any forward pass nbdebug runs itself: it runs on clones of the
buffers (BatchNorm running statistics and every other buffer stay untouched, version counters
included, so a graph the user still holds can be backpropagated). :func:`fingerprint` is what tests
compare before and after a capture.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from .hooks import HookSet, hook_count

__all__ = ["execution_device", "fingerprint", "intervening", "loaded_weights", "offloaded", "preserve_buffers",
           "preserve_modes", "suspend_hooks", "user_hook_count"]

#: hooks defined in these packages are part of how the model computes (weight_norm, pruning,
#: transformers' output capturing, accelerate's offloading): they run in nbdebug's passes too
_LIBRARIES = ("torch", "transformers", "accelerate", "peft", "timm", "torchvision", "bitsandbytes", "optimum")
_KEYED = {"_forward_hooks": ("_forward_hooks_with_kwargs", "_forward_hooks_always_called"),
          "_forward_pre_hooks": ("_forward_pre_hooks_with_kwargs",), "_backward_hooks": (), "_backward_pre_hooks": ()}


def _is_users(fn: Any) -> bool:
    """Whether a hook was written by the user (not by a library the model is built with)."""
    while hasattr(fn, "func"):  # functools.partial
        fn = fn.func
    fn = getattr(fn, "__func__", fn)  # bound method
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return str(module).split(".")[0] not in _LIBRARIES


#: the hook sets of nbdebug's interventions in force now (``nbdebug.ablate``/``steer``, patches): they
#: are part of what the model computes while they last, so :func:`suspend_hooks` never sets them aside
_INTERVENING: list[HookSet] = []


@contextmanager
def intervening(hooks: HookSet) -> Iterator[HookSet]:
    """Mark ``hooks`` (nbdebug's own intervention hooks) as kept by every :func:`suspend_hooks` while
    the block runs: an ablation or a steering entered before an own pass still acts inside it, so the
    order of ``with`` items does not matter. The thermometer's and the user's hooks are not marked."""
    _INTERVENING.append(hooks)
    try:
        yield hooks
    finally:
        for i in range(len(_INTERVENING) - 1, -1, -1):
            if _INTERVENING[i] is hooks:
                del _INTERVENING[i]
                break


def user_hook_count(model: nn.Module) -> int:
    """The user's own forward/backward hooks on ``model`` and its submodules (the ones
    :func:`suspend_hooks` sets aside; library hooks such as transformers' are not counted)."""
    return sum(_is_users(fn) for m in model.modules() for attr in _KEYED for fn in (m.__dict__.get(attr) or {}).values())


@contextmanager
def suspend_hooks(model: nn.Module, keep: Iterable[HookSet] = ()) -> Iterator[None]:
    """Set the user's own module hooks aside for nbdebug's own passes, and put the same tables back.

    A re-run of nbdebug's must not call the user's hooks again (a hook that records activations
    would see extra calls the cell never made). Hooks defined by libraries (``torch`` weight norm
    and pruning, ``transformers`` output capturing, ``accelerate``) stay: they are part of the
    model's computation. Inside the block each module with a user hook has new tables without it
    (hooks nbdebug registers there are dropped with them); afterwards the original table objects
    are back, so the user's handles still remove their hooks. Global module hooks
    (``register_module_forward_hook``) are left alone.

    The hooks of the ``keep`` hook sets (the calling view's own) keep running too, and so do those of
    nbdebug's interventions in force (:func:`intervening`). A hook removed during the block (by its
    handle) stays removed afterwards.
    """
    ids = {i for hs in (*keep, *_INTERVENING) for i in hs.handle_ids()}
    saved: list[tuple[nn.Module, dict[str, Any]]] = []

    def drop(k: int, fn: Any) -> bool:
        return k not in ids and _is_users(fn)

    try:
        for m in model.modules():
            tables = {attr: m.__dict__.get(attr) for attr in _KEYED}
            if not any(drop(k, fn) for t in tables.values() for k, fn in (t or {}).items()):
                continue
            originals: dict[str, Any] = {}
            for attr, side in _KEYED.items():
                table = tables[attr]
                if table is None:
                    continue
                kept = type(table)((k, fn) for k, fn in table.items() if not drop(k, fn))
                originals[attr] = table
                m.__dict__[attr] = kept
                for extra in side:
                    flags = m.__dict__.get(extra)
                    if flags is not None:
                        originals[extra] = flags
                        m.__dict__[extra] = type(flags)((k, v) for k, v in flags.items() if k in kept)
            saved.append((m, originals))
        yield
    finally:
        for m, originals in saved:
            m.__dict__.update(originals)


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter, or None for inference tensors (they have none)."""
    try:
        return int(t._version)
    except RuntimeError:
        return None


@contextmanager
def preserve_buffers(model: nn.Module) -> Iterator[None]:
    """Run nbdebug's own forward passes on clones of every buffer, so the originals are never touched.

    Inside the block each module's buffers (BatchNorm running statistics, ``num_batches_tracked``,
    caches...) are swapped for clones (a buffer shared by several modules gets one shared clone);
    afterwards the original tensor objects are put back. Nothing is copied back into them, so their
    version counters do not move and an autograd graph the user still holds (BatchNorm in training
    mode saves its running statistics for backward) stays valid. A forward that mutates a buffer
    through a reference of its own (not through the module) is caught as a safety net: that buffer
    is restored bit for bit from a copy (which does bump its version, unavoidably).

    The random number generators are forked too (CPU and the model's CUDA devices): dropout in a
    training-mode re-run draws its masks without moving the user's random stream.
    """
    owners: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    clones: dict[int, torch.Tensor] = {}
    for m in model.modules():
        for name, buf in m._buffers.items():
            if buf is None:
                continue
            if id(buf) not in clones:
                with torch.inference_mode(buf.is_inference()):
                    clones[id(buf)] = buf.detach().clone()
            owners.append((m._buffers, name, buf))
    originals = {id(b): b for _, _, b in owners}
    versions = {key: _version(b) for key, b in originals.items()}
    pristine = {key: c.clone() for key, c in clones.items()}  # the safety net's copy (buffers are small)
    cuda = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    try:
        for table, name, buf in owners:
            table[name] = clones[id(buf)]
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        for table, name, buf in owners:
            table[name] = buf
        with torch.no_grad():
            for key, buf in originals.items():
                if versions[key] is None:  # inference tensor: compare values instead
                    if not torch.equal(buf, pristine[key]):
                        with torch.inference_mode():
                            buf.copy_(pristine[key])
                elif _version(buf) != versions[key]:  # mutated behind the module's back
                    buf.copy_(pristine[key])


@contextmanager
def preserve_modes(model: nn.Module) -> Iterator[None]:
    """Restore every submodule's ``training`` flag afterwards (for code that must switch it)."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for m, flag in modes:
            m.training = flag


def offloaded(module: nn.Module) -> bool:
    """Whether accelerate keeps ``module``'s own weights off the device (``device_map`` with CPU or disk
    offload): they sit on the ``meta`` device until its ``AlignDevicesHook`` loads them for a forward."""
    hook = getattr(module, "_hf_hook", None)
    return bool(getattr(hook, "offload", False)) and hasattr(hook, "pre_forward") and hasattr(hook, "weights_map")


def execution_device(module: nn.Module) -> torch.device | None:
    """Where ``module``'s forward runs: its accelerate hook's ``execution_device`` (a ``device_map``
    model), else the device of its first parameter not on ``meta``; None when it has none."""
    dev = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
    if dev is not None:
        return torch.device(dev)
    for p in module.parameters():
        if p.device.type != "meta":
            return p.device
    return None


@contextmanager
def loaded_weights(module: nn.Module) -> Iterator[None]:
    """Inside the block ``module``'s own offloaded weights are on its execution device, loaded by its
    accelerate hook exactly as for a forward (``accelerate.utils.align_module_device``); afterwards
    they are back on ``meta`` (nothing stays materialised). A module that is not offloaded is left
    alone. Read the weights by attribute inside the block (accelerate swaps the parameter objects)."""
    if not offloaded(module):
        yield
        return
    from accelerate.utils import align_module_device

    with align_module_device(module):
        yield


def _stored(model: nn.Module, name: str, p: torch.Tensor) -> torch.Tensor:
    """A parameter's value to compare: a clone, or for a weight accelerate keeps on ``meta`` the copy
    its hook loads from (CPU or disk offload; the meta tensor itself when there is none)."""
    if p.device.type != "meta":
        return p.detach().clone()
    prefix, _, leaf = name.rpartition(".")
    module = model.get_submodule(prefix) if prefix else model
    try:
        value = module._hf_hook.weights_map[leaf] if offloaded(module) else None
    except Exception:  # not in the offload map (a tied weight loaded from elsewhere): compared by shape
        value = None
    return value.detach().clone() if isinstance(value, torch.Tensor) else p.detach()


def fingerprint(model: nn.Module) -> dict[str, Any]:
    """Everything a capture must not change, as comparable plain data (tensors cloned). Parameters
    accelerate keeps on ``meta`` (``device_map`` offload) are compared through the copy it loads them
    from, and every parameter's device is recorded (nothing may stay materialised)."""
    return {
        "params": {n: _stored(model, n, p) for n, p in model.named_parameters()},
        "devices": {n: str(p.device) for n, p in model.named_parameters()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "grads": {
            n: (None if p.grad is None else p.grad.detach().clone())
            for n, p in model.named_parameters()
        },
        "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
        "training": {n: m.training for n, m in model.named_modules()},
        "attrs": {n: sorted(vars(m)) for n, m in model.named_modules()},
        "settings": {n: _settings(m) for n, m in model.named_modules()},
        "hooks": hook_count(model),
    }


_SCALARS = (bool, int, float, str, type(None))


def _settings(m: nn.Module) -> dict[str, str]:
    """A module's plain public settings (``inplace``, ``p``, ``eps``…: attributes holding a number, a
    string, None, or a tuple of those), as their ``repr`` (NaN equals NaN). torch's own bookkeeping
    (``_is_full_backward_hook``…) is not a setting."""
    out = {}
    for k, v in vars(m).items():
        if k == "training" or k.startswith("_"):
            continue
        if isinstance(v, _SCALARS) or (isinstance(v, tuple) and all(isinstance(x, _SCALARS) for x in v)):
            out[k] = repr(v)
    return out


def _same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Same shape, dtype and bytes (so -0.0 is not +0.0, and inf is not the dtype's largest value)."""
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if x.is_quantized or x.layout != torch.strided:
        return torch.equal(x, y)
    return torch.equal(x.contiguous().reshape(-1).view(torch.uint8), y.contiguous().reshape(-1).view(torch.uint8))


def same_fingerprint(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Differences between two fingerprints, as readable strings (empty list: identical)."""
    diffs: list[str] = []
    for key in ("requires_grad", "training", "attrs", "devices", "settings"):
        if a.get(key) != b.get(key):
            diffs.append(key)
    if a["hooks"] != b["hooks"]:
        diffs.append(f"hooks {a['hooks']} -> {b['hooks']}")
    for key in ("params", "grads", "buffers"):
        if a[key].keys() != b[key].keys():
            diffs.append(f"{key} names")
            continue
        for name, x in a[key].items():
            y = b[key][name]
            if (x is None) != (y is None):
                diffs.append(f"{key}[{name}] None-ness")
            elif x is not None and "meta" in (x.device.type, y.device.type):
                if x.shape != y.shape or x.dtype != y.dtype:
                    diffs.append(f"{key}[{name}] shape")
            elif x is not None and not _same_bits(x, y):
                diffs.append(f"{key}[{name}] " + ("dtype" if x.dtype != y.dtype else "values"))
    return diffs
