"""nbdebug: debug PyTorch models inside Jupyter.

>>> %load_ext nbdebug                                   # doctest: +SKIP
>>> %%nndebug model --view thermometer                 # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext nbdebug`: registers `%%nndebug` (the magics module is imported only now)."""
    from .magic import NNDebugMagics

    ipython.register_magics(NNDebugMagics)
