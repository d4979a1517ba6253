"""Scroll boxes that hide content without a visible cue (issue 27: "no hidden scroll boxes").

One check for every view (it was two modules with two rules). An element under the root hides content

- **vertically** when its ``overflow-y`` lets it scroll or clip (auto/scroll/hidden/clip) and its content
  is taller than the box: overlay scrollbars (macOS, many Linux themes) draw nothing until scrolled, so a
  scrollbar is no cue. The view must fit its content or show a cue: a visible element with a
  ``data-more`` attribute inside the box or right after it, worded "N more … ▾" / "show all ▾" /
  "show fewer ▴" (``js/src/lib/more.ts``);
- **horizontally** when its ``overflow-x`` is not ``visible``, its content is wider than the box and no
  scrollbar is drawn (``hidden``/``clip``, or ``auto`` with an overlay scrollbar).

Single lines cut with an ellipsis (``text-overflow: ellipsis`` on one line) are
:func:`tests.browser.legibility.clipped`'s business (a ``title`` there is the way to read them whole) and
are skipped here.
"""

from __future__ import annotations

from typing import Any

_JS = r"""(rootSel) => {
  const out = [];
  let checked = 0;
  const clips = (v) => v === 'auto' || v === 'scroll' || v === 'hidden' || v === 'clip';
  const shown = (e) => e && e.getClientRects().length > 0 && getComputedStyle(e).visibility === 'visible';
  const cueRe = /^(\d+ more .+ ▾|show all ▾|show fewer ▴)$/;
  for (const root of document.querySelectorAll(rootSel)) {
    for (const el of [root, ...root.querySelectorAll('*')]) {
      if (!shown(el)) continue;
      checked++;
      const cs = getComputedStyle(el);
      const oneLine = cs.textOverflow === 'ellipsis' && (cs.whiteSpace === 'nowrap' || cs.whiteSpace === 'pre');
      let tall = clips(cs.overflowY) && el.scrollHeight > el.clientHeight + 1 && !oneLine;
      if (tall && el.hasAttribute('title') && parseFloat(cs.lineHeight || '0') >= el.clientHeight - 1) tall = false;
      let cue = null;
      if (tall) {
        const cues = [...el.querySelectorAll('[data-more]'), el.nextElementSibling].filter((c) => c && c.hasAttribute('data-more') && shown(c));
        cue = cues.length ? (cues[0].textContent || '').trim() : null;
        if (cue !== null && cueRe.test(cue)) tall = false;
      }
      const bar = el.offsetHeight - el.clientHeight - parseFloat(cs.borderTopWidth) - parseFloat(cs.borderBottomWidth);
      const wide = cs.overflowX !== 'visible' && cs.textOverflow !== 'ellipsis' && el.scrollWidth > el.clientWidth + 1 && !(bar > 0);
      if (tall || wide) {
        out.push({ cls: String(el.className && el.className.baseVal !== undefined ? el.className.baseVal : el.className),
                   tall, wide, cue, hidden_px: el.scrollHeight - el.clientHeight,
                   scrollWidth: el.scrollWidth, clientWidth: el.clientWidth,
                   text: (el.textContent || '').trim().slice(0, 60) });
      }
    }
  }
  return { checked, failures: out };
}"""


def hidden_in_scroll_boxes(page: Any, root_selector: str) -> tuple[int, list[dict[str, Any]]]:
    """``(elements measured, those hiding content without a visible cue)`` under (and including)
    ``root_selector``."""
    res = page.evaluate(_JS, root_selector)
    return int(res["checked"]), list(res["failures"])


def hidden_in_scroll(page: Any, root_selector: str) -> list[dict[str, Any]]:
    """The boxes of :func:`hidden_in_scroll_boxes` only; ``[]`` when every box fits its content or says
    what it hides."""
    return hidden_in_scroll_boxes(page, root_selector)[1]
