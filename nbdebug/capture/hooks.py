"""Hook hygiene: every handle nbdebug registers is removed, and only those.

>>> with HookSet() as hooks:
...     hooks.forward(model.fc, fn)      # doctest: +SKIP
...     model(x)                         # doctest: +SKIP
>>> # every handle is gone here, on success, exception or KeyboardInterrupt
"""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.overrides import has_torch_function_unary
from torch.utils.hooks import RemovableHandle

__all__ = [
    "COMPILED_NOTE",
    "HookSet",
    "SharedPatch",
    "hook_count",
    "hooks_see_compiled",
    "is_compiled",
    "no_param_grads",
    "optimizer_hook_count",
    "tensor_hook",
]


class _Callback:
    """A handle whose ``remove()`` calls ``fn`` once (later calls do nothing), like ``RemovableHandle``."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn: Callable[[], Any] | None = fn

    def remove(self) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            fn()


class TensorHookHandle:
    """The handle of a :func:`tensor_hook` (``remove()``, and ``hooks_dict_ref`` like torch's
    ``RemovableHandle``: None once the tensor and its graph are gone)."""

    __slots__ = ("hooks_dict_ref", "id")

    def __init__(self, hooks: dict[int, Any], key: int) -> None:
        self.hooks_dict_ref = weakref.ref(hooks)
        self.id = key

    def remove(self) -> None:
        hooks = self.hooks_dict_ref()
        if hooks is not None:
            hooks.pop(self.id, None)


_Tensor = torch.Tensor
_keys = itertools.count(-1, -1)  # negative: never one of torch's own handle ids (those count up from 0)


def tensor_hook(t: torch.Tensor, fn: Callable[[torch.Tensor], Any]) -> TensorHookHandle | RemovableHandle:
    """``t.register_hook(fn)`` (an output-gradient hook) with less Python per call: the same
    registration as torch's (the tensor's ``_backward_hooks`` dict, registered with its ``grad_fn``
    the first time), without its generic handle. Anything but a plain tensor that requires grad
    (subclasses, an active ``__torch_function__`` mode) goes through ``t.register_hook``."""
    if type(t) is not _Tensor or has_torch_function_unary(t) or not t.requires_grad:
        return t.register_hook(fn)
    hooks = t._backward_hooks
    if hooks is None:
        hooks = t._backward_hooks = OrderedDict()
        grad_fn = t.grad_fn
        if grad_fn is not None:
            grad_fn._register_hook_dict(t)
    key = next(_keys)
    hooks[key] = fn
    return TensorHookHandle(hooks, key)


class HookSet:
    """A list of removable handles used as a context manager; removal happens in ``__exit__``.

    Tensor hooks (``tensor.register_hook``) registered through :meth:`tensor` are removed too, so a
    graph kept alive by the user after the cell does not call back into a finished capture.
    """

    def __init__(self) -> None:
        self._handles: list[RemovableHandle | _Callback] = []

    def handle_ids(self) -> set[int]:
        """The ids of the module hooks registered through this set (``RemovableHandle.id``; the keys of
        the hook tables they sit in)."""
        return {h.id for h in self._handles if isinstance(h, RemovableHandle)}

    def forward(self, module: nn.Module, fn: Callable[..., Any], *, with_kwargs: bool = False) -> None:
        self._handles.append(module.register_forward_hook(fn, with_kwargs=with_kwargs))

    def forward_pre(self, module: nn.Module, fn: Callable[..., Any], *, with_kwargs: bool = False) -> None:
        self._handles.append(module.register_forward_pre_hook(fn, with_kwargs=with_kwargs))

    def tensor(self, t: torch.Tensor, fn: Callable[[torch.Tensor], Any]) -> None:
        self._handles.append(t.register_hook(fn))

    def optimizer_step_pre(self, fn: Callable[[torch.optim.Optimizer, tuple[Any, ...], dict[str, Any]], None]) -> RemovableHandle:
        """A global ``torch.optim`` step pre-hook: every optimizer, including those created before."""
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        handle = register_optimizer_step_pre_hook(fn)
        self._handles.append(handle)
        return handle

    def optimizer_step_post(self, fn: Callable[[torch.optim.Optimizer, tuple[Any, ...], dict[str, Any]], None]) -> RemovableHandle:
        """A global ``torch.optim`` step post-hook (called after every optimizer's ``step()``)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        handle = register_optimizer_step_post_hook(fn)
        self._handles.append(handle)
        return handle

    def on_remove(self, fn: Callable[[], Any]) -> _Callback:
        """Call ``fn`` once when the set is removed (undo a patch on every exit path). The returned
        handle's ``remove()`` calls it earlier; later removals do nothing."""
        handle = _Callback(fn)
        self._handles.append(handle)
        return handle

    def remove(self) -> None:
        """Remove every handle, the last registered first; one failing removal does not stop the others."""
        error: BaseException | None = None
        while self._handles:
            try:
                self._handles.pop().remove()
            except BaseException as exc:  # keep removing; re-raise the first failure at the end
                error = error or exc
        if error is not None:
            raise error

    def __len__(self) -> int:
        return len(self._handles)

    def __enter__(self) -> HookSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class SharedPatch:
    """``owner.name`` replaced by ``wrap(original)`` while at least one user holds it: reference counted
    across nested captures and thread-safe. The last user to leave puts the original back (unless
    someone patched over ours meanwhile: theirs stays, and ours must pass through when ``users`` is
    empty). ``users`` lists the current users, in order; the wrapper reads it on every call. An
    ``owner`` of None, or one without ``name`` of its own, is never patched (users are still counted).

    >>> patch = SharedPatch(torch.amp.GradScaler, "step", make_wrapper)   # doctest: +SKIP
    >>> patch.hold(hooks, watch)       # undone by hooks.remove() or the returned handle
    """

    def __init__(self, owner: type | None, name: str, wrap: Callable[[Any], Any]) -> None:
        self.owner, self.name, self.wrap = owner, name, wrap
        self.users: list[Any] = []
        self._lock = threading.Lock()
        self._installed: tuple[Any, Any] | None = None  # (original, ours)

    @property
    def active(self) -> bool:
        return self._installed is not None

    def acquire(self, user: Any) -> None:
        with self._lock:
            self.users.append(user)
            if self._installed is None and self.owner is not None and self.name in self.owner.__dict__:
                original = self.owner.__dict__[self.name]
                ours = self.wrap(original)
                self._installed = (original, ours)  # first: an interrupt after it still restores
                setattr(self.owner, self.name, ours)

    def release(self, user: Any) -> None:
        """Idempotent: releasing a user that does not hold the patch does nothing."""
        with self._lock:
            for i, u in enumerate(self.users):
                if u is user:
                    del self.users[i]
                    break
            if self.users or self._installed is None:
                return
            original, ours = self._installed
            self._installed = None
            if self.owner is not None and self.owner.__dict__.get(self.name) is ours:
                setattr(self.owner, self.name, original)

    def hold(self, hooks: HookSet, user: Any) -> _Callback:
        """Acquire for ``user`` until ``hooks`` is removed (or the returned handle is)."""
        handle = hooks.on_remove(functools.partial(self.release, user))
        self.acquire(user)
        return handle


def hook_count(model: nn.Module) -> int:
    """Number of hooks of every kind on ``model``, its submodules and their parameters (for hygiene
    checks): forward, forward-pre, backward, backward-pre and state-dict hooks of the modules, and each
    parameter's own gradient and post-accumulate-grad hooks."""
    n = 0
    for m in model.modules():
        for attr in (
            "_forward_hooks",
            "_forward_pre_hooks",
            "_backward_hooks",
            "_backward_pre_hooks",
            "_state_dict_hooks",
            "_state_dict_pre_hooks",
            "_load_state_dict_pre_hooks",
            "_load_state_dict_post_hooks",
        ):
            n += len(getattr(m, attr, {}) or {})
    for p in model.parameters():
        for attr in ("_backward_hooks", "_post_accumulate_grad_hooks"):
            n += len(getattr(p, attr, None) or {})
    return n


def optimizer_hook_count() -> int:
    """Number of global ``torch.optim`` step hooks (pre and post) registered by anyone (hygiene checks)."""
    from torch.optim import optimizer

    return len(optimizer._global_optimizer_pre_hooks) + len(optimizer._global_optimizer_post_hooks)


@contextmanager
def no_param_grads(model: nn.Module) -> Iterator[None]:
    """Temporarily stop parameters from requiring grad, restoring each flag exactly afterwards.

    For nbdebug's own backward passes that only need activation gradients
    (``torch.autograd.grad``): parameters' ``.grad`` is never touched either way, this only saves
    the work of building their part of the graph.
    """
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


#: what a view says when the cell's compiled model ran eagerly under nbdebug
COMPILED_NOTE = ("torch.compile'd model: it ran eagerly while nbdebug watched (hooks added after compiling "
                 "are not seen by compiled code); it runs compiled again after the cell")


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` or a submodule is ``torch.compile``d (an ``OptimizedModule`` wrapper, or
    compiled in place with ``module.compile()``)."""
    return any(type(m).__name__ == "OptimizedModule" or getattr(m, "_compiled_call_impl", None) is not None
               for m in model.modules())


@contextmanager
def hooks_see_compiled(model: nn.Module) -> Iterator[bool]:
    """While entered, compiled code runs eagerly (``torch.compiler.set_stance("force_eager")``) when
    ``model`` is compiled, so that hooks registered after compiling fire: TorchDynamo does not guard
    on module hooks, so a graph compiled before would silently skip them (no rows, no attention).
    Yields whether it did; the stance in force before is restored on every exit path.
    """
    stance = getattr(torch.compiler, "set_stance", None)
    if stance is None or not is_compiled(model):
        yield False
        return
    ctx = stance("force_eager")  # sets the stance now; __exit__ restores the previous one
    try:
        yield True
    finally:
        ctx.__exit__(None, None, None)
