"""The fault zoo: training faults, each with its healthy twin, and healthy recipes (issue 26, item 3).

``CASES`` lists every case (fault ``name``, its twin ``name~``, recipes); ``CLASSES`` maps each fault
class to the finding codes that name it. Run them with ``benchmarks/bench_diagnosis.py``; the measured
table is in ``benchmarks/zoo/README.md``.
"""

from __future__ import annotations

from . import (
    activations,
    data,
    graph,
    loop_bugs,
    lr,
    mixing,
    nonfinite,
    order,
    output_kinds,
    outputs,
    recipes,
    recipes_data,
    recipes_lm,
    recipes_more,
    recipes_signed,
    training,
)
from .base import CASES, CLASSES, Case, Setup

__all__ = ["CASES", "CLASSES", "Case", "Setup"]
_MODULES = (activations, data, graph, loop_bugs, lr, mixing, nonfinite, order, output_kinds, outputs, recipes, recipes_data,
            recipes_lm, recipes_more, recipes_signed, training)
