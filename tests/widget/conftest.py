from __future__ import annotations

from collections.abc import Iterator

import ipywidgets
import pytest
from IPython.core.interactiveshell import InteractiveShell


@pytest.fixture
def shell() -> Iterator[InteractiveShell]:
    """A fresh IPython shell with nbdebug loaded and displays recorded in ``shell.displayed``."""
    InteractiveShell.clear_instance()
    sh = InteractiveShell.instance()
    displayed: list[object] = []
    sh.display_pub.publish = lambda data, metadata=None, **kw: displayed.append(data)  # type: ignore[method-assign]
    sh.displayed = displayed  # type: ignore[attr-defined]
    res = sh.run_cell("%load_ext nbdebug")
    assert res.success
    yield sh
    InteractiveShell.clear_instance()


@pytest.fixture
def created(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Class names of every widget whose front-end model is opened (created) from now on."""
    names: list[str] = []
    real_open = ipywidgets.Widget.open

    def spy(self: ipywidgets.Widget) -> None:
        names.append(type(self).__name__)
        real_open(self)

    monkeypatch.setattr(ipywidgets.Widget, "open", spy)
    return names
