"""A torch.compile'd model under nbdebug: TorchDynamo does not guard on module hooks, so code compiled
before the cell would skip ours silently (a thermometer with no rows after another view had run).
While nbdebug watches, compiled code runs eagerly; the compiler's stance is restored on every exit."""

from __future__ import annotations

import logging
import os
import pathlib
import re
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import torch._dynamo.eval_frame as eval_frame

import nbdebug
from nbdebug.adapters.offline import tiny_lm
from nbdebug.capture import hook_count, native, native_op
from nbdebug.capture.hooks import COMPILED_NOTE, is_compiled

NBDEBUG_DIR = str(pathlib.Path(nbdebug.__file__).parent)
ENV_OFF = os.environ.get("NBDEBUG_NATIVE", "1") == "0"
#: the kernel as the environment has it (skipped under NBDEBUG_NATIVE=0), and its numpy/torch fallback
KERNELS = [pytest.param(True, id="native", marks=pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")),
           pytest.param(False, id="fallback")]


@contextmanager
def _kernel(on: bool) -> Iterator[None]:
    """The native kernel (as the environment has it) or its numpy/torch fallback (NBDEBUG_NATIVE=0)."""
    saved = os.environ.get("NBDEBUG_NATIVE")
    if not on:
        os.environ["NBDEBUG_NATIVE"] = "0"
    native._reset()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("NBDEBUG_NATIVE", None)
        else:
            os.environ["NBDEBUG_NATIVE"] = saved
        native._reset()


@pytest.fixture(scope="module")
def compiled() -> object:
    torch.manual_seed(0)
    m = tiny_lm("gpt2")
    c = torch.compile(m, backend="eager")
    with torch.no_grad():
        c(torch.randint(1, 60, (1, 8)))  # compiled once, before any hook of ours
    yield c, m
    torch._dynamo.reset()


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_view_sees_a_model_compiled_before_the_cell(compiled: object, kernel: bool) -> None:
    """With the kernel and on its numpy/torch fallback (so the numpy-path run, NBDEBUG_NATIVE=0, need not
    run this file again: every stats-path case here is parametrized over both)."""
    c, m = compiled  # type: ignore[misc]
    ids = torch.randint(1, 60, (1, 8))
    assert is_compiled(c) and not is_compiled(m)
    hooks = hook_count(c)
    rows = []
    for view in ("logitlens", "attention", "thermometer", "thermometer"):  # the lens ran first: it used to blind the rest
        d = nbdebug.debug(c, view=view)
        with _kernel(kernel), d, torch.no_grad():
            assert native.available() is kernel, native.status()
            c(ids)
        assert view in d.results, d.note()
        assert COMPILED_NOTE in d.note()
        if view == "thermometer":
            rows.append([r.name for r in d.results[view].layers])
        assert eval_frame._stance.stance == "default" and hook_count(c) == hooks
    assert rows[0] == rows[1] and "lm_head" in rows[0] and "transformer.h.0.attn.c_attn" in rows[0]


def test_stance_restored_after_keyboard_interrupt(compiled: object) -> None:
    c, _ = compiled  # type: ignore[misc]
    with pytest.raises(KeyboardInterrupt), nbdebug.debug(c, view="thermometer"):
        assert eval_frame._stance.stance == "force_eager"
        raise KeyboardInterrupt
    assert eval_frame._stance.stance == "default"


def test_plain_model_leaves_the_stance_alone() -> None:
    m = torch.nn.Linear(2, 2)
    d = nbdebug.debug(m)
    with d:
        assert eval_frame._stance.stance == "default"
        m(torch.ones(1, 2))
    assert COMPILED_NOTE not in d.note()


# -- the native stats kernel while TorchDynamo traces our hooks (issue 19) --------------------------


def _cnn() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.Tanh(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3),
    )


class _Graphs:
    """``backend="eager"`` keeping the text of every graph it was given."""

    def __init__(self) -> None:
        self.graphs: list[str] = []

    def __call__(self, gm: torch.fx.GraphModule, _example: object) -> object:
        self.graphs.append(str(gm.graph))
        return gm.forward


