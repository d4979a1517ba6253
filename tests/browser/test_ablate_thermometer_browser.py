"""Row ablation of the thermometer in a real JupyterLab (Debian chromium): click a row, "ablate" → the
kernel re-runs the last step's forward with that module's output zeroed and the row panel shows Δ loss,
which equals the kernel's own value for the same request (the one ablation request/answer,
``nbdebug.sessions.ablation_io``); a hostile module name stays text.
"""

from __future__ import annotations

import pytest

from .harness import (
    HOSTILE,
    kernel_json,
    open_and_run,
    run_code_and_wait_text,
    run_js,
    screenshot,
    wait_widget,
    write_notebook,
)

pytestmark = pytest.mark.browser

SETUP = f"""
import torch, torch.nn as nn
%load_ext nbdebug
torch.manual_seed(0)
class WithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
        self.net.add_module({HOSTILE!r}, nn.Identity())
    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)
model = WithLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(8, 6), torch.randint(0, 4, (8,))) for _ in range(3)]
"""

RUN = """%%nndebug model --view thermometer
for xb, yb in data:
    opt.zero_grad(); loss = model(xb, yb); loss.backward(); opt.step()
"""


def test_ablate_a_thermometer_row_lab(page, lab) -> None:  # type: ignore[no-untyped-def]
    write_notebook(lab.root, "ablate_thermometer", [SETUP, RUN, "w = _nndebug_widget"])
    open_and_run(page, lab, "ablate_thermometer")
    view = wait_widget(page, "thermometer")
    page.locator('.nbdebug-thermometer[data-ready="1"]').wait_for(state="attached", timeout=120_000)
    names = [t.strip() for t in view.locator(".nbd-row .nbd-name").all_text_contents()]
    hostile = f"net.{HOSTILE}"
    assert "net.2" in names and hostile in names, names
    view.locator(f'.nbd-row[data-row="{names.index("net.2")}"]').click()
    panel = view.locator(".nbd-row-ablate")
    panel.wait_for(state="visible", timeout=60_000)
    assert panel.locator(".nbd-ablate-row").text_content() == "net.2"
    panel.locator(".nbd-ablate-go").click()
    page.locator(".nbdebug-thermometer .nbd-row-ablate[data-delta]").wait_for(state="attached", timeout=120_000)
    shown = float(panel.get_attribute("data-delta"))
    assert panel.locator(".nbd-delta").text_content().startswith("Δ loss = ")
    # the click reached the kernel, and the Δ shown is the kernel's value for the same request
    run_code_and_wait_text(page, "print('ablations', w.ablations)", "ablations 1")
    want = kernel_json(page, "w.handle_request('ablate', {'kind': 'modules', 'targets': [{'layer': 'net.2', 'units': []}],"
                             " 'mode': 'zero'})[0]['result']['metric']['delta']")
    assert shown == pytest.approx(want, rel=1e-9, abs=1e-12) and want != 0
    # the hostile row's name is text in the panel too
    view.locator(f'.nbd-row[data-row="{names.index(hostile)}"]').click()
    assert panel.locator(".nbd-ablate-row").text_content() == hostile
    assert run_js(page, "return document.querySelectorAll('.nbdebug-thermometer img').length") == 0
    screenshot(page, "ablate-thermometer-lab", view)
