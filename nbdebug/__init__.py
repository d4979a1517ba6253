"""nbdebug: debug PyTorch models inside Jupyter.

>>> %load_ext nbdebug                                   # doctest: +SKIP
>>> %%nndebug model --view thermometer                 # doctest: +SKIP

Without the magic: ``nbdebug.debug(model, view=...)`` (a context manager whose ``show()`` displays
the views), ``nbdebug.thermometer(model, fn)``, ``nbdebug.Capture`` (the stats capture alone),
``nbdebug.head_view(attentions, tokens)`` (BertViz-style), ``nbdebug.compare(run_a, run_b, ...)``
(two or more runs' loss and series overlaid by step, the first divergence marked).

Training: ``nbdebug.doctor(model, inputs, targets)`` (the pre-training checklist, a
``DoctorReport``), ``nbdebug.NonFiniteError`` (raised by ``--break-on nonfinite``),
``nbdebug.TrainerCallback()`` (Hugging Face ``Trainer``) and ``nbdebug.LightningCallback()``
(PyTorch Lightning); neither callback imports its framework before one is created.
``nbdebug.assert_healthy(dbg_or_result, allow=[codes])``: AssertionError listing the run's findings
(``dbg.result.findings`` / ``.headline``; docs/diagnosis.md lists the codes).

Testing what a view shows (the causal workbench): ``nbdebug.patch(model, clean=, corrupt=, answer=,
wrong=, tokenizer=, sites=)`` (an activation-patching grid, a ``PatchGrid``), ``with
nbdebug.ablate(model, heads={3: [5]}):``, ``with nbdebug.steer(model, layer=, vector=, alpha=):`` and
``nbdebug.steering_vector(model, tokenizer=tok, positive=[...], negative=[...], layer=)``;
``nbdebug.attribute(model, ids, answer=" Paris", wrong=" Rome", tokenizer=tok, method=...)`` ("why A,
not B?": one score per input token, with integrated gradients' completeness gap and faithfulness curves).

Lenses: ``lens = nbdebug.fit_lens(model, tok, texts, kind="tuned"|"shortcut")`` (offline, on local text),
``nbdebug.load_lens(folder, model)`` (nbdebug's, tuned-lens's or a Jacobian lens's files); the logit-lens
view shows one with ``--lens lens`` (or ``lens=``).

Many processes: ``%%nndebug --distributed -o run`` over a cell that launches workers whose steps run
inside ``with nbdebug.debug(model):``; ``nbdebug.load(spool_dir)`` reads a spool written by a
``torchrun``/script launch with ``NBDEBUG_SPOOL=spool_dir`` (both give a ``nbdebug.distributed.Run``).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public names, imported on first use so that `%load_ext nbdebug` stays light.
_LAZY = {
    "debug": "nbdebug.api",
    "thermometer": "nbdebug.api",
    "Debug": "nbdebug.api",
    "Capture": "nbdebug.capture.session",
    "head_view": "nbdebug.widgets.attention",
    "model_view": "nbdebug.widgets.attention",
    "doctor": "nbdebug.doctor",
    "DoctorReport": "nbdebug.doctor",
    "NonFiniteError": "nbdebug.capture.incidents",
    "load": "nbdebug.distributed",
    "compare": "nbdebug.widgets.compare",
    "TrainerCallback": "nbdebug.integrations.hf",
    "LightningCallback": "nbdebug.integrations.lightning",
    "patch": "nbdebug.workbench",
    "ablate": "nbdebug.workbench",
    "steer": "nbdebug.workbench",
    "steering_vector": "nbdebug.workbench",
    "PatchGrid": "nbdebug.workbench",
    "attribute": "nbdebug.attribution",
    "fit_lens": "nbdebug.lens",
    "load_lens": "nbdebug.lens",
    "assert_healthy": "nbdebug.inspectors.health",
}
__all__ = ["__version__", "load_ipython_extension", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        # cached: importing the submodule `nbdebug.doctor` just bound the *module* to `nbdebug.doctor`;
        # the public name is the function of the same name
        globals()[name] = value
        return value
    raise AttributeError(f"module 'nbdebug' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext nbdebug`: registers `%%nndebug` (the magics module is imported only now)."""
    from .magic import NNDebugMagics

    ipython.register_magics(NNDebugMagics)