class _Frames(logging.Handler):
    """The frames TorchDynamo compiles, "file name" each (its step log: "torchdynamo start tracing NAME FILE:LINE")."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.frames: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = re.search(r"torchdynamo start tracing (\S+) (\S+):\d+", record.getMessage())
        if m:
            self.frames.append(f"{m[2]} {m[1]}")


@contextmanager
def _frames() -> Iterator[list[str]]:
    """The frames TorchDynamo compiles in the block (``_Frames``), its log not printed."""
    log, handler = logging.getLogger("torch._dynamo.symbolic_convert"), _Frames()
    saved = log.level, log.propagate
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(handler)
    try:
        yield handler.frames
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]


def _train(model: torch.nn.Module, steps: list[tuple[torch.Tensor, torch.Tensor]], compiled_autograd: bool,
           compiled_step: bool) -> tuple[object, list[str], list[str], list[str], list[str]]:
    """The loop under the thermometer: (result, warnings, graph-break reasons (one per break), graphs,
    the frames Dynamo compiled). ``compiled_autograd``:
    each backward under compiled autograd (Dynamo traces the output-gradient hooks, as the envelope's
    ``compiled_autograd`` row); ``compiled_step``: the forward inside a ``torch.compile``d function
    (Dynamo traces the forward hooks)."""
    import warnings
    from contextlib import nullcontext

    from torch._dynamo import compiled_autograd as ca
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ns: dict[str, torch.Tensor] = {}

    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(x), y)

    backend = _Graphs()
    fwd = torch.compile(forward, backend=backend) if compiled_step else forward
    d = nbdebug.debug(model, view="thermometer", loss=lambda: ns.get("loss"))
    with warnings.catch_warnings(record=True) as caught, _frames() as frames, d:
        warnings.simplefilter("always")
        for x, y in steps:
            opt.zero_grad()
            ns["loss"] = loss = fwd(x, y)
            with ca._enable(torch.compile(backend=backend)) if compiled_autograd else nullcontext():
                loss.backward()
            opt.step()
    breaks = list(counters["graph_break"].elements())
    torch._dynamo.reset()
    return d.results["thermometer"], [str(w.message) for w in caught], breaks, backend.graphs, frames


def _same_history(got: object, want: object) -> None:
    hg, hw = got.history, want.history  # type: ignore[attr-defined]
    assert hg.rows == hw.rows and got.step_index.tolist() == want.step_index.tolist()  # type: ignore[attr-defined]
    np.testing.assert_array_equal(hg.values(), hw.values())
    np.testing.assert_array_equal(hg.scalar("loss"), hw.scalar("loss"))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 2, 6, 6, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(3)]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("mode", ["compiled_autograd", "compiled_step"])
def test_traced_hooks_take_the_stats_op_without_warning(kernel: bool, mode: str) -> None:
    """Under compiled autograd the output-gradient hook runs eagerly (``torch.compiler.disable``):
    Dynamo compiles none of nbdebug's frames (before: it traced the hook into the backward graph and
    recompiled it per layer shape and per gradient order, ~100 CPU-s on the envelope's row), every
    graph break is at the hook, no "does not know how to trace the builtin `_nbdext.stats`" warning.
    In a compiled training step (``torch.compile(train_step)``)
    Dynamo compiles none of nbdebug's frames: the forward hooks and the step bookkeeping behind the
    root hooks run eagerly (``torch.compiler.disable``; before, ~140 of nbdebug's frames per loop, 13
    kinds of graph break inside them), every graph break is at one of those calls, and the user's
    function is still compiled. Either way the history equals the eager loop's bit for bit, with the
    kernel and on its numpy/torch fallback."""
    batches = _batches()
    with _kernel(kernel):
        want, *_ = _train(_cnn(), batches, False, False)
        got, caught, breaks, graphs, frames = _train(_cnn(), batches, mode == "compiled_autograd", mode == "compiled_step")
        assert native.available() is kernel, native.status()
    assert not [w for w in caught if "_nbdext" in w], caught
    assert not [b for b in breaks if "_nbdext" in b or "ctypes" in b], breaks
    assert native_op.status().startswith("registered"), native_op.status()
    # Dynamo compiles none of nbdebug's frames (before the gradient hook was disabled: 27 under compiled
    # autograd, recompiled per layer shape and per grad_counter value), and breaks the graph only at them
    assert [f for f in frames if f.startswith(NBDEBUG_DIR)] == [], frames
    assert breaks and all("torch.compiler.disable" in b for b in breaks), breaks
    assert graphs, "nothing was compiled"
    if mode == "compiled_step":
        assert f"{__file__} forward" in frames, frames  # the user's function was compiled (and the log was read)
    _same_history(got, want)
    assert np.isfinite(got.series("0", "grad_norm")).all() and (got.series("0", "grad_norm") > 0).all()
