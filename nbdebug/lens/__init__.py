"""Lenses beyond the logit lens, fitted on the user's own model offline or loaded from a folder:
``fit_lens`` (tuned, linear shortcut), ``load_lens`` (nbdebug's, tuned-lens's and a Jacobian lens's
files), :class:`FittedLens` (``logits(block, hidden)``, ``save``), ``resolve_lens`` (what ``--lens``
names).

>>> lens = nbdebug.fit_lens(model, tok, texts, kind="shortcut", max_seconds=120)   # doctest: +SKIP
"""

from __future__ import annotations

from .fit import fit_lens
from .formats import load_lens
from .lens import KINDS, FittedLens
from .resolve import resolve_lens

__all__ = ["KINDS", "FittedLens", "fit_lens", "load_lens", "resolve_lens"]
