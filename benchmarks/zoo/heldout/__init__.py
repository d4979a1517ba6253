"""The held-out fault zoo (issue 26's acceptance: "other faults of these classes, other recipes"):
faults of the project zoo's classes (``..classes``) written differently — other architectures (a 1-D
conv net, an EmbeddingBag text classifier, a GRU regressor, a tiny batch-first transformer, a UNet-ish
segmenter), other data (synthetic signals, pydoc_data words, make_moons, Friedman, Poisson counts),
other optimizers and shapes — each with its healthy twin, and other healthy recipes. Written blind to
the rules (nbdebug's findings code and thresholds were not read).

Registered through the project zoo's API (``@fault``, ``@recipe``) but kept apart: ``CASES`` here, and
the project zoo's ``zoo.CASES`` is left exactly as it was. ``benchmarks/bench_diagnosis.py --heldout``
runs it; ``python -m zoo.heldout.curves`` (from ``benchmarks/``) checks that every fault harms and every
twin learns."""

from __future__ import annotations

from .. import base

_before = len(base.CASES)
from . import data_faults, model_faults, optim_faults, recipes  # noqa: E402  (registers into base.CASES)

CASES: list[base.Case] = base.CASES[_before:]
del base.CASES[_before:]  # the project zoo's registry is unchanged

__all__ = ["CASES"]
_MODULES = (data_faults, model_faults, optim_faults, recipes)
