"""A torch.compile'd model under nbdebug: TorchDynamo does not guard on module hooks, so code compiled
before the cell would skip ours silently (a thermometer with no rows after another view had run).
While nbdebug watches, compiled code runs eagerly; the compiler's stance is restored on every exit."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.eval_frame as eval_frame

import nbdebug
from nbdebug.adapters.offline import tiny_lm
from nbdebug.capture import hook_count
from nbdebug.capture.hooks import COMPILED_NOTE, is_compiled


@pytest.fixture(scope="module")
def compiled() -> object:
    torch.manual_seed(0)
    m = tiny_lm("gpt2")
    c = torch.compile(m, backend="eager")
    with torch.no_grad():
        c(torch.randint(1, 60, (1, 8)))  # compiled once, before any hook of ours
    yield c, m
    torch._dynamo.reset()


def test_every_view_sees_a_model_compiled_before_the_cell(compiled: object) -> None:
    c, m = compiled  # type: ignore[misc]
    ids = torch.randint(1, 60, (1, 8))
    assert is_compiled(c) and not is_compiled(m)
    hooks = hook_count(c)
    rows = []
    for view in ("logitlens", "attention", "thermometer", "thermometer"):  # the lens ran first: it used to blind the rest
        d = nbdebug.debug(c, view=view)
        with d, torch.no_grad():
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
