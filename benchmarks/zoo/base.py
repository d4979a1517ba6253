"""The zoo's registry, data and loop helpers: what every fault module and recipe builds on.

A case is a function that builds a user's training setup (:class:`Setup`: the model, a ``loop(n)``
that runs ``n`` steps of the user's own loop, and what the user would hand ``nbdebug.doctor``).
A fault is registered with :func:`fault` and built twice: ``make(True)`` plants the bug,
``make(False)`` is its healthy twin (the same code with the bug fixed). A healthy recipe is
registered with :func:`recipe`. :mod:`benchmarks.bench_diagnosis` runs each under
``nbdebug.debug(model)`` and scores the root finding against the fault's accepted codes.

Every case is seeded and small (CPU seconds); data: ``sklearn.datasets.load_digits`` and synthetic
tensors, nothing downloaded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CASES", "CLASSES", "Case", "Setup", "batches", "cnn", "digits", "fault", "first_batch", "klass", "mlp", "recipe", "sgd_loop"]


@dataclass
class Setup:
    """One user's training cell: ``model`` (what ``nbdebug.debug`` watches), ``loop(n)`` (n steps of the
    user's loop), ``doctor`` (``(inputs, targets, loss_fn, optimizer)`` as the user would call
    ``nbdebug.doctor``; None where the doctor does not apply), ``steps`` (the full run's steps)."""

    model: nn.Module
    loop: Callable[[int], Any]
    doctor: tuple[Any, Any, Any, Any] | None = None
    steps: int = 60
    keep: Any = None  # objects the user's notebook still holds (e.g. an earlier model)


@dataclass(frozen=True)
class Case:
    """A registered case: ``name``, fault ``cls`` ("healthy" for a recipe), ``make(faulty) → Setup``,
    ``accepted`` (finding codes that name the root cause), ``doctor_checks`` (doctor checks whose
    failure names it), ``faulty`` (False: a healthy twin or recipe), ``full_only`` (skipped by --quick)."""

    name: str
    cls: str
    make: Callable[[bool], Setup]
    accepted: frozenset[str] = frozenset()
    doctor_checks: frozenset[str] = frozenset()
    faulty: bool = True
    full_only: bool = False
    what: str = ""

    def build(self) -> Setup:
        return self.make(self.faulty)


#: fault class → the finding codes that name it (aliases included: today's codes and the loop-bug
#: codes of docs/diagnosis.md). A root finding "names" a class when its code is in this set.
CLASSES: dict[str, frozenset[str]] = {}
CASES: list[Case] = []


def _codes(*names: str) -> frozenset[str]:
    return frozenset(names)


def klass(name: str, *codes: str) -> str:
    """Register fault class ``name`` with the codes that name it."""
    CLASSES[name] = _codes(*codes)
    return name


def fault(cls: str, name: str, *, also: tuple[str, ...] = (), doctor: tuple[str, ...] = (), full_only: bool = False,
          what: str = "") -> Callable[[Callable[[bool], Setup]], Callable[[bool], Setup]]:
    """Register ``make(faulty)`` as fault ``name`` of class ``cls`` and as its healthy twin ``name~``;
    ``also``: codes accepted for this fault beyond its class's; ``doctor``: doctor checks that name it."""

    def wrap(make: Callable[[bool], Setup]) -> Callable[[bool], Setup]:
        accepted = CLASSES[cls] | _codes(*also)
        doc = (what or make.__doc__ or "").strip().split("\n")[0]
        CASES.append(Case(name, cls, make, accepted, _codes(*doctor), True, full_only, doc))
        CASES.append(Case(name + "~", cls, make, accepted, _codes(*doctor), False, full_only, "healthy twin: " + doc))
        return make

    return wrap


def recipe(name: str, *, full_only: bool = False) -> Callable[[Callable[[], Setup]], Callable[[], Setup]]:
    """Register ``make()`` as healthy recipe ``name``."""

    def wrap(make: Callable[[], Setup]) -> Callable[[], Setup]:
        doc = (make.__doc__ or "").strip().split("\n")[0]
        CASES.append(Case(name, "healthy", lambda _faulty: make(), frozenset(), frozenset(), False, full_only, doc))
        return make

    return wrap


# -- data ----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _digits_raw() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data, dtype=torch.float32), torch.tensor(d.target, dtype=torch.long)


def digits(*, raw: bool = False, image: bool = False, sort: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 sklearn digits (8×8, 10 classes): standardised per pixel (constant pixels stay 0) unless
    ``raw`` (0–16); ``image``: N×1×8×8; ``sort``: ordered by class (as the files come)."""
    x, y = _digits_raw()
    if not raw:
        x = (x - x.mean(0)) / x.std(0).clamp_min(1e-3)
    if sort:
        order = torch.argsort(y, stable=True)
        x, y = x[order], y[order]
    return (x.reshape(-1, 1, 8, 8) if image else x.clone()), y.clone()


def batches(n: int, size: int, seed: int, *, shuffle: bool = True) -> Callable[[], torch.Tensor]:
    """An endless index stream: epochs of ``n`` samples in batches of ``size`` (shuffled per epoch, seeded)."""
    g = torch.Generator().manual_seed(seed)
    state = {"order": torch.arange(n), "at": n}

    def nxt() -> torch.Tensor:
        if state["at"] + size > n:
            state["order"] = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
            state["at"] = 0
        i = state["order"][state["at"]:state["at"] + size]
        state["at"] += size
        return i

    return nxt


def mlp(d_in: int = 64, hidden: int = 64, d_out: int = 10, *, act: type[nn.Module] = nn.ReLU, depth: int = 2,
        seed: int = 0) -> nn.Sequential:
    """A seeded MLP: ``depth`` hidden layers of ``hidden`` units with ``act``."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    d = d_in
    for _ in range(depth):
        layers += [nn.Linear(d, hidden), act()]
        d = hidden
    layers.append(nn.Linear(d, d_out))
    return nn.Sequential(*layers)


def cnn(seed: int = 0, bn: bool = True) -> nn.Sequential:
    """A seeded digits CNN (8×8 → 10 classes), BatchNorm after each conv when ``bn``."""
    torch.manual_seed(seed)
    norm: Callable[[int], nn.Module] = nn.BatchNorm2d if bn else (lambda c: nn.Identity())
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), norm(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), norm(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(128, 10))


def sgd_loop(model: nn.Module, opt: torch.optim.Optimizer, x: Any, y: torch.Tensor, *, size: int = 64,
             loss_fn: Callable[..., torch.Tensor] = F.cross_entropy, shuffle: bool = True, seed: int = 0,
             clip: float | None = None, sched: Any = None, forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
             ) -> Callable[[int], None]:
    """The textbook loop: zero_grad, forward, loss, backward, (clip), step, (scheduler per step)."""
    nxt = batches(len(y), size, seed, shuffle=shuffle)
    fwd = forward or model

    def loop(n: int) -> None:
        model.train()
        for _ in range(n):
            i = nxt()
            opt.zero_grad()
            loss = loss_fn(fwd(x[i]), y[i])
            loss.backward()
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            if sched is not None:
                sched.step()

    return loop


def first_batch(x: Any, y: torch.Tensor, size: int = 64, seed: int = 0) -> tuple[Any, torch.Tensor]:
    """The batch the user would hand the doctor (the loop's first, seeded)."""
    g = torch.Generator().manual_seed(seed)
    i = torch.randperm(len(y), generator=g)[:size]
    return x[i], y[i]
