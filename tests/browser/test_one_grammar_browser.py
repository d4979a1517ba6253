"""Issue 27's "one grammar across views", over every view's rendered DOM (exported pages opened from
file:// in chromium: each view's own ``render()`` on its own state, no kernel, no Jupyter server).

- **No view hides content in a scroll box without a visible cue** (tests/browser/scrollboxes.py): every
  view is built big enough to overflow its boxes where it has any (a thermometer of 81 rows, a logit lens
  of 41 rows, an event list of 30 items), at an 800-px-wide window. A box with a max-height must show
  "N more … ▾" beside it, and a click on the cue shows every row. Planted: the same boxes with their cue
  removed are reported (the check is not vacuous).
- **Attribution and patching use the same colour for "toward the answer"**: an attribution whose
  strongest token pushes the answer up (+1 on its scale) and a patching grid with a cell of effect +1
  (fully restores the answer) are drawn in the same computed colour, and so are +0.5 and the negative
  side. Planted: a view that flipped its scale (red toward the answer) fails the equalities.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from .scrollboxes import hidden_in_scroll_boxes

pytestmark = pytest.mark.browser

_spec = importlib.util.spec_from_file_location("snapshot_models", Path(__file__).resolve().parent.parent / "widget" / "snapshot_models.py")
models = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(models)  # type: ignore[union-attr]
KEEP: list[Any] = []  # models the widgets hold weakly


def _open(page: Any, widget: Any, tmp_path: Path, view: str) -> Any:
    """Export ``widget``, open it from file:// with every other request aborted, wait for the view."""
    path = widget.save_html(tmp_path / f"{view}-{len(KEEP)}.html")
    me = path.resolve().as_uri()
    page.route("**/*", lambda r: r.continue_() if r.request.url == me else r.abort())
    page.goto(me)
    root = page.locator(f'.nbdebug-{view}[data-ready="1"]')
    root.wait_for(state="attached", timeout=60_000)
    page.wait_for_timeout(300)  # the cues are worded on the next animation frame
    return root


def big_thermometer() -> Any:
    from nbdebug.capture.session import Capture
    from nbdebug.widgets.thermometer import ThermometerWidget

    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(40)])
    KEEP.append(m)
    with Capture(m) as cap:
        m(torch.rand(4, 8)).sum().backward()
    return ThermometerWidget.from_capture(cap.result)


def big_lens() -> Any:
    from nbdebug.adapters.offline import tiny_lm
    from nbdebug.recorders.logitlens import LogitLensRecorder

    torch.manual_seed(0)
    m = tiny_lm("llama", vocab=200, layers=40, d=16)
    KEEP.append(m)
    with LogitLensRecorder(m, lens_topk=3, tokens=list("abcdef")) as rec, torch.no_grad():
        m(torch.randint(0, 200, (1, 6)))
    return rec.widget()


def compare_runs() -> Any:
    import nbdebug
    from nbdebug.capture.session import Capture

    out = []
    for lr in (3.0, 0.1):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        opt = torch.optim.SGD(m.parameters(), lr=lr)
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(8, 16, 8, generator=g), torch.randint(0, 3, (8, 16), generator=g)
        with Capture(m) as cap:
            for i in range(8):
                loss = nn.functional.cross_entropy(m(x[i]), y[i])
                opt.zero_grad()
                loss.backward()
                opt.step()
        out.append(cap.result)
    return nbdebug.compare(*out, labels=["lr=3.0", "lr=0.1"])


def planted_patching_and_attribution() -> tuple[Any, Any]:
    """A patching grid with effects +1, +0.5 and −0.5 at known cells, and an attribution whose scores
    are +1, +0.5 and −0.5 of its largest |score|: the same values on both views' scales."""
    import nbdebug
    from nbdebug.adapters.offline import tiny_lm
    from nbdebug.attribution import Attribution

    torch.manual_seed(0)
    m = tiny_lm("gpt2", vocab=64, layers=3, heads=2, d=16)
    KEEP.append(m)
    x = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    x2 = x.clone()
    x2[0, 2] = (x2[0, 2] + 7) % 64
    grid = nbdebug.patch(m, x, x2, answer=3, wrong=4, sites="resid")
    effect = np.zeros(grid.effect.shape)
    effect[0, 2], effect[1, 3], effect[2, 4] = 1.0, 0.5, -0.5
    grid = dataclasses.replace(grid, effect=effect, identical=np.zeros(effect.shape, dtype=bool))
    attr = Attribution(scores=np.array([0.3, 1.2, 0.6, -0.6]), tokens=["The", " E", "iffel", " of"], ids=[1, 2, 3, 4],
                       method="occlusion", metric=2.0, label="logit[' Paris'] - logit[' Rome']")
    return grid.show(), attr.show()


