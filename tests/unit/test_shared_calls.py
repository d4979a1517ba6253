"""tests/shared_calls.py: identical calls computed once, everything else computed again. Planted
mistakes caught: a cache keyed without the defaults (``steps=64`` written out computed twice), one
that ignores an argument (a different ``steps`` handed the first result), one that hands out the
stored object itself (a test's change seen by the next), and one that skips binding (a wrong keyword
accepted on a cache hit)."""

from __future__ import annotations

import numpy as np
import pytest
from shared_calls import calls_made, once


def test_identical_calls_are_computed_once_and_copied() -> None:
    ran: list[tuple[object, int]] = []
    model = object()

    def ig(model: object, prompt: str, *, steps: int = 64, progress: bool | None = None) -> dict[str, object]:
        ran.append((model, steps))
        return {"scores": np.arange(3.0), "steps": steps}

    first = once(ig, model, "p")
    again = once(ig, model, "p", steps=64, progress=False)  # the default written out; progress left out
    assert ran == [(model, 64)] and np.array_equal(again["scores"], first["scores"])
    again["scores"][0] = 99.0  # a test changing its copy
    assert once(ig, model, "p")["scores"][0] == 0.0 and len(ran) == 1
    assert once(ig, model, "p", steps=8)["steps"] == 8 and len(ran) == 2  # a different argument runs again
    assert once(ig, object(), "p")["steps"] == 64 and len(ran) == 3  # another model runs again
    assert once(ig, model, "q")["steps"] == 64 and len(ran) == 4
    with pytest.raises(TypeError):
        once(ig, model, "p", stpes=64)  # does not bind, as the real call would not
    assert calls_made()[-6:] == [f"{ig.__qualname__} {w}" for w in ("computed", "shared", "shared", "computed", "computed", "computed")]
