"""nbdebug's own forward pass: the one set-up every forward nbdebug runs itself goes through.

Inside :func:`own_pass` the model runs on clones of its buffers with the random generators forked
(:func:`~nbdebug.capture.state.preserve_buffers`), the user's hooks and other views' hooks set aside
(:func:`~nbdebug.capture.state.suspend_hooks`; nbdebug's interventions in force and the ``keep`` hook
sets stay), and either without autograd or, with ``grad``, with gradients enabled (also under a
caller's ``no_grad`` / ``inference_mode``) for activations only. Nothing else in nbdebug calls
``preserve_buffers`` or ``suspend_hooks`` (``tests/unit/test_architecture.py`` checks it): a copy of the
model nbdebug changes (the CAM sanity check's re-initialised layers, the doctor's training) is
:func:`hookless_copy`.

>>> with own_pass(model):                             # doctest: +SKIP
...     out = model(x)                                # our forward: the user's state untouched
>>> with own_pass(model, grad=True):                  # doctest: +SKIP
...     g, = torch.autograd.grad(model(x).sum(), leaf) # parameters do not require grad meanwhile
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import nn

from ..capture.hooks import HookSet
from ..capture.state import offloaded, preserve_buffers, suspend_hooks

__all__ = ["PARAMS", "NotCopyable", "frozen_params", "hookless_copy", "own_pass"]

#: what happens to parameters' ``requires_grad`` in a gradient pass
PARAMS = ("frozen", "as_is")


class NotCopyable(ValueError):
    """:func:`hookless_copy` cannot give a copy nbdebug may change (its message says why and what to do)."""


def hookless_copy(model: nn.Module, memo: dict[int, Any] | None = None, *, own: Iterable[str] | None = None) -> nn.Module:
    """A deep copy of ``model`` that holds none of the user's module hooks (library hooks, as
    :func:`~nbdebug.capture.state.suspend_hooks` tells them apart, are copied; parameters' ``.grad`` and
    tensor hooks are not): nbdebug's own copy to change and train, the user's module hooks neither
    copied nor called (global module hooks, ``register_module_forward_hook``, still fire on its
    forwards). ``memo``: :func:`copy.deepcopy`'s, to map the user's parameters to the copy's (an
    optimizer's). A tensor a forward left as an attribute of a module (``self.last = y``, part of a
    graph: ``copy.deepcopy`` refuses those) is copied detached.

    ``own``: names of the modules nbdebug will change (the CAM sanity check's re-initialised layers);
    only their parameters and buffers (children's included) are copied, every other parameter and
    buffer is the user's tensor, shared (the copy's memory is then those modules', not the model's). Valid only for a copy
    that changes nothing else and runs only in :func:`own_pass` (buffers cloned, no ``.grad`` written).

    Raises :class:`NotCopyable` for a model whose weights accelerate offloads (``device_map`` with CPU or
    disk offload): the copy's weights would sit on ``meta`` and be reloaded from the offloaded ones at
    every forward, so nothing nbdebug wrote into them (a re-initialisation, an optimizer step) would
    count, and copying the offloaded weights would take the memory the offload saves."""
    off = [name or type(model).__name__ for name, m in model.named_modules() if offloaded(m)]
    if off:
        raise NotCopyable(f"accelerate offloads the weights of {len(off)} module(s) of this model (`{off[0]}`"
                          f"{', …' if len(off) > 1 else ''}), so a copy nbdebug changes would have them reloaded "
                          "unchanged at every forward; load the model without CPU/disk offload to run this")
    memo = {} if memo is None else memo
    if own is not None:  # share every tensor but those of the modules named (their buffers and children too:
        # a BatchNorm's reset_parameters zeroes its running statistics, MultiheadAttention's resets out_proj)
        mods = [model.get_submodule(name) for name in own]
        mine = {id(t) for m in mods for t in (*m.parameters(), *m.buffers())}
        for t in (*model.parameters(), *model.buffers()):
            if id(t) not in mine:
                memo.setdefault(id(t), t)
    for m in model.modules():  # a tensor a forward left on a module (``self.last = y``): deepcopy refuses non-leaves
        for v in vars(m).values():
            if isinstance(v, torch.Tensor) and not v.is_leaf and id(v) not in memo:
                memo[id(v)] = v.detach().clone()
    with suspend_hooks(model):
        return copy.deepcopy(model, memo)


@contextmanager
def frozen_params(model: nn.Module) -> Iterator[None]:
    """Parameters stop requiring grad for the block; each flag is put back *by name* afterwards, on the
    parameter object the module holds then (accelerate's offload swaps the objects at every forward)."""
    flags = [(m, n, p.requires_grad) for m in model.modules() for n, p in m.named_parameters(recurse=False)]
    try:
        for m, n, _ in flags:
            getattr(m, n).requires_grad_(False)
        yield
    finally:
        for m, n, flag in flags:
            p = getattr(m, n, None)
            if isinstance(p, torch.Tensor) and p.requires_grad != flag:
                p.requires_grad_(flag)


@contextmanager
def own_pass(model: nn.Module, *, grad: bool = False, params: str = "frozen", keep: Iterable[HookSet] = ()) -> Iterator[None]:
    """nbdebug's own forward (see the module docstring). ``grad``: gradients of activations can be taken
    (``torch.autograd.grad``); ``params="frozen"`` (default) stops parameters requiring grad for the pass
    (restored by name), ``"as_is"`` leaves the flags (no ``.grad`` is written either way: only
    activations' gradients are asked for). ``keep``: hook sets of the caller's that keep running
    although registered before the pass (a language view's own). The reentrant-checkpoint warning
    "None of the inputs have requires_grad" is silenced (our inputs never require grad)."""
    if params not in PARAMS:
        raise ValueError(f"params={params!r}: one of {PARAMS}")
    with ExitStack() as stack:
        if grad:
            stack.enter_context(torch.inference_mode(False))
            stack.enter_context(torch.enable_grad())
        else:
            stack.enter_context(torch.no_grad())
        stack.enter_context(preserve_buffers(model))
        stack.enter_context(suspend_hooks(model, keep))
        if grad and params == "frozen":
            stack.enter_context(frozen_params(model))
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="None of the inputs have requires_grad")  # reentrant checkpoint
        yield
