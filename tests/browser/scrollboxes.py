"""Scroll boxes that hide content without a visible cue (issue 27: "no hidden scroll boxes").

A box hides content when its CSS lets it scroll or clip (``overflow-y`` auto/scroll/hidden/clip) and
its content is taller than the box. Overlay scrollbars (macOS, many Linux themes) are invisible until
scrolled, so a scrollbar is no cue: the view must either fit its content or show one, an element with
a ``data-more`` attribute (e.g. "12 more ▾") that is visible, inside the box or right after it.
Single lines cut with an ellipsis are :func:`tests.browser.readability.clipped`'s business (a
``title`` there is the way to read them whole) and are skipped here.
"""

from __future__ import annotations

from typing import Any

_HIDDEN = """(rootSel) => {
  const out = [];
  const clips = (v) => v === 'auto' || v === 'scroll' || v === 'hidden' || v === 'clip';
  const visible = (e) => e && e.getClientRects().length > 0 && getComputedStyle(e).visibility === 'visible';
  for (const root of document.querySelectorAll(rootSel)) {
    for (const el of [root, ...root.querySelectorAll('*')]) {
      if (!visible(el)) continue;
      const cs = getComputedStyle(el);
      if (!clips(cs.overflowY) || el.scrollHeight <= el.clientHeight + 1) continue;
      if (el.hasAttribute('title') && parseFloat(cs.lineHeight || '0') >= el.clientHeight - 1) continue;  // one cut line
      const cue = [...el.querySelectorAll('[data-more]'), el.nextElementSibling].filter((c) => c && c.hasAttribute('data-more'));
      if (cue.some(visible)) continue;
      out.push({ cls: String(el.className), hidden_px: el.scrollHeight - el.clientHeight,
                 text: (el.textContent || '').trim().slice(0, 60) });
    }
  }
  return out;
}"""


def hidden_in_scroll(page: Any, root_selector: str) -> list[dict[str, Any]]:
    """Boxes under (and including) ``root_selector`` whose content is taller than they are, with no
    visible ``data-more`` cue; ``[]`` when every box fits its content or says what it hides."""
    return list(page.evaluate(_HIDDEN, root_selector))