def test_no_view_hides_content_in_a_scroll_box_without_a_cue(page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("transformers")
    page.set_viewport_size({"width": 800, "height": 900})
    patch_w, attr_w = planted_patching_and_attribution()
    views = {
        "thermometer": big_thermometer(), "logitlens": big_lens(), "compare": compare_runs(),
        "featuremaps": models.featuremaps(), "gradcam": models.gradcam(), "attention": models.attention(),
        "patching": patch_w, "attribution": attr_w,
    }
    for view, widget in views.items():
        root = _open(page, widget, tmp_path, view)
        checked, hidden = hidden_in_scroll_boxes(page, f".nbdebug-{view}")
        assert checked > 10 and hidden == [], (view, hidden[:5])
        KEEP.append(widget)
        if view == "thermometer":
            # 81 rows overflow the table's max-height: the cue counts the rows below the fold, and a
            # click shows every one of them (nothing left to hide)
            cue = root.locator(".nbd-table + [data-more]")
            text = cue.text_content() or ""
            assert cue.is_visible() and text.endswith(" more rows ▾"), text
            below = int(text.split()[0])
            assert 0 < below < 81
            cue.click()
            page.wait_for_function("(() => { const t = document.querySelector('.nbdebug-thermometer .nbd-table');"
                                   " return t.scrollHeight <= t.clientHeight + 1; })()")
            assert cue.text_content() == "show fewer ▴"
            assert hidden_in_scroll_boxes(page, ".nbdebug-thermometer")[1] == []
            cue.click()
            page.wait_for_function("document.querySelector('.nbdebug-thermometer .nbd-table + [data-more]')"
                                   ".textContent.endsWith('more rows ▾')")
            # the event list (shown, as renderTimeline shows a list with entries): 30 items in its 14em box say how many are below too (its last item is no
            # longer silently below the fold)
            page.evaluate("""() => { const ul = document.querySelector('.nbdebug-thermometer .nbd-events');
                for (let i = 0; i < 30; i++) { const li = document.createElement('li'); li.textContent = 'event ' + i; ul.appendChild(li); }
                ul.style.display = ''; }""")
            ev = root.locator(".nbd-events + [data-more]")
            page.wait_for_function("/^\\d+ more events ▾$/.test(document.querySelector('.nbdebug-thermometer .nbd-events + [data-more]').textContent)")
            assert ev.is_visible()
            assert hidden_in_scroll_boxes(page, ".nbdebug-thermometer")[1] == []
            # planted: the same boxes without their cue are reported
            page.evaluate("document.querySelectorAll('.nbdebug-thermometer [data-more]').forEach(c => c.removeAttribute('data-more'))")
            planted = {f["cls"] for f in hidden_in_scroll_boxes(page, ".nbdebug-thermometer")[1]}
            assert {"nbd-table", "nbd-events"} <= planted, planted
        if view == "logitlens":
            cue = root.locator(".nbl-wrap + [data-more]")
            text = cue.text_content() or ""
            assert cue.is_visible() and text.endswith(" more rows ▾"), text
            page.evaluate("document.querySelector('.nbdebug-logitlens .nbl-wrap + [data-more]').remove()")
            assert [f["cls"] for f in hidden_in_scroll_boxes(page, ".nbdebug-logitlens")[1]] == ["nbl-wrap"]
        page.unroute("**/*")


def _colours(page: Any, selector: str) -> list[str]:
    return page.locator(selector).evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")


def test_attribution_and_patching_draw_toward_the_answer_in_the_same_colour(page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    patch_w, attr_w = planted_patching_and_attribution()
    _open(page, attr_w, tmp_path, "attribution")
    tokens = _colours(page, ".nbdebug-attribution .nbd-attr-tok")  # scores +0.25, +1, +0.5, −0.5 of the peak
    page.unroute("**/*")
    _open(page, patch_w, tmp_path, "patching")
    cell = {(r, c): _colours(page, f'.nbdebug-patching .nbp-cell[data-row="{r}"][data-col="{c}"]')[0]
            for r, c in ((0, 2), (1, 3), (2, 4), (0, 0))}
    page.unroute("**/*")
    # toward the answer: a token pushing it up most = a cell that fully restores it, in one colour
    assert tokens[1] == cell[(0, 2)] == "rgb(33, 102, 172)", (tokens, cell)
    assert tokens[2] == cell[(1, 3)] and tokens[3] == cell[(2, 4)], (tokens, cell)
    assert cell[(0, 0)] == "rgb(255, 255, 255)" and tokens[1] != tokens[3]  # zero is white; the sides differ
    KEEP.extend([patch_w, attr_w])
