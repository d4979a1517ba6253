"""Content hidden in a scroll box without a visible cue (issue 27): an element under ``selector`` whose
content is taller than its box while its ``overflow-y`` is not ``visible`` (a max-height list or grid:
the last rows are below the fold, and overlay scrollbars show nothing until scrolled), or wider than its
box with no scrollbar drawn (``overflow-x: hidden``/``clip``, or ``auto`` with an overlay scrollbar).
An ellipsis is a visible cue (``clipped`` in legibility.py measures those labels); so is an element
marked ``data-more`` (a "N more ▾" control next to it)."""

from __future__ import annotations

from typing import Any

_JS = """(sel) => {
  const out = [];
  let checked = 0;
  for (const root of document.querySelectorAll(sel)) {
    for (const el of [root, ...root.querySelectorAll('*')]) {
      const cs = getComputedStyle(el);
      if (cs.display === 'none' || cs.visibility !== 'visible' || el.closest('[data-more]')) continue;
      checked++;
      const tall = cs.overflowY !== 'visible' && el.scrollHeight > el.clientHeight + 1;
      const bar = el.offsetHeight - el.clientHeight - parseFloat(cs.borderTopWidth) - parseFloat(cs.borderBottomWidth);
      const wide = cs.overflowX !== 'visible' && cs.textOverflow !== 'ellipsis' && el.scrollWidth > el.clientWidth + 1 && !(bar > 0);
      if (tall || wide) {
        out.push({ cls: String(el.className && el.className.baseVal !== undefined ? el.className.baseVal : el.className),
                   tall, wide, scrollHeight: el.scrollHeight, clientHeight: el.clientHeight,
                   scrollWidth: el.scrollWidth, clientWidth: el.clientWidth });
      }
    }
  }
  return { checked, failures: out };
}"""


def hidden_in_scroll_boxes(page: Any, selector: str) -> tuple[int, list[dict[str, Any]]]:
    """``(elements measured, those hiding content without a visible cue)`` under ``selector``."""
    res = page.evaluate(_JS, selector)
    return int(res["checked"]), list(res["failures"])
