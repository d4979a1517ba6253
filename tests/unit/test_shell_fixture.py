"""The ``shell`` fixture lets go of its IPython shell: its exit hook (which would keep the shell, its
namespace and models alive until the process exits, then run a full ``gc.collect`` for it) is
unregistered and its history thread stopped (tests/shells.py says what that saved)."""

from __future__ import annotations

import atexit
from typing import Any

import pytest
import shells
from IPython.core.interactiveshell import InteractiveShell


def _shell() -> InteractiveShell:
    InteractiveShell.clear_instance()
    sh = InteractiveShell.instance()
    assert sh.run_cell("%load_ext nbdebug").success
    return sh


@pytest.mark.parametrize("let_go", [True, False], ids=["let_go_of", "planted_nothing_done"])
def test_let_go_of_unregisters_the_exit_hook_and_stops_the_history_thread(
    let_go: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    unregistered: list[Any] = []
    real = atexit.unregister
    monkeypatch.setattr(atexit, "unregister", lambda f: (unregistered.append(f), real(f))[1])
    sh = _shell()
    thread = sh.history_manager.save_thread
    try:
        if let_go:
            shells.let_go_of(sh)
        running = thread is not None and thread.is_alive()
        hook_gone = sh.atexit_operations in unregistered
        assert (hook_gone, running) == ((True, False) if let_go else (False, True))
    finally:
        InteractiveShell.clear_instance()
        if not let_go:
            shells.let_go_of(sh)
