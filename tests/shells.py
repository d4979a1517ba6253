"""Letting go of a test's IPython shell (the ``shell`` fixture of tests/conftest.py).

An ``InteractiveShell`` registers its ``atexit_operations`` with ``atexit``, which keeps it (and every
model and widget its namespace holds) alive until the process exits, where each one runs a full
``gc.collect``: measured 1.6 s a shell; tests/envelope/test_modes.py spent 18 s of its 80 s in 11 of
them, and the whole envelope stage ~100 s after its last test. Every full collection during the run
also walks all the shells kept so far.
"""

from __future__ import annotations

import atexit
from typing import Any


def let_go_of(sh: Any) -> None:
    """Unregister the shell's exit hook, stop its history thread and close its database (what that
    hook does besides clearing the namespace), and put back the ``sys.modules["__main__"]`` the shell
    replaced with its namespace (IPython's own ``cleanup``): the shell is then garbage like any other
    object (tests/unit/test_shell_fixture.py)."""
    atexit.unregister(sh.atexit_operations)
    sh.restore_sys_module_state()
    hm = sh.history_manager
    if hm is not None:
        hm.end_session()
        hm.close()
        sh.history_manager = None
