"""The matrix's own checks fail when they should: a view replaced by a note where it must show, a
value off, a reference run that failed for another reason than the one the mode plants (issue 19:
tests that cannot pass by accident). No table cells: nothing here is recorded in "Works with"."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from . import cells
from . import models as M
from .checks import check
from .usercode import Outcome, reference_activations


def tampered(mutate: Callable[[Outcome, dict[str, Any]], None], caught: list[BaseException]) -> Callable[[Outcome, dict[str, Any]], None]:
    """``check`` as it is (must pass), then again after ``mutate(outcome, ctx)`` changed what the view
    showed or what it is compared with (must fail: the failure goes to ``caught``)."""

    def run(res: Outcome, ctx: dict[str, Any]) -> None:
        check(res, ctx)
        mutate(res, ctx)
        with pytest.raises(AssertionError) as info:
            check(res, ctx)
        caught.append(info.value)

    return run


def test_reference_run_failing_unplanned_fails_the_cell() -> None:
    x = M.image()

    def broken(m: torch.nn.Module) -> Any:
        m(x)
        raise TypeError("a bug in the reference, not the planted error")

    with pytest.raises(AssertionError, match=r"failed unexpectedly.*TypeError"):
        reference_activations(M.tiny_cnn(), broken)
    with pytest.raises(AssertionError, match=r"failed unexpectedly.*TypeError"):  # planted: ValueError
        reference_activations(M.tiny_cnn(), broken, expect=ValueError)
    with pytest.raises(AssertionError, match="did not raise the planted"):
        reference_activations(M.tiny_cnn(), lambda m: m(x), expect=ValueError)


def test_reference_run_keeps_what_ran_before_the_planted_error() -> None:
    model = M.tiny_cnn()
    model.conv2.register_forward_hook(lambda *_: (_ for _ in ()).throw(ValueError("planted")))
    rng = torch.get_rng_state()
    acts = reference_activations(model, lambda m: m(M.image()), expect=ValueError)
    assert sorted(acts) == ["bn", "conv1", "relu"], sorted(acts)  # conv2's own hook raised before ours
    assert torch.equal(torch.get_rng_state(), rng), "the reference run moved the caller's random stream"


def test_reference_names_every_output_as_the_views_do() -> None:
    """Tuple outputs by index, a module called twice by ``#2``, blocks (non-leaf modules) too, and a
    chosen forward of a loop."""

    class Pair(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x + 1, x * 2

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = torch.nn.Sequential(torch.nn.Linear(2, 2))
            self.act = torch.nn.ReLU()
            self.pair = Pair()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b = self.pair(self.act(self.act(self.block(x))))
            return a + b

    torch.manual_seed(0)
    net = Net()
    xs = [torch.randn(3, 2, generator=torch.Generator().manual_seed(k)) for k in range(3)]

    def loop(m: torch.nn.Module) -> None:
        for x in xs:
            m(x)

    first = reference_activations(net, loop)
    assert sorted(first) == ["act", "act#2", "block", "block.0", "pair[0]", "pair[1]"], sorted(first)
    h = net.block(xs[0])
    assert torch.equal(first["block"], h) and torch.equal(first["pair[1]"], torch.relu(h) * 2)
    last = reference_activations(net, loop, forward=-1)
    assert torch.equal(last["block.0"], net.block(xs[2]))
    assert torch.equal(reference_activations(net, loop, forward=2)["block.0"], net.block(xs[1]))


@pytest.mark.parametrize(("mode", "view"), [("compiled", "thermometer"), ("compiled", "gradcam"), ("budget0", "thermometer"),
                                            ("budget0", "logitlens"), ("plain", "featuremaps")])
def test_a_note_where_the_view_must_show_fails(mode: str, view: str) -> None:
    """Before: a compiled cell's note containing "compile" passed, and any ``--max-bytes 0`` note did."""
    note = {"compiled": "hooks cannot see a torch.compile'd model", "budget0": "dropped by the --max-bytes budget"}.get(mode, "skipped")
    ctx = dict(mode=mode, view=view, family="cnn", lm=False)
    with pytest.raises(AssertionError, match="view not shown"):
        check(Outcome(view, note=note), ctx)


