from __future__ import annotations

import ipywidgets
import pytest


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