def shift_first_row(res: Outcome, ctx: dict[str, Any]) -> None:
    row = res.result.layers[0]
    row.stats["mean"] += 1e-2 * (1 + abs(row.stats["mean"]))


def shift_step2_reference(res: Outcome, ctx: dict[str, Any]) -> None:
    """As if the loop's second forward had computed another ``bn`` (each step is compared with its own)."""
    ctx["acts_steps"][1]["bn"] = ctx["acts_steps"][1]["bn"] + 0.1


def swap_cam_classes(res: Outcome, ctx: dict[str, Any]) -> None:
    maps = res.result.maps["relu#2"]
    maps.low = np.ascontiguousarray(np.asarray(maps.low)[:, ::-1])


def bump_score(res: Outcome, ctx: dict[str, Any]) -> None:
    res.result.scores[0, 0] += 0.05


def drop_differ_note(res: Outcome, ctx: dict[str, Any]) -> None:
    res.result.notes[:] = [n for n in res.result.notes if "differ" not in n]


def shift_lens_top1(res: Outcome, ctx: dict[str, Any]) -> None:
    ids = res.result.top_ids  # (rows, T, k): the cached table itself
    ids[-1, :, 0] = (ids[-1, :, 0] + 1) % M.VOCAB


def other_weights(res: Outcome, ctx: dict[str, Any]) -> None:
    """Compared with other weights than the model's after the cell (fc's bias zeroed): no fit."""
    ctx["ref"] = copy.deepcopy(ctx["ref"])
    torch.nn.init.zeros_(ctx["ref"].fc.bias)


CAUGHT = [
    ("budget0", "thermometer", shift_first_row),  # before: only the budget note was checked
    ("budget0", "gradcam", swap_cam_classes),
    ("budget0", "logitlens[gpt2]", shift_lens_top1),
    ("train_step", "thermometer", shift_first_row),  # before: loop rows were not compared at all
    ("train_step", "thermometer", shift_step2_reference),
    ("nan_loop", "thermometer", shift_step2_reference),
    ("train_step", "gradcam", swap_cam_classes),  # before: skipped when a note said "differ"
    ("train_step", "gradcam", bump_score),
    ("train_step", "gradcam", drop_differ_note),
    ("train_step", "gradcam", other_weights),
    ("dropout", "gradcam", swap_cam_classes),
    ("dropout", "gradcam", bump_score),
    ("dropout", "gradcam", drop_differ_note),
    ("plain", "gradcam", swap_cam_classes),
]


@pytest.mark.parametrize(("mode", "view", "mutate"), CAUGHT, ids=[f"{m}-{v}-{f.__name__}" for m, v, f in CAUGHT])
def test_a_wrong_value_fails_the_cell(mode: str, view: str, mutate: Callable[[Outcome, dict[str, Any]], None]) -> None:
    caught: list[BaseException] = []
    cells.run(mode, view, tampered(mutate, caught))
    assert len(caught) == 1


def test_training_reference_failing_unplanned_fails_the_cell() -> None:
    """The training rows' reference loop (training.reference) is held to the same rule."""
    from . import training as T

    model, opt, batches = T.build("train_history")
    bad = [batches[0], (torch.randn(2, 5), batches[1][1])]  # a batch the CNN cannot take: RuntimeError
    with pytest.raises(AssertionError, match="failed unexpectedly"):
        T.reference("train_history", *T.copies(model, opt), bad)
    model, opt, batches = T.build("interrupt_loop")
    with pytest.raises(AssertionError, match="did not raise the planted KeyboardInterrupt"):
        T.reference("interrupt_loop", *T.copies(model, opt), batches[: T.INTERRUPT_AT - 1])
    assert type(T.reference("interrupt_loop", *T.copies(model, opt), batches).raised) is KeyboardInterrupt
